"""RL math for the trainer: advantage and KL estimators and losses, as pure tensor functions.

Imports only torch (and that only with the functions). What each flag means: docs/rl-semantics.md.

Layout
    A batch of ``B`` samples is packed into padded ``[B, T]`` tensors over RESPONSE tokens only
    (:func:`pad_samples` of ``Sample.rollout_log_probs`` etc.). ``mask`` ``[B, T]`` is float,
    1 on tokens that count (``Sample.loss_mask`` 1) and 0 on environment tokens and padding
    (:func:`response_mask`). Rewards are ``[B]``. Groups are explicit ids ``[B]`` (a LongTensor or
    any hashables, see :func:`group_index`), never inferred by reshaping: groups may be uneven and
    in any order.

Advantages (:func:`compute_advantages`, ``--advantage-estimator``)
    * grpo / gspo: ``A = (r - mean_g r) / (std_g r + 1e-6)``, unbiased std; a group of one gets 0;
      ``--disable-grpo-std-normalization`` drops the division. Broadcast to mask-1 tokens.
    * reinforce_plus_plus: token reward ``-kl_coef * KL_t`` on mask-1 tokens plus ``r`` on the
      last; ``A_t = whiten(sum_{s>=t} gamma^(s-t) r_s)`` (environment tokens skipped).
    * reinforce_plus_plus_baseline: ``A_t = whiten(r - mean_g r - kl_coef * KL_t)``.
    * ppo: GAE ``delta_t = r_t + gamma V_next - V_t``, ``A_t = delta_t + gamma lam A_next``;
      ``returns = A + V`` (raw A); the advantages are whitened.
    ``whiten`` is the masked batch whitening ``(x - mean) / sqrt(var + 1e-8)`` with population var.

KL (:func:`kl_estimate`, ``log_ratio = logp - ref_logp``)
    ``k1 = log_ratio``; ``k2 = log_ratio^2 / 2``; ``k3 = exp(-log_ratio) - 1 + log_ratio``;
    ``low_var_kl = clamp(k3, -10, 10)``.

Losses
    * :func:`policy_loss`: ``rho = exp(logp - old_logp)`` (GSPO: ``exp`` of the per-sample masked
      mean, shared by its tokens); ``pg = max(-rho A, -clip(rho, 1 - eps, 1 + eps_high) A)``;
      dual clip for ``A < 0``: ``min(pg, -c A)``; TIS: ``pg * clamp(exp(old - rollout), lo, hi)``.
    * :func:`mis_weights`: ``exp(old - rollout)`` where it lies in ``[lo, hi]``, else 0; the
      trainer also drops those tokens from the denominator (:func:`ratio_within_bounds`).
      :func:`importance_ratio_stats`: sums and extremes of that ratio, for the metrics.
    * :func:`value_loss`: ``0.5 * max((clip(V, V_old +- c) - R)^2, (V - R)^2)``.
    * :func:`total_loss`: ``pg - entropy_coef * H + kl_loss_coef * KL``.
    * :func:`aggregate`: ``token_mean`` (default), ``seq_mean_token_mean``,
      ``seq_mean_token_sum``; mask-0 tokens never count, an empty mask gives 0.
"""

import importlib
from typing import Any

from agentrl.algorithms.names import (
    AGGREGATIONS,
    ESTIMATORS,
    KL_KINDS,
    RATIO_KINDS,
    default_aggregation,
)

# The functions import torch: loaded on first use, so the names above stay cheap to import.
_LAZY = {
    **dict.fromkeys(("Advantages", "compute_advantages", "discounted_returns", "gae_advantages",
                     "group_index", "grpo_advantages", "reinforce_plus_plus_baseline_advantages",
                     "reinforce_plus_plus_returns", "token_rewards"), "agentrl.algorithms.advantages"),
    **dict.fromkeys(("aggregate", "masked_mean", "masked_whiten", "pad_samples", "response_mask"),
                    "agentrl.algorithms.batching"),
    "kl_estimate": "agentrl.algorithms.kl",
    **dict.fromkeys(("entropy_bonus", "entropy_from_logits", "importance_ratio_stats",
                     "mis_weights", "policy_loss", "ratio_within_bounds", "tis_weights",
                     "total_loss", "value_loss"), "agentrl.algorithms.losses"),
}

__all__ = ["AGGREGATIONS", "ESTIMATORS", "KL_KINDS", "RATIO_KINDS", "default_aggregation", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentrl.algorithms' has no attribute {name!r}")
