"""From ``Sample`` records to the padded tensors a training step consumes.

Layout (the "shifted" layout every trainer tensor uses): sample ``b`` of ``L_b`` tokens gives
positions ``i = 0 .. L_b - 2``; position ``i`` holds the log-prob of token ``i + 1`` given tokens
``0 .. i``. A response token at sequence index ``P + j`` (``P`` = prompt length) therefore sits at
position ``P + j - 1``, and ``mask[b, i]`` is 1 exactly where that token has ``loss_mask`` 1
(engine-sampled tokens), 0 on prompt, environment and padding positions. The algorithms in
:mod:`agentrl.algorithms` work on any ``[B, T]`` layout with a mask, so they take these tensors
as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from agentrl.algorithms import group_index
from agentrl.records.sample import Sample

__all__ = ["TrainBatch", "build_batch", "micro_batches"]


@dataclasses.dataclass
class TrainBatch:
    """A batch of samples as tensors (see the module docstring for the layout).

    Attributes:
        tokens: ``[B, L]`` token ids, right-padded with ``pad_id``.
        lengths: ``[B]`` real lengths.
        mask: ``[B, L - 1]`` float, 1 where a trained (engine-sampled) token is predicted.
        rollout_logprobs: ``[B, L - 1]`` the engine's log-probs at those positions, 0 elsewhere.
        rewards: ``[B]``.
        groups: ``[B]`` dense group indices (from ``Sample.group_id``).
        samples: The samples, in row order.
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    rewards: torch.Tensor
    groups: torch.Tensor
    samples: list[Sample]

    @property
    def num_tokens(self) -> int:
        """Trained tokens in the batch."""
        return int(self.mask.sum().item())

    def select(self, rows: Sequence[int]) -> TrainBatch:
        """The sub-batch of ``rows``, trimmed to its own longest sequence."""
        index = torch.tensor(list(rows), dtype=torch.long)
        # from the samples (host data): no tensor is read for it
        length = max((max(len(self.samples[i].tokens), 1) for i in rows), default=1)
        return TrainBatch(
            tokens=self.tokens[index, :length], lengths=self.lengths[index],
            mask=self.mask[index, : length - 1],
            rollout_logprobs=self.rollout_logprobs[index, : length - 1],
            rewards=self.rewards[index], groups=self.groups[index],
            samples=[self.samples[i] for i in rows],
        )


def build_batch(samples: Sequence[Sample], pad_id: int = 0) -> TrainBatch:
    """Pads ``samples`` into a :class:`TrainBatch`.

    Raises:
        ValueError: A sample breaks its invariants (``Sample.check``) or has no reward.
    """
    if not samples:
        raise ValueError("build_batch needs at least one sample")
    for sample in samples:
        sample.check()
        if sample.reward is None:
            raise ValueError(f"sample {sample.group_id}/{sample.index} has no reward")
    longest = max(len(s.tokens) for s in samples)
    longest = max(longest, 2)
    count = len(samples)
    tokens = torch.full((count, longest), pad_id, dtype=torch.long)
    mask = torch.zeros((count, longest - 1))
    rollout = torch.zeros((count, longest - 1))
    for row, sample in enumerate(samples):
        tokens[row, : len(sample.tokens)] = torch.tensor(sample.tokens, dtype=torch.long)
        start = sample.prompt_length - 1  # the position predicting the first response token
        if sample.response_length:
            span = slice(start, start + sample.response_length)
            mask[row, span] = torch.tensor(sample.loss_mask, dtype=torch.float32)
            rollout[row, span] = torch.tensor(sample.rollout_log_probs, dtype=torch.float32)
    # A sample that failed before its prompt was rendered has no tokens; it stays one padding
    # token long (with no loss position), so that a micro-batch of such samples still has a shape.
    return TrainBatch(
        tokens=tokens, lengths=torch.tensor([max(len(s.tokens), 1) for s in samples]), mask=mask,
        rollout_logprobs=rollout * mask,
        rewards=torch.tensor([float(s.reward) for s in samples]),
        groups=group_index([s.group_id for s in samples]), samples=list(samples),
    )


def micro_batches(
    lengths: Sequence[int], *, micro_batch_size: int | None = None,
    max_tokens: int | None = None, packed: bool = False,
) -> list[list[int]]:
    """Row indices of each micro-batch.

    Fixed size (``--micro-batch-size``) keeps row order. Token budget (``--use-dynamic-batch-size
    --max-tokens-per-gpu N``) packs rows longest-first into micro-batches (first fit) whose size
    stays within ``max_tokens``: the sum of their real lengths when ``packed`` (the rows run
    concatenated, without padding), else rows x longest row (padded). A single row longer than
    the budget gets a micro-batch of its own.

    Raises:
        ValueError: Neither or both of ``micro_batch_size`` and ``max_tokens`` given, or < 1.
    """
    if (micro_batch_size is None) == (max_tokens is None):
        raise ValueError("give exactly one of micro_batch_size and max_tokens")
    rows = list(range(len(lengths)))
    if micro_batch_size is not None:
        if micro_batch_size < 1:
            raise ValueError(f"--micro-batch-size must be >= 1, got {micro_batch_size}")
        return [rows[i : i + micro_batch_size] for i in range(0, len(rows), micro_batch_size)]
    assert max_tokens is not None
    if max_tokens < 1:
        raise ValueError(f"--max-tokens-per-gpu must be >= 1, got {max_tokens}")
    bins: list[list[int]] = []
    for row in sorted(rows, key=lambda r: -lengths[r]):
        for members in bins:
            # rows arrive longest-first, so the first member fixes the padded width
            size = (sum(lengths[m] for m in members) + lengths[row] if packed
                    else (len(members) + 1) * lengths[members[0]])
            if size <= max_tokens:
                members.append(row)
                break
        else:
            bins.append([row])
    return bins
