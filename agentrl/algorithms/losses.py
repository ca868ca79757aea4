"""Policy, value, entropy and KL loss terms over the ``[B, T]`` response-token layout.

Every loss is per-token first, then reduced by :func:`~agentrl.algorithms.batching.aggregate`
with an explicit mode; mask-0 tokens never count. The policy loss's default mode depends on its
ratio (:func:`default_aggregation`): ``token_mean`` for the token ratio (PPO, GRPO),
``seq_mean_token_mean`` for GSPO's sequence ratio. Metrics are detached 0-d tensors reduced the
same way, so the trainer can all-reduce them before logging.
"""

from __future__ import annotations

import math

import torch

from agentrl.algorithms.batching import aggregate, masked_mean, masked_whiten
from agentrl.algorithms.kl import kl_estimate
from agentrl.algorithms.names import AGGREGATIONS, RATIO_KINDS, default_aggregation

__all__ = [
    "AGGREGATIONS",
    "aggregate",
    "default_aggregation",
    "entropy_bonus",
    "entropy_from_logits",
    "importance_ratio_stats",
    "masked_mean",
    "masked_whiten",
    "mis_weights",
    "policy_loss",
    "ratio_within_bounds",
    "tis_weights",
    "total_loss",
    "value_loss",
]


Metrics = dict[str, torch.Tensor]


def _check_shapes(mask: torch.Tensor, **tensors: torch.Tensor | None) -> None:
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    for name, tensor in tensors.items():
        if tensor is not None and tensor.shape != mask.shape:
            raise ValueError(f"{name} {tuple(tensor.shape)} must match mask {tuple(mask.shape)}")


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
    ratio: str = "token",
    tis_weights: torch.Tensor | None = None,
    aggregation: str | None = None,
    denominator: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Clipped surrogate (PPO, Schulman et al., 2017) with DAPO's asymmetric clip, dual clip and
    GSPO's sequence ratio.

    ``rho = exp(logp - old_logp)``;
    ``pg = max(-rho * A, -clip(rho, 1 - eps_clip, 1 + eps_clip_high) * A)``;
    dual clip (Ye et al., 2020, arXiv:1912.09729) for ``A < 0``: ``pg = min(pg, -c * A)``;
    TIS or MIS: ``pg *= w`` (weights detached). ``ratio="sequence"`` (GSPO, Zheng et al., 2025):
    ``rho_i = exp(mean_t m_it (logp_it - old_logp_it) / sum_t m_it)`` for every token of sample
    ``i``; the gradient flows through that mean, so d rho_i / d logp_it = rho_i / n_i.

    Args:
        logp: ``[B, T]`` current log-probs (with gradient).
        old_logp: ``[B, T]`` log-probs of the policy that sampled (detached here).
        advantages: ``[B, T]`` (from :func:`~agentrl.algorithms.advantages.compute_advantages`).
        mask: ``[B, T]`` 0/1.
        eps_clip: Lower clip ``--eps-clip``.
        eps_clip_high: Upper clip ``--eps-clip-high``; ``None`` means ``eps_clip``.
        eps_clip_c: Dual-clip constant ``--eps-clip-c`` (> 1); ``None`` disables it.
        ratio: ``token`` (PPO/GRPO) or ``sequence`` (GSPO).
        tis_weights: ``[B, T]`` importance weights (:func:`tis_weights` or :func:`mis_weights`).
        aggregation: See :func:`~agentrl.algorithms.batching.aggregate`; ``None``:
            :func:`default_aggregation` of ``ratio``.
        denominator: Global count for gradient accumulation (see ``aggregate``); with
            ``aggregation=None`` it must count what the resolved mode divides by.

    Returns:
        ``(loss, metrics)``; metrics: ``pg_loss``, ``clip_fraction`` (share of tokens where the
        clipped term is the larger, i.e. active), ``dual_clip_fraction``, ``ppo_kl`` (aggregate
        of ``old_logp - logp`` per token).

    Raises:
        ValueError: Bad clip values (naming the flag), ratio kind or shapes.
    """
    _check_shapes(
        mask, logp=logp, old_logp=old_logp, advantages=advantages, tis_weights=tis_weights
    )
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    if not 0.0 <= eps_clip < 1.0:
        raise ValueError(f"--eps-clip must be in [0, 1), got {eps_clip}")
    if eps_high < 0.0:
        raise ValueError(f"--eps-clip-high must be >= 0, got {eps_high}")
    if eps_clip_c is not None and eps_clip_c <= 1.0:
        raise ValueError(f"--eps-clip-c must be > 1, got {eps_clip_c}")
    if ratio not in RATIO_KINDS:
        raise ValueError(f"unknown ratio {ratio!r}; choose one of {', '.join(RATIO_KINDS)}")
    if aggregation is None:
        aggregation = default_aggregation(ratio)

    advantages = advantages.detach()
    token_log_ratio = logp - old_logp.detach()  # [B, T]
    if ratio == "sequence":
        seq_log_ratio = masked_mean(token_log_ratio, mask, dim=-1)  # [B]
        log_ratio = seq_log_ratio.unsqueeze(-1).expand_as(logp)  # [B, T]
    else:
        log_ratio = token_log_ratio  # [B, T]
    rho = torch.exp(log_ratio)  # [B, T]

    unclipped = -advantages * rho  # [B, T]
    clipped = -advantages * rho.clamp(1.0 - eps_clip, 1.0 + eps_high)  # [B, T]
    pg = torch.maximum(unclipped, clipped)  # [B, T]
    clip_active = clipped > unclipped  # [B, T]
    dual_active = torch.zeros_like(clip_active)  # [B, T]
    if eps_clip_c is not None:
        # caps the loss of a very large ratio on a negative advantage (the max above is unbounded)
        bound = -eps_clip_c * advantages  # [B, T]
        dual_active = (advantages < 0) & (pg > bound)  # [B, T]
        pg = torch.where(dual_active, bound, pg)  # [B, T]
    if tis_weights is not None:
        pg = pg * tis_weights.detach()  # [B, T]

    loss = aggregate(pg, mask, aggregation, denominator=denominator)
    with torch.no_grad():

        def reduce(per_token: torch.Tensor) -> torch.Tensor:
            return aggregate(per_token.to(pg.dtype), mask, aggregation, denominator=denominator)

        metrics = {
            "pg_loss": loss.detach(),
            "clip_fraction": reduce(clip_active),
            "dual_clip_fraction": reduce(dual_active),
            "ppo_kl": reduce(-token_log_ratio),
        }
    return loss, metrics


def _importance_ratio(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
                      low: float, high: float) -> torch.Tensor:
    """``[B, T]`` detached ``exp(old_logp - rollout_logp)``, once the shapes and the bounds
    (``0 <= low <= high``) are checked."""
    _check_shapes(mask, old_logp=old_logp, rollout_logp=rollout_logp)
    if not 0.0 <= low <= high:
        raise ValueError(f"need 0 <= --tis-clip-low ({low}) <= --tis-clip ({high})")
    return torch.exp(old_logp.detach() - rollout_logp.detach())


def tis_weights(
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    low: float = 0.0,
    high: float = 2.0,
) -> torch.Tensor:
    """Truncated importance sampling weights for the train/inference mismatch.

    ``w_t = clamp(exp(old_logp_t - rollout_logp_t), low, high)`` (Yao et al., "Your efficient RL
    framework secretly brings you off-policy RL training", 2025). Defaults follow the reference
    flags: ``--tis-clip-low 0``, ``--tis-clip 2``.

    Args:
        old_logp: ``[B, T]`` log-probs of the sampling policy recomputed by the trainer.
        rollout_logp: ``[B, T]`` log-probs the engine reported (``Sample.rollout_log_probs``).
        mask: ``[B, T]`` 0/1.
        low: Lower bound (``--tis-clip-low``).
        high: Upper bound (``--tis-clip``).

    Returns:
        ``[B, T]`` detached weights, 0 on mask-0 tokens.

    Raises:
        ValueError: ``not 0 <= low <= high`` or shapes differ.
    """
    weights = _importance_ratio(old_logp, rollout_logp, mask, low, high).clamp(low, high)  # [B, T]
    return torch.where(mask > 0, weights, torch.zeros_like(weights))


def ratio_within_bounds(
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    low: float = 0.0,
    high: float = 2.0,
) -> torch.Tensor:
    """Which tokens masked importance sampling keeps: ``low <= exp(old_logp - rollout_logp) <=
    high``, on mask-1 tokens only.

    The trainer multiplies ``mask`` by it for the loss AND its denominator, so a dropped token
    counts in neither (:func:`mis_weights` gives the weights of the kept ones).

    Args:
        old_logp: ``[B, T]`` log-probs of the sampling policy recomputed by the trainer.
        rollout_logp: ``[B, T]`` log-probs the engine reported (``Sample.rollout_log_probs``).
        mask: ``[B, T]`` 0/1.
        low: Lower bound (``--tis-clip-low``).
        high: Upper bound (``--tis-clip``).

    Returns:
        ``[B, T]`` detached, ``mask``'s dtype: 1 where kept, 0 where dropped or mask 0.

    Raises:
        ValueError: ``not 0 <= low <= high`` or shapes differ.
    """
    rho = _importance_ratio(old_logp, rollout_logp, mask, low, high)  # [B, T]
    return ((mask > 0) & (rho >= low) & (rho <= high)).to(mask.dtype)  # [B, T]


def mis_weights(
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    low: float = 0.0,
    high: float = 2.0,
) -> torch.Tensor:
    """Masked importance sampling weights for the train/inference mismatch.

    ``rho_t = exp(old_logp_t - rollout_logp_t)``; ``w_t = rho_t`` when ``low <= rho_t <= high``,
    else 0. Where truncated importance sampling (:func:`tis_weights`; Yao et al., "Your efficient
    RL framework secretly brings you off-policy RL training", 2025) caps an extreme ratio and
    keeps its token, masked importance sampling drops the token (Liu et al., "When speed kills
    stability: demystifying RL collapse from the training-inference mismatch", 2025): a token
    the trainer and the engine disagree on that much is treated as too far off-policy to
    correct. The caller drops those tokens from the aggregate's denominator too, by training on
    ``mask * ratio_within_bounds(...)``; a zero weight alone would still count them there and
    shrink every kept token's gradient.

    Args:
        old_logp: ``[B, T]`` log-probs of the sampling policy recomputed by the trainer.
        rollout_logp: ``[B, T]`` log-probs the engine reported (``Sample.rollout_log_probs``).
        mask: ``[B, T]`` 0/1.
        low: Lower bound (``--tis-clip-low``).
        high: Upper bound (``--tis-clip``).

    Returns:
        ``[B, T]`` detached weights, 0 on dropped and mask-0 tokens.

    Raises:
        ValueError: ``not 0 <= low <= high`` or shapes differ.
    """
    rho = _importance_ratio(old_logp, rollout_logp, mask, low, high)  # [B, T]
    return rho * ((mask > 0) & (rho >= low) & (rho <= high)).to(rho.dtype)  # [B, T]


def importance_ratio_stats(
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    low: float,
    high: float,
) -> Metrics:
    """Sums and extremes of ``rho_t = exp(old_logp_t - rollout_logp_t)`` over mask-1 tokens, to
    reduce across data-parallel replicas (sums add, extremes take the max / min) and then divide.

    Args:
        old_logp: ``[B, T]`` log-probs of the sampling policy recomputed by the trainer.
        rollout_logp: ``[B, T]`` log-probs the engine reported.
        mask: ``[B, T]`` 0/1.
        low: Lower bound (``--tis-clip-low``).
        high: Upper bound (``--tis-clip``).

    Returns:
        Detached 0-d float64 tensors: ``ratio_sum`` (sum of ``rho``), ``tokens`` (mask-1 count),
        ``ratio_min`` / ``ratio_max`` (``+inf`` / ``-inf`` when the mask is all 0, so a min or
        max over replicas ignores them), ``outside`` (tokens with ``rho`` outside
        ``[low, high]``: clipped by TIS, dropped by MIS), ``drift_sum`` (sum of
        ``|old_logp - rollout_logp|``).

    Raises:
        ValueError: ``not 0 <= low <= high`` or shapes differ.
    """
    keep = ratio_within_bounds(old_logp, rollout_logp, mask, low=low, high=high)  # [B, T]
    with torch.no_grad():
        live = mask > 0  # [B, T]
        log_ratio = torch.where(live, old_logp - rollout_logp, 0.0).double()  # [B, T]
        rho = torch.exp(log_ratio)  # [B, T]
        inf = torch.tensor(math.inf, dtype=torch.float64, device=rho.device)
        return {
            "ratio_sum": torch.where(live, rho, 0.0).sum(),
            "tokens": live.sum().double(),
            "ratio_min": torch.where(live, rho, inf).amin() if rho.numel() else inf,
            "ratio_max": torch.where(live, rho, -inf).amax() if rho.numel() else -inf,
            "outside": (live & (keep == 0)).sum().double(),
            "drift_sum": log_ratio.abs().sum(),
        }


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    value_clip: float | None = 0.2,
    aggregation: str = "token_mean",
    denominator: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Clipped critic loss: ``0.5 * max((clip(V, V_old +- c) - R)^2, (V - R)^2)``.

    The 0.5 factor IS applied, so the gradient of the unclipped branch is ``V - R``.

    Args:
        values: ``[B, T]`` current values (with gradient).
        old_values: ``[B, T]`` values at rollout time.
        returns: ``[B, T]`` targets (from :func:`~agentrl.algorithms.advantages.gae_advantages`).
        mask: ``[B, T]`` 0/1.
        value_clip: ``--value-clip``; ``None`` disables clipping.
        aggregation: See :func:`~agentrl.algorithms.batching.aggregate`.
        denominator: Global count for gradient accumulation.

    Returns:
        ``(loss, metrics)``; metrics: ``value_loss``, ``value_clip_fraction`` (share of tokens
        where the clipped branch is the larger).

    Raises:
        ValueError: ``value_clip <= 0`` or shapes differ.
    """
    _check_shapes(mask, values=values, old_values=old_values, returns=returns)
    if value_clip is not None and value_clip <= 0:
        raise ValueError(f"--value-clip must be > 0, got {value_clip}")
    old_values, returns = old_values.detach(), returns.detach()
    unclipped = (values - returns) ** 2  # [B, T]
    if value_clip is None:
        per_token = 0.5 * unclipped  # [B, T]
        clip_active = torch.zeros_like(unclipped, dtype=torch.bool)  # [B, T]
    else:
        clipped_values = old_values + (values - old_values).clamp(-value_clip, value_clip)  # [B, T]
        clipped = (clipped_values - returns) ** 2  # [B, T]
        per_token = 0.5 * torch.maximum(unclipped, clipped)  # [B, T]
        clip_active = clipped > unclipped  # [B, T]
    loss = aggregate(per_token, mask, aggregation, denominator=denominator)
    with torch.no_grad():
        metrics = {
            "value_loss": loss.detach(),
            "value_clip_fraction": aggregate(
                clip_active.to(per_token.dtype), mask, aggregation, denominator=denominator
            ),
        }
    return loss, metrics


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` over the last dim: ``H = logsumexp(z) - sum_v p_v z_v``.

    ``z`` is first shifted by its max (``H`` is shift-invariant): without it, large logits make
    the two terms large and nearly equal, and float32 cancellation loses the entropy. Logits
    must be finite (``-inf`` vocabulary masking gives ``0 * -inf``).

    Args:
        logits: ``[..., V]``.

    Returns:
        ``[...]`` entropies in nats.
    """
    shifted = logits - logits.amax(dim=-1, keepdim=True).detach()  # [..., V], max 0
    probs = torch.softmax(shifted, dim=-1)  # [..., V]
    return torch.logsumexp(shifted, dim=-1) - (probs * shifted).sum(-1)  # [...]


def entropy_bonus(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    aggregation: str = "token_mean",
    *,
    denominator: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Aggregated entropy ``H`` (the loss subtracts ``entropy_coef * H``, ``--entropy-coef``).

    Args:
        entropy: ``[B, T]`` per-token entropy (see :func:`entropy_from_logits`).
        mask: ``[B, T]`` 0/1.
        aggregation: See :func:`~agentrl.algorithms.batching.aggregate`.
        denominator: Global count for gradient accumulation.

    Returns:
        A scalar, differentiable.
    """
    _check_shapes(mask, entropy=entropy)
    return aggregate(entropy, mask, aggregation, denominator=denominator)


def total_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    kl_loss_coef: float = 0.0,
    kl_loss_type: str = "k1",
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
    ratio: str = "token",
    tis_weights: torch.Tensor | None = None,
    aggregation: str | None = None,
    denominator: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Actor loss: ``pg - entropy_coef * H + kl_loss_coef * KL(logp, ref_logp)``.

    KL-as-loss is ``--use-kl-loss`` / ``--kl-loss-coef`` / ``--kl-loss-type``; KL-in-reward
    instead goes to the advantage estimators (``kl=``).

    Args:
        logp, old_logp, advantages, mask: As :func:`policy_loss`.
        entropy: ``[B, T]`` per-token entropy; required when ``entropy_coef != 0``, logged when
            given.
        entropy_coef: ``--entropy-coef``.
        ref_logp: ``[B, T]`` reference-model log-probs; required when ``kl_loss_coef != 0``,
            logged when given.
        kl_loss_coef: ``--kl-loss-coef``.
        kl_loss_type: ``--kl-loss-type`` (see :func:`~agentrl.algorithms.kl.kl_estimate`).
        eps_clip, eps_clip_high, eps_clip_c, ratio, tis_weights: As :func:`policy_loss`.
        aggregation: Used for every term; ``None``: :func:`default_aggregation` of ``ratio``.
        denominator: Global count for gradient accumulation.

    Returns:
        ``(loss, metrics)``: :func:`policy_loss`'s metrics plus ``loss``, and ``entropy`` /
        ``kl_loss`` when their inputs are given.

    Raises:
        ValueError: A coefficient is set without its input (naming the flag).
    """
    if entropy_coef != 0.0 and entropy is None:
        raise ValueError("--entropy-coef is set but no per-token entropy was given")
    if kl_loss_coef != 0.0 and ref_logp is None:
        raise ValueError(
            "--use-kl-loss / --kl-loss-coef is set but no reference log-probs were given"
        )
    _check_shapes(mask, entropy=entropy, ref_logp=ref_logp)
    if aggregation is None:
        aggregation = default_aggregation(ratio)
    loss, metrics = policy_loss(
        logp, old_logp, advantages, mask,
        eps_clip=eps_clip, eps_clip_high=eps_clip_high, eps_clip_c=eps_clip_c, ratio=ratio,
        tis_weights=tis_weights, aggregation=aggregation, denominator=denominator,
    )
    if entropy is not None:
        mean_entropy = entropy_bonus(entropy, mask, aggregation, denominator=denominator)
        loss = loss - entropy_coef * mean_entropy
        metrics["entropy"] = mean_entropy.detach()
    if ref_logp is not None:
        per_token_kl = kl_estimate(logp, ref_logp.detach(), kl_loss_type)  # [B, T]
        kl_loss = aggregate(per_token_kl, mask, aggregation, denominator=denominator)
        loss = loss + kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
    metrics["loss"] = loss.detach()
    return loss, metrics
