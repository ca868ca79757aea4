"""Advantage estimators (``--advantage-estimator``): GRPO, GSPO, REINFORCE++ (+ baseline), PPO/GAE.

Layout: rewards ``[B]`` (one scalar per sample), ``mask`` ``[B, T]`` over response tokens (see
:mod:`agentrl.algorithms.batching`), groups as explicit ids ``[B]``. Groups are never inferred
from positions: they may be uneven and in any order.

Token rewards (REINFORCE++ and PPO): ``-kl_coef * KL_t`` on every mask-1 token, plus ``r`` on the
LAST mask-1 token of the row. Environment tokens (mask 0 inside the response) are SKIPPED by the
right-to-left recursions: they receive no reward, no discount step and no value bootstrap; the
return (and the GAE accumulator) flows through them unchanged to the previous model token, so
``gamma`` discounts per model token, not per environment token.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple

import torch

from agentrl.algorithms.batching import masked_whiten
from agentrl.algorithms.names import ESTIMATORS

GroupIds = torch.Tensor | Sequence[Hashable]


class Advantages(NamedTuple):
    """What :func:`compute_advantages` returns.

    Attributes:
        advantages: ``[B, T]``, 0 on mask-0 tokens.
        returns: ``[B, T]`` value targets for the critic (``ppo`` only, else ``None``).
    """

    advantages: torch.Tensor
    returns: torch.Tensor | None


def group_index(ids: GroupIds) -> torch.Tensor:
    """Dense group indices ``[B]`` (``0 .. G-1``) from arbitrary group ids.

    Args:
        ids: An integer tensor ``[B]`` of ids (any values), or a sequence of hashables such as
            ``Sample.group_id`` strings. Samples with equal ids form one group, wherever they are.

    Returns:
        LongTensor ``[B]``. Tensor ids map in sorted order; sequence ids in order of first
        appearance. Only equality matters to the estimators.

    Raises:
        TypeError: ``ids`` is a string, or a tensor that is not 1-D integer.
    """
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or ids.is_floating_point() or ids.is_complex():
            raise TypeError(
                f"group ids must be a 1-D integer tensor, got {ids.dtype} {tuple(ids.shape)}"
            )
        return torch.unique(ids, return_inverse=True)[1]  # [B]
    if isinstance(ids, str | bytes):
        raise TypeError("group ids must be a sequence of ids, not one string")
    dense: dict[Hashable, int] = {}
    return torch.tensor([dense.setdefault(i, len(dense)) for i in ids], dtype=torch.long)


def _group_stats(
    rewards: torch.Tensor, groups: GroupIds
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group mean, unbiased group std and group size, each ``[B]``."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [B], got shape {tuple(rewards.shape)}")
    index = group_index(groups).to(rewards.device)  # [B]
    if index.shape != rewards.shape:
        raise ValueError(f"{index.numel()} group ids for {rewards.numel()} rewards")
    num_groups = int(index.max()) + 1 if index.numel() else 0
    zeros = rewards.new_zeros(num_groups)  # [G]
    size = zeros.index_add(0, index, torch.ones_like(rewards))  # [G]
    mean = zeros.index_add(0, index, rewards) / size  # [G]
    squares = zeros.index_add(0, index, (rewards - mean[index]) ** 2)  # [G]
    # Unbiased (n - 1), as torch.std and the reference GRPO; a group of one has std 0.
    std = torch.sqrt(squares / (size - 1).clamp(min=1))  # [G]
    return mean[index], std[index], size[index]


def grpo_advantages(
    rewards: torch.Tensor, groups: GroupIds, *, std_normalize: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO: ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` within each sample's group g.

    DeepSeekMath (Shao et al., 2024), eq. for outcome supervision; ``std_g`` is the UNBIASED
    standard deviation (``n - 1``), as ``torch.std`` in the reference system. A group of one
    sample, and a group whose rewards are all equal, gets advantage 0 (never NaN).

    Args:
        rewards: ``[B]`` scalar rewards.
        groups: ``[B]`` group ids (see :func:`group_index`).
        std_normalize: False drops the division (``--disable-grpo-std-normalization``,
            Dr. GRPO, Liu et al., 2025).
        eps: Added to the std.

    Returns:
        ``[B]`` per-sample advantages (broadcast to tokens by :func:`compute_advantages`).
    """
    rewards = rewards.float() if not rewards.is_floating_point() else rewards
    mean, std, size = _group_stats(rewards, groups)  # [B] each
    advantages = rewards - mean  # [B]
    if std_normalize:
        advantages = advantages / (std + eps)  # [B]
    return torch.where(size > 1, advantages, torch.zeros_like(advantages))


def token_rewards(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Per-token rewards: ``-kl_coef * KL_t`` on mask-1 tokens, plus ``r`` on the last one.

    Args:
        rewards: ``[B]``.
        mask: ``[B, T]`` 0/1.
        kl: ``[B, T]`` per-token KL estimate to the reference (KL-in-reward, ``--kl-coef``).
        kl_coef: Its weight.

    Returns:
        ``[B, T]``; 0 on mask-0 tokens. A row with no mask-1 token drops its reward.
    """
    _check_token_shapes(rewards, mask, kl=kl)
    rewards = rewards.to(mask.dtype)
    out = torch.zeros_like(mask)  # [B, T]
    if out.numel() == 0:
        return out
    if kl is not None and kl_coef != 0.0:
        out = torch.where(mask > 0, -kl_coef * kl, out)  # [B, T]
    positions = torch.arange(mask.shape[-1], device=mask.device)  # [T]
    # argmax of position * mask finds the last mask-1 token (0 for a row with one at t=0)
    last = (positions * (mask > 0)).argmax(-1, keepdim=True)  # [B, 1]
    has_token = (mask > 0).any(-1, keepdim=True)  # [B, 1]
    final = torch.where(has_token, rewards.unsqueeze(-1), 0.0)  # [B, 1]
    return out.scatter_add(-1, last, final)


def discounted_returns(
    rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0
) -> torch.Tensor:
    """``G_t = r_t + gamma * G_next`` right to left, where ``next`` is the next mask-1 token.

    Mask-0 tokens are skipped: the return passes through them undiscounted (module docstring).

    Args:
        rewards: ``[B, T]`` token rewards (see :func:`token_rewards`).
        mask: ``[B, T]`` 0/1.
        gamma: Discount per model token.

    Returns:
        ``[B, T]`` returns, 0 on mask-0 tokens.
    """
    running = rewards.new_zeros(rewards.shape[0])  # [B]
    returns = torch.zeros_like(rewards)  # [B, T]
    for t in reversed(range(rewards.shape[-1])):
        counted = mask[:, t] > 0  # [B]
        running = torch.where(counted, rewards[:, t] + gamma * running, running)  # [B]
        returns[:, t] = torch.where(counted, running, 0.0)
    return returns


def reinforce_plus_plus_returns(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    whiten: bool = True,
) -> torch.Tensor:
    """REINFORCE++: discounted returns of the token rewards, whitened over the batch.

    Hu, "REINFORCE++" (2025): ``A_t = whiten(sum_{s>=t} gamma^(s-t) r_s)`` with token rewards
    from :func:`token_rewards`; whitening is masked over all tokens of the batch
    (:func:`~agentrl.algorithms.batching.masked_whiten`, mean shifted).

    Args:
        rewards: ``[B]``.
        mask: ``[B, T]`` 0/1.
        kl: ``[B, T]`` per-token KL to the reference, for KL-in-reward.
        kl_coef: Its weight (``--kl-coef``).
        gamma: Discount (``--gamma``).
        whiten: False returns the raw returns.

    Returns:
        ``[B, T]`` advantages, 0 on mask-0 tokens.
    """
    per_token = token_rewards(rewards, mask, kl=kl, kl_coef=kl_coef)  # [B, T]
    returns = discounted_returns(per_token, mask, gamma)  # [B, T]
    return masked_whiten(returns, mask) if whiten else returns


def reinforce_plus_plus_baseline_advantages(
    rewards: torch.Tensor,
    groups: GroupIds,
    mask: torch.Tensor,
    *,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    whiten: bool = True,
) -> torch.Tensor:
    """REINFORCE++ with a group baseline: ``A_t = whiten(r - mean_g(r) - kl_coef * KL_t)``.

    docs/rl-semantics.md: ``r - mean_group(r)`` broadcast to every mask-1 token, minus that token's
    own ``kl_coef * KL_t`` (not the sum of later tokens' KL), then masked-whitened over the batch.

    Args:
        rewards: ``[B]``.
        groups: ``[B]`` group ids.
        mask: ``[B, T]`` 0/1.
        kl: ``[B, T]`` per-token KL to the reference.
        kl_coef: Its weight (``--kl-coef``).
        whiten: False skips the whitening.

    Returns:
        ``[B, T]`` advantages, 0 on mask-0 tokens.
    """
    _check_token_shapes(rewards, mask, kl=kl)
    mean, _, _ = _group_stats(rewards.to(mask.dtype), groups)  # [B]
    centered = (rewards.to(mask.dtype) - mean).unsqueeze(-1).expand_as(mask)  # [B, T]
    if kl is not None and kl_coef != 0.0:
        centered = centered - kl_coef * kl  # [B, T]
    centered = torch.where(mask > 0, centered, 0.0)  # [B, T]
    return masked_whiten(centered, mask) if whiten else centered


def gae_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's generalized advantage estimation over the response tokens.

    Schulman et al., "High-Dimensional Continuous Control Using GAE" (2016):
    ``delta_t = r_t + gamma * V_next - V_t``, ``A_t = delta_t + gamma * lam * A_next`` (``next``
    = the next mask-1 token; ``V = 0`` after the last), token rewards from
    :func:`token_rewards`. ``returns = A + V`` uses the RAW advantages; only the advantages
    returned for the policy loss are masked-whitened over the batch.

    Args:
        rewards: ``[B]``.
        values: ``[B, T]`` critic values ``V_t`` (detached; values at mask-0 tokens are unused).
        mask: ``[B, T]`` 0/1.
        kl: ``[B, T]`` per-token KL to the reference, for KL-in-reward.
        kl_coef: Its weight (``--kl-coef``).
        gamma: Discount (``--gamma``).
        lam: GAE lambda (``--lambd``).
        whiten: False returns raw advantages.

    Returns:
        ``(advantages [B, T], returns [B, T])``, both 0 on mask-0 tokens.
    """
    if values.shape != mask.shape:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} differ")
    values = values.detach().to(mask.dtype)
    per_token = token_rewards(rewards, mask, kl=kl, kl_coef=kl_coef)  # [B, T]
    next_value = values.new_zeros(values.shape[0])  # [B]
    running = values.new_zeros(values.shape[0])  # [B]
    advantages = torch.zeros_like(values)  # [B, T]
    for t in reversed(range(values.shape[-1])):
        counted = mask[:, t] > 0  # [B]
        delta = per_token[:, t] + gamma * next_value - values[:, t]  # [B]
        running = torch.where(counted, delta + gamma * lam * running, running)  # [B]
        next_value = torch.where(counted, values[:, t], next_value)  # [B]
        advantages[:, t] = torch.where(counted, running, 0.0)
    returns = torch.where(mask > 0, advantages + values, 0.0)  # [B, T]
    if whiten:
        advantages = masked_whiten(advantages, mask)  # [B, T]
    return advantages, returns


def compute_advantages(
    estimator: str,
    rewards: torch.Tensor,
    groups: GroupIds | None,
    mask: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    lam: float = 1.0,
    std_normalize: bool = True,
) -> Advantages:
    """Token-level advantages ``[B, T]`` for ``--advantage-estimator``.

    ``grpo`` and ``gspo`` share :func:`grpo_advantages` (GSPO differs in the ratio, see
    :func:`~agentrl.algorithms.losses.policy_loss`), broadcast to tokens and masked. ``ppo``:
    :func:`gae_advantages`; ``reinforce_plus_plus``: :func:`reinforce_plus_plus_returns`;
    ``reinforce_plus_plus_baseline``: :func:`reinforce_plus_plus_baseline_advantages`.

    Args:
        estimator: One of :data:`ESTIMATORS`.
        rewards: ``[B]``.
        groups: ``[B]`` group ids; required by ``grpo``, ``gspo`` and the baseline estimator.
        mask: ``[B, T]`` 0/1.
        values: ``[B, T]`` critic values (``ppo`` only, required there).
        kl: ``[B, T]`` per-token KL for KL-in-reward (``ppo`` and the REINFORCE++ estimators).
        kl_coef: Its weight (``--kl-coef``).
        gamma: Discount (``--gamma``).
        lam: GAE lambda (``--lambd``).
        std_normalize: GRPO/GSPO std division (``--disable-grpo-std-normalization`` sets False).

    Returns:
        :class:`Advantages`; ``returns`` is set for ``ppo`` only.

    Raises:
        ValueError: Unknown estimator (lists the choices), or a missing input it needs.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(
            f"unknown --advantage-estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}"
        )
    if estimator in ("grpo", "gspo", "reinforce_plus_plus_baseline") and groups is None:
        raise ValueError(f"--advantage-estimator {estimator} needs group ids")
    if estimator in ("grpo", "gspo"):
        if kl is not None and kl_coef != 0.0:
            raise ValueError(
                f"--advantage-estimator {estimator} takes no KL in the reward (--kl-coef); "
                "use --use-kl-loss with --kl-loss-coef"
            )
        _check_token_shapes(rewards, mask)
        per_sample = grpo_advantages(rewards, groups, std_normalize=std_normalize)  # [B]
        return Advantages(per_sample.to(mask.dtype).unsqueeze(-1) * mask, None)  # [B, T]
    if estimator == "ppo":
        if values is None:
            raise ValueError("--advantage-estimator ppo needs critic values")
        adv, ret = gae_advantages(
            rewards, values, mask, kl=kl, kl_coef=kl_coef, gamma=gamma, lam=lam
        )
        return Advantages(adv, ret)
    if estimator == "reinforce_plus_plus":
        return Advantages(
            reinforce_plus_plus_returns(rewards, mask, kl=kl, kl_coef=kl_coef, gamma=gamma), None
        )
    return Advantages(
        reinforce_plus_plus_baseline_advantages(rewards, groups, mask, kl=kl, kl_coef=kl_coef),
        None,
    )


def _check_token_shapes(
    rewards: torch.Tensor, mask: torch.Tensor, *, kl: torch.Tensor | None = None
) -> None:
    if mask.dim() != 2 or rewards.shape != mask.shape[:1]:
        raise ValueError(
            f"rewards must be [B] and mask [B, T]; "
            f"got {tuple(rewards.shape)} and {tuple(mask.shape)}"
        )
    if kl is not None and kl.shape != mask.shape:
        raise ValueError(f"kl {tuple(kl.shape)} and mask {tuple(mask.shape)} differ")
