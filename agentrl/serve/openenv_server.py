"""A registered agentrl env served with the ``openenv`` package's own server.

``agentrl serve-env ENV_ID`` builds the app with ``openenv``'s ``create_fastapi_app`` over an
``openenv`` ``Environment`` (:class:`ServedEnv`) that wraps one :class:`~agentrl.ToolEnv` per
session. What an OpenEnv client sees:

* **Sessions.** Each WebSocket session (``/ws``, or an MCP session on ``/mcp``) gets its own
  env instance, made by :func:`~agentrl.env.registry.make_env` with the served id and
  ``--env-kwarg`` values. At most ``--max-sessions`` exist at once; one more is refused with
  OpenEnv's ``CAPACITY_REACHED`` error. A session ends when its client closes or disconnects,
  or after ``--session-timeout`` seconds without a message; its env is then closed, which ends
  the open episode and gives back its sandbox.
* **reset** (``seed``, ``split`` + ``index`` from the task API, or a ``task`` row) starts an
  episode: the observation holds the prompt as chat ``messages``, the tools' OpenAI-style
  schemas (``tool_schemas``), the ``task``'s public view (``ToolEnv.public_task``: the fields
  the env's ``TaskFields`` declares public, never an answer, fix or hidden test), ``turn`` and
  ``max_turns``.
* **Tools** are MCP tools with their JSON schemas (``list_tools`` / ``tools/list``), plus
  :data:`FINAL_ANSWER_TOOL`, which plays an assistant turn without a tool call (how an agentrl
  episode ends with a text answer). A ``call_tool`` step is one assistant turn holding that one
  call. The observation's ``result`` is what the model would read (the tool message's text);
  a call the env refused (unknown tool, arguments that break the schema, a timeout, a tool that
  raised) also sets ``error`` with OpenEnv's error type, and still counts as a turn, as it does
  in agentrl. ``metadata`` carries ``messages`` (the new messages), ``terminated``,
  ``truncated``, ``turn`` and ``tool_errors``.
* **reward / done**: ``reward`` is the env's score on the step that terminated, 0 elsewhere;
  ``done`` is terminated or truncated (the turn limit), which ``metadata`` tells apart.
* **Task API** (``/{env}/splits``, ``tasks``, ``num_tasks``, ``task``, ``task_range``): the env's
  ``task_set`` splits; a task is its row's public view. ``reset`` with ``split`` and ``index``
  plays the whole row, which stays in the server (the grader's side).

What is isolated where: sandboxed envs run the model's commands in their sandboxes on the
server's machine, as they do in training; the server process itself runs tools that are plain
Python functions. Hence the loopback default and the warning for any other host.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import ipaddress
import signal
import uuid
import weakref
from collections.abc import Mapping
from typing import Any

from openenv.core.env_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import (
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    Tool,
    ToolError,
    ToolErrorType,
)
from openenv.core.env_server.types import ConcurrencyConfig, Observation, State
from pydantic import Field

from agentrl.env.core import splits_of, task_set_of
from agentrl.env.registry import env_spec
from agentrl.errors import ConfigError, UnknownSplitError

__all__ = ["FINAL_ANSWER_TOOL", "EpisodeObservation", "ServeConfig", "ServedEnv", "build_app", "is_loopback",
           "serve"]

FINAL_ANSWER_TOOL = "final_answer"
"""The tool an OpenEnv client calls to play an assistant turn without a tool call: its
``content`` is the turn's text (an agentrl episode ends with such a turn and is graded on it)."""

_ERROR_TYPES = {
    "parse_error": ToolErrorType.INVALID_ARGS,
    "malformed_arguments": ToolErrorType.INVALID_ARGS,
    "schema_violation": ToolErrorType.INVALID_ARGS,
    "unknown_tool": ToolErrorType.TOOL_NOT_FOUND,
    "timeout": ToolErrorType.TIMEOUT,
    "tool_exception": ToolErrorType.EXECUTION_ERROR,
    "tool_error": ToolErrorType.EXECUTION_ERROR,
}
"""agentrl's tool-error kinds -> OpenEnv's error types."""


class EpisodeObservation(Observation):
    """The observation of ``reset``: the task as the model first sees it."""

    messages: list[dict[str, Any]] = Field(default_factory=list, description="the prompt: chat messages")
    tool_schemas: list[dict[str, Any]] = Field(default_factory=list,
                                               description="the tools, as OpenAI-style function schemas")
    task: dict[str, Any] | None = Field(default=None, description="the task's public fields")
    turn: int = Field(default=0, description="assistant turns played")
    max_turns: int = Field(default=0, description="turns before the episode is truncated")


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """What ``agentrl serve-env`` serves, and how.

    Attributes:
        env_id: The registered env (``agentrl list-envs``).
        env_kwargs: Constructor arguments of every session's env (``--env-kwarg K=V``).
        host: Interface to bind; anything but loopback needs ``allow_remote``.
        port: TCP port.
        max_sessions: Sessions (env instances) at once.
        session_timeout: Seconds without a message after which a session is closed.
        allow_remote: Bind a non-loopback host although the server runs model-written commands.
    """

    env_id: str
    env_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8000
    max_sessions: int = 8
    session_timeout: float = 600.0
    allow_remote: bool = False

    def validate(self) -> None:
        """Raises ConfigError naming the flag to change."""
        if self.max_sessions < 1:
            raise ConfigError(f"--max-sessions must be >= 1, got {self.max_sessions}")
        if not self.session_timeout > 0:
            raise ConfigError(f"--session-timeout must be > 0, got {self.session_timeout}")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"--port must be in [0, 65535], got {self.port}")
        if not is_loopback(self.host) and not self.allow_remote:
            raise ConfigError(f"--host {self.host} is not a loopback address: the server runs the "
                              "commands a model writes (in the env's sandboxes, and its Python tools "
                              "in the server process); add --allow-remote to serve it anyway")


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServedEnv(Environment):
    """One OpenEnv session's environment: an agentrl :class:`~agentrl.ToolEnv` behind OpenEnv's
    ``reset`` / ``step`` / ``state``, MCP-style tool actions and task API (see the module)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any]) -> None:
        super().__init__()
        self.spec = env_spec(env_id)
        self.env = self.spec.make(**dict(env_kwargs))
        if FINAL_ANSWER_TOOL in self.env.toolbox:
            raise ConfigError(f"{self.spec.id} has a tool named {FINAL_ANSWER_TOOL!r}, the name "
                              "agentrl serve-env gives the answer-without-a-tool turn; rename it")
        self._state = State(episode_id=None, step_count=0)
        self._loop: asyncio.AbstractEventLoop | None = None  # the server's: the env's resources live there
        self._done = True

    # -- episodes ------------------------------------------------------------------------------

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        raise RuntimeError("ServedEnv runs in the server's event loop: reset_async is the entry point")

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        raise RuntimeError("ServedEnv runs in the server's event loop: step_async is the entry point")

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None,
                          split: str | None = None, index: int | None = None,
                          task: dict[str, Any] | None = None, **kwargs: Any) -> EpisodeObservation:
        """Starts an episode on ``task``, on task ``index`` of ``split``, or on a task drawn
        with ``seed``."""
        self._loop = asyncio.get_running_loop()
        if task is None and split is not None:
            if index is None:
                raise ValueError("reset: split needs an index (the task API gives both)")
            task = self._row(split, index)
        options = {"task": task} if task is not None else None
        messages, info = await self.env.areset(seed=seed, options=options)
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        self._done = False
        return EpisodeObservation(messages=messages, tool_schemas=info["tools"], task=info["task"],
                                  turn=0, max_turns=info["max_turns"], done=False, reward=0.0)

    async def step_async(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        if isinstance(action, ListToolsAction):
            return ListToolsObservation(tools=self.tools())
        if not isinstance(action, CallToolAction):
            raise ValueError(f"{self.spec.id} takes list_tools and call_tool actions, got "
                             f"{type(action).__name__}")
        if self._done:
            raise RuntimeError(f"{self.spec.id}: the episode has ended (or none was started): "
                               "reset before stepping")
        if action.tool_name == FINAL_ANSWER_TOOL:
            turn = {"role": "assistant", "content": str(action.arguments.get("content", ""))}
        else:
            turn = {"role": "assistant", "content": "",
                    "tool_calls": [{"name": action.tool_name, "arguments": dict(action.arguments)}]}
        messages, reward, terminated, truncated, info = await self.env.astep(turn)
        self._done = terminated or truncated
        self._state.step_count += 1
        error = None
        result = messages[0]["content"] if messages else None
        results = info["tool_results"]
        if results and results[0]["error"] is not None:
            kind = results[0]["error"]
            error = ToolError(error_type=_ERROR_TYPES.get(kind, ToolErrorType.EXECUTION_ERROR),
                              message=f"{self.spec.id}: {result}")
        metadata = {"messages": messages, "terminated": terminated, "truncated": truncated,
                    "turn": info["turn"], "tool_errors": info["tool_errors"]}
        grade = self.env.episode_record().get("grade") if terminated else None
        if grade is not None:
            metadata["grade"] = grade
        return CallToolObservation(tool_name=action.tool_name, result=result, error=error,
                                   done=self._done, reward=reward, metadata=metadata)

    @property
    def state(self) -> State:
        return self._state

    def tools(self) -> list[Tool]:
        """The env's tools (MCP tools with their JSON schemas) and :data:`FINAL_ANSWER_TOOL`."""
        listed = [Tool(name=s["function"]["name"], description=s["function"].get("description", ""),
                       input_schema=s["function"]["parameters"]) for s in self.env.toolbox.schemas]
        listed.append(Tool(name=FINAL_ANSWER_TOOL,
                           description="Give your final answer as text, without calling a tool; "
                                       "this ends the episode.",
                           input_schema={"type": "object", "properties": {"content": {"type": "string"}},
                                         "required": ["content"]}))
        return listed

    def close(self) -> None:
        """Ends the open episode and frees the env. OpenEnv calls it from a worker thread, so the
        env's async close runs on the server's loop, where its sandbox and clients live."""
        loop = self._loop
        if loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(self.env.aclose(), loop).result(timeout=120)
        else:
            self.env.close()

    # -- task API ------------------------------------------------------------------------------

    def list_splits(self) -> list[str]:
        return list(splits_of(self.env))

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return [self.env.public_task(row) for row in task_set_of(self.env, split)]

    def num_tasks(self, split: str) -> int:
        return len(task_set_of(self.env, split))

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        return self.env.public_task(self._row(split, index))

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[dict[str, Any]]:
        return [self.env.public_task(row) for row in task_set_of(self.env, split)[start:stop]]

    def _row(self, split: str, index: int) -> dict[str, Any]:
        """Task ``index`` of ``split``, the whole row: for the env's grader, never sent."""
        tasks = task_set_of(self.env, split)
        if not 0 <= index < len(tasks):
            raise IndexError(index)
        return copy.deepcopy(dict(tasks[index]))


def build_app(config: ServeConfig, live: weakref.WeakSet[ServedEnv] | None = None) -> Any:
    """The FastAPI app serving ``config.env_id`` (checked by making one instance first, so a bad
    id or ``--env-kwarg`` fails here, not in the first session). ``live`` collects every session
    env the app makes (:func:`serve` closes those still open when it stops)."""
    config.validate()
    ServedEnv(config.env_id, config.env_kwargs).env.close()

    def factory() -> ServedEnv:
        env = ServedEnv(config.env_id, config.env_kwargs)
        if live is not None:
            live.add(env)
        return env

    factory.__name__ = config.env_id
    app = create_fastapi_app(
        factory, CallToolAction, CallToolObservation, env_name=env_spec(config.env_id).name,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=config.max_sessions,
                                             session_timeout=config.session_timeout),
        reset_observation_cls=EpisodeObservation, mode="simulation",
    )

    async def unknown_split(request: Any, exc: Exception) -> Any:
        # the task API's answer to a split the env lacks: its message (the splits it has), not 500
        from fastapi.responses import JSONResponse

        return JSONResponse({"detail": str(exc)}, status_code=404)

    app.add_exception_handler(UnknownSplitError, unknown_split)
    return app


def serve(config: ServeConfig) -> None:
    """Serves until SIGINT or SIGTERM, then closes every session still open, so no sandbox of
    a session outlives the server."""
    import uvicorn

    live: weakref.WeakSet[ServedEnv] = weakref.WeakSet()
    app = build_app(config, live)

    async def run() -> None:
        server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning"))
        try:
            await server.serve()
        finally:
            for env in list(live):
                with contextlib.suppress(Exception):  # one env failing to close must not keep the others
                    await env.env.aclose()

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    # uvicorn re-raises the signal that stopped it once it has shut down: as an exception here,
    # not the default handler's exit, so the sessions above are closed first
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        asyncio.run(run())
    finally:
        signal.signal(signal.SIGTERM, previous)
