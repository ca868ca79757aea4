"""Live MCP connections: :class:`McpConnection` (one session, owned by its own task),
:class:`McpPool` (the run's shared servers), :class:`McpEpisode` (what one episode's tools call
through) and :func:`list_mcp_tools`.

The MCP SDK is imported when the first server starts, not when this module is imported.

Why one task per connection: the SDK's sessions and transports are anyio task groups, which
must be exited by the task that entered them, while an env's ``reset``, ``step`` and ``close``
run in different tasks (and a rollout closes envs in yet another). So each connection's whole
transport-and-session stack lives in a dedicated task; the others only send requests through
it, which is safe from any task of the same event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentrl._version import __version__
from agentrl.errors import McpServerError, ToolServerError, ToolTimeoutError
from agentrl.sandbox.base import WORKSPACE
from agentrl.tools.mcp._server import McpServer
from agentrl.tools.mcp._tool import McpCalls, McpTool, render_result

if TYPE_CHECKING:
    from agentrl.sandbox.base import Sandbox
    from agentrl.tools.mcp._stdio import Tail

_log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 10.0
"""Longest wait for a connection's shutdown (the SDK's stdio shutdown takes at most ~6.5 s)."""
MAX_LIST_PAGES = 100
"""Most ``tools/list`` pages read from one server."""
_CONNECTION_CLOSED = -32000
_REQUEST_TIMEOUT = -32001
_RESTART_NOTE = "it is unavailable for the rest of this episode and restarts with the next one"
_TOOL_CACHE: dict[tuple[str, str], McpTool] = {}
_TOOL_CACHE_MAX = 4096


def _sdk() -> Any:
    """The ``mcp`` package, or the error that says how to install it."""
    try:
        import mcp
    except ImportError as exc:
        raise McpServerError(
            f"MCP servers need the mcp package: pip install 'agentrl[mcp]' (mcp>=2.3,<3); {exc}"
        ) from exc
    return mcp


class McpConnection:
    """One live MCP session with a server, owned by a dedicated asyncio task.

    Make it with :meth:`start`; call tools with :meth:`call_tool` from any task of the same
    event loop; end it with :meth:`close`.

    Attributes:
        server: The declaration.
        tools: The server's tools as agentrl tools (allow-list and prefix applied), in listing
            order.
        server_info: ``"<name> <version>"`` as the server introduced itself, or ``None``.
        protocol_version: The negotiated MCP protocol version.
        broken: Why the connection is unusable, or ``None`` while it is healthy.
    """

    def __init__(self, server: McpServer, sandbox: Sandbox | None = None) -> None:
        self.server = server
        self.tools: tuple[McpTool, ...] = ()
        self.server_info: str | None = None
        self.protocol_version = ""
        self.broken: str | None = None
        self._sandbox = sandbox
        self._listing: list[Any] = []
        self._client: Any = None
        self._tail: Tail | None = None
        self._stop = asyncio.Event()
        self._eof = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def start(cls, server: McpServer, *, sandbox: Sandbox | None = None) -> McpConnection:
        """Starts (or connects to) ``server``, runs the handshake and lists its tools, all
        within ``server.startup_timeout``.

        Args:
            server: The declaration.
            sandbox: Where a ``sandbox=True`` server runs (``None``: on the host).

        Raises:
            McpServerError: It cannot be started or reached, did not answer in time, or lists
                tools that cannot be offered; the message has the end of its stderr. Nothing is
                left running.
        """
        if server.sandbox and sandbox is None:
            raise McpServerError(f"MCP server {server.label!r} is declared sandbox=True, but the "
                                 "episode has no sandbox: use a SandboxedToolEnv")
        connection = cls(server, sandbox if server.sandbox else None)
        await connection._start()
        return connection

    async def _start(self) -> None:
        _sdk()
        from agentrl.tools.mcp._stdio import Tail

        self._tail = Tail()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._own(ready), name=f"mcp:{self.server.label}")
        try:
            await asyncio.wait({ready}, timeout=self.server.startup_timeout)
        except BaseException:
            await self._abort()
            raise
        failure: BaseException | None = None
        if ready.done() and not ready.cancelled() and ready.exception() is None:
            try:
                self.tools = _convert(self.server, self._listing)
                return
            except McpServerError as exc:
                await self.close()
                raise exc from None
        await self._abort()
        if ready.done() and not ready.cancelled():
            failure = ready.exception()
        await self._tail.wait_closed(1.0)
        what = (f"did not start: {_describe(failure)}" if failure is not None else
                f"did not answer initialize and tools/list within {self.server.startup_timeout:g} s")
        raise McpServerError(
            f"MCP server {self.server.label!r} ({self.server.target}) {what}; {self._stderr()}"
        ) from failure

    async def _own(self, ready: asyncio.Future[None]) -> None:
        """The owner task: opens the transport and session, then holds them until stopped."""
        mcp = _sdk()
        from mcp_types import Implementation

        from agentrl.tools.mcp._stdio import watched

        try:
            async with contextlib.AsyncExitStack() as stack:
                streams = await self._open(stack)
                client = await stack.enter_async_context(mcp.Client(
                    watched(streams, self._eof), mode=self.server.handshake, cache=None,
                    client_info=Implementation(name="agentrl", version=__version__),
                ))
                self.protocol_version = client.protocol_version
                info = client.server_info
                self.server_info = f"{info.name} {info.version}" if info is not None else None
                self._listing = await _list_all(client)
                self._client = client
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                if isinstance(exc, asyncio.CancelledError):
                    ready.cancel()
                else:
                    ready.set_exception(exc)
            elif not self._stop.is_set():
                self.broken = self.broken or f"the connection failed: {_describe(exc)}"
                _log.warning("MCP server %r stopped: %s; %s", self.server.label, _describe(exc),
                             self._stderr())
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise

    async def _open(self, stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
        """Enters the server's transport on ``stack``; returns its (read, write) streams."""
        from agentrl.tools.mcp._stdio import sandbox_stdio, stderr_pipe

        server = self.server
        assert self._tail is not None
        if server.url is not None:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            http = await stack.enter_async_context(httpx2.AsyncClient(
                headers=dict(server.headers or {}), timeout=httpx2.Timeout(30.0, read=300.0)))
            return await stack.enter_async_context(streamable_http_client(server.url, http_client=http))
        assert server.command is not None
        if self._sandbox is not None:
            process = await self._sandbox.spawn(
                [server.command, *server.args], env=dict(server.env or {}), cwd=server.cwd or WORKSPACE)
            stack.push_async_callback(process.kill)  # also when entering the transport fails
            return await stack.enter_async_context(sandbox_stdio(process, self._tail))
        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(command=server.command, args=list(server.args),
                                       env=dict(server.env) if server.env else None, cwd=server.cwd)
        errlog = await stack.enter_async_context(stderr_pipe(self._tail))
        try:
            return await stack.enter_async_context(stdio_client(params, errlog=errlog))
        finally:
            errlog.close()  # the child has its copy: the tail ends when the server exits

    async def _abort(self) -> None:
        """Stops the owner task of a connection that did not finish starting."""
        self._closed = True
        self._stop.set()
        task = self._task
        if task is None:
            return
        task.cancel()
        await asyncio.wait({task}, timeout=CLOSE_TIMEOUT_S)
        _retrieve(task)

    @property
    def alive(self) -> bool:
        """Whether calls can be sent: started, not closed, not broken, the server still there."""
        return (self._client is not None and not self._closed and self.broken is None
                and not self._eof.is_set() and self._task is not None and not self._task.done())

    def _why_gone(self) -> str:
        if self.broken:
            return self.broken
        if self._closed:
            return "its connection was closed"
        return "the server exited or closed the connection"

    def _stderr(self) -> str:
        tail = self._tail.text() if self._tail is not None else ""
        if self.server.url is not None:
            return "(an HTTP server's stderr is not visible here)"
        return f"its stderr ended with:\n{tail}" if tail else "it wrote nothing to stderr"

    async def call_tool(self, tool: McpTool, arguments: dict[str, Any]) -> str:
        """Calls ``tool`` with (already validated) ``arguments``.

        Returns:
            The result as the model's text (:func:`render_result`).

        Raises:
            ToolServerError: The server reported an error (``isError`` or a JSON-RPC error),
                returned an invalid result, stopped during the call, or is not running.
            ToolTimeoutError: The server answered with a request timeout.
            asyncio.CancelledError: The caller was cancelled (e.g. the tool's timeout); the
                server is told, and the connection stays usable.
        """
        label = self.server.label
        if not self.alive:
            raise ToolServerError(
                f"the MCP server {label!r} is not running ({self._why_gone()}); {_RESTART_NOTE}",
                tool_name=tool.name, server=label, connection_lost=True,
            )
        mcp = _sdk()
        import pydantic

        try:
            result = await self._client.call_tool(tool.remote_name, arguments)
        except mcp.MCPError as exc:
            if exc.code == _CONNECTION_CLOSED:
                why = exc.message or "connection closed"
                raise self._lost(tool, why[0].lower() + why[1:] if why[1:2].islower() else why) from None
            if exc.code == _REQUEST_TIMEOUT:
                raise ToolTimeoutError(f"tool {tool.name!r}: the MCP server {label!r} reported a "
                                       f"request timeout ({exc.message})", tool_name=tool.name) from None
            raise ToolServerError(
                f"the MCP server {label!r} rejected the call: {exc.message} (JSON-RPC error {exc.code})",
                tool_name=tool.name, server=label,
            ) from None
        except (RuntimeError, pydantic.ValidationError) as exc:
            if not self.alive:
                raise self._lost(tool, _describe(exc)) from None
            raise ToolServerError(f"the MCP server {label!r} returned an invalid result: {exc}",
                                  tool_name=tool.name, server=label) from None
        except Exception as exc:  # noqa: BLE001 - a transport failure: the connection is gone
            raise self._lost(tool, _describe(exc)) from None
        text = render_result(result, self.server.max_output_chars)
        if result.is_error:
            raise ToolServerError(text or "the tool reported an error without a message",
                                  tool_name=tool.name, server=label)
        return text

    def _lost(self, tool: McpTool, why: str) -> ToolServerError:
        self.broken = self.broken or why
        _log.warning("MCP server %r stopped during a call of %r (%s); %s", self.server.label,
                     tool.remote_name, why, self._stderr())
        return ToolServerError(
            f"the MCP server {self.server.label!r} stopped during the call ({why}); {_RESTART_NOTE}",
            tool_name=tool.name, server=self.server.label, connection_lost=True,
        )

    async def close(self) -> None:
        """Ends the session and stops (or disconnects from) the server, within
        :data:`CLOSE_TIMEOUT_S`. Idempotent; never raises (failures are logged)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        task = self._task
        if task is None:
            return
        done, _ = await asyncio.wait({task}, timeout=CLOSE_TIMEOUT_S)
        if not done:
            _log.warning("MCP server %r did not shut down within %g s; cancelling it",
                         self.server.label, CLOSE_TIMEOUT_S)
            task.cancel()
            await asyncio.wait({task}, timeout=CLOSE_TIMEOUT_S)
        _retrieve(task)

    def __repr__(self) -> str:
        state = "alive" if self.alive else f"gone: {self._why_gone()}"
        return f"McpConnection({self.server.label!r}, {state})"


class McpEpisode(McpCalls):
    """The MCP connections of one episode: what its :class:`McpTool` calls go through (the env
    injects it into the tool context).

    Attributes:
        tools: Every server's tools, in declaration order, then listing order.
    """

    def __init__(self, connections: Sequence[McpConnection]) -> None:
        self.connections = tuple(connections)
        self._by_key = {c.server.key: c for c in self.connections}
        self.tools: list[McpTool] = [t for c in self.connections for t in c.tools]

    async def call(self, tool: McpTool, arguments: dict[str, Any]) -> str:
        """Sends ``tool``'s call to its server's connection (see :meth:`McpConnection.call_tool`)."""
        connection = self._by_key.get(tool.server.key)
        if connection is None:
            raise ToolServerError(f"the MCP server {tool.server.label!r} is not running in this "
                                  "episode", tool_name=tool.name, server=tool.server.label)
        return await connection.call_tool(tool, arguments)

    def describe(self) -> list[dict[str, Any]]:
        """Per server: ``name`` (label), ``server_info``, ``lifetime``, ``sandbox``,
        ``connected``, ``tools`` (the names the model sees)."""
        return [
            {"name": c.server.label, "server_info": c.server_info, "lifetime": c.server.lifetime,
             "sandbox": c.server.sandbox, "connected": c.alive, "tools": [t.name for t in c.tools]}
            for c in self.connections
        ]

    async def close(self) -> None:
        """Closes the episode's own (``lifetime="episode"``) connections; shared ones stay."""
        await asyncio.gather(*(c.close() for c in self.connections if c.server.lifetime == "episode"))


class _LoopConnections:
    def __init__(self) -> None:
        self.connections: dict[str, McpConnection] = {}
        self.locks: dict[str, asyncio.Lock] = {}


class McpPool:
    """The MCP servers of a run: those declared ``lifetime="run"`` are started once per event
    loop and shared by every episode (one found dead is restarted for the next episode), and
    every episode's own servers are started through it.

    An env without a pool makes its own and closes it when the env closes; an
    :class:`~agentrl.env.EnvFactory` gives all envs of a run one pool and closes it at the
    run's end. Copies of a pool (``copy.deepcopy`` of an env) are the pool itself.
    """

    def __init__(self) -> None:
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopConnections] = (
            weakref.WeakKeyDictionary()
        )

    async def open_episode(self, servers: Sequence[McpServer], *,
                           sandbox: Sandbox | None = None) -> McpEpisode:
        """Starts the episode's own servers and takes (starting them if needed) the shared
        ones, concurrently; when one fails, the other starts are stopped.

        Args:
            servers: The env's declarations.
            sandbox: The episode's sandbox, for ``sandbox=True`` servers.

        Raises:
            McpServerError: A server did not start; the episode's own servers that did are
                stopped again (shared ones stay in the pool for the next episode).
        """
        async def one(server: McpServer) -> McpConnection:
            if server.lifetime == "run":
                return await self.shared(server)
            return await McpConnection.start(server, sandbox=sandbox)

        tasks = [asyncio.ensure_future(one(s)) for s in servers]
        if not tasks:
            return McpEpisode([])
        try:
            _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        except BaseException:  # cancelled: stop the starts, close what did start
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            await _close_own(tasks)
            raise
        if pending:  # one failed: the others are not needed
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)
        failures = [t.exception() for t in tasks if not t.cancelled() and t.exception() is not None]
        if failures or any(t.cancelled() for t in tasks):
            await _close_own(tasks)
            raise failures[0] if failures else asyncio.CancelledError()
        return McpEpisode([t.result() for t in tasks])

    async def shared(self, server: McpServer) -> McpConnection:
        """The running loop's connection to the ``lifetime="run"`` ``server``, started (or
        restarted, when it is no longer alive) on demand.

        Raises:
            McpServerError: It did not start.
        """
        entry = self._loops.setdefault(asyncio.get_running_loop(), _LoopConnections())
        lock = entry.locks.setdefault(server.key, asyncio.Lock())
        async with lock:
            connection = entry.connections.get(server.key)
            if connection is not None and connection.alive:
                return connection
            if connection is not None:
                _log.warning("restarting the MCP server %r (%s)", server.label, connection._why_gone())
                del entry.connections[server.key]
                await connection.close()
            connection = await McpConnection.start(server)
            entry.connections[server.key] = connection
            return connection

    def connections(self) -> list[McpConnection]:
        """The shared connections held now, over every event loop."""
        return [c for entry in list(self._loops.values()) for c in entry.connections.values()]

    async def aclose(self) -> None:
        """Closes the running loop's shared connections (their servers stop) and forgets them;
        a later episode starts new ones. Call it in each loop that used the pool. Idempotent."""
        entry = self._loops.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await asyncio.gather(*(c.close() for c in entry.connections.values()))

    def __copy__(self) -> McpPool:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> McpPool:
        return self


async def _close_own(tasks: Sequence[asyncio.Future[McpConnection]]) -> None:
    """Closes the per-episode connections that ``tasks`` did start (shared ones stay)."""
    started = [t.result() for t in tasks
               if t.done() and not t.cancelled() and t.exception() is None]
    await asyncio.gather(*(c.close() for c in started if c.server.lifetime == "episode"))


async def list_mcp_tools(server: McpServer, *, sandbox: Sandbox | None = None) -> list[McpTool]:
    """Starts ``server``, lists its tools as agentrl tools and stops it again.

    Raises:
        McpServerError: As :meth:`McpConnection.start`.
    """
    connection = await McpConnection.start(server, sandbox=sandbox)
    try:
        return list(connection.tools)
    finally:
        await connection.close()


async def _list_all(client: Any) -> list[Any]:
    tools: list[Any] = []
    cursor = None
    for _ in range(MAX_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _convert(server: McpServer, listing: Sequence[Any]) -> tuple[McpTool, ...]:
    """The listed tools as agentrl tools (allow-list applied), reusing equal ones."""
    names = [spec.name for spec in listing]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise McpServerError(f"MCP server {server.label!r} lists two tools named {duplicates[0]!r}")
    if server.tools is not None:
        missing = [n for n in server.tools if n not in names]
        if missing:
            raise McpServerError(
                f"MCP server {server.label!r} does not list the tool(s) {', '.join(map(repr, missing))} "
                f"named in tools=[...]; it lists: {', '.join(names) or '(none)'}"
            )
        listing = [spec for spec in listing if spec.name in server.tools]
    tools = []
    for spec in listing:
        dump = spec.model_dump_json() if hasattr(spec, "model_dump_json") else repr(spec)
        cache_key = (server.key, dump)
        tool = _TOOL_CACHE.get(cache_key)
        if tool is None:
            tool = McpTool(server, spec)
            if len(_TOOL_CACHE) >= _TOOL_CACHE_MAX:
                _TOOL_CACHE.clear()
            _TOOL_CACHE[cache_key] = tool
        tools.append(tool)
    return tuple(tools)


def _describe(exc: BaseException | None) -> str:
    """``Type: message`` of the innermost exception (exception groups unwrapped)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if exc is None:
        return "unknown error"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _retrieve(task: asyncio.Task[None]) -> None:
    """Reads a finished owner task's outcome (so asyncio never reports it as lost)."""
    if task.done() and not task.cancelled():
        exc = task.exception()
        if exc is not None:
            _log.debug("MCP owner task ended with %r", exc)
