"""Per-token log-probs and entropies over a vocabulary sharded across tensor-parallel ranks.

Megatron's output layer is vocab-parallel: each TP rank holds logits for a contiguous slice of
the (padded) vocabulary. The functions here compute ``log_softmax(logits / T)[target]`` and the
entropy of ``softmax(logits / T)`` over the FULL real vocabulary from one rank's slice, with
the vocabulary-parallel reductions: all-reduce MAX of the
per-shard maxima, SUM of the exp-sums, and the target logit taken on the owning shard and
SUM-reduced. Columns at or past ``vocab_size`` (Megatron's padding, see
:func:`agentrl.trainer.hf_convert.padded_vocab_size`) are excluded.

They are custom autograd functions rather than megatron's ``vocab_parallel_cross_entropy``,
which has no temperature and counts padded vocabulary columns in the softmax. Each processes
``chunk_size`` tokens at a time, so no more than one chunk of fp32 shard logits exists at once
(the backward recomputes the softmax chunk by chunk from the saved input). Without tensor
parallelism, logits up to :data:`FUSED_MAX_ELEMENTS` take torch's fused log-softmax instead
(same values, several times faster on small batches).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "FUSED_MAX_ELEMENTS",
    "vocab_parallel_entropy",
    "vocab_parallel_logprobs",
    "vocab_parallel_logprobs_and_entropy",
]

FUSED_MAX_ELEMENTS = 1 << 26
"""Without tensor parallelism, logits up to this many elements (256 MiB in fp32) go through
torch's fused log-softmax; larger ones through the chunked function, whose memory stays at one
chunk of fp32 logits."""


def _default_tp_group() -> Any:
    """Megatron's TP group when it spans more than one rank, else ``None`` (no collectives)."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return None
    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        return None
    return parallel_state.get_tensor_model_parallel_group()


def _all_reduce(tensor: torch.Tensor, op: Any, group: Any) -> torch.Tensor:
    if group is not None:
        dist.all_reduce(tensor, op=op, group=group)
    return tensor


def _chunks(n: int, chunk_size: int | None) -> list[slice]:
    """Row slices of at most ``chunk_size`` (all rows when ``None``)."""
    size = max(1, chunk_size or n)
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


@dataclasses.dataclass(frozen=True)
class _ShardLayout:
    """Where a rank's vocab shard sits: global column ``start``; the first ``valid`` columns are
    real vocabulary, the rest padding."""

    start: int
    valid: int

    @classmethod
    def of(cls, width: int, vocab_size: int, group: Any) -> _ShardLayout:
        rank = dist.get_rank(group) if group is not None else 0
        start = rank * width
        return cls(start=start, valid=max(0, min(width, vocab_size - start)))


def _scaled(
    logits2d: torch.Tensor, rows: slice, layout: _ShardLayout, temperature: float
) -> torch.Tensor:
    """fp32 logits / temperature of real-vocabulary columns for a chunk of rows."""
    return logits2d[rows, : layout.valid].float() / temperature


def _max_and_sumexp(x: torch.Tensor, group: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Global max and sum of exp(x - max) over the sharded last dim; x: [n, valid]."""
    if x.shape[1]:
        local_max = x.max(dim=1).values
    else:  # a shard of padding only
        local_max = x.new_full((x.shape[0],), float("-inf"))
    global_max = _all_reduce(local_max, dist.ReduceOp.MAX, group)  # [n]
    return global_max, torch.exp(x - global_max[:, None]).sum(dim=1)


def _check_inputs(logits: torch.Tensor, temperature: float, vocab_size: int, group: Any) -> int:
    """Validates the common arguments; returns the TP size."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    tp = dist.get_world_size(group) if group is not None else 1
    if vocab_size > logits.shape[-1] * tp or vocab_size < 1:
        raise ValueError(
            f"vocab_size {vocab_size} does not fit {tp} shard(s) of {logits.shape[-1]} columns"
        )
    return tp


class _VocabParallelLogProbs(torch.autograd.Function):
    """log_softmax(logits / T)[target] over a vocabulary sharded across the TP group.

    Written here rather than using megatron's ``vocab_parallel_cross_entropy``, which has no
    temperature and counts padded vocabulary rows in the softmax.
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                chunk_size: int | None, vocab_size: int, group: Any) -> torch.Tensor:
        width = logits.shape[-1]
        layout = _ShardLayout.of(width, vocab_size, group)
        logits2d = logits.reshape(-1, width)  # [n, width]
        flat_targets = targets.reshape(-1)  # [n]
        n = flat_targets.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=logits.device)
        maxes = torch.empty_like(logp)
        sums = torch.empty_like(logp)
        local_targets = flat_targets - layout.start  # [n]; valid where 0 <= t < layout.valid
        owned = (local_targets >= 0) & (local_targets < layout.valid)
        for rows in _chunks(n, chunk_size):
            x = _scaled(logits2d, rows, layout, temperature)  # [c, valid]
            global_max, local_sum = _max_and_sumexp(x, group)
            index = local_targets[rows].clamp(0, max(layout.valid - 1, 0))
            picked = (
                x.gather(1, index[:, None])[:, 0] if x.shape[1] else torch.zeros_like(local_sum)
            )
            target_logit = torch.where(owned[rows], picked, torch.zeros_like(picked))
            # One SUM all-reduce for both the exp-sums and the owning shard's target logit.
            summed = _all_reduce(torch.stack([local_sum, target_logit]), dist.ReduceOp.SUM, group)
            logp[rows] = summed[1] - global_max - torch.log(summed[0])
            maxes[rows], sums[rows] = global_max, summed[0]
        ctx.save_for_backward(logits, local_targets, owned, maxes, sums)
        ctx.layout, ctx.temperature, ctx.chunk_size = layout, temperature, chunk_size
        return logp.reshape(targets.shape)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        logits, local_targets, owned, maxes, sums = ctx.saved_tensors
        layout, temperature = ctx.layout, ctx.temperature
        width = logits.shape[-1]
        logits2d = logits.reshape(-1, width)
        grad = grad_output.reshape(-1).float()
        # d logp / d logit_j = (1[j == target] - softmax_j) / T; padded columns get 0.
        grad_logits = torch.zeros_like(logits2d)
        for rows in _chunks(logits2d.shape[0], ctx.chunk_size):
            x = _scaled(logits2d, rows, layout, temperature)
            g = -torch.exp(x - maxes[rows, None]) / sums[rows, None]  # [c, valid]
            hit = owned[rows].nonzero()[:, 0]
            g[hit, local_targets[rows][hit]] += 1.0
            g *= (grad[rows] / temperature)[:, None]
            grad_logits[rows, : layout.valid] = g.to(grad_logits.dtype)
        return grad_logits.reshape(logits.shape), None, None, None, None, None


def vocab_parallel_logprobs(
    logits_shard: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab_size: int,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    group: Any = None,
    check_targets: bool = True,
) -> torch.Tensor:
    """Per-token ``log_softmax(logits / temperature)[target]`` over the full vocabulary.

    Each TP rank passes its vocab shard of the logits (as :func:`build_gpt_model`'s forward
    returns them). With ``m`` the all-reduced (MAX) maximum and ``S`` the all-reduced (SUM) sum
    of ``exp(l / T - m)``, ``logp = l_target / T - m - log S``, where the target logit comes
    from the rank owning it (SUM-reduced, zero elsewhere). Differentiable (a custom autograd
    function; the backward is local to each rank). Memory: at most ``chunk_size`` rows of fp32
    shard logits at a time, plus the saved input.

    Args:
        logits_shard: ``[..., V_shard]`` logits of this rank's vocabulary columns (any float
            dtype; computed in fp32).
        targets: ``[...]`` global token ids, ``0 <= id < vocab_size``.
        vocab_size: The real vocabulary size; columns at or past it (Megatron's padding) are
            excluded from the softmax.
        temperature: The sampling temperature of the rollout engine.
        chunk_size: Rows (tokens) per step; ``None`` for all at once.
        group: The tensor-parallel group; defaults to Megatron's (none when TP is 1).
        check_targets: Check the targets' range (reading two values back from the device: a
            synchronisation); a caller that checked its batch once passes False.

    Returns:
        ``[...]`` fp32 log-probs.
    """
    group = _default_tp_group() if group is None else group
    _check_inputs(logits_shard, temperature, vocab_size, group)
    if check_targets and targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab_size):
        raise ValueError(f"targets must lie in [0, {vocab_size}); got "
                         f"[{int(targets.min())}, {int(targets.max())}]")
    if group is None and logits_shard.numel() <= FUSED_MAX_ELEMENTS:
        # One rank and a small batch: torch's fused log-softmax (forward and backward kernels)
        # is several times faster than the chunked function, and the fp32 copy it keeps for
        # backward is at most FUSED_MAX_ELEMENTS floats.
        scaled = logits_shard[..., :vocab_size].float() / temperature
        return scaled.log_softmax(-1).gather(-1, targets[..., None].long())[..., 0]
    return _VocabParallelLogProbs.apply(
        logits_shard, targets, float(temperature), chunk_size, int(vocab_size), group
    )


class _VocabParallelEntropy(torch.autograd.Function):
    """Entropy of softmax(logits / T) over a vocabulary sharded across the TP group."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, temperature: float, chunk_size: int | None,
                vocab_size: int, group: Any) -> torch.Tensor:
        width = logits.shape[-1]
        layout = _ShardLayout.of(width, vocab_size, group)
        logits2d = logits.reshape(-1, width)
        n = logits2d.shape[0]
        entropy = torch.empty(n, dtype=torch.float32, device=logits.device)
        maxes, sums, means = (
            torch.empty_like(entropy),
            torch.empty_like(entropy),
            torch.empty_like(entropy),
        )
        for rows in _chunks(n, chunk_size):
            x = _scaled(logits2d, rows, layout, temperature)
            global_max, _ = _max_and_sumexp(x, group)
            e = torch.exp(x - global_max[:, None])
            summed = _all_reduce(
                torch.stack([e.sum(dim=1), (e * x).sum(dim=1)]), dist.ReduceOp.SUM, group
            )
            mean = summed[1] / summed[0]  # E_p[x]
            # H = log Z - E_p[x] with log Z = m + log S.
            entropy[rows] = global_max + torch.log(summed[0]) - mean
            maxes[rows], sums[rows], means[rows] = global_max, summed[0], mean
        ctx.save_for_backward(logits, maxes, sums, means)
        ctx.layout, ctx.temperature, ctx.chunk_size = layout, temperature, chunk_size
        return entropy.reshape(logits.shape[:-1])

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        logits, maxes, sums, means = ctx.saved_tensors
        layout, temperature = ctx.layout, ctx.temperature
        logits2d = logits.reshape(-1, logits.shape[-1])
        grad = grad_output.reshape(-1).float()
        grad_logits = torch.zeros_like(logits2d)
        # dH / dx_j = -p_j (x_j - E_p[x]), and x = logit / T.
        for rows in _chunks(logits2d.shape[0], ctx.chunk_size):
            x = _scaled(logits2d, rows, layout, temperature)
            p = torch.exp(x - maxes[rows, None]) / sums[rows, None]
            g = -p * (x - means[rows, None]) * (grad[rows] / temperature)[:, None]
            grad_logits[rows, : layout.valid] = g.to(grad_logits.dtype)
        return grad_logits.reshape(logits.shape), None, None, None, None


def vocab_parallel_entropy(
    logits_shard: torch.Tensor,
    *,
    vocab_size: int,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    group: Any = None,
) -> torch.Tensor:
    """Per-token entropy of ``softmax(logits / temperature)`` over the full vocabulary.

    ``H = m + log S - E_p[l / T]``, with ``m`` and ``S`` as in :func:`vocab_parallel_logprobs`
    and ``E_p[l / T]`` from a SUM all-reduce of each shard's ``sum(exp(l / T - m) * l / T)``.
    Differentiable; arguments as in :func:`vocab_parallel_logprobs`.

    Returns:
        ``[...]`` fp32 entropies (the logits' shape without the last dim).
    """
    group = _default_tp_group() if group is None else group
    _check_inputs(logits_shard, temperature, vocab_size, group)
    if group is None and logits_shard.numel() <= FUSED_MAX_ELEMENTS:
        logp = (logits_shard[..., :vocab_size].float() / temperature).log_softmax(-1)
        return -(logp.exp() * logp).sum(-1)
    return _VocabParallelEntropy.apply(
        logits_shard, float(temperature), chunk_size, int(vocab_size), group
    )


def vocab_parallel_logprobs_and_entropy(
    logits_shard: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab_size: int,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    entropy_grad: bool = True,
    group: Any = None,
    check_targets: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both :func:`vocab_parallel_logprobs` and :func:`vocab_parallel_entropy`; on the fused
    single-rank path from one log-softmax. ``entropy_grad=False`` returns a detached entropy
    (a metric), which skips its backward."""
    group = _default_tp_group() if group is None else group
    if group is None and logits_shard.numel() <= FUSED_MAX_ELEMENTS:
        _check_inputs(logits_shard, temperature, vocab_size, group)
        logp_all = (logits_shard[..., :vocab_size].float() / temperature).log_softmax(-1)
        logp = logp_all.gather(-1, targets[..., None].long())[..., 0]
        source = logp_all if entropy_grad else logp_all.detach()
        return logp, -(source.exp() * source).sum(-1)
    logp = vocab_parallel_logprobs(logits_shard, targets, vocab_size=vocab_size,
                                   temperature=temperature, chunk_size=chunk_size, group=group,
                                   check_targets=check_targets)
    context = contextlib.nullcontext() if entropy_grad else torch.no_grad()
    with context:
        entropy = vocab_parallel_entropy(logits_shard, vocab_size=vocab_size,
                                         temperature=temperature, chunk_size=chunk_size,
                                         group=group)
    return logp, entropy
