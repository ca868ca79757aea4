"""Playing one episode: the one loop every rollout, demonstration and evaluation goes through.

An episode alternates assistant turns and environment steps until the env ends it, the turn
limit truncates it, the context is full, or the turn source stops it. Where the assistant turns
come from is a :class:`TurnSource`: the engine's sampled tokens (:class:`EngineTurns`, training
and model evaluation), or a scripted policy such as the env's oracle (:class:`ScriptedTurns`,
demonstrations and ``agentrl eval --policy oracle``). Custom generate functions drive the same
:class:`Episode` step by step (:mod:`agentrl.rollout.custom`); black-box agents play it through
the gateway (:mod:`agentrl.rollout.agents`).

With a chat renderer the episode is built token-in/token-out into the sample (prompt ids, the
turns' ids with loss mask 1, the env's replies as template deltas with loss mask 0; see
:mod:`agentrl.records.trajectory`). Without one (a scripted evaluation, no model) it plays
messages only and the sample has no tokens.

Every played sample also keeps, for logs and ``agentrl view``, its conversation as chat
messages (``metadata["messages"]``) and what the env recorded of the episode
(:meth:`~agentrl.env.ToolEnv.episode_record`: ``grade``, and a sandboxed env's ``commands``).

The episode's fate is the sample's status:

========================================  ===========  ==============================
what happened                              status       ``metadata["finish"]``
========================================  ===========  ==============================
final answer / ``submit`` (env terminated) completed    ``env``
no env: the engine stopped (stop token)    completed    ``stop``
``--max-turns`` reached (env truncated)    truncated    ``max_turns``
a turn hit ``--rollout-max-response-len``  truncated    ``length``
context full (``--rollout-max-context-len``) truncated  ``context``
the prompt alone fills the context         skipped      ``overlong_prompt`` (not played)
engine aborted the request                 aborted      ``abort`` (resumable)
a black-box agent returned                 completed    ``agent``
a black-box agent ran past its timeout     truncated    ``agent_timeout``
env, tool plumbing, policy or template     failed       ``error`` (``metadata["error"]``)
crashed
the sandbox's host died (SandboxLost)      failed       ``sandbox_lost`` (played again
                                                        with ``--use-fault-tolerance``)
========================================  ===========  ==============================
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import logging
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from agentrl.chat import ChatRenderer
from agentrl.engine.base import Engine, SamplingParams
from agentrl.env import ToolEnv
from agentrl.env.factory import EnvFactory
from agentrl.errors import EnvServerLost
from agentrl.records.sample import Sample, Status, Turn
from agentrl.records.trajectory import Trajectory
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.overlong import OVERLONG_FINISH, fit_prompt
from agentrl.rollout.rewards import RewardModels
from agentrl.sandbox.base import SandboxLost
from agentrl.tools.calls import ToolCall

__all__ = [
    "ENV_SERVER_LOST",
    "LOST_RESOURCE_FINISHES",
    "SANDBOX_LOST",
    "EngineTurns",
    "Episode",
    "RolloutContext",
    "ScriptedTurns",
    "TurnOutput",
    "TurnSource",
    "prompt_messages",
    "task_id_of",
]

log = logging.getLogger(__name__)

SANDBOX_LOST = "sandbox_lost"
"""``metadata["finish"]`` of an episode whose sandbox's host died (see :class:`SandboxLost`)."""

ENV_SERVER_LOST = "env_server_lost"
"""``metadata["finish"]`` of an episode whose environment server went away
(:class:`~agentrl.errors.EnvServerLost`: an OpenEnv server that stopped or stopped answering)."""

LOST_RESOURCE_FINISHES = (SANDBOX_LOST, ENV_SERVER_LOST)
"""Finishes the model did not cause: such an episode may be played again (the runner's retries)."""

RESPONSE_ROOM = 64
"""Tokens kept free for the next assistant turn when tool output must be cut to fit."""

Policy = Callable[[ToolEnv, Mapping[str, Any], Sequence[Mapping[str, Any]]], Any]
"""A scripted policy: ``(env, task, history) -> action`` (an assistant message or text)."""


@dataclasses.dataclass(frozen=True)
class TurnOutput:
    """One assistant turn from a :class:`TurnSource`.

    Attributes:
        action: What the env steps with: the turn's text, or an assistant message dict.
        finish_reason: ``stop`` (the turn is complete), ``length`` (cut by the per-turn token
            cap) or ``abort`` (stopped; the episode may resume).
    """

    action: str | Mapping[str, Any]
    finish_reason: str = "stop"


class AgentPlay(Protocol):
    """A black-box agent that plays every episode of a context instead of its turn source, with
    the gateway it plays through (:class:`agentrl.rollout.agents.AgentPlayer`)."""

    @property
    def name(self) -> str:
        """The agent's name, for labels."""

    async def play(self, episode: Episode, *, evaluation: bool) -> list[Sample]:
        """Plays ``episode``; returns its samples (one per gateway segment)."""

    async def aclose(self) -> None:
        """Stops the gateway."""


class TurnSource(abc.ABC):
    """Where an episode's assistant turns come from."""

    name: str = "turns"

    @abc.abstractmethod
    async def next_turn(self, episode: Episode, rid: str) -> TurnOutput | None:
        """Produces the next assistant turn of ``episode`` (and, when the episode keeps tokens,
        appends its ids to ``episode.trajectory``).

        Args:
            episode: The episode being played.
            rid: The request id of this turn (engine requests; abort matches by prefix).

        Returns:
            The turn, or ``None`` when the context has no room left for one.
        """


class EngineTurns(TurnSource):
    """Turns sampled by the policy engine, token-in/token-out.

    Args:
        engine: The engine.
        sampling: Per-turn sampling parameters (``max_new_tokens`` shrinks to the budget).
        seed: The run's ``--rollout-seed``: each request's sampling seed derives from it and
            the request id (``None``: the engine's own stream).
    """

    name = "engine"

    def __init__(self, engine: Engine, sampling: SamplingParams, seed: int | None = None) -> None:
        self.engine = engine
        self.sampling = sampling
        self.seed = seed

    async def next_turn(self, episode: Episode, rid: str) -> TurnOutput | None:
        trajectory = episode.trajectory
        if trajectory is None:
            raise RuntimeError("engine turns need a chat renderer (token ids)")
        out = await trajectory.generate(self.engine, self.sampling, rid, seed=self.seed)
        if out is None:
            return None
        return TurnOutput(trajectory.last_turn_text(), out.finish_reason)


class ScriptedTurns(TurnSource):
    """Turns written by a scripted policy, e.g. the env's oracle.

    When the episode keeps tokens (a demonstration for a supervised warm start), each action is
    written as the model would write it (the env's tool-call format), then encoded with the
    end-of-turn token: loss mask 1, log-probabilities 0. Otherwise the action goes to the env
    as it is.

    Args:
        policy: ``(env, task, history) -> action``.
        name: Shown in results (``oracle``, ``null``).
    """

    def __init__(self, policy: Policy, name: str) -> None:
        self.policy = policy
        self.name = name

    async def next_turn(self, episode: Episode, rid: str) -> TurnOutput | None:
        env = episode.env
        if env is None or env.state is None:
            raise RuntimeError(f"the {self.name} policy needs an env (--env)")
        started = time.perf_counter()
        action = self.policy(env, env.state.task, env.messages)
        policy_s = time.perf_counter() - started
        trajectory = episode.trajectory
        if trajectory is None:
            episode.sample.turns.append(Turn("assistant", 0, 0, finish_reason="stop",
                                             generate_s=policy_s))
            return TurnOutput(action)
        text = action_text(env, action)
        renderer = trajectory.renderer
        ids = renderer.encode(text) + trajectory.end_of_turn_ids
        if len(ids) > trajectory.budget:
            return None
        trajectory.append_assistant(ids, [0.0] * len(ids), generate_s=policy_s)
        return TurnOutput(text)


def oracle_policy(env: ToolEnv, task: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> Any:
    """The env's scripted expert (:meth:`ToolEnv.oracle_action`)."""
    return env.oracle_action(task, history)


def null_policy(env: ToolEnv, task: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> Any:
    """A policy that does no work (:meth:`ToolEnv.null_action`)."""
    return env.null_action(task, history)


SCRIPTED_POLICIES: dict[str, Policy] = {"oracle": oracle_policy, "null": null_policy}
"""The scripted policies ``agentrl eval --policy`` knows besides ``model``."""


def action_text(env: ToolEnv, action: Any) -> str:
    """An action as the raw text a model would write (in the env's tool-call format)."""
    if isinstance(action, str):
        return action
    calls = [c if isinstance(c, ToolCall) else ToolCall(c["name"], dict(c.get("arguments") or {}))
             for c in action.get("tool_calls") or ()]
    return env.format.render(str(action.get("content") or ""), calls)


@dataclasses.dataclass
class RolloutContext:
    """What every episode of a rollout (or an evaluation) shares.

    Attributes:
        config: The rollout settings, resolved: ``max_turns`` holds the turn limit episodes
            run under (the env's own when ``--max-turns`` was not given). Plug-ins receive it
            as ``args``.
        engine: The policy engine (``None`` for a scripted evaluation).
        renderer: Chat renderer of the policy's tokenizer (``None``: no tokens are kept).
        sampling: Sampling parameters of a turn (``max_new_tokens`` = per-turn cap).
        max_context_len: Prompt + response tokens allowed per sample.
        envs: Makes the run's envs; ``None`` for single-turn prompts without an env.
        turns: Where assistant turns come from (default: the engine's sampled turns).
        rewards: The run's reward plug-ins (``--custom-rm-path``, per-row ones), loaded once.
        stopping: Set when the rollout has enough groups: episodes stop before their next
            turn (as aborted); in-flight engine requests are aborted by the rollout.
        agents: The black-box agent that plays every episode instead of the turn source
            (``--agent-function-path`` / ``--agent-command``), with its gateway.
    """

    config: RolloutConfig
    engine: Engine | None
    renderer: ChatRenderer | None
    sampling: SamplingParams
    max_context_len: int
    envs: EnvFactory | None = None
    turns: TurnSource | None = None
    rewards: RewardModels | None = None
    stopping: threading.Event = dataclasses.field(default_factory=threading.Event)
    agents: AgentPlay | None = None

    def __post_init__(self) -> None:
        if self.rewards is None:
            self.rewards = RewardModels(self.config)
        if self.turns is None:
            if self.engine is None:
                raise ValueError("a rollout context needs an engine or a turn source")
            self.turns = EngineTurns(self.engine, self.sampling, self.config.rollout_seed)

    async def aclose(self) -> None:
        """Stops what the context started (the black-box agents' gateway)."""
        if self.agents is not None:
            await self.agents.aclose()

    @property
    def args(self) -> RolloutConfig:
        """The config, under the name plug-ins know it by (``custom_generate(args, ...)``)."""
        return self.config

    @property
    def max_turns(self) -> int:
        """The turn limit (resolved)."""
        assert self.config.max_turns is not None
        return self.config.max_turns

    @property
    def sandbox_retries(self) -> int:
        """How many times an episode whose sandbox was lost is played again (the env
        factory's, set by ``--use-fault-tolerance`` with ``--sandbox-placement ray``)."""
        return self.envs.sandbox_retries if self.envs is not None else 0


def prompt_messages(prompt: Any) -> list[dict[str, Any]]:
    """A sample's prompt as chat messages (a text prompt becomes one user message)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(m) for m in prompt]


def task_id_of(task: Mapping[str, Any] | None, default: Any = None) -> Any:
    """A task's id: its ``id`` key, else ``task_id``, else ``default``."""
    task = task or {}
    return task.get("id", task.get("task_id", default))


class Episode:
    """One sample's episode; :meth:`run` plays it, and plays on after an abort.

    Args:
        ctx: The shared rollout context.
        sample: The sample to fill (fresh, or one this episode already started).
        rid: Request-id prefix of the episode's engine requests (abort matches by prefix).
        turns: The turn source (default: the context's).
    """

    def __init__(self, ctx: RolloutContext, sample: Sample, rid: str, *,
                 turns: TurnSource | None = None) -> None:
        self.ctx = ctx
        self.sample = sample
        self.rid = rid
        self.source = turns or ctx.turns
        self.env: ToolEnv | None = None
        self.history: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] | None = None
        self.trajectory: Trajectory | None = None
        self.started = False
        self._started_at = 0.0
        self.done = False
        self.turn = 0
        self.last_text = ""

    async def run(self) -> Sample:
        """Plays until the episode ends or is aborted; never raises for env, tool or policy
        failures (they fail the sample, with the reason in ``metadata["error"]``).

        Returns:
            The sample, with status, tokens, loss mask, log-probs, reward and per-turn records.
        """
        try:
            if not self.started:
                await self.start()
            await self._play()
        except Exception as exc:  # noqa: BLE001 - an env crash fails one sample, not the batch
            self.fail(exc)
        except asyncio.CancelledError:  # the run is stopping: the env's sandbox goes with it
            self._abort()
            await asyncio.shield(self.close())
            raise
        if self.done:
            if self.sample.reward is None:  # ended without a score (truncated, failed)
                self.sample.reward = 0.0
            await self.close()
        return self.sample

    async def start(self) -> None:
        """Resets the env with the sample's task (or seed) and writes the prompt (and its ids).

        A prompt that leaves no room for a response is measured without tokenizing more of it
        than the context holds (:mod:`agentrl.rollout.overlong`). With ``--overlong-prompts
        cut`` its longest user message is cut to fit (``metadata["prompt_cut"]``: characters
        cut); otherwise, or when it cannot be cut, the episode ends at once: status
        ``skipped``, finish ``overlong_prompt``, no tokens, the reason in
        ``metadata["error"]``.
        """
        sample, renderer = self.sample, self.ctx.renderer
        self.started = True
        self._started_at = time.perf_counter()
        if self.ctx.envs is not None:
            self.env = self.ctx.envs()
            options = {"task": sample.metadata["task"]} if "task" in sample.metadata else None
            observation, info = await self.env.areset(seed=sample.metadata.get("seed"), options=options)
            self.history = [dict(m) for m in observation]
            self.tools = list(info["tools"]) or None
            assert self.env.state is not None
            sample.metadata.setdefault("task_id", task_id_of(self.env.state.task))
        else:
            self.history = prompt_messages(sample.prompt)
        if not sample.prompt:
            sample.prompt = [dict(m) for m in self.history]
        sample.response_length = 0
        sample.loss_mask, sample.rollout_log_probs, sample.turns = [], [], []
        sample.token_versions = []
        sample.routed_experts = None
        if renderer is None:
            sample.tokens = []
            return
        limit, mode = self.ctx.max_context_len, self.ctx.config.overlong_prompts
        fitted = fit_prompt(renderer, self.history, self.tools, limit, mode=mode,
                            response_room=self.ctx.sampling.max_new_tokens)
        if fitted.ids is None:
            sample.tokens = []  # never the prompt's ids: they are what exhausts memory
            why = f" and cannot be cut: {fitted.reason}" if mode == "cut" else ""
            fix = "" if mode == "cut" else ", or pass --overlong-prompts cut"
            sample.metadata["error"] = (
                f"the prompt has at least {fitted.tokens} tokens (rendered with the chat "
                f"template), leaving no room for a response in the context of {limit} "
                f"(--rollout-max-context-len){why}; shorten it{fix}")
            self.finish(Status.SKIPPED, OVERLONG_FINISH)
            return
        if fitted.cut_chars:
            self.history = fitted.messages
            # what the model sees; a text prompt stays text when it is the only message
            one_text = isinstance(sample.prompt, str) and len(fitted.messages) == 1
            sample.prompt = (fitted.messages[0]["content"] if one_text
                             else [dict(m) for m in fitted.messages])
            sample.metadata["prompt_cut"] = fitted.cut_chars
        sample.tokens = fitted.ids
        self.trajectory = Trajectory(sample, renderer, limit)

    async def next_turn(self, source: TurnSource | None = None) -> TurnOutput | None:
        """One assistant turn from ``source`` (default: the episode's), counted; ``None`` when
        the context is full or the episode is stopping (its status then says which)."""
        if self.ctx.stopping.is_set():
            self._abort()
            return None
        out = await (source or self.source).next_turn(self, f"{self.rid}-t{self.turn}")
        if out is None:
            self.finish(Status.TRUNCATED, "context")
            return None
        if out.finish_reason == "abort":
            self._abort()
            return None
        self.turn += 1
        self.last_text = out.action if isinstance(out.action, str) else str(out.action.get("content") or "")
        return out

    def append_env(self, history: Sequence[Mapping[str, Any]],
                   messages: Sequence[Mapping[str, Any]], tools_s: float = 0.0
                   ) -> list[dict[str, Any]] | None:
        """Adds the env's reply to the sample (the template delta, loss mask 0), tool results
        cut to fit the context when needed (counted in ``metadata["tool_outputs_cut"]``; each
        in ``metadata["cut_messages"]``: its index in the conversation, its length and the
        length the model saw).

        Args:
            history: The conversation up to and including the last assistant message.
            messages: The env's new messages.
            tools_s: Seconds the tools took.

        Returns:
            The messages as the model will see them, or ``None`` when even emptied tool results
            do not fit (the episode is then truncated, ``context``).
        """
        if self.trajectory is None:
            return [dict(m) for m in messages]
        room = min(RESPONSE_ROOM, self.ctx.sampling.max_new_tokens)
        appended, fits = self.trajectory.append_env(history, messages, self.tools, tools_s=tools_s,
                                                    min_generation_room=room)
        if not fits:
            self.finish(Status.TRUNCATED, "context")
            return None
        cut = [(len(history) + i, o, m) for i, (m, o) in enumerate(zip(appended, messages, strict=True))
               if m != o]
        if cut:
            meta = self.sample.metadata
            meta["tool_outputs_cut"] = meta.get("tool_outputs_cut", 0) + len(cut)
            # which messages of the conversation the model saw shortened, and by how much
            meta.setdefault("cut_messages", []).extend(
                {"message": index, "original_chars": len(str(o.get("content") or "")),
                 "shown_chars": len(str(m.get("content") or ""))} for index, o, m in cut)
        return appended

    def finish(self, status: Status, finish: str) -> None:
        """Ends the episode: status, finish reason, turn count, response text."""
        sample = self.sample
        sample.status = status
        sample.metadata["finish"] = finish
        sample.metadata["turns"] = self.turn
        if self.started:
            sample.metadata["episode_s"] = time.perf_counter() - self._started_at
        if self.trajectory is not None:
            tokenizer = self.trajectory.renderer.tokenizer
            sample.response = tokenizer.decode(sample.tokens[sample.prompt_length :],
                                               skip_special_tokens=True)
            if len(self.trajectory.weight_versions) > 1:
                sample.metadata["weight_versions"] = list(self.trajectory.weight_versions)
        else:
            sample.response = self.last_text
        if status is not Status.SKIPPED:  # a skipped sample's prompt never fit: no copy of it
            messages = list(self.env.messages) if self.env is not None else list(self.history)
            if finish in ("length", "stop"):
                # the last turn never reached an env: keep what the model wrote
                messages.append({"role": "assistant", "content": self.last_text})
            sample.metadata["messages"] = [dict(m) for m in messages]
        if self.env is not None:  # the grader's findings and the sandbox's command log
            sample.metadata.update(self.env.episode_record())
        self.done = True

    async def grade(self, final: dict[str, Any]) -> float:
        """Grades an episode that ended outside :meth:`~agentrl.env.ToolEnv.astep` (a custom
        generate loop, a black-box agent) through the env's one grading path
        (:meth:`~agentrl.env.ToolEnv.agrade`), and records what the grader found and ran with
        the sample, as a terminating step's grading is.

        Args:
            final: The last assistant message.
        """
        assert self.env is not None, "grade() needs the episode's env"
        reward = await self.env.agrade(final)
        self.sample.metadata.update(self.env.episode_record())
        return reward

    def fail(self, exc: BaseException, *, report: bool = True) -> None:
        """Fails the sample with ``exc`` as the reason (``metadata["error"]``); finish
        ``sandbox_lost`` for a :class:`SandboxLost`, ``env_server_lost`` for an
        :class:`~agentrl.errors.EnvServerLost`, else ``error``. ``report``: also log it (a
        caller that reports a whole batch's failure once passes False)."""
        finish = (SANDBOX_LOST if isinstance(exc, SandboxLost)
                  else ENV_SERVER_LOST if isinstance(exc, EnvServerLost) else "error")
        self.finish(Status.FAILED, finish)
        self.sample.reward = 0.0
        self.sample.metadata["error"] = f"{type(exc).__name__}: {exc}"
        self.sample.metadata["traceback"] = traceback.format_exc(limit=8)
        if report:
            where = self.sample.metadata.get("source") or {}
            row = f" (row {where['file']}:{where['line']})" if "file" in where else ""
            log.warning("episode %s failed%s: %s: %s", self.rid, row, type(exc).__name__, exc)

    async def close(self) -> None:
        """Closes the env (idempotent); an aborted episode closed here cannot resume."""
        env, self.env = self.env, None
        if env is not None:
            await env.aclose()

    # -- the default loop ------------------------------------------------------------------------

    async def _play(self) -> None:
        sample = self.sample
        while not self.done:
            out = await self.next_turn()
            if out is None:
                return
            if out.finish_reason == "length":
                return self.finish(Status.TRUNCATED, "length")
            if self.env is None:
                return self.finish(Status.COMPLETED, "stop")
            observation, reward, terminated, truncated, info = await self.env.astep(out.action)
            timings = self.env.last_step_timings
            errors = sample.metadata.setdefault("tool_errors", {})
            for kind, count in info["tool_errors"].items():
                errors[kind] = errors.get(kind, 0) + count
            turn = sample.turns[-1]
            turn.tool_names = list(info["tool_calls"])
            turn.tools_s, turn.reward_s = timings.tools_s, timings.reward_s
            if terminated:
                sample.reward = reward
                return self.finish(Status.COMPLETED, "env")
            self.history.append(dict(self.env.messages[-(len(observation) + 1)]))
            if truncated:
                return self.finish(Status.TRUNCATED, "max_turns")
            appended = self.append_env(self.history, observation, tools_s=timings.tools_s)
            if appended is None:
                return
            self.history.extend(appended)
        return

    def _abort(self) -> None:
        self.sample.status = Status.ABORTED
        self.sample.metadata["finish"] = "abort"
