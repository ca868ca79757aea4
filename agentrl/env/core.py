"""``ToolEnv``: the environment contract every agentrl task implements.

An episode is a conversation. ``reset`` returns the task as chat messages; each ``step`` takes
one assistant turn and returns the environment's reply. Tools are plain typed functions (see
:func:`agentrl.tool`); the environment parses the model's tool calls, validates them, runs the
tools and returns their results as ``role: tool`` messages.

Imported on first use: the MCP client (the MCP SDK), only for an env with ``mcp_servers``.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import copy
import dataclasses
import inspect
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import gymnasium
from gymnasium.error import ResetNeeded

from agentrl.env.mcp import EnvMcp
from agentrl.env.messages import AssistantTurn, Message, MessageList, message_problem
from agentrl.env.rewards import as_reward
from agentrl.env.tasks import TaskFields, public_view
from agentrl.errors import (
    AgentRLError,
    MalformedArgumentsError,
    NoTaskSetError,
    ToolCallParseError,
    ToolErrorKind,
    UnknownSplitError,
)
from agentrl.tools.calls import ToolCall
from agentrl.tools.formats import ToolCallFormat, get_format
from agentrl.tools.mcp._client import McpEpisode, McpPool
from agentrl.tools.mcp._server import McpServer, checked_servers
from agentrl.tools.tool import Injected, Tool
from agentrl.tools.toolbox import Toolbox, ToolOutcome, error_text

Action = str | Mapping[str, Any]
"""An assistant turn: ``{"role": "assistant", "content": str, "tool_calls": [...]}`` or text."""


@dataclasses.dataclass(frozen=True)
class StepTimings:
    """Wall-clock seconds one :meth:`ToolEnv.step` spent, by phase.

    Attributes:
        parse_s: Reading the action (parsing tool calls out of raw text).
        tools_s: Running the turn's tool calls, one after another.
        reward_s: ``compute_reward`` (grading), on the step that terminated; else about 0.
        tool_calls_s: Per call, in call order: validation and the tool itself.
    """

    parse_s: float
    tools_s: float
    reward_s: float
    tool_calls_s: tuple[float, ...] = ()


def check_split(env: object, split: str, available: Sequence[str], *, reason: str = "") -> None:
    """Raises the standard error for a task split an env does not have (in ``task_set`` and
    in constructors that take a ``split``).

    Args:
        env: The env (or its class) asked for the split, named in the message.
        split: The split asked for.
        available: The env's splits.
        reason: A sentence added to the message (e.g. why there is no training split).

    Raises:
        UnknownSplitError: ``split`` is not in ``available``.
    """
    if split not in available:
        name = env.__name__ if isinstance(env, type) else type(env).__name__
        listed = ", ".join(repr(s) for s in available) or "(none)"
        message = f"{name} has no task split {split!r}; available splits: {listed}"
        raise UnknownSplitError(f"{message}. {reason}" if reason else message, tuple(available))


PROBED_SPLITS = ("train", "validation", "test")
"""Split names tried when an env does not say which splits it has."""


def task_set_of(env: ToolEnv, split: str, limit: int | None = None) -> list[dict[str, Any]]:
    """``env.task_set(split, limit)``, where an unknown split is always
    :class:`~agentrl.errors.UnknownSplitError`.

    Every caller that asks an env for a split goes through here (the data source, evaluation,
    ``agentrl serve-env``, ``check_env``), so an env that looks its split up in a dict
    (``SPLITS[split]``, whose ``KeyError`` names the split) fails with the same message as one
    that calls :func:`check_split`: the split, and the splits it does have.

    Raises:
        UnknownSplitError: ``split`` is not one of the env's splits.
        NoTaskSetError: The env has no task set.
    """
    try:
        return env.task_set(split, limit)
    except KeyError as exc:
        if exc.args != (split,):
            raise  # a KeyError about something else is the env's bug
        available = splits_of(env, exclude=split)
    name = type(env).__name__
    listed = ", ".join(repr(s) for s in available) or "(none found)"
    raise UnknownSplitError(f"{name} has no task split {split!r}; available splits: {listed}", available)


def splits_of(env: ToolEnv, exclude: str | None = None) -> tuple[str, ...]:
    """The env's task splits: those its :class:`~agentrl.errors.UnknownSplitError` lists, else
    those of :data:`PROBED_SPLITS` (but ``exclude``) it answers (empty for an env without a
    task set)."""
    return _splits_named(env) or tuple(s for s in PROBED_SPLITS if s != exclude and _answers(env, s))


def _splits_named(env: ToolEnv) -> tuple[str, ...]:
    """The splits the env's standard refusal lists (no env has the split asked here)."""
    try:
        env.task_set("\0", 1)
    except UnknownSplitError as exc:
        return tuple(exc.available)
    except Exception:  # noqa: BLE001 - a KeyError, or any other refusal, names none
        return ()
    return ()


def _answers(env: ToolEnv, split: str) -> bool:
    """Whether ``env.task_set(split)`` gives tasks instead of refusing."""
    try:
        env.task_set(split, 1)
    except Exception:  # noqa: BLE001 - not one of its splits (or no task set at all)
        return False
    return True


class EpisodeState(Injected):
    """Per-episode state that tools can receive by annotating a parameter with this type.

    Attributes:
        task: The task row of the episode.
        data: Free scratch space for tools (e.g. files seen, a running total).
        finished: Set by :meth:`finish`; the step that set it terminates the episode.
        answer: The value passed to :meth:`finish`, available to ``compute_reward``.
        grade: What ``compute_reward`` found, as JSON-able data (tests passed, the verifier's
            output, the parsed answer); the rollout keeps it in ``sample.metadata["grade"]``
            and ``agentrl view`` shows it. ``None``: nothing recorded.
    """

    def __init__(self, task: Mapping[str, Any]) -> None:
        self.task = task
        self.data: dict[str, Any] = {}
        self.finished = False
        self.answer: Any = None
        self.grade: Any = None

    def finish(self, answer: Any = None) -> None:
        """Ends the episode after the current step (e.g. from a ``submit`` tool)."""
        self.finished = True
        self.answer = answer


class ToolEnv(gymnasium.Env[list[Message], Action], metaclass=abc.ABCMeta):
    """A multi-turn, tool-using task as a Gymnasium environment.

    **Observations** are lists of chat messages (dicts with ``role`` and ``content``). The
    observation from :meth:`reset` is the task (system and user messages). The observation from
    :meth:`step` holds only the *new* messages: one ``role: tool`` message per tool call (in call
    order), or an empty list when the episode has just ended.

    **Actions** are the model's assistant turn: ``{"role": "assistant", "content": str,
    "tool_calls": [{"name": str, "arguments": dict}]}``. A plain ``str`` (raw model output) is
    parsed with the env's tool-call format; a dict without ``tool_calls`` has its ``content``
    parsed the same way. ``arguments`` may also be a JSON string.

    **Episode end.**

    * ``terminated=True``: the episode reached a natural end and was scored. That happens when an
      assistant turn contains no tool calls (the model gave its final answer), or when a tool
      called :meth:`EpisodeState.finish` (e.g. ``submit``). ``reward`` on that step is
      :meth:`compute_reward`'s score as a float (:func:`agentrl.env.as_reward`: a bool counts
      as 0/1; a value that is not a finite number raises :class:`~agentrl.errors.RewardError`
      naming the env); on all other steps it is ``0.0``.
    * A multi-stage env (:meth:`next_stage`) goes on instead at the end of every stage but the
      last: the observation then also holds the next stage's messages.
    * ``truncated=True``: the turn limit ``max_turns`` was reached with tools still being called.
      The episode is cut, not failed; its reward is ``0.0`` and it is *not* scored, so RL code
      can tell "ran out of turns" apart from "answered wrongly".
    * Both are never true together. Stepping after either raises ``gymnasium.error.ResetNeeded``.

    **Tool failures never raise.** A call that cannot be parsed, names an unknown tool, has
    arguments that are not a JSON object or break the tool's schema, times out, raises inside
    the tool, or fails in the tool's server (``tool_error``: an MCP server's error, or a server
    that stopped) becomes a ``role: tool`` message starting ``Error (<kind>):`` that says what to fix,
    and is counted in ``info["tool_errors"]``. A turn with a malformed call runs none of its
    calls. Errors in the environment's own code (hooks below, an injected value missing)
    propagate: those are bugs, not model behaviour.

    **Info.** ``reset`` returns ``{"task" (the task's public view, :meth:`public_task`: only
    the fields the env's :attr:`task_fields` declares public; the grader's row is
    ``self.state.task``), "tools" (OpenAI-style
    schemas; empty when :attr:`show_tool_schemas` is false: a compact prompt names the tools
    itself and the chat template lists none, while the tools still run), "max_turns",
    "turn"}``. ``step`` returns ``{"turn", "tool_calls" (names),
    "tool_errors" (kind -> count, this step), "tool_results" (per call: name, error kind or
    ``None``), "episode_tool_errors" (kind -> count so far)}``. Observations and infos are new
    objects on every call (changing one never changes the env or a later return), and they hold
    no wall-clock values: two episodes with the same seed (or task) and actions return equal
    data, as Gymnasium's ``check_env`` requires.

    **Timings.** :attr:`last_step_timings` holds the wall-clock seconds of the latest step
    (:class:`StepTimings`: ``parse_s``, ``tools_s``, ``reward_s``, ``tool_calls_s``); every
    ``step`` replaces it. It is kept out of ``info`` because it differs between identical steps.

    **Isolation.** The env itself isolates nothing: tools run in this process (sync tools in a
    worker thread, with their timeout). Tools that run model-written code must do so through a
    sandbox handle injected via :meth:`tool_context`.

    **MCP servers.** ``mcp_servers`` (a class attribute next to ``tools``, or the constructor
    keyword) declares :class:`~agentrl.tools.mcp.McpServer` s whose tools join ``tools``: the
    servers are started when the first episode starts (constructors stay cheap), and their
    listed tools are added to :attr:`toolbox` and ``info["tools"]`` from that first ``reset`` on,
    validated against the servers' schemas like any tool. A server declared
    ``lifetime="episode"`` (the default) is started for every episode and stopped when it
    ends; one declared ``lifetime="run"`` is shared by the episodes of :attr:`mcp_pool` (the
    env's own pool, for this env's life, unless an :class:`~agentrl.env.EnvFactory` gives the
    run's). A server that reports an error, stops or crashes during a call gives an
    ``Error (tool_error)`` message and is restarted for the next episode; one that cannot be
    started at all raises :class:`~agentrl.errors.McpServerError` from ``reset``.

    **Subclassing.** Set ``tools`` (or pass ``tools=``) and implement :meth:`make_prompt` and
    :meth:`compute_reward`; implement :meth:`sample_task` so ``reset()`` without a task works.
    Optional: :meth:`setup_episode` / :meth:`teardown_episode` (async, e.g. a sandbox),
    :meth:`tool_context`, :meth:`next_stage` (episodes of several stages). Constructors must be cheap: start resources in ``setup_episode``.
    Every hook may be sync or async.

    Args:
        tools: Tools for this instance (defaults to the class attribute ``tools``).
        mcp_servers: MCP servers whose tools this instance offers too (defaults to the class
            attribute ``mcp_servers``); their labels must be unique. Their ``lifetime="run"``
            servers are shared through the env's own pool (made on first use, closed in
            :meth:`close` / :meth:`aclose`) unless :meth:`use_mcp_pool` gives it another.
        max_turns: Assistant turns per episode before truncation (>= 1).
        tool_call_format: How tool calls are written in raw text (see
            :func:`agentrl.tools.available_formats`).
        render_mode: ``"ansi"`` for :meth:`render` to return the transcript, or ``None``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}
    """``render_fps`` means nothing for a text transcript; it is set because Gymnasium's
    checker expects every env with render modes to declare one."""
    tools: ClassVar[Sequence[Tool | Callable[..., Any]]] = ()
    """Default tools of the env class."""
    mcp_servers: ClassVar[Sequence[McpServer]] = ()
    """Default MCP servers of the env class (:class:`~agentrl.tools.mcp.McpServer`)."""
    show_tool_schemas: bool = True
    """Whether ``reset`` hands the model the tools' JSON schemas (``info["tools"]``, which the
    chat template lists); envs with a compact prompt for small models turn it off."""
    default_max_turns: ClassVar[int] = 8
    task_fields: ClassVar[TaskFields | None] = None
    """The fields :meth:`make_prompt` and :meth:`compute_reward` read from a task row
    (:class:`~agentrl.env.tasks.TaskFields`). With them, a prompt file's rows are checked
    against them when the run starts (a row without them is skipped with its line and reason,
    a file without any usable row is refused) and ``--input-key`` / ``--label-key`` name the
    columns that fill the prompt and label fields. ``None``: rows are not checked ahead; one
    :meth:`make_prompt` cannot read is skipped when the run reaches it. Its ``public`` fields
    are all the policy side ever sees of a row (:meth:`public_task`); without a declaration it
    sees none."""
    env_id: str | None = None
    """The registry id this instance was made from (set by ``make_env``)."""

    def __init__(
        self,
        *,
        tools: Iterable[Tool | Callable[..., Any]] | None = None,
        mcp_servers: Iterable[McpServer] | None = None,
        max_turns: int | None = None,
        tool_call_format: str | ToolCallFormat = "hermes",
        render_mode: str | None = None,
    ) -> None:
        max_turns = self.default_max_turns if max_turns is None else max_turns
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be an int >= 1, got {max_turns!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}")
        self.toolbox = Toolbox(type(self).tools if tools is None else tools)
        self.mcp_servers: tuple[McpServer, ...] = checked_servers(
            type(self).mcp_servers if mcp_servers is None else mcp_servers)
        self._mcp = EnvMcp(type(self).__name__)
        self.max_turns = max_turns
        self.format = (
            tool_call_format
            if isinstance(tool_call_format, ToolCallFormat)
            else get_format(tool_call_format)
        )
        self.render_mode = render_mode
        self.observation_space = MessageList()
        self.action_space = AssistantTurn()
        self.state: EpisodeState | None = None
        self.grading = False
        """True while :meth:`compute_reward` runs (a sandboxed env labels its commands with it)."""
        self.messages: list[Message] = []
        self.last_step_timings: StepTimings | None = None
        """Wall-clock seconds of the latest step (``None`` before the first)."""
        self._turn = 0
        self._done = True
        self._episode_open = False
        self._episode_errors: collections.Counter[str] = collections.Counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._context: dict[type, Any] = {}

    # -- hooks for subclasses ----------------------------------------------------------------

    def sample_task(self) -> dict[str, Any]:
        """Draws a task when ``reset`` gets no ``options["task"]``; use ``self.np_random``."""
        raise ValueError(
            f"{type(self).__name__} has no task sampler: pass reset(options={{'task': row}})"
        )

    @abc.abstractmethod
    def make_prompt(self, task: Mapping[str, Any]) -> list[Message]:
        """The first observation for ``task``: system and/or user messages."""

    @abc.abstractmethod
    def compute_reward(
        self, task: Mapping[str, Any], final: Message, state: EpisodeState
    ) -> float:
        """Scores a terminated episode. ``final`` is the last assistant message (with parsed
        ``tool_calls`` if the episode ended through :meth:`EpisodeState.finish`)."""

    async def agrade(self, final: Message) -> float:
        """Grades the current episode: the one path from :meth:`compute_reward` to a reward.

        Every kind of episode ends here (a step that terminates, a custom generate function's
        ``compute_reward``, a black-box agent's end), so :attr:`grading` is set while the grader
        runs everywhere (a sandboxed env logs the grader's commands as grading, never as the
        model's tool calls) and the score is coerced the same way.

        Args:
            final: The last assistant message (``compute_reward``'s ``final``).

        Returns:
            The reward, a finite float (:func:`agentrl.env.as_reward`).

        Raises:
            RewardError: ``compute_reward`` returned something that is not a finite number.
        """
        assert self.state is not None, "agrade() needs an episode: call reset() first"
        self.grading = True
        try:
            return as_reward(await _maybe_await(self.compute_reward(self.state.task, final, self.state)),
                             f"{type(self).__name__}.compute_reward")
        finally:
            self.grading = False

    def next_stage(self, final: Message) -> list[Message] | None:
        """Whether a turn that ends the current stage also ends the episode.

        Called when a turn would terminate the episode (the model answered without a tool call,
        or a tool called :meth:`EpisodeState.finish`), before any grading. Return None (the
        default) to end it: the step is terminated and :meth:`compute_reward` scores it. Return
        messages (typically one ``user`` message: the next instruction) to go on with the same
        episode instead: they follow the turn's tool results in the observation and the
        transcript, :attr:`EpisodeState.finished` is cleared, the turn's reward is ``0.0``,
        and the turn limit still counts every turn of every stage. A multi-stage env (a
        multi-step Harbor task) grades the finished stage here and keeps the result in its
        :class:`EpisodeState` for :meth:`compute_reward` to combine.

        Args:
            final: The turn's assistant message.
        """
        return None

    def public_task(self, task: Mapping[str, Any]) -> dict[str, Any]:
        """What the policy side may see of ``task``: its public fields (see
        :class:`~agentrl.env.tasks.TaskFields`), as new objects. Every path that hands a task
        to the side being graded uses it (``info["task"]``, ``agentrl serve-env``, black-box
        agents, exported trajectories); the grader keeps the whole row. An env without
        :attr:`task_fields` shows nothing: a field nobody classified is private."""
        return public_view(self.task_fields, task)

    def task_set(self, split: str = "test", limit: int | None = None) -> list[dict[str, Any]]:
        """The env's fixed tasks of ``split`` (for evaluation and data sources), in a stable
        order; ``limit`` takes the first ones. Envs without a fixed task set raise
        :class:`~agentrl.errors.NoTaskSetError`; an unknown split raises
        :class:`~agentrl.errors.UnknownSplitError` (see :func:`check_split`)."""
        raise NoTaskSetError(
            f"{type(self).__name__} has no task set; evaluate it on seeds (reset(seed=i)) instead"
        )

    def oracle_action(self, task: Mapping[str, Any], history: Sequence[Message]) -> Action:
        """The scripted expert's next turn given the conversation so far (graders are tested
        with it: it must reach >= 95% success). Envs without an oracle raise."""
        raise AgentRLError(f"{type(self).__name__} has no scripted oracle")

    def null_action(self, task: Mapping[str, Any], history: Sequence[Message]) -> Action:
        """A policy that does no work: it answers at once, with no tool call."""
        return {"role": "assistant", "content": ""}

    async def setup_episode(self, task: Mapping[str, Any]) -> None:
        """Acquires per-episode resources (sandboxes, workspaces) after a task is chosen."""

    async def teardown_episode(self) -> None:
        """Releases what :meth:`setup_episode` acquired. Called once per opened episode."""

    def tool_context(self) -> list[Any]:
        """Objects injectable into tools for the current episode (default: the state).

        Called once per episode, after :meth:`setup_episode`."""
        return [self.state]

    # -- gymnasium API -----------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Starts an episode. ``options={"task": row}`` picks the task; otherwise
        :meth:`sample_task` draws one from ``self.np_random`` (seeded by ``seed``)."""
        return self._run_sync(self.areset(seed=seed, options=options))

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Plays one assistant turn; see the class docstring for what comes back."""
        return self._run_sync(self.astep(action))

    def render(self) -> str | None:
        """With ``render_mode="ansi"``: the conversation so far as text."""
        if self.render_mode != "ansi":
            return None
        lines = []
        for m in self.messages:
            calls = "".join(
                f"\n  -> {c['name']}({json.dumps(c.get('arguments'), ensure_ascii=False)})"
                for c in m.get("tool_calls") or ()
            )
            lines.append(f"[{m['role']}{':' + m['name'] if m.get('name') else ''}] {m['content']}{calls}")
        return "\n".join(lines)

    def close(self) -> None:
        """Runs :meth:`aclose` (ends any open episode, frees what the env holds) and frees the
        env's event loop. Safe to call repeatedly."""
        if self._episode_open or (self._loop is not None and not self._loop.is_closed()):
            self._run_sync(self.aclose())
        if self._loop is not None and not self._loop.is_closed():
            self._loop.close()
        self._loop = None

    # -- async API (used by the rollout runner to play many episodes at once) -----------------

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Async form of :meth:`reset`."""
        super().reset(seed=seed)
        await self._close_episode()
        task = (options or {}).get("task")
        if task is None:
            task = await _maybe_await(self.sample_task())
        if not isinstance(task, Mapping):
            raise TypeError(f"a task must be a mapping (row), got {type(task).__name__}")
        self.state = EpisodeState(task)
        self._turn = 0
        self._episode_errors = collections.Counter()
        self._episode_open = True
        await self.setup_episode(task)
        if self.mcp_servers:
            try:
                # after setup_episode: the episode's sandbox exists
                self.toolbox = await self._mcp.open(self.mcp_servers, self.toolbox,
                                                    getattr(self, "sandbox", None))
            except BaseException:
                await self._close_episode()  # releases the sandbox too
                raise
        self._context = {type(obj): obj for obj in self.tool_context() if obj is not None}
        if self._mcp.episode is not None:  # not through tool_context(): subclasses override it
            self._context[McpEpisode] = self._mcp.episode
        prompt = await _maybe_await(self.make_prompt(task))
        self.messages = list(prompt)
        self._done = False
        # Copies: what the caller keeps must not alias the env's task, schemas or transcript.
        info = {
            "task": self.public_task(task),
            "tools": copy.deepcopy(self.toolbox.schemas) if self.show_tool_schemas else [],
            "max_turns": self.max_turns,
            "turn": 0,
        }
        return copy.deepcopy(self.messages), info

    async def astep(
        self, action: Action
    ) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Async form of :meth:`step`."""
        if self._done or self.state is None:
            raise ResetNeeded("call reset() before step(), and again after an episode ends")
        t0 = time.perf_counter()
        self._turn += 1
        message, calls, parse_error = self._read_action(action)
        self.messages.append(message)
        t1 = time.perf_counter()

        outcomes: list[ToolOutcome] = []
        if parse_error is not None:
            outcomes.append(ToolOutcome(ToolCall("(unparsed)"), error_text(parse_error), parse_error.kind, 0.0))
        else:
            for call in calls:
                if isinstance(call, ToolOutcome):  # malformed call given as a dict
                    outcomes.append(call)
                else:
                    outcomes.append(await self.toolbox.run(call, self._context))
        t2 = time.perf_counter()

        observation = [o.to_message() for o in outcomes]
        self.messages.extend(o.to_message() for o in outcomes)
        terminated = parse_error is None and (not calls or self.state.finished)
        if terminated and (opening := await _maybe_await(self.next_stage(message))):
            opening = [dict(m) for m in opening]
            observation.extend(copy.deepcopy(opening))
            self.messages.extend(opening)
            self.state.finished, self.state.answer = False, None
            terminated = False
        truncated = not terminated and self._turn >= self.max_turns
        reward = 0.0
        if terminated:
            reward = await self.agrade(message)
        t3 = time.perf_counter()
        self._done = terminated or truncated
        self.last_step_timings = StepTimings(
            t1 - t0, t2 - t1, t3 - t2, tuple(o.duration_s for o in outcomes)
        )

        step_errors: dict[str, int] = {}
        for o in outcomes:
            if o.error is not None:
                step_errors[o.error.value] = step_errors.get(o.error.value, 0) + 1
                self._episode_errors[o.error.value] += 1
        info = {
            "turn": self._turn,
            "tool_calls": [o.call.name for o in outcomes],
            "tool_errors": step_errors,
            "tool_results": [
                {"name": o.call.name, "error": o.error.value if o.error else None}
                for o in outcomes
            ],
            "episode_tool_errors": dict(self._episode_errors),
        }
        if self._done:
            await self._close_episode()
        return observation, reward, terminated, truncated, info

    def episode_record(self) -> dict[str, Any]:
        """What the rollout keeps of the latest episode besides its tokens, for logs and
        ``agentrl view``: ``grade`` (:attr:`EpisodeState.grade`, when set); sandboxed envs add
        ``commands``. JSON-able; empty before the first reset."""
        if self.state is None or self.state.grade is None:
            return {}
        return {"grade": self.state.grade}

    async def arun_tool(self, call: ToolCall) -> ToolOutcome:
        """Runs one tool call in the current episode (its injected state and sandbox) outside
        :meth:`step`: no turn is counted and nothing is added to :attr:`messages`. Used by
        custom generate functions that drive tools themselves. Failures come back as the
        outcome's error, as in :meth:`step`."""
        if self.state is None or not self._episode_open:
            raise ResetNeeded("call reset() before running tools")
        return await self.toolbox.run(call, self._context)

    async def aclose(self) -> None:
        """Async form of :meth:`close` for code already running in an event loop: ends any open
        episode and stops the env's own shared MCP servers (those of a pool it was given stay).
        Subclasses that hold more (e.g. sandbox pools) free it here too, calling
        ``super().aclose()``. Safe to call repeatedly."""
        try:
            await self._close_episode()
        finally:
            await self._mcp.aclose()

    def use_mcp_pool(self, pool: McpPool) -> None:
        """Shares ``pool``'s ``lifetime="run"`` MCP servers with this env (e.g. the run's, from
        :class:`~agentrl.env.EnvFactory`); its owner closes it, not this env. Call it before
        the first ``reset``."""
        self._mcp.share(pool)

    @property
    def mcp_pool(self) -> McpPool | None:
        """Where this env's ``lifetime="run"`` MCP servers are shared (see :meth:`use_mcp_pool`)."""
        return self._mcp.pool

    @property
    def mcp_info(self) -> list[dict[str, Any]]:
        """The MCP servers of the latest episode (name, server_info, lifetime, sandbox,
        connected, tools); kept after the episode ends."""
        return self._mcp.info

    def mcp_status(self) -> list[dict[str, Any]]:
        """The current episode's MCP servers (name, server_info, lifetime, sandbox, connected,
        tools); ``[]`` outside an episode or without servers."""
        return self._mcp.status()

    def mcp_servers_left_running(self) -> list[Any]:
        """The shared MCP connections of the env's own pool that are still open: none once
        :meth:`close` has run (a pool given by :meth:`use_mcp_pool` is its owner's to close)."""
        return self._mcp.running_after_close()

    # -- internals -----------------------------------------------------------------------------

    def _read_action(
        self, action: Action
    ) -> tuple[Message, list[ToolCall | ToolOutcome], ToolCallParseError | None]:
        """Normalises an action into (assistant message, calls, parse error)."""
        if isinstance(action, str):
            action = {"role": "assistant", "content": action}
        if not isinstance(action, Mapping):
            raise TypeError(f"an action must be a str or an assistant message dict, got {type(action).__name__}")
        content = action.get("content") or ""
        if not isinstance(content, str):
            raise TypeError(f"action content must be a str, got {type(content).__name__}")
        raw_calls = action.get("tool_calls")
        if raw_calls is None:
            try:
                parsed = self.format.parse(content)
            except ToolCallParseError as exc:
                return {"role": "assistant", "content": content}, [], exc
            calls: list[ToolCall | ToolOutcome] = list(parsed.tool_calls)
            content = parsed.content if parsed.tool_calls else content
        else:
            calls = [_call_from_dict(c, i) for i, c in enumerate(raw_calls)]
        message: Message = {"role": "assistant", "content": content}
        good = [c for c in calls if isinstance(c, ToolCall)]
        if good:
            message["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in good]
        return message, calls, None

    async def _close_episode(self) -> None:
        if self._episode_open:
            self._episode_open = False
            self._done = True
            try:
                await self._mcp.close_episode()  # before the teardown: sandboxed servers go first
            finally:
                await self.teardown_episode()

    def _run_sync(self, coroutine: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coroutine.close()
            raise RuntimeError(
                "ToolEnv.reset/step/close were called from inside a running event loop; "
                "use `await env.areset(...)` / `await env.astep(...)` / `await env.aclose()`"
            )
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coroutine)


def _call_from_dict(raw: Any, index: int) -> ToolCall | ToolOutcome:
    """A call from an action dict, or an error outcome when it is malformed."""
    if isinstance(raw, ToolCall):
        return raw
    if isinstance(raw, Mapping) and isinstance(raw.get("function"), Mapping):  # OpenAI form
        raw = {**raw["function"], "id": raw.get("id")}
    name = raw.get("name") if isinstance(raw, Mapping) else None
    if not isinstance(name, str):
        problem = message_problem({"role": "assistant", "content": "", "tool_calls": [raw]})
        error = MalformedArgumentsError(f"tool_calls[{index}] is malformed: {problem}")
        return ToolOutcome(ToolCall("(malformed)"), error_text(error), ToolErrorKind.MALFORMED_ARGUMENTS, 0.0)
    arguments = raw.get("arguments", {})
    return ToolCall(name, arguments, raw.get("id"))


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value
