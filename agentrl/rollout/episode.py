"""Playing one episode token-in/token-out: the default generate function of the rollout.

An episode alternates engine turns and environment steps until the env ends it, the turn limit
truncates it, the context is full, or the engine stops it. Its fate is the sample's status:

========================================  ===========  ==============================
what happened                              status       ``metadata["finish"]``
========================================  ===========  ==============================
final answer / ``submit`` (env terminated) completed    ``env``
no env: the engine stopped (stop token)    completed    ``stop``
``--max-turns`` reached (env truncated)    truncated    ``max_turns``
a turn hit ``--rollout-max-response-len``  truncated    ``length``
context full (``--rollout-max-context-len``) truncated  ``context``
engine aborted the request                 aborted      ``abort`` (resumable)
env, tool plumbing or template crashed     failed       ``error`` (``metadata["error"]``)
========================================  ===========  ==============================
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.env import ToolEnv
from agentrl.rollout.engine.base import Engine, SamplingParams
from agentrl.rollout.sample import Sample, Status
from agentrl.rollout.trajectory import Trajectory

__all__ = ["Episode", "RolloutContext", "prompt_messages"]

log = logging.getLogger(__name__)

RESPONSE_ROOM = 64
"""Tokens kept free for the next assistant turn when tool output must be cut to fit."""


@dataclasses.dataclass
class RolloutContext:
    """What every episode of a rollout shares.

    Attributes:
        args: The run's arguments (a :class:`~agentrl.rollout.RolloutConfig` or namespace);
            handed to plug-ins.
        engine: The policy engine.
        renderer: Chat renderer of the policy's tokenizer (token-exact env deltas).
        sampling: Sampling parameters of a turn (``max_new_tokens`` = per-turn cap).
        max_context_len: Prompt + response tokens allowed per sample.
        env_factory: Makes a fresh env per episode; ``None`` for single-turn prompts.
        stopping: Set when the rollout has enough groups: episodes stop before their next
            engine request (as aborted), in-flight requests are aborted by the rollout.
        seed: The run's ``--rollout-seed``: each request's sampling seed derives from it and the
            request id, so sampling is reproducible (``None``: the engine's own stream).
    """

    args: Any
    engine: Engine
    renderer: ChatRenderer
    sampling: SamplingParams
    max_context_len: int
    env_factory: Callable[[], ToolEnv] | None = None
    stopping: threading.Event = dataclasses.field(default_factory=threading.Event)
    seed: int | None = None


def prompt_messages(prompt: Any) -> list[dict[str, Any]]:
    """A sample's prompt as chat messages (a text prompt becomes one user message)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(m) for m in prompt]


class Episode:
    """One sample's episode; :meth:`run` plays it, and plays on after an abort.

    Args:
        ctx: The shared rollout context.
        sample: The sample to fill (fresh, or one this episode already started).
        rid: Request-id prefix of the episode's engine requests (abort matches by prefix).
    """

    def __init__(self, ctx: RolloutContext, sample: Sample, rid: str) -> None:
        self.ctx = ctx
        self.sample = sample
        self.rid = rid
        self.env: ToolEnv | None = None
        self.history: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] | None = None
        self.trajectory: Trajectory | None = None
        self.done = False
        self._turn = 0

    async def run(self) -> Sample:
        """Plays until the episode ends or is aborted; never raises for env or tool failures.

        Returns:
            The sample, with status, tokens, loss mask, log-probs, reward and per-turn records.
        """
        try:
            if self.trajectory is None:
                await self._start()
            await self._play()
        except Exception as exc:  # noqa: BLE001 - an env crash fails one sample, not the batch
            self._finish(Status.FAILED, "error")
            self.sample.reward = 0.0
            self.sample.metadata["error"] = f"{type(exc).__name__}: {exc}"
            self.sample.metadata["traceback"] = traceback.format_exc(limit=8)
            log.warning("episode %s failed: %s: %s", self.rid, type(exc).__name__, exc)
        if self.done:
            await self.close()
        return self.sample

    async def close(self) -> None:
        """Closes the env (idempotent); an aborted episode closed here cannot resume."""
        env, self.env = self.env, None
        if env is not None:
            await env.aclose()

    async def _start(self) -> None:
        sample, renderer = self.sample, self.ctx.renderer
        if self.ctx.env_factory is not None:
            self.env = self.ctx.env_factory()
            options = {"task": sample.metadata["task"]} if "task" in sample.metadata else None
            observation, info = await self.env.areset(seed=sample.metadata.get("seed"), options=options)
            self.history = [dict(m) for m in observation]
            self.tools = list(info["tools"]) or None
            sample.metadata.setdefault("task_id", info["task"].get("task_id", info["task"].get("id")))
        else:
            self.history = prompt_messages(sample.prompt)
        if not sample.prompt:
            sample.prompt = [dict(m) for m in self.history]
        sample.tokens = renderer.prompt_ids(self.history, self.tools)
        sample.response_length = 0
        sample.loss_mask, sample.rollout_log_probs, sample.turns = [], [], []
        if len(sample.tokens) >= self.ctx.max_context_len:
            self.trajectory = Trajectory(sample, renderer, self.ctx.max_context_len)
            self._finish(Status.TRUNCATED, "context")
            sample.metadata["error"] = (f"the prompt has {len(sample.tokens)} tokens; "
                                        f"--rollout-max-context-len is {self.ctx.max_context_len}")
            return
        self.trajectory = Trajectory(sample, renderer, self.ctx.max_context_len)

    async def _play(self) -> None:
        trajectory, sample = self.trajectory, self.sample
        assert trajectory is not None
        while not self.done:
            if self.ctx.stopping.is_set():
                sample.status = Status.ABORTED
                sample.metadata["finish"] = "abort"
                return None
            out = await trajectory.generate(self.ctx.engine, self.ctx.sampling,
                                            f"{self.rid}-t{self._turn}", seed=self.ctx.seed)  # fmt: skip
            if out is None:
                return self._finish(Status.TRUNCATED, "context")
            if out.finish_reason == "abort":
                sample.status = Status.ABORTED
                sample.metadata["finish"] = "abort"
                return None
            self._turn += 1
            if out.finish_reason == "length":
                return self._finish(Status.TRUNCATED, "length")
            if self.env is None:
                return self._finish(Status.COMPLETED, "stop")
            observation, reward, terminated, truncated, info = await self.env.astep(
                trajectory.last_turn_text())
            errors = sample.metadata.setdefault("tool_errors", {})
            for kind, count in info["tool_errors"].items():
                errors[kind] = errors.get(kind, 0) + count
            sample.turns[-1].tool_names = list(info["tool_calls"])
            sample.turns[-1].tools_s = info["timings"]["tools_s"]
            sample.turns[-1].reward_s = info["timings"]["reward_s"]
            if terminated:
                sample.reward = reward
                return self._finish(Status.COMPLETED, "env")
            self.history.append(self._assistant_message(len(observation)))
            if truncated:
                return self._finish(Status.TRUNCATED, "max_turns")
            appended, fits = trajectory.append_env(
                self.history, observation, self.tools, tools_s=info["timings"]["tools_s"],
                min_generation_room=min(RESPONSE_ROOM, self.ctx.sampling.max_new_tokens))
            if not fits:
                return self._finish(Status.TRUNCATED, "context")
            cut = sum(1 for m, o in zip(appended, observation, strict=True) if m != o)
            if cut:
                sample.metadata["tool_outputs_cut"] = sample.metadata.get("tool_outputs_cut", 0) + cut
            self.history.extend(appended)
        return None

    def _assistant_message(self, n_new: int) -> dict[str, Any]:
        """The env's parsed record of the assistant turn just played."""
        assert self.env is not None
        message: Mapping[str, Any] = self.env.messages[-(n_new + 1)]
        return dict(message)

    def _finish(self, status: Status, finish: str) -> None:
        sample = self.sample
        sample.status = status
        sample.metadata["finish"] = finish
        sample.metadata["turns"] = self._turn
        if sample.reward is None:
            sample.reward = 0.0
        if self.trajectory is not None:
            tokenizer = self.ctx.renderer.tokenizer
            sample.response = tokenizer.decode(
                sample.tokens[sample.prompt_length :], skip_special_tokens=True)
            if len(self.trajectory.weight_versions) > 1:
                sample.metadata["weight_versions"] = list(self.trajectory.weight_versions)
        self.done = True
