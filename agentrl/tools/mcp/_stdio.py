"""Transports of :mod:`agentrl.tools.mcp` beyond the SDK's own: stdio over a sandboxed
process's pipes, an end-of-stream watcher, and the bounded tail of a server's stderr.

Imports the MCP SDK (and anyio): loaded only when a server starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import anyio
import mcp_types
from mcp.shared.message import SessionMessage

from agentrl.sandbox.base import SandboxProcess

STDERR_TAIL_BYTES = 8192
"""How much of a server's stderr is kept (the end), for error messages and logs."""
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Longest JSON-RPC line read from a sandboxed server; a longer one ends the connection."""
EXIT_GRACE_S = 2.0
"""How long a sandboxed server may take to exit after its stdin is closed, before it is killed."""


class Tail:
    """The last :data:`STDERR_TAIL_BYTES` bytes of a stream (a server's stderr)."""

    def __init__(self) -> None:
        self._data = bytearray()
        self.closed = asyncio.Event()
        """Set when the stream has ended."""

    def feed(self, chunk: bytes) -> None:
        self._data += chunk
        if len(self._data) > STDERR_TAIL_BYTES:
            del self._data[: len(self._data) - STDERR_TAIL_BYTES]

    def text(self) -> str:
        """The tail, decoded (invalid bytes replaced), stripped; ``""`` when empty."""
        return self._data.decode(errors="replace").strip()

    async def wait_closed(self, timeout: float) -> None:
        """Waits up to ``timeout`` s for the stream to end (its writer has exited)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.closed.wait(), timeout)


class _TailProtocol(asyncio.Protocol):
    def __init__(self, tail: Tail) -> None:
        self._tail = tail

    def data_received(self, data: bytes) -> None:
        self._tail.feed(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._tail.closed.set()


@contextlib.asynccontextmanager
async def stderr_pipe(tail: Tail) -> AsyncIterator[Any]:
    """A writable file (a real descriptor, for a child's stderr) whose data ends up in ``tail``.

    The caller closes the yielded file once the child has it (the child keeps its copy), so the
    tail sees the end of the stream when the child exits. On exit the read side is closed.
    """
    read_fd, write_fd = os.pipe()
    writer = os.fdopen(write_fd, "w")
    try:
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: _TailProtocol(tail), os.fdopen(read_fd, "rb", buffering=0)
        )
    except BaseException:
        writer.close()
        os.close(read_fd)
        raise
    try:
        yield writer
    finally:
        writer.close()
        transport.close()


@contextlib.asynccontextmanager
async def watched(streams: tuple[Any, Any], eof: asyncio.Event) -> AsyncIterator[tuple[Any, Any]]:
    """A transport over opened ``(read, write)`` streams that sets ``eof`` when the server's
    side ends (the process exited, the connection closed), even between requests.

    Messages are passed through unchanged; the task group it runs belongs to the caller's task.
    """
    inner_read, write = streams
    send, outer_read = anyio.create_memory_object_stream[Any](0)

    async def pump() -> None:
        try:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError,
                                     anyio.EndOfStream):
                async with send:
                    async for item in inner_read:
                        await send.send(item)
        finally:
            eof.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(pump)
        try:
            yield outer_read, write
        finally:
            tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def sandbox_stdio(process: SandboxProcess, tail: Tail) -> AsyncIterator[tuple[Any, Any]]:
    """The MCP stdio transport over a process running in a sandbox (``Sandbox.spawn``).

    Messages are newline-delimited JSON-RPC on the process's stdin and stdout; its stderr goes
    to ``tail``. On exit the process's stdin is closed, it gets :data:`EXIT_GRACE_S` to exit,
    then it (and everything it started) is killed; this shutdown runs even when the caller is
    cancelled.
    """
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)

    async def stdout_reader() -> None:
        buffer = b""
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError,
                                 ConnectionError, OSError):
            async with read_send:
                while chunk := await process.stdout.read(65536):
                    lines = (buffer + chunk).split(b"\n")
                    buffer = lines.pop()
                    if len(buffer) > MAX_MESSAGE_BYTES:
                        return  # a server flooding one line: the connection ends
                    for line in lines:
                        if line.strip():
                            await read_send.send(_parse(line))

    async def stdin_writer() -> None:
        try:
            async with write_recv:
                async for message in write_recv:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    process.stdin.write(data.encode() + b"\n")
                    await process.stdin.drain()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError, OSError):
            await read_send.aclose()  # the server is gone: pending requests end now

    async def stderr_reader() -> None:
        try:
            with contextlib.suppress(ConnectionError, OSError):
                while chunk := await process.stderr.read(65536):
                    tail.feed(chunk)
        finally:
            tail.closed.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        tg.start_soon(stderr_reader)
        try:
            yield read_recv, write_send
        finally:
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                    process.stdin.close()
                with anyio.move_on_after(EXIT_GRACE_S):
                    await process.wait()
                await process.kill()
            tg.cancel_scope.cancel()


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:  # pydantic's ValidationError included: the session reports it
        return exc
