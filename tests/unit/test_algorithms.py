"""agentrl.algorithms: every estimator and loss against numbers computed by hand in the test."""

from __future__ import annotations

import ast
import math
import sys
from pathlib import Path

import pytest
import torch

from agentrl.algorithms import (
    aggregate,
    compute_advantages,
    discounted_returns,
    entropy_bonus,
    entropy_from_logits,
    gae_advantages,
    group_index,
    grpo_advantages,
    importance_ratio_stats,
    kl_estimate,
    masked_mean,
    masked_whiten,
    mis_weights,
    pad_samples,
    policy_loss,
    ratio_within_bounds,
    reinforce_plus_plus_baseline_advantages,
    reinforce_plus_plus_returns,
    response_mask,
    tis_weights,
    token_rewards,
    total_loss,
    value_loss,
)

LN2 = math.log(2.0)


def t(values, dtype=torch.float64) -> torch.Tensor:
    return torch.as_tensor(values, dtype=dtype)


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual.double(), t(expected), atol=atol, rtol=0)


# ---- layout -------------------------------------------------------------------------------


def test_pad_samples_and_response_mask():
    close(pad_samples([[1.0, 2.0], [3.0], []]), [[1, 2], [3, 0], [0, 0]])
    close(pad_samples([[-0.5], [-1.0, -2.0]], pad=9.0), [[-0.5, 9], [-1, -2]])
    assert pad_samples([]).shape == (0, 0)
    mask = response_mask([[1, 1, 0, 0, 0, 1], [0, 1]])
    assert mask.dtype == torch.float32
    close(mask, [[1, 1, 0, 0, 0, 1], [0, 1, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match=r"loss_masks\[1\]"):
        response_mask([[1], [2]])


def test_algorithms_modules_import_only_torch_and_stdlib():
    allowed = {"torch", "agentrl"} | set(sys.stdlib_module_names)
    package = Path(__file__).parents[2] / "agentrl" / "algorithms"
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"
                if name.startswith("agentrl"):
                    assert name.startswith("agentrl.algorithms"), f"{path.name} imports {name}"


# ---- aggregation --------------------------------------------------------------------------

VALUES = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]
RAGGED = [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token_mean", (1 + 2 + 4) / 3),  # 3 counted tokens
        ("seq_mean_token_mean", ((1 + 2) / 2 + 4 / 1) / 2),  # row 3 has no tokens
        ("seq_mean_token_sum", ((1 + 2) + 4) / 2),
    ],
)
def test_aggregate_modes_on_a_ragged_mask(mode, expected):
    values = t(VALUES)
    values[0, 2] = float("nan")  # masked tokens must not leak, even as NaN
    values[2, 0] = float("inf")
    close(aggregate(values, t(RAGGED), mode), expected)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_aggregate_of_an_empty_mask_is_zero_with_a_finite_gradient(mode):
    values = t(VALUES).requires_grad_()
    out = aggregate(values, torch.zeros(3, 3, dtype=torch.float64), mode)
    out.backward()
    assert out.item() == 0.0
    assert torch.equal(values.grad, torch.zeros(3, 3, dtype=torch.float64))


def test_aggregate_with_a_global_denominator_and_unknown_mode():
    # micro-batch of 3 tokens out of a global batch of 7: sum / 7
    close(aggregate(t(VALUES), t(RAGGED), "token_mean", denominator=7.0), 1.0)
    # 2 samples with tokens here, 4 globally: (1.5 + 4) / 4
    close(aggregate(t(VALUES), t(RAGGED), "seq_mean_token_mean", denominator=4), 1.375)
    with pytest.raises(ValueError, match="token_mean, seq_mean_token_mean, seq_mean_token_sum"):
        aggregate(t(VALUES), t(RAGGED), "mean")


def test_masked_mean_per_row_and_whiten():
    close(masked_mean(t(VALUES), t(RAGGED), dim=-1), [1.5, 4.0, 0.0])
    # counted values 1, 2, 4: mean 7/3, population var ((16 + 1 + 25) / 9) / 3 = 14/9
    std = math.sqrt(14 / 9 + 1e-8)
    close(
        masked_whiten(t(VALUES), t(RAGGED)),
        [[-4 / 3 / std, -1 / 3 / std, 0], [5 / 3 / std, 0, 0], [0, 0, 0]],
    )
    close(masked_whiten(torch.full((2, 2), 3.0), torch.ones(2, 2)), [[0, 0], [0, 0]])
    close(masked_whiten(t(VALUES), torch.zeros(3, 3)), [[0] * 3] * 3)


# ---- group ids and GRPO -------------------------------------------------------------------


def test_group_index_is_dense_and_explicit():
    assert group_index(torch.tensor([7, 7, 3, 3])).tolist() == [1, 1, 0, 0]
    assert group_index(["task-b", "task-a", "task-b"]).tolist() == [0, 1, 0]
    with pytest.raises(TypeError):
        group_index("abc")
    with pytest.raises(TypeError):
        group_index(torch.tensor([1.0, 2.0]))


def test_grpo_advantages_by_hand():
    rewards = t([1.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([7, 7, 3, 3])
    # group 7: mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1); group 3: all equal -> 0
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    close(grpo_advantages(rewards, groups), [a, -a, 0, 0])
    close(grpo_advantages(rewards, groups, std_normalize=False), [0.5, -0.5, 0, 0])


def test_grpo_uneven_groups_in_shuffled_order_match_grouped_order():
    rewards = t([3.0, 1.0, 2.0, 5.0, 0.0, 4.0])
    groups = ["a", "a", "a", "b", "c", "c"]
    # a: mean 2, std sqrt(2 / 2) = 1; b: one sample -> 0; c: mean 2, std sqrt(8 / 1)
    c = 2 / (math.sqrt(8) + 1e-6)
    expected = [1 / (1 + 1e-6), -1 / (1 + 1e-6), 0.0, 0.0, -c, c]
    close(grpo_advantages(rewards, groups), expected)
    perm = [4, 0, 3, 2, 5, 1]
    shuffled = grpo_advantages(rewards[perm], [groups[i] for i in perm])
    close(shuffled, [expected[i] for i in perm])


def test_grpo_singleton_and_equal_rewards_give_zero_not_nan():
    close(grpo_advantages(t([0.7]), [0]), [0.0])
    out = grpo_advantages(torch.tensor([0.1, 0.1, 0.1], dtype=torch.float32), ["g"] * 3)
    assert torch.isfinite(out).all()
    close(out, [0.0, 0.0, 0.0], atol=1e-5)
    # integer rewards are accepted
    close(grpo_advantages(torch.tensor([2, 0]), [1, 1], std_normalize=False), [1.0, -1.0])


# ---- REINFORCE++ --------------------------------------------------------------------------

MASK_ENV = [[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]]  # row 0: env token at t=2


def test_token_rewards_with_kl_penalty():
    kl = t([[0.1, 0.2, 5.0, 0.3], [0.4, 0.0, 9.0, 9.0]])
    out = token_rewards(t([1.0, -1.0]), t(MASK_ENV), kl=kl, kl_coef=0.5)
    # -0.5 * KL on mask-1 tokens only; r on the last mask-1 token (t=3 and t=1)
    close(out, [[-0.05, -0.1, 0.0, 1.0 - 0.15], [-0.2, -1.0, 0.0, 0.0]])
    close(token_rewards(t([2.0, 3.0]), t([[1.0, 0.0], [0.0, 0.0]])), [[2.0, 0.0], [0.0, 0.0]])


def test_reinforce_plus_plus_returns_by_hand_with_gamma_half():
    rewards, mask = t([1.0, -1.0]), t(MASK_ENV)
    # row 0: G3 = 1; t=2 is an env token (skipped, returns flow through); G1 = 0.5; G0 = 0.25
    # row 1: G1 = -1; G0 = -0.5
    raw = [[0.25, 0.5, 0.0, 1.0], [-0.5, -1.0, 0.0, 0.0]]
    close(reinforce_plus_plus_returns(rewards, mask, gamma=0.5, whiten=False), raw)
    close(discounted_returns(token_rewards(rewards, mask), mask, 0.5), raw)
    # whitened over the 5 counted tokens: mean 0.05, population var 2.55 / 5 = 0.51
    s = math.sqrt(0.51 + 1e-8)
    close(
        reinforce_plus_plus_returns(rewards, mask, gamma=0.5),
        [[0.2 / s, 0.45 / s, 0.0, 0.95 / s], [-0.55 / s, -1.05 / s, 0.0, 0.0]],
    )


def test_reinforce_plus_plus_returns_accumulate_kl_with_gamma_one():
    kl = t([[0.1, 0.2, 5.0, 0.3], [0.4, 0.0, 9.0, 9.0]])
    out = reinforce_plus_plus_returns(t([1.0, -1.0]), t(MASK_ENV), kl=kl, kl_coef=0.5, whiten=False)
    # row 0 token rewards [-0.05, -0.1, 0, 0.85]; row 1 [-0.2, -1, 0, 0]
    close(out, [[0.7, 0.75, 0.0, 0.85], [-1.2, -1.0, 0.0, 0.0]])


def test_reinforce_plus_plus_baseline_by_hand():
    rewards, groups = t([1.0, 0.0, 1.0, 1.0]), [7, 7, 3, 3]
    mask = t([[1, 1], [1, 0], [1, 1], [0, 1]])
    raw = reinforce_plus_plus_baseline_advantages(rewards, groups, mask, whiten=False)
    close(raw, [[0.5, 0.5], [-0.5, 0.0], [0.0, 0.0], [0.0, 0.0]])
    # 6 counted tokens .5 .5 -.5 0 0 0: mean 1/12, deviations 5,5,-7,-1,-1,-1 (/12),
    # population var 102 / 144 / 6 = 17 / 144 -> whitened = deviation * 12 / sqrt(17) / 12
    r = math.sqrt(17)
    close(
        reinforce_plus_plus_baseline_advantages(rewards, groups, mask),
        [[5 / r, 5 / r], [-7 / r, 0.0], [-1 / r, -1 / r], [0.0, -1 / r]],
        atol=1e-5,
    )
    kl = t([[0.2, 0.4], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    out = reinforce_plus_plus_baseline_advantages(
        rewards, groups, mask, kl=kl, kl_coef=0.5, whiten=False
    )
    close(out[0], [0.4, 0.3])


# ---- PPO / GAE ----------------------------------------------------------------------------


def test_gae_two_by_three_by_hand():
    rewards = t([1.0, 0.0])
    values = t([[0.5, 0.4, 0.2], [0.3, 0.6, 9.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.5, whiten=False)
    # row 0: d2 = 1 - 0.2 = 0.8; d1 = 0.9*0.2 - 0.4 = -0.22, A1 = -0.22 + 0.45*0.8 = 0.14;
    #        d0 = 0.9*0.4 - 0.5 = -0.14, A0 = -0.14 + 0.45*0.14 = -0.077
    # row 1 (t=2 padding): d1 = -0.6; d0 = 0.9*0.6 - 0.3 = 0.24, A0 = 0.24 - 0.45*0.6 = -0.03
    close(adv, [[-0.077, 0.14, 0.8], [-0.03, -0.6, 0.0]])
    close(ret, [[0.423, 0.54, 1.0], [0.27, 0.0, 0.0]])
    whitened, ret_w = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.5)
    close(whitened, masked_whiten(adv, mask))
    close(ret_w, ret)  # returns come from the raw advantages
    close(masked_mean(whitened, mask), 0.0)


def test_gae_skips_env_tokens():
    # env token at t=1 (value 7 ignored): V_next of t=0 is V_2
    adv, ret = gae_advantages(
        t([1.0]), t([[0.5, 7.0, 0.2]]), t([[1, 0, 1]]), gamma=0.9, lam=0.5, whiten=False
    )
    # d2 = 0.8; d0 = 0.9*0.2 - 0.5 = -0.32, A0 = -0.32 + 0.45*0.8 = 0.04
    close(adv, [[0.04, 0.0, 0.8]])
    close(ret, [[0.54, 0.0, 1.0]])


# ---- dispatch -----------------------------------------------------------------------------


def test_compute_advantages_dispatch():
    rewards, groups = t([1.0, 0.0, 1.0, 1.0]), torch.tensor([7, 7, 3, 3])
    mask = t([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1]])
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    for name in ("grpo", "gspo"):
        out = compute_advantages(name, rewards, groups, mask)
        close(out.advantages, [[a, a, 0], [-a, 0, 0], [0, 0, 0], [0, 0, 0]])
        assert out.returns is None
    out = compute_advantages("reinforce_plus_plus", rewards, None, mask, gamma=0.5)
    close(out.advantages, reinforce_plus_plus_returns(rewards, mask, gamma=0.5))
    out = compute_advantages("reinforce_plus_plus_baseline", rewards, groups, mask)
    close(out.advantages, reinforce_plus_plus_baseline_advantages(rewards, groups, mask))
    values = torch.rand(4, 3, dtype=torch.float64)
    out = compute_advantages("ppo", rewards, None, mask, values=values, gamma=0.9, lam=0.5)
    expected = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.5)
    close(out.advantages, expected[0])
    close(out.returns, expected[1])


def test_compute_advantages_errors():
    rewards, mask = t([1.0]), t([[1.0]])
    with pytest.raises(ValueError, match="grpo, gspo, ppo, reinforce_plus_plus"):
        compute_advantages("rloo", rewards, [0], mask)
    with pytest.raises(ValueError, match="critic values"):
        compute_advantages("ppo", rewards, None, mask)
    with pytest.raises(ValueError, match="group ids"):
        compute_advantages("grpo", rewards, None, mask)
    with pytest.raises(ValueError, match="--use-kl-loss"):
        compute_advantages("grpo", rewards, [0], mask, kl=t([[0.1]]), kl_coef=0.1)


# ---- KL -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "at_ln2", "at_minus_ln2"),
    [
        ("k1", LN2, -LN2),
        ("k2", LN2**2 / 2, LN2**2 / 2),
        ("k3", 0.5 - 1 + LN2, 2 - 1 - LN2),  # exp(-x) - 1 + x
        ("low_var_kl", 0.5 - 1 + LN2, 2 - 1 - LN2),
    ],
)
def test_kl_kinds_at_a_chosen_log_ratio(kind, at_ln2, at_minus_ln2):
    ref = t([[-1.0, -1.0]])
    logp = ref + t([[LN2, -LN2]])
    close(kl_estimate(logp, ref, kind), [[at_ln2, at_minus_ln2]])


def test_low_var_kl_clamps_with_finite_gradient_and_unknown_kind():
    logp = t([[-40.0, 0.0]]).requires_grad_()
    ref = t([[0.0, 0.0]])
    out = kl_estimate(logp, ref, "low_var_kl")
    close(out, [[10.0, 0.0]])
    out.sum().backward()
    assert torch.isfinite(logp.grad).all()
    with pytest.raises(ValueError, match="--kl-loss-type"):
        kl_estimate(logp, ref, "k4")


# ---- policy loss --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("adv", "rho", "expected", "clipped"),
    [
        (1.0, 1.1, -1.1, 0.0),  # inside the range
        (1.0, 1.5, -1.2, 1.0),  # A > 0, above 1 + eps: clipped
        (1.0, 0.5, -0.5, 0.0),  # A > 0, below 1 - eps: unclipped term is larger
        (-1.0, 0.5, 0.8, 1.0),  # A < 0, below 1 - eps: clipped
        (-1.0, 1.5, 1.5, 0.0),  # A < 0, above 1 + eps: unclipped term is larger
        (-1.0, 0.9, 0.9, 0.0),
    ],
)
def test_policy_loss_clip_branches(adv, rho, expected, clipped):
    old = t([[-1.0]])
    logp = (old + math.log(rho)).requires_grad_()
    loss, metrics = policy_loss(logp, old, t([[adv]]), t([[1.0]]), eps_clip=0.2)
    close(loss, expected)
    close(metrics["clip_fraction"], clipped)
    close(metrics["ppo_kl"], -math.log(rho))
    loss.backward()
    # d(-A rho)/d logp = -A rho unless the clipped (constant) term is active
    close(logp.grad, [[0.0 if clipped else -adv * rho]])


def test_policy_loss_asymmetric_clip_and_masking():
    old = t([[0.0, 0.0, 0.0]])
    logp = t([[math.log(1.25), math.log(1.5), float("nan")]])  # NaN on a padding token
    mask = t([[1.0, 1.0, 0.0]])
    loss, metrics = policy_loss(logp, old, t([[1.0, 1.0, 1.0]]), mask, eps_clip_high=0.28)
    close(loss, (-1.25 - 1.28) / 2)
    close(metrics["clip_fraction"], 0.5)


def test_dual_clip():
    old = t([[0.0, 0.0, 0.0]])
    logp = t([[math.log(5.0), math.log(2.0), math.log(5.0)]]).requires_grad_()
    adv = t([[-1.0, -1.0, 1.0]])
    loss, metrics = policy_loss(
        logp, old, adv, torch.ones(1, 3, dtype=torch.float64), eps_clip_c=3.0,
        aggregation="seq_mean_token_sum",
    )
    # rho 5, A -1: max(5, 1.2) = 5 -> min(5, 3) = 3; rho 2, A -1: 2; rho 5, A +1: -1.2
    close(loss, 3.0 + 2.0 - 1.2)
    close(metrics["dual_clip_fraction"], 1.0)  # 1 of 3 tokens, summed per sample
    loss.backward()
    close(logp.grad, [[0.0, 2.0, 0.0]])
    with pytest.raises(ValueError, match="--eps-clip-c"):
        policy_loss(logp, old, adv, torch.ones(1, 3), eps_clip_c=1.0)


def _gspo_loss(logp: torch.Tensor, old: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    adv = t([[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]])
    return policy_loss(logp, old, adv, mask, ratio="sequence", aggregation="token_mean")[0]


def test_gspo_sequence_ratio_and_its_gradient():
    old = t([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    logp = (old + t([[0.1, 0.2, 5.0], [0.0, 0.0, -0.3]])).requires_grad_()
    mask = t([[1, 1, 0], [1, 1, 1]])
    loss = _gspo_loss(logp, old, mask)
    s0 = math.exp(0.15)  # row 0: mean of 0.1, 0.2 (t=2 masked) -> 1.1618, inside [0.8, 1.2]
    s1 = math.exp(-0.1)  # row 1: mean of 0, 0, -0.3 -> 0.9048
    # token_mean over 5 tokens: 2 tokens of -2 s0 and 3 of +1 s1
    close(loss, (2 * -2 * s0 + 3 * s1) / 5)
    loss.backward()
    # loss = sum_i n_i (-A_i s_i) / 5 and d s_i / d logp_it = s_i / n_i, so each counted token
    # of row i gets -A_i s_i / 5; the masked token gets 0
    grad = [[-2 * s0 / 5, -2 * s0 / 5, 0.0], [s1 / 5] * 3]
    close(logp.grad, grad)
    # and against central finite differences
    h = 1e-6
    base = logp.detach()
    numeric = torch.zeros_like(base)
    for i in range(2):
        for j in range(3):
            up, down = base.clone(), base.clone()
            up[i, j] += h
            down[i, j] -= h
            numeric[i, j] = (_gspo_loss(up, old, mask) - _gspo_loss(down, old, mask)) / (2 * h)
    torch.testing.assert_close(logp.grad, numeric, atol=1e-6, rtol=0)


def test_gspo_defaults_to_one_weight_per_sequence():
    # ratio 1 everywhere: each counted token's term is -A of its row; row 0 has 1 token (A = 1),
    # row 1 has 3 (A = -1)
    old = t([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    adv, mask = t([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]), t([[1, 0, 0], [1, 1, 1]])
    logp = old.clone().requires_grad_()
    loss, _ = policy_loss(logp, old, adv, mask, ratio="sequence")
    close(loss, (-1.0 + 1.0) / 2)  # mean over the 2 sequences of each one's token mean
    loss.backward()
    # d loss / d logp_it = -A_i * (rho_i / n_i) / 2 sequences
    close(logp.grad, [[-0.5, 0.0, 0.0], [1 / 6, 1 / 6, 1 / 6]])
    token_loss, _ = policy_loss(old, old, adv, mask, ratio="sequence", aggregation="token_mean")
    close(token_loss, (-1.0 + 3 * 1.0) / 4)  # chosen explicitly: each token weighs the same
    total, _ = total_loss(old, old, adv, mask, ratio="sequence")
    close(total, 0.0)  # the full actor loss takes the same default


def test_gspo_clips_the_sequence_ratio():
    old = t([[0.0, 0.0]])
    logp = t([[0.1, 0.5]]).requires_grad_()  # mean 0.3 -> ratio 1.35 > 1.2
    loss, metrics = policy_loss(logp, old, t([[2.0, 2.0]]), t([[1, 1]]), ratio="sequence")
    close(loss, -2.4)
    close(metrics["clip_fraction"], 1.0)
    loss.backward()
    close(logp.grad, [[0.0, 0.0]])
    # per-token ratios 1.105 (inside) and 1.649 (clipped) give a different loss
    token_loss, _ = policy_loss(logp, old, t([[2.0, 2.0]]), t([[1, 1]]))
    close(token_loss, (-2 * math.exp(0.1) - 2.4) / 2)


# ---- TIS and MIS --------------------------------------------------------------------------


def test_tis_weights_clamp_and_detach():
    old = t([[0.0, 0.0, 0.0, 0.0]]).requires_grad_()
    rollout = t([[math.log(4.0), -math.log(4.0), -math.log(1.5), 0.0]])
    mask = t([[1, 1, 1, 0]])
    # exp(old - rollout) = 0.25, 4, 1.5 (and a masked 1)
    w = tis_weights(old, rollout, mask)
    close(w, [[0.25, 2.0, 1.5, 0.0]])
    assert not w.requires_grad
    close(tis_weights(old, rollout, mask, low=0.5, high=3.0), [[0.5, 3.0, 1.5, 0.0]])
    with pytest.raises(ValueError, match="--tis-clip"):
        tis_weights(old, rollout, mask, low=2.0, high=1.0)
    ones = torch.ones(1, 4, dtype=torch.float64)
    loss, _ = policy_loss(old, old.detach(), ones, mask, tis_weights=w)
    close(loss, (-0.25 - 2.0 - 1.5) / 3)  # ratio 1, A 1: pg = -w


def test_mis_masks_tokens_whose_ratio_is_outside_the_bounds():
    old = torch.zeros(2, 4, dtype=torch.float64).requires_grad_()
    # exp(old - rollout) = 0.25, 1.5, 4 (and a masked 1); 0.8, 1.25, 3, 0.4
    ratios = [[0.25, 1.5, 4.0, 1.0], [0.8, 1.25, 3.0, 0.4]]
    rollout = -torch.log(t(ratios))
    mask = t([[1, 1, 1, 0], [1, 1, 1, 1]])
    w = mis_weights(old, rollout, mask, low=0.5, high=2.0)
    close(w, [[0.0, 1.5, 0.0, 0.0], [0.8, 1.25, 0.0, 0.0]])
    assert not w.requires_grad
    keep = ratio_within_bounds(old, rollout, mask, low=0.5, high=2.0)
    close(keep, [[0, 1, 0, 0], [1, 1, 0, 0]])
    close(ratio_within_bounds(old, rollout, mask), [[1, 1, 0, 0], [1, 1, 0, 1]])  # [0, 2]
    with pytest.raises(ValueError, match="--tis-clip"):
        mis_weights(old, rollout, mask, low=2.0, high=1.0)
    # ratio 1, A 1: pg = -w; the 4 dropped tokens leave the denominator too (3 kept, not 7)
    ones = torch.ones(2, 4, dtype=torch.float64)
    loss, _ = policy_loss(old, old.detach(), ones, mask * keep, tis_weights=w)
    close(loss, (-1.5 - 0.8 - 1.25) / 3)
    per_sequence, _ = policy_loss(old, old.detach(), ones, mask * keep, tis_weights=w,
                                  aggregation="seq_mean_token_mean")
    close(per_sequence, (-1.5 + (-0.8 - 1.25) / 2) / 2)


def test_importance_ratio_statistics_by_hand():
    old = t([[-1.0, -2.0, -0.5], [-0.2, -3.0, 0.0], [-1.0, -1.0, -1.0]])
    # log ratios old - rollout; the masked ones (ratio 4 and e^10) must not count
    log_ratio = t([[LN2, -LN2, 2 * LN2], [math.log(1.5), 0.0, -2 * LN2], [10.0, 10.0, 10.0]])
    mask = t([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    stats = importance_ratio_stats(old, old - log_ratio, mask, low=0.3, high=1.8)
    # trained ratios: 2, 0.5, 1.5, 1, 0.25
    close(stats["ratio_sum"], 5.25)
    close(stats["tokens"], 5)
    close(stats["ratio_sum"] / stats["tokens"], 1.05)
    close(stats["ratio_min"], 0.25)
    close(stats["ratio_max"], 2.0)
    close(stats["outside"], 2)  # 2 above 1.8, 0.25 below 0.3
    close(stats["drift_sum"], 4 * LN2 + math.log(1.5))
    assert all(value.dim() == 0 and not value.requires_grad for value in stats.values())
    empty = importance_ratio_stats(old, old - log_ratio, torch.zeros_like(mask), low=0.3, high=1.8)
    assert (empty["ratio_min"], empty["ratio_max"]) == (math.inf, -math.inf)  # ignored by min/max
    assert float(empty["tokens"]) == float(empty["ratio_sum"]) == float(empty["outside"]) == 0


# ---- value loss and entropy ---------------------------------------------------------------


def test_value_loss_both_branches():
    values = t([[1.0, 0.6, 0.0]]).requires_grad_()
    old = t([[0.5, 0.5, 0.5]])
    returns = t([[1.0, 1.0, 1.0]])
    loss, metrics = value_loss(values, old, returns, torch.ones(1, 3, dtype=torch.float64))
    # t0: unclipped 0, clipped V 0.7 -> 0.09 (clipped larger); t1: both 0.16; t2: unclipped 1
    # vs clipped V 0.3 -> 0.49; times 0.5
    close(loss, (0.045 + 0.08 + 0.5) / 3)
    close(metrics["value_clip_fraction"], 1 / 3)
    loss.backward()
    # clipped branch saturated -> 0; otherwise 0.5 * 2 (V - R) / 3 tokens
    close(values.grad, [[0.0, -0.4 / 3, -1.0 / 3]])
    loss, metrics = value_loss(values, old, returns, t([[1, 1, 0]]), value_clip=None)
    close(loss, (0.0 + 0.08) / 2)
    close(metrics["value_clip_fraction"], 0.0)
    with pytest.raises(ValueError, match="--value-clip"):
        value_loss(values, old, returns, t([[1, 1, 1]]), value_clip=0.0)


def test_entropy_from_logits_by_hand_and_large_logits():
    close(entropy_from_logits(torch.zeros(4, dtype=torch.float64)), math.log(4))
    p = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    close(entropy_from_logits(t([0.0, math.log(3.0)])), p)
    # float32 with large logits: no cancellation between logsumexp and the expectation
    close(entropy_from_logits(torch.tensor([[1000.0, 1000.0], [1000.0, 0.0]])), [LN2, 0.0])
    logits = torch.randn(3, 5, dtype=torch.float64)
    close(entropy_from_logits(logits + 500.0), entropy_from_logits(logits).tolist(), atol=1e-9)
    h = t([[0.5, 1.5, 9.0]])
    close(entropy_bonus(h, t([[1, 1, 0]])), 1.0)


# ---- total loss ---------------------------------------------------------------------------


def test_total_loss_composes_the_parts():
    ref = t([[-1.0, -1.0]])
    logp = (ref + t([[LN2, -LN2]])).requires_grad_()
    mask = torch.ones(1, 2, dtype=torch.float64)
    loss, metrics = total_loss(
        logp, logp.detach(), t([[1.0, -1.0]]), mask,
        entropy=t([[0.5, 1.5]]), entropy_coef=0.1,
        ref_logp=ref, kl_loss_coef=0.5, kl_loss_type="k3",
    )
    # ratio 1: pg = (-1 + 1) / 2 = 0; H = 1; k3 = (0.193147 + 0.306853) / 2 = 0.25
    close(metrics["pg_loss"], 0.0)
    close(metrics["entropy"], 1.0)
    close(metrics["kl_loss"], 0.25)
    close(metrics["ppo_kl"], 0.0)
    close(loss, 0.0 - 0.1 * 1.0 + 0.5 * 0.25)
    close(metrics["loss"], 0.025)
    loss.backward()
    # pg: -A; k3: 0.5 * (1 - exp(-x)) / 2 tokens -> x=ln2: 0.125, x=-ln2: -0.25
    close(logp.grad, [[-0.5 + 0.125, 0.5 - 0.25]])
    with pytest.raises(ValueError, match="--kl-loss-coef"):
        total_loss(logp, logp.detach(), t([[1.0, -1.0]]), mask, kl_loss_coef=0.1)
    with pytest.raises(ValueError, match="--entropy-coef"):
        total_loss(logp, logp.detach(), t([[1.0, -1.0]]), mask, entropy_coef=0.1)
