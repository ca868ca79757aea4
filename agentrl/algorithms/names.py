"""The names the algorithm flags take, and the default aggregation of each ratio kind.

Torch-free, so the trainer's config can check its flags at start-up without loading torch.
"""

from __future__ import annotations

__all__ = ["AGGREGATIONS", "ESTIMATORS", "KL_KINDS", "RATIO_KINDS", "default_aggregation"]

ESTIMATORS = ("grpo", "gspo", "ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
"""``--advantage-estimator`` values."""
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
"""``--loss-aggregation`` values."""
KL_KINDS = ("k1", "k2", "k3", "low_var_kl")
"""``--kl-loss-type`` values."""
RATIO_KINDS = ("token", "sequence")
"""Importance ratios: per token (PPO, GRPO) or per sequence (GSPO)."""


def default_aggregation(ratio: str) -> str:
    """The policy loss's aggregation when none is chosen, by importance ratio kind.

    GSPO (``ratio="sequence"``) defines its objective as a mean over sequences of per-sequence
    terms, so each sequence weighs the same whatever its length: ``seq_mean_token_mean``. The
    token ratio (PPO, GRPO) averages over tokens: ``token_mean``.

    Raises:
        ValueError: Unknown ratio kind.
    """
    if ratio not in RATIO_KINDS:
        raise ValueError(f"unknown ratio {ratio!r}; choose one of {', '.join(RATIO_KINDS)}")
    return "seq_mean_token_mean" if ratio == "sequence" else "token_mean"
