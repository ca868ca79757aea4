"""Samples -> padded training tensors; micro-batching; the batch equation."""

from __future__ import annotations

import pytest

from agentrl.errors import ConfigError
from agentrl.records.sample import Sample, Status, Turn
from agentrl.trainer.batch import build_batch, micro_batches
from agentrl.trainer.config import TrainerConfig, batch_shape


def sample(group, prompt, response, mask, reward=1.0):
    logprobs = [-0.1 * (i + 1) if m else 0.0 for i, m in enumerate(mask)]
    turns, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            turns.append(Turn("assistant" if mask[start] else "environment", start, i))
            start = i
    return Sample(group_id=group, tokens=prompt + response, response_length=len(response),
                  loss_mask=mask, rollout_log_probs=logprobs, reward=reward,
                  status=Status.COMPLETED, turns=turns)


def test_shifted_layout_by_hand():
    a = sample("g1", [10, 11, 12], [20, 21, 30, 22], [1, 1, 0, 1], reward=1.0)
    b = sample("g0", [10], [40, 41], [1, 1], reward=0.0)
    batch = build_batch([a, b], pad_id=0)
    assert batch.tokens.tolist() == [[10, 11, 12, 20, 21, 30, 22], [10, 40, 41, 0, 0, 0, 0]]
    assert batch.lengths.tolist() == [7, 3]
    # position i predicts token i + 1: a's first response token (index 3) sits at position 2
    assert batch.mask.tolist() == [[0, 0, 1, 1, 0, 1], [1, 1, 0, 0, 0, 0]]
    assert batch.rollout_logprobs[0].tolist() == pytest.approx([0, 0, -0.1, -0.2, 0, -0.4])
    assert batch.rollout_logprobs[1].tolist() == pytest.approx([-0.1, -0.2, 0, 0, 0, 0])
    assert batch.rewards.tolist() == [1.0, 0.0]
    assert batch.groups.tolist() == [0, 1]  # dense ids in order of first appearance
    assert batch.num_tokens == 5
    sub = batch.select([1])
    assert sub.tokens.tolist() == [[10, 40, 41]] and sub.mask.tolist() == [[1, 1]]


def test_batch_rejects_broken_samples():
    bad = sample("g", [1, 2], [3, 4], [1, 1])
    bad.loss_mask = [1]
    with pytest.raises(ValueError, match="loss_mask"):
        build_batch([bad])
    unscored = sample("g", [1, 2], [3], [1], reward=None)
    with pytest.raises(ValueError, match="no reward"):
        build_batch([unscored])


def test_micro_batches_fixed_and_token_budget():
    assert micro_batches([5, 6, 7, 8, 9], micro_batch_size=2) == [[0, 1], [2, 3], [4]]
    # longest first, first fit under rows x longest <= 20
    assert micro_batches([4, 10, 3, 9, 30], max_tokens=20) == [[4], [1, 3], [0, 2]]
    # packed, the budget counts real tokens: short rows join where padding would not let them
    assert micro_batches([6, 6, 6, 1, 1], max_tokens=14) == [[0, 1], [2, 3], [4]]
    assert micro_batches([6, 6, 6, 1, 1], max_tokens=14, packed=True) == [[0, 1, 3, 4], [2]]
    with pytest.raises(ValueError, match="exactly one"):
        micro_batches([1], micro_batch_size=1, max_tokens=5)


def test_batch_equation_names_the_flag():
    assert batch_shape(TrainerConfig(), 32) == (32, 1)
    assert batch_shape(TrainerConfig(global_batch_size=8), 32) == (8, 4)
    assert batch_shape(TrainerConfig(num_steps_per_rollout=2), 32) == (16, 2)
    with pytest.raises(ConfigError, match="--global-batch-size 12"):
        batch_shape(TrainerConfig(global_batch_size=12), 32)
    with pytest.raises(ConfigError, match="drop --num-steps-per-rollout"):
        batch_shape(TrainerConfig(global_batch_size=8, num_steps_per_rollout=2), 32)
    with pytest.raises(ConfigError, match="--micro-batch-size 3"):
        batch_shape(TrainerConfig(micro_batch_size=3), 32)


def test_a_failed_sample_without_tokens_is_one_padding_token_without_loss():
    """Regression: a sample that failed before its prompt was rendered has no tokens; a
    micro-batch of such samples had no shape and crashed the Megatron step."""
    failed = Sample(group_id=0, index=1, reward=0.0, status=Status.FAILED)
    batch = build_batch([failed, sample(0, [5, 6], [7, 8, 9], [1, 1, 0])])
    assert batch.lengths.tolist()[0] == 1 and batch.mask[0].sum() == 0


@pytest.mark.parametrize("changes,match", [
    ({"advantage_estimator": "dpo"}, "--advantage-estimator must be one of grpo"),
    ({"eps_clip_c": 0.5}, "--eps-clip-c must be > 1"),
    ({"use_kl_loss": True}, "--kl-loss-coef > 0"),
    ({"kl_coef": 0.1}, "use --use-kl-loss"),
    ({"use_dynamic_batch_size": True}, "--max-tokens-per-gpu"),
])
def test_trainer_flags_are_validated(changes, match):
    with pytest.raises(ConfigError, match=match):
        TrainerConfig(**changes).validate()
