"""The LM head only where a log-prob is used: at the positions that predict a trained token.

A rollout sample is mostly prompt and tool output; only the model's own tokens (loss mask 1)
are trained. The output layer and the log-softmax over the vocabulary cost
``[tokens, vocab]`` each (151,936 columns for Qwen2.5), and the loss and its metrics read
them at the trained positions only. :func:`trained_token_logprobs` runs the model with a
forward pre-hook on its output layer that keeps the hidden states of those positions, so the
head's matmul, the logits and the (chunked, vocabulary-parallel) log-softmax and entropy exist
for ``n`` trained tokens instead of ``b * s`` positions; the results are scattered back into the
batch's ``[b, L - 1]`` layout (0 elsewhere), which the losses read with the mask as before.

Tensor parallelism is unchanged: positions are picked along the sequence, the vocabulary stays
sharded. With sequence parallelism the output layer's input is split along the sequence (it
gathers it itself), so there the head runs at every position.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import torch

from agentrl.trainer.hf_convert import unwrap_model
from agentrl.trainer.vocab_parallel import (
    vocab_parallel_logprobs,
    vocab_parallel_logprobs_and_entropy,
)

__all__ = ["head_only_at", "packed_trained_logprobs", "trained_token_logprobs"]


@contextlib.contextmanager
def head_only_at(model: Any, rows: torch.Tensor, cols: torch.Tensor) -> Iterator[None]:
    """Within it, ``model``'s output layer sees only the hidden states at ``(cols, rows)`` of
    its ``[s, b, h]`` input, as a ``[n, 1, h]`` sequence: the model returns ``[1, n, V / tp]``
    logits, in the order of ``rows`` / ``cols``."""
    layer = unwrap_model(model).output_layer

    def keep(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        hidden = args[0]  # [s, b, h]
        return (hidden[cols, rows].unsqueeze(1), *args[1:]), kwargs  # [n, 1, h]

    handle = layer.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def trained_token_logprobs(
    model: Any, tokens: torch.Tensor, mask: torch.Tensor, *, vocab_size: int, temperature: float,
    chunk_size: int | None, entropy: bool = False, entropy_grad: bool = True,
    every_position: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the next token at the positions ``mask`` marks.

    Args:
        model: The Megatron model (any wrapper around it).
        tokens: ``[b, L]`` token ids, on the model's device.
        mask: ``[b, L - 1]`` on the host: non-zero where position ``t`` predicts a token whose
            log-prob is used (the batch's loss mask).
        vocab_size: The real vocabulary size.
        temperature: The sampling temperature.
        chunk_size: Tokens per chunk of the vocabulary-parallel log-softmax.
        entropy: Also return the entropies.
        entropy_grad: The entropies carry a gradient (``--entropy-coef`` is non-zero).
        every_position: Run the head at every position (sequence parallelism).

    Returns:
        ``[b, L - 1]`` fp32 log-probs, and entropies or ``None``, 0 where ``mask`` is 0.
    """
    device = tokens.device
    positions = torch.arange(tokens.shape[1], device=device).expand_as(tokens)
    width = tokens.shape[1] - 1
    if every_position:
        logits = model(tokens, positions, None)[:, :-1]  # [b, L - 1, V / tp]
        targets = tokens[:, 1:]
        keep = mask.to(device) != 0
    else:
        rows, cols = (t.to(device) for t in mask.nonzero(as_tuple=True))  # on the host: no sync
        with head_only_at(model, rows, cols):
            logits = model(tokens, positions, None)[0]  # [n, V / tp]
        targets = tokens[rows, cols + 1]  # [n]
    logp, ent = _at_positions(logits, targets, vocab_size=vocab_size, temperature=temperature,
                              chunk_size=chunk_size, entropy=entropy, entropy_grad=entropy_grad)
    if every_position:
        logp = logp.float() * keep
        return logp, ent.float() * keep if ent is not None else None
    shape = (tokens.shape[0], width)
    return _scatter(logp, rows, cols, shape), _scatter(ent, rows, cols, shape) if ent is not None else None


def packed_trained_logprobs(
    model: Any, tokens: torch.Tensor, lengths: list[int], mask: torch.Tensor, *, device: torch.device,
    vocab_size: int, temperature: float, chunk_size: int | None, entropy: bool = False,
    entropy_grad: bool = True, layout: str = "sbhd",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`trained_token_logprobs` on a packed micro-batch: the rows' real tokens concatenated
    into one sequence without padding (Megatron's ``thd`` format), positions restarting at each
    row, attention within each row only (:mod:`agentrl.trainer.attention`).

    Args:
        model: The Megatron model.
        tokens: ``[b, L]`` right-padded token ids, on the host.
        lengths: Each row's real length.
        mask: ``[b, L - 1]`` on the host (see :func:`trained_token_logprobs`).
        device: The model's device.
        vocab_size: The real vocabulary size.
        temperature: The sampling temperature.
        chunk_size: Tokens per chunk of the vocabulary-parallel log-softmax.
        entropy: Also return the entropies.
        entropy_grad: The entropies carry a gradient.
        layout: ``"sbhd"``: agentrl's own form, for the local layer spec (one row, the rotary
            embedding taken per token, the boundaries on the host, so no layer reads the device).
            ``"thd"``: Megatron's packed-sequence parameters (``cu_seqlens`` on the device),
            which Transformer Engine's attention reads; Megatron applies the rotary embedding
            sample by sample.

    Returns:
        ``[b, L - 1]`` fp32 log-probs, and entropies or ``None``, 0 where ``mask`` is 0: the
        padded layout, so losses read them as they read an unpacked batch's.
    """
    from megatron.core.packed_seq_params import PackedSeqParams

    bounds = [0, *itertools.accumulate(lengths)]
    starts = torch.tensor(bounds)  # [b + 1], on the host
    packed = torch.cat([tokens[row, :n] for row, n in enumerate(lengths)])[None].to(device)  # [1, T]
    positions = torch.cat([torch.arange(n) for n in lengths])[None].to(device)  # restart per row
    longest = max(lengths)
    if layout == "thd":
        cu_seqlens = starts.to(device=device, dtype=torch.int32)
        params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
                                 max_seqlen_q=longest, max_seqlen_kv=longest)
        per_token_rope: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    elif layout == "sbhd":
        # Megatron's thd rotary embedding reads the boundaries back from the device at every
        # layer: here one sbhd row whose rotary frequencies are taken at each token's own
        # position, and the boundaries on the host for the attention (agentrl/trainer/attention.py)
        params = PackedSeqParams(qkv_format="sbhd", max_seqlen_q=longest, max_seqlen_kv=longest)
        params.host_bounds = bounds
        per_token_rope = _rope_at(model, positions[0])
    else:
        raise ValueError(f"layout must be 'sbhd' or 'thd', got {layout!r}")
    rows, cols = mask.nonzero(as_tuple=True)  # on the host: no sync
    source = (starts[rows] + cols).to(device)  # where each trained position sits in the pack
    with head_only_at(model, torch.zeros_like(source), source), per_token_rope:
        logits = model(packed, positions, None, packed_seq_params=params)[0]  # [n, V / tp]
    targets = packed[0, source + 1]  # the next token of the same row: cols < length - 1
    logp, ent = _at_positions(logits, targets, vocab_size=vocab_size, temperature=temperature,
                              chunk_size=chunk_size, entropy=entropy, entropy_grad=entropy_grad)
    rows, cols = rows.to(device), cols.to(device)
    shape = (tokens.shape[0], tokens.shape[1] - 1)
    return _scatter(logp, rows, cols, shape), _scatter(ent, rows, cols, shape) if ent is not None else None


@contextlib.contextmanager
def _rope_at(model: Any, positions: torch.Tensor) -> Iterator[None]:
    """Within it, the model's rotary embedding gives token ``i`` the frequencies of position
    ``positions[i]`` (its place in its own sample) instead of ``i``."""
    rope = unwrap_model(model).rotary_pos_emb

    def per_token(module: Any, args: Any, frequencies: torch.Tensor) -> torch.Tensor:
        return frequencies[positions]  # [max_s, 1, 1, d] -> [t, 1, 1, d]

    handle = rope.register_forward_hook(per_token)
    try:
        yield
    finally:
        handle.remove()


def _at_positions(logits: torch.Tensor, targets: torch.Tensor, *, vocab_size: int, temperature: float,
                  chunk_size: int | None, entropy: bool, entropy_grad: bool
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    if entropy:
        return vocab_parallel_logprobs_and_entropy(
            logits, targets, vocab_size=vocab_size, temperature=temperature,
            chunk_size=chunk_size, entropy_grad=entropy_grad, check_targets=False)
    return vocab_parallel_logprobs(logits, targets, vocab_size=vocab_size, temperature=temperature,
                                   chunk_size=chunk_size, check_targets=False), None


def _scatter(values: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, shape: tuple[int, int]
             ) -> torch.Tensor:
    full = torch.zeros(shape, device=values.device, dtype=torch.float32)
    return full.index_put((rows, cols), values.float())  # [b, L - 1]
