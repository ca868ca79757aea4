"""Engine stand-ins and adapters for rollout tests and benches.

:class:`ScriptedEngine`: a scripted :class:`~agentrl.engine.Engine`.

It plays a policy written as a Python function: ``policy(text_so_far, rid) -> reply text``. The
reply is tokenized and returned as the sampled ids (ending with the end-of-turn id), with
deterministic pseudo log-probabilities, so rollout tests run in milliseconds and can check every
token. It honours ``max_new_tokens`` (finish ``length``), abort by rid prefix and pause.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from agentrl.engine.base import Engine, GenerateOutput, SamplingParams
from agentrl.tools.calls import ParsedTurn, ToolCall
from agentrl.tools.formats.base import ToolCallFormat


class ScriptedEngine(Engine):
    def __init__(self, tokenizer: Any, policy: Callable[[str, str], str], *,
                 end_of_turn: str = "<|im_end|>",
                 delay_s: float | Callable[[str], float] = 0.0) -> None:
        self.tokenizer = tokenizer
        self.policy = policy
        self.eot_ids = tokenizer.encode(end_of_turn, add_special_tokens=False)
        self.delay_s = delay_s
        self.requests: list[tuple[str, list[int]]] = []
        self.version = "0"
        self._aborted: set[str] = set()
        self._inflight: dict[str, asyncio.Event] = {}
        self._paused = asyncio.Event()
        self._paused.set()

    async def generate(self, input_ids, sampling: SamplingParams, rid=None) -> GenerateOutput:
        rid = rid or f"req{len(self.requests)}"
        self.requests.append((rid, list(input_ids)))
        await self._paused.wait()
        cancel = asyncio.Event()
        self._inflight[rid] = cancel
        try:
            delay = self.delay_s(rid) if callable(self.delay_s) else self.delay_s
            if delay:
                try:
                    await asyncio.wait_for(cancel.wait(), delay)
                except TimeoutError:
                    pass
            ids = self._reply(list(input_ids), rid)
            rng = random.Random(f"{rid}:{len(input_ids)}")
            finish, matched = "stop", self.eot_ids[-1]
            if cancel.is_set():
                ids, finish, matched = ids[: len(ids) // 2], "abort", None
            elif len(ids) > sampling.max_new_tokens:
                ids, finish, matched = ids[: sampling.max_new_tokens], "length", None
            logprobs = [-rng.random() for _ in ids]
            return GenerateOutput(ids, logprobs, finish, self.version, len(input_ids), matched)
        finally:
            self._inflight.pop(rid, None)

    def _reply(self, input_ids: list[int], rid: str) -> list[int]:
        """The policy's reply ids; after an abort, only the part not generated yet."""
        header = self.tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
        starts = [i for i in range(len(input_ids) - len(header) + 1)
                  if input_ids[i : i + len(header)] == header]
        cut = starts[-1] + len(header) if starts else len(input_ids)
        text = self.policy(self.tokenizer.decode(input_ids[:cut]), rid)
        reply = self.tokenizer.encode(text, add_special_tokens=False) + self.eot_ids
        already = input_ids[cut:]
        return reply[len(already) :] if reply[: len(already)] == already else reply

    async def update_weights(self, *, state_dict=None, path=None, version: str) -> None:
        self.version = version

    async def pause(self, mode="abort") -> None:
        self._paused.clear()
        if mode == "abort":
            await self.abort("")

    async def resume(self) -> None:
        self._paused.set()

    async def abort(self, rid_prefix: str = "") -> int:
        hits = [e for rid, e in self._inflight.items() if rid.startswith(rid_prefix)]
        for event in hits:
            event.set()
        return len(hits)

    async def health(self) -> bool:
        return True

    @property
    def weight_version(self) -> str:
        return self.version

    async def close(self) -> None:
        await self.abort("")


class FixedLengthTurns(Engine):
    """Wraps an engine so a turn that hits ``max_new_tokens`` counts as stopped.

    A random-init model practically never writes its end-of-turn token; this lets tests and
    benches play multi-turn episodes with it (the episode runner appends the end-of-turn token
    as an environment token, loss mask 0)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def generate(self, input_ids, sampling, rid=None):
        out = await self.engine.generate(input_ids, sampling, rid)
        if out.finish_reason == "length":
            out.finish_reason = "stop"
        return out

    async def update_weights(self, **kwargs):
        await self.engine.update_weights(**kwargs)

    async def pause(self, mode="abort"):
        await self.engine.pause(mode)

    async def resume(self):
        await self.engine.resume()

    async def abort(self, rid_prefix=""):
        return await self.engine.abort(rid_prefix)

    async def health(self):
        return await self.engine.health()

    @property
    def weight_version(self):
        return self.engine.weight_version

    async def close(self):
        await self.engine.close()


class EveryTurnCalls(ToolCallFormat):
    """Reads any assistant text as one call to ``tool_name`` with no arguments (for random-init
    models, which write no tool-call markup)."""

    def __init__(self, tool_name: str) -> None:
        self.name = f"every-turn-calls-{tool_name}"
        self.tool_name = tool_name

    def render(self, content, calls):
        return content

    def parse(self, text):
        return ParsedTurn(text.strip(), (ToolCall(self.tool_name, {}),))
