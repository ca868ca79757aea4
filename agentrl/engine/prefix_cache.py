"""Keys and values of finished requests, kept so that the next turn of an episode computes only
what it adds.

A multi-turn episode sends the engine its whole conversation every turn: the previous turn's
prompt, the tokens the engine sampled, then the environment's reply. Without a cache every turn
recomputes the conversation from its first token; on a real model and a long conversation that
prefill costs as much as the turn's decoding. :class:`PrefixStore` keeps, for each finished
request, the keys and values of every position the engine computed (its prompt and all sampled
tokens but the last), and finds for a new request the stored sequence sharing the longest
prefix with it. The engine copies those positions into the new request's slot and runs only
the rest (:meth:`~agentrl.engine.model.DecoderModel.extend`).

What is and is not reused:

* The stored values are those of the weights that computed them: the engine empties the store
  whenever its weights change, so a hit always equals a recomputation (to float rounding: the
  suffix attends to the same keys and values, computed in other batch shapes).
* Reuse needs equal token ids from position 0, which token-in/token-out rollouts give by
  construction (a turn's prompt is the previous sequence plus the env's delta). Samples of one
  GRPO group share their prompt, so a group's later samples reuse its first one's prompt.
* Memory is bounded by ``budget_bytes`` (and the entries by ``max_entries``): the least
  recently used entries are dropped first, and an entry that is a prefix of a newer one is
  dropped when the newer one is stored.
* A hit needs at least ``min_tokens`` common tokens, and one token of the request is always
  computed (its logits give the first output token).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import torch

__all__ = ["PrefixHit", "PrefixStore"]


@dataclasses.dataclass(frozen=True)
class PrefixHit:
    """The stored keys and values of the first ``length`` positions of a request (and, for a
    mixture of experts, the experts each was routed to)."""

    length: int
    k: torch.Tensor  # [layers, length, kv_heads, dim]
    v: torch.Tensor  # [layers, length, kv_heads, dim]
    routes: torch.Tensor | None = None  # [length, layers, topk]


@dataclasses.dataclass
class _Entry:
    tokens: torch.Tensor  # [n] int64: the ids whose keys and values are stored
    k: torch.Tensor  # [layers, n, kv_heads, dim]
    v: torch.Tensor
    used: int  # recency stamp
    routes: torch.Tensor | None = None  # [n, layers, topk]

    @property
    def nbytes(self) -> int:
        routes = self.routes.numel() * self.routes.element_size() if self.routes is not None else 0
        return 2 * self.k.numel() * self.k.element_size() + routes


class PrefixStore:
    """An LRU store of finished sequences' keys and values, looked up by longest common prefix.

    Not thread-safe: the engine's scheduler thread owns it.

    Args:
        budget_bytes: Most bytes of keys and values held; 0 disables the store.
        min_tokens: Shortest common prefix worth a hit.
        max_entries: Most sequences held (a lookup compares the request with each).
    """

    def __init__(self, budget_bytes: int, min_tokens: int = 16, max_entries: int = 256) -> None:
        self.budget_bytes = int(budget_bytes)
        self.min_tokens = int(min_tokens)
        self.max_entries = int(max_entries)
        self._entries: list[_Entry] = []
        self._clock = itertools.count()
        self.nbytes = 0
        """Bytes held now."""

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drops every entry (the weights changed, or memory is needed)."""
        self._entries.clear()
        self.nbytes = 0

    def keeps(self, length: int) -> bool:
        """Whether :meth:`add` would keep a sequence of ``length`` positions at all (so the
        caller copies its keys and values only then)."""
        return self.budget_bytes > 0 and length >= self.min_tokens

    def lookup(self, input_ids: Sequence[int]) -> PrefixHit | None:
        """The stored positions sharing the longest prefix with ``input_ids`` (at most all but
        its last token), or ``None`` below ``min_tokens``."""
        if not self._entries or len(input_ids) <= self.min_tokens:
            return None
        ids = torch.as_tensor(list(input_ids), dtype=torch.long)
        best, best_len = None, 0
        for entry in self._entries:
            n = min(len(entry.tokens), len(ids) - 1)
            differs = (entry.tokens[:n] != ids[:n]).nonzero()
            common = int(differs[0]) if len(differs) else n
            if common > best_len:
                best, best_len = entry, common
        if best is None or best_len < self.min_tokens:
            return None
        best.used = next(self._clock)
        routes = best.routes[:best_len] if best.routes is not None else None
        return PrefixHit(best_len, best.k[:, :best_len], best.v[:, :best_len], routes)

    def add(self, tokens: Sequence[int], k: torch.Tensor, v: torch.Tensor,
            routes: torch.Tensor | None = None) -> None:
        """Stores a finished sequence's keys and values ``[layers, len(tokens), kv_heads, dim]``
        (and routes ``[len(tokens), layers, topk]``); drops stored prefixes of it, then the least
        recently used entries over the budget."""
        if not self.keeps(len(tokens)):
            return
        ids = torch.as_tensor(list(tokens), dtype=torch.long)
        entry = _Entry(ids, k, v, next(self._clock), routes)
        if entry.nbytes > self.budget_bytes:
            return
        self._entries = [e for e in self._entries
                         if not (len(e.tokens) <= len(ids) and torch.equal(e.tokens, ids[: len(e.tokens)]))]
        self._entries.append(entry)
        self._entries.sort(key=lambda e: e.used)
        self.nbytes = sum(e.nbytes for e in self._entries)
        while self.nbytes > self.budget_bytes or len(self._entries) > self.max_entries:
            self.nbytes -= self._entries.pop(0).nbytes
