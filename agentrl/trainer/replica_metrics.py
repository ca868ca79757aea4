"""Metrics of the Megatron actor reduced over its data-parallel replicas.

Each replica trains its own micro-batches (round robin), so a metric is first a per-replica
partial (a sum, or an extreme) and then reduced over the data-parallel group: sums add, extremes
take the max (a minimum is the negated maximum of the negations). With one replica every reduce
is the identity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from agentrl.algorithms import importance_ratio_stats

__all__ = ["extremes_over_data_parallel", "importance_ratio_metrics", "sum_over_data_parallel"]


def _data_parallel_group() -> object | None:
    """The data-parallel process group, or ``None`` with a single replica."""
    from megatron.core import parallel_state

    if parallel_state.get_data_parallel_world_size() == 1:
        return None
    return parallel_state.get_data_parallel_group()


def sum_over_data_parallel(values: Mapping[str, torch.Tensor | float], device: torch.device
                           ) -> dict[str, float]:
    """Adds up per-replica partial sums (loss parts, log-prob differences, token counts).

    The sums stay on the device while a step's micro-batches run; here they are stacked,
    all-reduced over the data-parallel replicas, and cross to the host in one transfer (one
    synchronisation per step, however many micro-batches it had).

    Args:
        values: This replica's partial sums (0-dim tensors on ``device``, or numbers); every
            replica passes the same keys.
        device: Where the collective runs (the actor's device: nccl needs CUDA tensors).

    Returns:
        The totals, by key, as floats.
    """
    keys = sorted(values)
    if not keys:
        return {}
    packed = torch.stack([torch.as_tensor(values[k], device=device).to(torch.float64).reshape(())
                          for k in keys])
    group = _data_parallel_group()
    if group is not None:
        torch.distributed.all_reduce(packed, group=group)
    return dict(zip(keys, packed.tolist(), strict=True))


def extremes_over_data_parallel(maxima: dict[str, float], minima: dict[str, float],
                                device: torch.device
                                ) -> tuple[dict[str, float], dict[str, float]]:
    """The largest of each of ``maxima`` and the smallest of each of ``minima`` over the
    replicas, in one MAX all-reduce of ``[maxima..., -minima...]``.

    Args:
        maxima: This replica's maxima (``-inf`` where it has none).
        minima: This replica's minima (``+inf`` where it has none).
        device: Where the collective runs.

    Returns:
        ``(maxima, minima)`` over every replica, by key.
    """
    group = _data_parallel_group()
    if group is None:
        return maxima, minima
    high, low = sorted(maxima), sorted(minima)
    packed = torch.tensor([maxima[k] for k in high] + [-minima[k] for k in low],
                          dtype=torch.float64, device=device)
    torch.distributed.all_reduce(packed, op=torch.distributed.ReduceOp.MAX, group=group)
    values = packed.tolist()
    return (dict(zip(high, values[: len(high)], strict=True)),
            {k: -v for k, v in zip(low, values[len(high) :], strict=True)})


def importance_ratio_metrics(old_logp: torch.Tensor, rollout_logp: torch.Tensor,
                             mask: torch.Tensor, *, correction: str, low: float, high: float,
                             device: torch.device) -> dict[str, float]:
    """The off-policy metrics of the tokens this replica trains, reduced over the replicas.

    Args:
        old_logp: ``[b, T]`` pre-step log-probs of this replica's rows.
        rollout_logp: ``[b, T]`` the engine's log-probs of those rows.
        mask: ``[b, T]`` 0/1 trained tokens.
        correction: ``tis`` or ``mis`` (``--off-policy-correction``, solved).
        low: ``--tis-clip-low``.
        high: ``--tis-clip``.
        device: Where the collectives run.

    Returns:
        Over every replica's trained tokens, with ``rho = exp(old - rollout)``:
        ``is_ratio_mean``, ``is_ratio_min``, ``is_ratio_max`` (NaN when no token is trained),
        the share of tokens with ``rho`` outside ``[low, high]`` (``is_clipped_fraction`` for
        tis, ``is_masked_fraction`` for mis), ``logprob_drift`` (mean ``|old - rollout|``).
    """
    stats = importance_ratio_stats(old_logp, rollout_logp, mask, low=low, high=high)
    sums = sum_over_data_parallel(
        {k: float(stats[k]) for k in ("ratio_sum", "tokens", "outside", "drift_sum")}, device)
    highest, lowest = extremes_over_data_parallel({"ratio": float(stats["ratio_max"])},
                                                  {"ratio": float(stats["ratio_min"])}, device)
    tokens = max(sums["tokens"], 1.0)
    empty = sums["tokens"] == 0  # the extremes are still -inf / +inf
    return {
        "is_ratio_mean": sums["ratio_sum"] / tokens,
        "is_ratio_min": math.nan if empty else lowest["ratio"],
        "is_ratio_max": math.nan if empty else highest["ratio"],
        "is_clipped_fraction" if correction == "tis" else "is_masked_fraction":
            sums["outside"] / tokens,
        "logprob_drift": sums["drift_sum"] / tokens,
    }
