"""Per-token estimators of KL(pi || pi_ref) from log-probs of tokens sampled from pi.

With ``log_ratio = logp - ref_logp`` (log pi(y_t) - log pi_ref(y_t), y_t ~ pi), following
J. Schulman, "Approximating KL Divergence" (2020) and docs/rl-semantics.md:

* ``k1 = log_ratio`` - unbiased, high variance, can be negative per token.
* ``k2 = log_ratio^2 / 2`` - biased, low variance, >= 0.
* ``k3 = exp(-log_ratio) - 1 + log_ratio`` - i.e. ``r - 1 - log r`` with ``r = pi_ref / pi``:
  unbiased for KL(pi || pi_ref), >= 0 per token.
* ``low_var_kl`` - ``k3`` clamped to ``[-10, 10]`` (k3 >= 0, so in effect capped at 10), with
  ``log_ratio`` first clamped to ``[-20, 20]`` so ``exp`` cannot overflow to inf.
"""

from __future__ import annotations

import torch

from agentrl.algorithms.names import KL_KINDS

# exp(20) ~ 4.9e8 is finite in bf16/fp32; beyond it exp would overflow and the clamp's zero
# gradient times inf would give NaN gradients.
_LOG_RATIO_LIMIT = 20.0
_LOW_VAR_KL_LIMIT = 10.0


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate (Schulman's k1 / k2 / k3; see the module docstring).

    Args:
        logp: ``[B, T]`` log-probs of the sampled tokens under the policy.
        ref_logp: ``[B, T]`` log-probs of the same tokens under the reference model.
        kind: One of :data:`KL_KINDS` (``--kl-loss-type``).

    Returns:
        ``[B, T]`` per-token estimates (unmasked: the caller masks and aggregates).

    Raises:
        ValueError: Unknown ``kind``.
    """
    log_ratio = logp - ref_logp  # [B, T]
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2  # [B, T]
    if kind == "k3":
        return torch.exp(-log_ratio) - 1.0 + log_ratio  # [B, T]
    if kind == "low_var_kl":
        log_ratio = log_ratio.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)  # [B, T]
        k3 = torch.exp(-log_ratio) - 1.0 + log_ratio  # [B, T]
        return k3.clamp(-_LOW_VAR_KL_LIMIT, _LOW_VAR_KL_LIMIT)
    raise ValueError(
        f"unknown KL kind {kind!r} (--kl-loss-type); choose one of {', '.join(KL_KINDS)}"
    )
