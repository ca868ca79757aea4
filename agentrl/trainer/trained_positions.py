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
from collections.abc import Iterator
from typing import Any

import torch

from agentrl.trainer.hf_convert import unwrap_model
from agentrl.trainer.vocab_parallel import (
    vocab_parallel_logprobs,
    vocab_parallel_logprobs_and_entropy,
)

__all__ = ["head_only_at", "trained_token_logprobs"]


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
    if entropy:
        logp, ent = vocab_parallel_logprobs_and_entropy(
            logits, targets, vocab_size=vocab_size, temperature=temperature,
            chunk_size=chunk_size, entropy_grad=entropy_grad, check_targets=False)
    else:
        logp = vocab_parallel_logprobs(logits, targets, vocab_size=vocab_size, temperature=temperature,
                                       chunk_size=chunk_size, check_targets=False)
        ent = None
    if every_position:
        logp = logp.float() * keep
        return logp, ent.float() * keep if ent is not None else None

    def scatter(values: torch.Tensor) -> torch.Tensor:
        full = torch.zeros((tokens.shape[0], width), device=device, dtype=torch.float32)
        return full.index_put((rows, cols), values.float())  # [b, L - 1]

    return scatter(logp), scatter(ent) if ent is not None else None
