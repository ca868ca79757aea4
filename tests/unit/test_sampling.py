"""Batched sampling against hand-computed draws (probabilities 0.5 / 0.3 / 0.2, cdf .5 / .8 / 1)."""

import math

import pytest
import torch

from agentrl.engine.sampling import draw_tokens, sample_tokens

PROBS = torch.tensor([0.5, 0.3, 0.2])
LOGP = PROBS.log()


def draw(u: float, top_k: int = -1, top_p: float = 1.0, logp: torch.Tensor = LOGP) -> int:
    return int(draw_tokens(logp[None, :], torch.tensor([top_k]), torch.tensor([top_p]), torch.tensor([u]))[0])


@pytest.mark.parametrize(("u", "token"), [(0.0, 0), (0.49, 0), (0.51, 1), (0.79, 1), (0.81, 2), (0.999999, 2)])
def test_inverse_cdf_without_truncation(u, token):
    assert draw(u) == token


def test_top_k_keeps_the_k_most_probable():
    assert draw(0.999999, top_k=1) == 0
    # top-2 keeps mass .8: u = .7 -> .56 along the cdf -> token 1; u = .6 -> .48 -> token 0
    assert draw(0.7, top_k=2) == 1 and draw(0.6, top_k=2) == 0


def test_top_p_keeps_the_token_that_crosses_p():
    # mass before each sorted token: 0, .5, .8 -> p = .6 keeps tokens 0 and 1 (mass .8)
    assert draw(0.999999, top_p=0.6) == 1
    assert draw(0.6, top_p=0.6) == 0  # .48 < .5
    assert draw(0.999999, top_p=0.45) == 0  # token 1 starts at mass .5, not below p


def test_truncation_maps_sorted_positions_back_to_token_ids():
    shuffled = torch.tensor([0.2, 0.5, 0.3]).log()  # the most probable token is id 1
    assert draw(0.999999, top_k=1, logp=shuffled) == 1
    assert draw(0.999999, top_p=0.6, logp=shuffled) == 2  # keeps ids 1 (.5) and 2 (.3)


def test_logprob_is_log_softmax_of_tempered_logits_before_truncation():
    logits = LOGP[None, :]
    tokens, logprobs = sample_tokens(logits, temperature=torch.tensor([2.0]), greedy=torch.tensor([False]),
                                     top_k=torch.tensor([1]), top_p=torch.tensor([1.0]),
                                     uniforms=torch.tensor([0.3]))
    # T = 2: probabilities proportional to sqrt(p) = .7071, .5477, .4472 (sum 1.7020)
    assert int(tokens[0]) == 0
    assert float(logprobs[0]) == pytest.approx(math.log(0.70711 / 1.70200), abs=1e-4)


def test_greedy_rows_take_the_argmax_and_ignore_their_uniform():
    logits = torch.stack([LOGP, LOGP])
    tokens, logprobs = sample_tokens(logits, temperature=torch.tensor([1.0, 1.0]),
                                     greedy=torch.tensor([True, False]), top_k=torch.tensor([-1, -1]),
                                     top_p=torch.tensor([1.0, 1.0]), uniforms=torch.tensor([0.9, 0.9]))
    assert tokens.tolist() == [0, 2]
    assert logprobs.tolist() == pytest.approx([math.log(0.5), math.log(0.2)], abs=1e-6)


def test_a_row_draws_the_same_token_whatever_else_is_in_the_batch():
    torch.manual_seed(0)
    logits = torch.randn(5, 50)
    params = {"temperature": torch.tensor([0.7, 1.0, 1.3, 1.0, 0.5]),
              "greedy": torch.tensor([False, True, False, False, False]),
              "top_k": torch.tensor([-1, -1, 10, 5, -1]), "top_p": torch.tensor([0.9, 1.0, 1.0, 0.8, 1.0]),
              "uniforms": torch.rand(5)}
    together = sample_tokens(logits, **params)
    for row in range(5):
        alone = sample_tokens(logits[row : row + 1], **{k: v[row : row + 1] for k, v in params.items()})
        assert int(alone[0][0]) == int(together[0][row])
        assert float(alone[1][0]) == pytest.approx(float(together[1][row]), abs=1e-6)
