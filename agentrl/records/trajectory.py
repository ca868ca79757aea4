"""Building one sample's token sequence token-in/token-out.

The sequence is the prompt ids, then, turn by turn, the ids the engine sampled (loss mask 1,
with the engine's log-probabilities) and the chat-template delta of the environment's reply
(loss mask 0, log-probability 0; see :mod:`agentrl.chat`). Nothing on this path decodes and
re-encodes text: decoding happens only to hand the model's text to the tool-call parser.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.engine.base import Engine, GenerateOutput, SamplingParams
from agentrl.records.sample import Sample, Turn, parse_version

__all__ = ["CUT_MARKER", "Trajectory", "fit_env_messages", "request_seed", "token_versions_of"]

CUT_MARKER = "\n[... {removed} characters of output cut to fit the context window]"
"""Appended to a tool result that was shortened to fit ``--rollout-max-context-len``."""


@dataclasses.dataclass
class Trajectory:
    """The growing token sequence of one sample, written into the :class:`Sample` itself.

    Args:
        sample: The sample to fill; its ``tokens`` must hold exactly the prompt ids.
        renderer: The chat renderer of the policy's tokenizer.
        max_context_len: Prompt + response tokens allowed in total.
    """

    sample: Sample
    renderer: ChatRenderer
    max_context_len: int
    weight_versions: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.end_of_turn_ids = self.renderer.encode(self.renderer.end_of_turn)

    @property
    def budget(self) -> int:
        """Tokens that can still be added before the context is full."""
        return self.max_context_len - len(self.sample.tokens)

    async def generate(
        self, engine: Engine, sampling: SamplingParams, rid: str, *, seed: int | None = None
    ) -> GenerateOutput | None:
        """Generates one assistant turn (or the rest of one cut by an abort) and appends it.

        ``max_new_tokens`` shrinks to the remaining budget. With ``seed`` (the run's
        ``--rollout-seed``) and no seed in ``sampling``, the request's sampling seed is derived
        from ``(seed, rid)``: the same request draws the same tokens in a resumed run, whatever
        else the engine is serving. Each token's weight version is recorded
        (:func:`token_versions_of`). Returns ``None`` when no budget is left.
        """
        budget = self.budget
        if budget <= 0:
            return None
        params = sampling.replace(max_new_tokens=min(sampling.max_new_tokens, budget))
        if seed is not None and params.sampling_seed is None:
            params = params.replace(sampling_seed=request_seed(seed, rid))
        started = time.perf_counter()
        submitted = engine.weight_version
        out = await engine.generate(list(self.sample.tokens), params, rid=rid)
        versions, exact = token_versions_of(out, submitted)
        if not exact:
            self.sample.metadata["versions_inexact"] = True
        self.append_assistant(out.output_ids, out.output_logprobs, finish_reason=out.finish_reason,
                              generate_s=time.perf_counter() - started,
                              weight_version=out.weight_version, token_versions=versions)
        if out.routed_experts is not None:  # every position so far but the last: the newest wins
            self.sample.routed_experts = out.routed_experts.head(len(self.sample.tokens) - 1)
        return out

    def append_assistant(
        self, ids: Sequence[int], logprobs: Sequence[float], *, finish_reason: str = "stop",
        generate_s: float = 0.0, weight_version: str | None = None,
        token_versions: Sequence[int] | None = None,
    ) -> None:
        """Appends an assistant turn (loss mask 1): the engine's ids, or a demonstration's.

        ``token_versions`` (one per id) default to ``weight_version`` for every id.
        """
        if token_versions is None:
            token_versions = [parse_version(weight_version)] * len(ids)
        elif len(token_versions) != len(ids):
            raise ValueError(f"{len(token_versions)} token versions for {len(ids)} ids")
        self._append(ids, logprobs, mask=1, versions=token_versions)
        turns = self.sample.turns
        span_start = self.sample.response_length - len(ids)
        if turns and turns[-1].role == "assistant" and turns[-1].finish_reason == "abort":
            turns[-1].end = self.sample.response_length  # an aborted turn resumed
            turns[-1].finish_reason = finish_reason
            turns[-1].generate_s += generate_s
        else:
            turns.append(Turn("assistant", span_start, self.sample.response_length,
                              finish_reason=finish_reason, generate_s=generate_s))
        if weight_version is not None:
            self.sample.weight_version = weight_version
            if not self.weight_versions or self.weight_versions[-1] != weight_version:
                self.weight_versions.append(weight_version)

    def last_turn_ids(self) -> list[int]:
        """The ids of the last assistant turn."""
        turn = self.sample.turns[-1]
        offset = self.sample.prompt_length
        return self.sample.tokens[offset + turn.start : offset + turn.end]

    def last_turn_text(self) -> str:
        """The last assistant turn as text for the tool-call parser (special tokens dropped)."""
        return self.renderer.tokenizer.decode(self.last_turn_ids(), skip_special_tokens=True)

    def append_env(
        self, history: Sequence[Mapping[str, Any]], new_messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None, *, tools_s: float = 0.0,
        min_generation_room: int = 1, cut: bool = True,
    ) -> tuple[list[dict[str, Any]], bool]:
        """Appends the environment's reply as the template delta (loss mask 0).

        When the last assistant turn did not end with the end-of-turn token (a stop string, or
        another end-of-sequence id), the end-of-turn token is added first, as an env token.
        Tool results too long for the remaining budget are cut, with :data:`CUT_MARKER`.

        Args:
            history: The conversation up to and including the last assistant message.
            new_messages: The environment's messages (tool results, user turns).
            tools: Tool schemas given to the chat template.
            tools_s: Seconds the tools took, recorded on the turn.
            min_generation_room: Tokens that must stay free for the next assistant turn.
            cut: False never shortens a message (an OpenAI client's messages are kept as sent):
                a reply too long for the budget does not fit.

        Returns:
            ``(messages as appended, fits)``. ``fits`` is False when even emptied tool results
            leave no room for another turn; nothing is appended then.
        """
        prefix: list[int] = []
        if self.last_turn_ids()[-len(self.end_of_turn_ids):] != self.end_of_turn_ids:
            prefix = list(self.end_of_turn_ids)
        room = self.budget - len(prefix) - min_generation_room
        if cut:
            messages, delta = fit_env_messages(self.renderer, history, new_messages, tools, room)
        else:
            messages = [dict(m) for m in new_messages]
            delta = self.renderer.env_delta_ids(history, messages, tools)
            delta = delta if len(delta) <= room else None
        if delta is None:
            return messages, False
        self.sample.turns[-1].tools_s = tools_s  # the assistant turn whose calls ran
        names = [str(m.get("name", "")) for m in messages if m.get("role") == "tool"]
        self.append_env_ids(prefix + delta, tool_names=names)
        return messages, True

    def append_env_ids(self, ids: Sequence[int], *, tool_names: Sequence[str] = ()) -> None:
        """Appends ids the model did not sample (loss mask 0) as one environment turn."""
        start = self.sample.response_length
        self._append(ids, None, mask=0)
        self.sample.turns.append(Turn("environment", start, self.sample.response_length,
                                      tool_names=list(tool_names)))

    def _append(self, ids: Sequence[int], logprobs: Sequence[float] | None, mask: int,
                versions: Sequence[int] | None = None) -> None:
        s = self.sample
        if len(s.token_versions) != s.response_length:  # a sample from before versions were kept
            s.token_versions[:] = [-1] * s.response_length
        s.token_versions.extend(versions if versions is not None else [-1] * len(ids))
        s.tokens.extend(int(i) for i in ids)
        s.response_length += len(ids)
        s.loss_mask.extend([mask] * len(ids))
        s.rollout_log_probs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


def fit_env_messages(
    renderer: ChatRenderer, history: Sequence[Mapping[str, Any]],
    new_messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
    room: int,
) -> tuple[list[dict[str, Any]], list[int] | None]:
    """The env delta for ``new_messages``, with tool results cut until it fits ``room`` tokens.

    Only ``role: tool`` contents are shortened (their tails are cut and :data:`CUT_MARKER` says
    how much); user and system messages are never altered.

    Returns:
        ``(messages, delta ids)``, or ``(messages, None)`` when it cannot fit even with every
        tool result emptied.
    """
    messages = [dict(m) for m in new_messages]
    delta = renderer.env_delta_ids(history, messages, tools)
    if len(delta) <= room:
        return messages, delta
    originals = [str(m.get("content") or "") for m in messages]
    cuttable = [i for i, m in enumerate(messages) if m.get("role") == "tool" and originals[i]]

    def cut(keep: float) -> tuple[list[dict[str, Any]], list[int]]:
        out = [dict(m) for m in messages]
        for i in cuttable:
            kept = int(len(originals[i]) * keep)
            out[i]["content"] = originals[i][:kept] + CUT_MARKER.format(removed=len(originals[i]) - kept)
        return out, renderer.env_delta_ids(history, out, tools)

    best = cut(0.0)
    if not cuttable or len(best[1]) > room:
        return messages, None
    low, high = 0.0, 1.0  # binary search for the largest kept fraction that fits
    for _ in range(14):
        middle = (low + high) / 2
        candidate = cut(middle)
        if len(candidate[1]) <= room:
            low, best = middle, candidate
        else:
            high = middle
    return best


def token_versions_of(out: GenerateOutput, submitted: str) -> tuple[list[int], bool]:
    """Each sampled token's weight version, and whether it is exact.

    An engine that reports per-token versions (embedded, vLLM) is exact. Otherwise every token
    gets the version served when the request was ``submitted``; that is exact when the output
    reports the same version, and otherwise (an update landed mid-request, so some tokens are
    newer) errs towards older tokens, so staleness is never under-counted.
    """
    if out.token_versions is not None and len(out.token_versions) == len(out.output_ids):
        return [parse_version(v) for v in out.token_versions], True
    return [parse_version(submitted)] * len(out.output_ids), out.weight_version == submitted


def request_seed(seed: int, rid: str) -> int:
    """A 63-bit sampling seed for request ``rid`` of a run seeded with ``seed``."""
    digest = hashlib.blake2b(f"{seed}:{rid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1
