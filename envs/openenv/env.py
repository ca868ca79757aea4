"""``openenv-v0``: an environment served over OpenEnv's protocol, as a ToolEnv."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

from agentrl.env import EpisodeState, ToolEnv
from agentrl.errors import EnvServerError, NoTaskSetError, ToolDefinitionError, ToolServerError
from agentrl.tools import Tool
from agentrl_envs.openenv.client import (
    OpenEnvSession,
    ServerInfo,
    describe_server,
    task_range,
    task_splits,
)

FINAL_ANSWER_TOOL = "final_answer"
"""The tool an agentrl server (``agentrl serve-env``) offers for a turn without a tool call."""

_LISTINGS: dict[str, ServerInfo] = {}
_LISTINGS_LOCK = threading.Lock()


def server_info(url: str, timeout: float) -> ServerInfo:
    """The server's description, read once per process and URL (every episode's env shares it)."""
    with _LISTINGS_LOCK:
        if url not in _LISTINGS:
            _LISTINGS[url] = describe_server(url, timeout=timeout)
        return _LISTINGS[url]


class RemoteTool(Tool):
    """One tool of an OpenEnv server (an MCP tool, or the typed action of a non-MCP env).

    Arguments are validated here against the server's schema, as for any agentrl tool, and a
    valid call is one ``step`` of the episode's session (:class:`OpenEnvEnv`). What the server
    answers becomes the tool message; its reward and ``done`` are kept for the episode's reward.
    """

    def __init__(self, env: OpenEnvEnv, name: str, description: str, schema: Mapping[str, Any],
                 *, mcp: bool) -> None:
        async def _remote(**arguments: Any) -> str:  # never called: invoke is overridden
            raise AssertionError("a remote tool is called through its session")

        super().__init__(_remote, name=name, description=description or f"Tool {name!r} of the OpenEnv env.",
                         parameters=copy.deepcopy(dict(schema)), timeout=None)
        self.env = env
        self.mcp = mcp

    async def invoke(self, arguments: dict[str, Any], context: Mapping[type, Any]) -> str:
        self.validate(arguments)
        action = ({"type": "call_tool", "tool_name": self.name, "arguments": arguments}
                  if self.mcp else dict(arguments))
        return await self.env.play(action, tool_name=self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"OpenEnv tool {self.name!r} is called through an env (step, arun_tool)")


class OpenEnvEnv(ToolEnv):
    """An OpenEnv environment server (its ``reset`` / ``step`` over a WebSocket session, its
    MCP tools, its task API) as an agentrl env.

    * **Tools.** An env that takes MCP-style actions offers its MCP tools, with their JSON
      schemas (validated here like any ``@agentrl.tool``); a call is one ``step``. An env with a
      typed action (OpenEnv's template) offers one tool, ``action_tool`` (default ``act``),
      whose parameters are the action's schema. :data:`FINAL_ANSWER_TOOL` (what ``agentrl
      serve-env`` lists) is not a tool here: an assistant turn without a tool call plays it.
    * **Episodes.** Each episode is one session on the server (one env instance there), opened
      in ``reset`` and closed when the episode ends. The prompt is the reset observation's chat
      ``messages`` when it has them, else the observation's fields as JSON in a user message.
      ``max_turns`` is the smaller of this env's and the server's (when the server says).
    * **Reward.** The sum of the rewards the server reported in the episode. The episode
      terminates when the server says ``done`` after a tool call, or when the model answers
      without a tool call (the answer is sent as ``final_answer`` where the server lists it).
    * **Tasks.** ``task_set(split)`` reads the task API; each row is ``{"split", "index",
      "task"}`` and ``reset`` asks the server for that task. Without a task, ``reset(seed=...)``
      passes the seed.
    * **Failures.** A server that cannot be reached, closes the session or does not answer
      within ``message_timeout`` raises :class:`~agentrl.errors.EnvServerLost` (the episode
      fails; under ``--use-fault-tolerance`` it is played again); an error answer raises
      :class:`~agentrl.errors.EnvServerError` naming the env and URL. Nothing waits unbounded.

    Args:
        url: The server's base URL, e.g. ``http://127.0.0.1:8000``.
        action_tool: The tool name of a typed (non-MCP) action.
        connect_timeout: Seconds to reach the server.
        message_timeout: Seconds to wait for each answer (a tool that runs tests needs more).
        admission_timeout: Seconds to wait for a free session when the server is full.
        max_turns, tool_call_format, render_mode: As for :class:`~agentrl.ToolEnv`.
    """

    default_max_turns: ClassVar[int] = 8

    def __init__(self, url: str = "http://127.0.0.1:8000", *, action_tool: str = "act",
                 connect_timeout: float = 10.0, message_timeout: float = 300.0,
                 admission_timeout: float = 300.0, max_turns: int | None = None,
                 tool_call_format: str = "hermes", render_mode: str | None = None) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"openenv: url must be an http(s) URL of an OpenEnv server, got {url!r}")
        self.url = url.rstrip("/")
        self.timeouts = {"connect_timeout": connect_timeout, "message_timeout": message_timeout,
                         "admission_timeout": admission_timeout}
        self.info = server_info(self.url, connect_timeout)
        if self.info.mcp:
            specs = [t for t in self.info.tools if t["name"] != FINAL_ANSWER_TOOL]
        else:
            schema = copy.deepcopy(self.info.action_schema)
            schema.get("properties", {}).pop("metadata", None)
            schema.pop("title", None)
            specs = [{"name": action_tool, "description": schema.pop("description", ""), "input_schema": schema}]
        try:
            tools = [RemoteTool(self, spec["name"], spec["description"], spec["input_schema"], mcp=self.info.mcp)
                     for spec in specs]
        except ToolDefinitionError as exc:
            raise EnvServerError(f"OpenEnv env at {self.url} offers a tool agentrl cannot use: {exc}") from None
        super().__init__(tools=tools, max_turns=max_turns, tool_call_format=tool_call_format,
                         render_mode=render_mode)
        self._configured_max_turns = self.max_turns
        self._session: OpenEnvSession | None = None
        self._reset_payload: dict[str, Any] = {}

    # -- tasks ---------------------------------------------------------------------------------

    def sample_task(self) -> dict[str, Any]:
        return {"seed": int(self.np_random.integers(2**31))}

    def task_set(self, split: str = "test", limit: int | None = None) -> list[dict[str, Any]]:
        timeout = self.timeouts["connect_timeout"]
        if self.info.env_name is None:
            raise NoTaskSetError(f"the OpenEnv env at {self.url} has no task API; evaluate it on seeds")
        try:
            splits = task_splits(self.info, timeout=timeout)
        except EnvServerError as exc:
            if getattr(exc, "status", None) != 501:  # 501: the env implements no task API
                raise
            raise NoTaskSetError(f"the OpenEnv env at {self.url} has no task API ({exc}); "
                                 "evaluate it on seeds") from None
        if split not in splits:
            from agentrl.env import check_split

            check_split(self, split, splits, reason=f"(the task API of {self.url})")
        rows = task_range(self.info, split, limit, timeout=timeout)
        return [{"id": row.get("id", f"{split}-{i}") if isinstance(row, dict) else f"{split}-{i}",
                 "split": split, "index": i, "task": row} for i, row in enumerate(rows)]

    def public_task(self, task: Mapping[str, Any]) -> dict[str, Any]:
        """The row's place in the server's task API (``id``, ``split``, ``index``, or ``seed``):
        the server's own row (``task``) stays out, as this side cannot tell which of a foreign
        server's fields are its answers (agentrl's ``serve-env`` sends public fields only)."""
        return {k: copy.deepcopy(task[k]) for k in ("id", "split", "index", "seed") if k in task}

    # -- episodes ------------------------------------------------------------------------------

    async def setup_episode(self, task: Mapping[str, Any]) -> None:
        self._session = OpenEnvSession(self.url, **self.timeouts)
        if "split" in task and "index" in task:
            data: dict[str, Any] = {"split": task["split"], "index": task["index"]}
        else:
            data = {"seed": task["seed"]} if task.get("seed") is not None else {}
        self._reset_payload = await self._session.reset(**data)
        server_max = (self._reset_payload.get("observation") or {}).get("max_turns")
        self.max_turns = (min(self._configured_max_turns, int(server_max))
                          if isinstance(server_max, int) and server_max > 0 else self._configured_max_turns)
        assert self.state is not None
        self.state.data.update(rewards=[], done=False, last=None)

    async def teardown_episode(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def make_prompt(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        observation = dict(self._reset_payload.get("observation") or {})
        messages = observation.get("messages")
        if isinstance(messages, list) and messages:
            return copy.deepcopy(messages)
        fields = {k: v for k, v in observation.items() if k not in ("done", "reward", "metadata")}
        return [{"role": "user", "content": json.dumps(fields, ensure_ascii=False, default=str)}]

    async def play(self, action: dict[str, Any], *, tool_name: str) -> str:
        """One ``step`` of the episode's session: the text the model sees.

        Raises:
            ToolServerError: The server reported the call failed and gave no result text.
            EnvServerError, EnvServerLost: See the class docstring.
        """
        assert self._session is not None and self.state is not None
        payload = await self._session.step(action)
        observation = dict(payload.get("observation") or {})
        reward = payload.get("reward")
        self.state.data["rewards"].append(float(reward) if reward is not None else 0.0)
        self.state.data["last"] = observation.get("metadata") or payload.get("metadata")
        if payload.get("done"):
            self.state.data["done"] = True
            self.state.finish(observation.get("result"))
        if "tool_name" in observation:  # an MCP-style answer
            result, error = observation.get("result"), observation.get("error")
            if result is None and error:
                raise ToolServerError(str(error.get("message") or error), tool_name=tool_name, server=self.url)
            return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
        fields = {k: v for k, v in observation.items() if k not in ("done", "reward", "metadata")}
        return json.dumps(fields, ensure_ascii=False, default=str)

    async def compute_reward(self, task: Mapping[str, Any], final: Mapping[str, Any], state: EpisodeState) -> float:
        answered = False
        if not state.data.get("done") and self.info.mcp and any(
                t["name"] == FINAL_ANSWER_TOOL for t in self.info.tools):
            await self.play({"type": "call_tool", "tool_name": FINAL_ANSWER_TOOL,
                             "arguments": {"content": final.get("content") or ""}}, tool_name=FINAL_ANSWER_TOOL)
            answered = True
        rewards = state.data.get("rewards", [])
        last = state.data.get("last") or {}
        state.grade = {"server_rewards": rewards, "server_done": bool(state.data.get("done")),
                       "final_answer_sent": answered}
        if isinstance(last, dict) and "grade" in last:
            state.grade["server_grade"] = last["grade"]
        return float(sum(rewards))
