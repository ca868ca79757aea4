"""OpenEnv's wire protocol, client side, without the ``openenv`` package.

agentrl cannot import ``openenv`` 0.10 in its own process (it needs the MCP SDK 1.x; agentrl's MCP
tools need 2.x), so this module speaks the protocol the ``openenv`` server serves:

* ``GET /schema``: the action, observation and state JSON schemas. An action schema titled
  ``CallToolAction`` means the env takes MCP-style ``call_tool`` / ``list_tools`` actions.
* ``POST /mcp`` (JSON-RPC 2.0, ``tools/list``): the env's MCP tools.
* ``GET /list_environments`` and ``POST /{env}/task_range``: the task API.
* ``/ws``: one WebSocket per session (one env instance on the server): ``{"type": "reset" |
  "step" | "state" | "close", "data": ...}`` in, ``{"type": "observation" | "state" | "error",
  "data": ...}`` out; an observation's data is ``{"observation", "reward", "done"}``.

Every wait is bounded: connecting (``connect_timeout``), each answer (``message_timeout``), and
waiting for a free session when the server is at capacity (``admission_timeout``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.error
import urllib.request
from typing import Any

import aiohttp

from agentrl.errors import EnvServerError, EnvServerLost

__all__ = ["OpenEnvSession", "ServerInfo", "describe_server"]

_CAPACITY = "CAPACITY_REACHED"


class ServerInfo:
    """What an OpenEnv server offers, read once (:func:`describe_server`).

    Attributes:
        url: The server's base URL.
        env_name: The name its task API answers to (``/list_environments``).
        mcp: Whether it takes MCP-style actions (``call_tool`` / ``list_tools``).
        tools: MCP tools as listed (``name``, ``description``, ``input_schema``), or the one
            typed action (``mcp`` false) as its JSON schema under the key ``action``.
    """

    def __init__(self, url: str, env_name: str | None, mcp: bool, tools: list[dict[str, Any]],
                 action_schema: dict[str, Any]) -> None:
        self.url = url
        self.env_name = env_name
        self.mcp = mcp
        self.tools = tools
        self.action_schema = action_schema


def _http(url: str, path: str, *, body: Any = None, timeout: float) -> Any:
    request = urllib.request.Request(
        url.rstrip("/") + path, method="GET" if body is None else "POST",
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        error = EnvServerError(f"OpenEnv env at {url}: {'GET' if body is None else 'POST'} {path} "
                               f"answered HTTP {exc.code}: {detail}")
        error.status = exc.code  # type: ignore[attr-defined]
        raise error from None
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EnvServerLost(f"OpenEnv env at {url}: cannot reach the server ({reason}); is it "
                            "running, and is the URL right?") from None
    except ValueError as exc:
        raise EnvServerError(f"OpenEnv env at {url}: {path} did not answer JSON ({exc}): not an "
                             "OpenEnv server?") from None


def describe_server(url: str, *, timeout: float = 10.0) -> ServerInfo:
    """Reads what the server at ``url`` offers: its action schema, its tools and its name.

    Raises:
        EnvServerLost: The server cannot be reached.
        EnvServerError: It does not answer like an OpenEnv server (the message says what).
    """
    schema = _http(url, "/schema", timeout=timeout)
    if not isinstance(schema, dict) or not isinstance(schema.get("action"), dict):
        raise EnvServerError(f"OpenEnv env at {url}: GET /schema has no action schema: not an "
                             "OpenEnv server, or a protocol version agentrl does not know")
    action = schema["action"]
    mcp = action.get("title") == "CallToolAction"
    tools: list[dict[str, Any]] = []
    if mcp:
        answer = _http(url, "/mcp", body={"jsonrpc": "2.0", "method": "tools/list", "params": {},
                                          "id": 1}, timeout=timeout)
        if not isinstance(answer, dict) or "error" in answer and answer["error"]:
            message = (answer.get("error") or {}).get("message") if isinstance(answer, dict) else answer
            raise EnvServerError(f"OpenEnv env at {url}: tools/list failed: {message}")
        for spec in answer.get("result", {}).get("tools", []):
            tools.append({"name": spec["name"], "description": spec.get("description") or "",
                          "input_schema": spec.get("input_schema") or spec.get("inputSchema") or {}})
    try:
        names = _http(url, "/list_environments", timeout=timeout)
    except EnvServerError:  # an older server without the task API
        names = []
    env_name = names[0] if isinstance(names, list) and names else None
    return ServerInfo(url, env_name, mcp, tools, action)


def task_range(info: ServerInfo, split: str, stop: int | None, *, timeout: float) -> list[Any]:
    """The first ``stop`` tasks (all with ``None``) of ``split`` through the task API."""
    if info.env_name is None:
        raise EnvServerError(f"OpenEnv env at {info.url} has no task API (/list_environments)")
    answer = _http(info.url, f"/{info.env_name}/task_range",
                   body={"split": split, "start": 0, "stop": stop}, timeout=timeout)
    return list(answer.get("tasks", []))


def task_splits(info: ServerInfo, *, timeout: float) -> list[str]:
    """The split names of the task API (empty without one)."""
    if info.env_name is None:
        return []
    return [s["name"] if isinstance(s, dict) else str(s)
            for s in _http(info.url, f"/{info.env_name}/splits", timeout=timeout)]


class OpenEnvSession:
    """One session on an OpenEnv server: a WebSocket, and the env instance behind it.

    Args:
        url: The server's base URL.
        connect_timeout: Seconds to open the connection.
        message_timeout: Seconds to wait for each answer.
        admission_timeout: Seconds to keep asking when the server is at its session limit.
    """

    def __init__(self, url: str, *, connect_timeout: float, message_timeout: float,
                 admission_timeout: float) -> None:
        self.url = url.rstrip("/")
        self.connect_timeout = connect_timeout
        self.message_timeout = message_timeout
        self.admission_timeout = admission_timeout
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None

    async def reset(self, **data: Any) -> dict[str, Any]:
        """Opens the session if needed (waiting for a free one) and resets its env.

        Returns:
            The observation payload: ``{"observation", "reward", "done"}``.
        """
        deadline = time.monotonic() + self.admission_timeout
        delay = 0.1
        while True:
            if self._ws is None:
                await self._connect()
            try:
                return await self._exchange({"type": "reset", "data": data}, "observation")
            except _AtCapacity as full:
                await self.close()
                if time.monotonic() + delay > deadline:
                    raise EnvServerError(
                        f"OpenEnv env at {self.url}: no free session within {self.admission_timeout:g} s "
                        f"({full}); the server's session limit is reached: raise it, or play fewer "
                        "episodes at once") from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def step(self, action: dict[str, Any]) -> dict[str, Any]:
        """Sends one action; returns the observation payload."""
        if self._ws is None:
            raise EnvServerError(f"OpenEnv env at {self.url}: step before reset")
        return await self._exchange({"type": "step", "data": action}, "observation")

    async def close(self) -> None:
        """Says goodbye and closes the connection (the server then closes the env). Safe to
        call repeatedly, and on a broken connection."""
        ws, http, self._ws, self._http = self._ws, self._http, None, None
        if ws is not None and not ws.closed:
            # a server that is gone has nothing to be told
            with contextlib.suppress(aiohttp.ClientError, ConnectionError, TimeoutError, RuntimeError):
                await asyncio.wait_for(ws.send_str(json.dumps({"type": "close"})), 5)
            await ws.close()
        if http is not None:
            await http.close()

    async def _connect(self) -> None:
        """Opens the WebSocket; a refused connection is tried again until ``connect_timeout``
        (a server being restarted comes back on the same port)."""
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, connect=self.connect_timeout))
        ws_url = "ws" + self.url.removeprefix("http") + "/ws"
        deadline = time.monotonic() + self.connect_timeout
        while True:
            left = deadline - time.monotonic()
            try:
                self._ws = await asyncio.wait_for(self._http.ws_connect(ws_url, heartbeat=30), max(left, 0.1))
                return
            except aiohttp.ClientConnectorError as exc:
                if time.monotonic() + 0.2 < deadline:
                    await asyncio.sleep(0.2)
                    continue
                failure: BaseException = exc
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                failure = exc
            await self.close()
            raise EnvServerLost(f"OpenEnv env at {self.url}: cannot open a session at {ws_url} "
                                f"({type(failure).__name__}: {failure}); is the server running?") from None

    async def _exchange(self, message: dict[str, Any], expected: str) -> dict[str, Any]:
        assert self._ws is not None
        try:
            # a server that refused the session (at capacity) has already said why and closed:
            # the send fails, and its error is still there to be read
            with contextlib.suppress(aiohttp.ClientError, ConnectionError, RuntimeError):
                await self._ws.send_str(json.dumps(message))
            reply = await asyncio.wait_for(self._ws.receive(), self.message_timeout)
        except TimeoutError:
            await self.close()
            raise EnvServerLost(f"OpenEnv env at {self.url}: no answer to {message['type']} within "
                                f"{self.message_timeout:g} s") from None
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            await self.close()
            raise EnvServerLost(f"OpenEnv env at {self.url}: the connection broke during "
                                f"{message['type']} ({type(exc).__name__}: {exc})") from None
        if reply.type is not aiohttp.WSMsgType.TEXT:
            await self.close()
            raise EnvServerLost(f"OpenEnv env at {self.url}: the server closed the session during "
                                f"{message['type']}")
        try:
            payload = json.loads(reply.data)
        except ValueError:
            raise EnvServerError(f"OpenEnv env at {self.url}: {message['type']} answered text "
                                 "that is not JSON: not an OpenEnv server?") from None
        if payload.get("type") == "error":
            data = payload.get("data") or {}
            if data.get("code") == _CAPACITY:
                raise _AtCapacity(f"{data.get('active_sessions')} of {data.get('max_sessions')} in use")
            detail = data.get("message", "")
            if data.get("errors"):
                detail += f" {json.dumps(data['errors'])[:300]}"
            raise EnvServerError(f"OpenEnv env at {self.url}: {message['type']} failed "
                                 f"({data.get('code', 'error')}): {detail}")
        if payload.get("type") != expected:
            raise EnvServerError(f"OpenEnv env at {self.url}: {message['type']} answered "
                                 f"{payload.get('type')!r}, expected {expected!r}: a protocol "
                                 "version agentrl does not know")
        return payload.get("data") or {}


class _AtCapacity(Exception):
    """The server refused a session: all are in use."""
