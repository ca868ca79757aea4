"""Tensor layout: per-sample lists to padded ``[B, T]`` tensors, and masked reductions over them.

A batch of ``B`` samples is laid out over RESPONSE tokens only: row ``i`` holds sample ``i``'s
response tokens at positions ``0 .. response_length - 1`` and padding after them. ``mask`` is a
float ``[B, T]`` tensor: 1 on tokens that count (``Sample.loss_mask`` 1), 0 on environment tokens
and padding. Every reduction here ignores mask-0 tokens in the numerator AND the denominator, and
an all-zero mask reduces to 0, never NaN.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentrl.algorithms.names import AGGREGATIONS


def pad_samples(
    per_sample_lists: Sequence[Sequence[float]],
    pad: float = 0.0,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Right-pads per-sample lists (e.g. ``Sample.rollout_log_probs``) into one tensor.

    Args:
        per_sample_lists: ``B`` lists, one value per response token.
        pad: Value written after the end of each shorter list.
        dtype: Result dtype.
        device: Result device.

    Returns:
        ``[B, T]`` with ``T`` the longest list (``[0, 0]`` for no samples).
    """
    width = max((len(values) for values in per_sample_lists), default=0)
    out = torch.full((len(per_sample_lists), width), pad, dtype=dtype, device=device)  # [B, T]
    for row, values in enumerate(per_sample_lists):
        if len(values):
            out[row, : len(values)] = torch.as_tensor(values, dtype=dtype, device=device)
    return out


def response_mask(
    loss_masks: Sequence[Sequence[int]], *, device: torch.device | str | None = None
) -> torch.Tensor:
    """The float ``[B, T]`` mask from ``Sample.loss_mask`` lists; padding is 0.

    Args:
        loss_masks: ``B`` lists of 0/1, one entry per response token.
        device: Result device.

    Returns:
        ``[B, T]`` float32 of 0.0/1.0.

    Raises:
        ValueError: An entry is neither 0 nor 1 (names the sample).
    """
    for row, values in enumerate(loss_masks):
        if any(v not in (0, 1) for v in values):
            raise ValueError(f"loss_masks[{row}] has entries other than 0 and 1")
    return pad_samples(loss_masks, 0.0, dtype=torch.float32, device=device)


def _safe_div(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """numerator / denominator, with 0 where the denominator is 0 (empty masks give 0)."""
    empty = denominator == 0
    safe = torch.where(empty, torch.ones_like(denominator), denominator)
    return torch.where(empty, torch.zeros_like(numerator), numerator / safe)


def _masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    # where, not multiply: a NaN/inf in padding (e.g. -inf log-probs) must not leak into the sum
    kept = torch.where(mask > 0, values, torch.zeros_like(values))  # [B, T]
    kept = kept * mask  # [B, T] honour fractional weights, if any
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(
    values: torch.Tensor, mask: torch.Tensor, dim: int | None = None
) -> torch.Tensor:
    """Mean of ``values`` over mask-1 entries: ``sum(v * m) / sum(m)``; 0 where ``sum(m) == 0``.

    Args:
        values: ``[B, T]`` (any shape matching ``mask``).
        mask: Same shape, 0/1.
        dim: Reduce only this dimension; ``None`` reduces everything to a scalar.

    Returns:
        A scalar, or ``values`` with ``dim`` removed.
    """
    count = mask.sum() if dim is None else mask.sum(dim)
    return _safe_div(_masked_sum(values, mask, dim), count)


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Whitens over all mask-1 entries of the batch: ``(x - mean) / sqrt(var + eps)``.

    ``mean`` and ``var`` are masked over the whole batch; ``var`` is the POPULATION variance
    (divide by the token count, not count - 1): with thousands of tokens the two agree, and the
    population form stays finite for a single token. Constant input whitens to exactly 0.

    Args:
        values: ``[B, T]``.
        mask: ``[B, T]`` 0/1.
        shift_mean: If False, the mean is added back (scale only).
        eps: Added to the variance so constant input does not divide by zero.

    Returns:
        ``[B, T]``, 0 on mask-0 tokens.
    """
    mean = masked_mean(values, mask)  # scalar
    var = masked_mean((values - mean) ** 2, mask)  # scalar, population variance
    whitened = (values - mean) * torch.rsqrt(var + eps)  # [B, T]
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask > 0, whitened, torch.zeros_like(whitened))


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token_mean",
    *,
    denominator: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduces per-token ``values`` ``[B, T]`` to a scalar loss; mask-0 tokens never count.

    Modes (docs/rl-semantics.md, "The policy loss", aggregation):

    * ``token_mean``: ``sum_{i,t} m_it v_it / sum_{i,t} m_it`` - every token weighs the same.
    * ``seq_mean_token_mean``: ``mean_i [sum_t m_it v_it / sum_t m_it]`` over samples with at
      least one token - every sample weighs the same (slime's default reducer).
    * ``seq_mean_token_sum``: ``mean_i [sum_t m_it v_it]`` over samples with at least one token.

    Args:
        values: ``[B, T]``.
        mask: ``[B, T]`` 0/1.
        mode: One of :data:`AGGREGATIONS`.
        denominator: If given, divide by this instead of the count in THIS batch (the token count
            for ``token_mean``, the sample count otherwise). Gradient accumulation over
            micro-batches and data-parallel ranks passes the global count so the summed
            micro-batch losses equal the loss of the whole batch.

    Returns:
        A scalar; 0 (not NaN) for an all-zero mask.

    Raises:
        ValueError: Unknown ``mode``.
    """
    if mode == "token_mean":
        numerator = _masked_sum(values, mask)  # scalar
        count = mask.sum()  # scalar
    elif mode in ("seq_mean_token_mean", "seq_mean_token_sum"):
        per_sample = _masked_sum(values, mask, dim=-1)  # [B]
        tokens = mask.sum(-1)  # [B]
        if mode == "seq_mean_token_mean":
            per_sample = _safe_div(per_sample, tokens)  # [B]
        numerator = per_sample.sum()  # scalar
        count = (tokens > 0).sum().to(values.dtype)  # scalar, samples that have tokens
    else:
        raise ValueError(f"unknown aggregation {mode!r}; choose one of {', '.join(AGGREGATIONS)}")
    if denominator is not None:
        count = torch.as_tensor(denominator, dtype=values.dtype, device=values.device)
    return _safe_div(numerator, count)
