"""A stateful shell session over a long-running ``bash`` process's pipes.

Each command is sent base64-encoded and run with ``eval`` in the same shell, so ``cd``,
``export`` and shell variables persist, and a syntax error cannot kill the session. Its stdin is
``/dev/null`` (it cannot swallow the next command). Completion is detected by a random marker
printed after the command on both stdout and stderr, with the exit status.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from agentrl.sandbox._io import CappedBuffer
from agentrl.sandbox.base import ExecResult, ShellSession


class ShellProcess(Protocol):
    """What the session needs of the shell process (``asyncio.subprocess.Process`` fits)."""

    stdin: asyncio.StreamWriter | None
    stdout: asyncio.StreamReader | None
    stderr: asyncio.StreamReader | None

    @property
    def returncode(self) -> int | None: ...


SpawnShell = Callable[[], Awaitable[ShellProcess]]
KillShell = Callable[[ShellProcess], Awaitable[None]]


class _MarkerReader:
    """Reads a stream up to a marker line, keeping at most ``cap`` bytes of what came before."""

    def __init__(self, stream: asyncio.StreamReader, cap: int) -> None:
        self.stream = stream
        self.cap = cap

    async def read_until(self, marker: bytes) -> tuple[CappedBuffer, bytes]:
        """Returns (output before the marker, the rest of the marker line)."""
        out = CappedBuffer(self.cap)
        pending = b""
        needle = b"\n" + marker
        while True:
            chunk = await self.stream.read(65536)
            if not chunk:
                out.feed(pending)
                raise EOFError("shell exited")
            pending += chunk
            at = pending.find(needle)
            if at >= 0:
                end = pending.find(b"\n", at + len(needle))
                while end < 0:
                    more = await self.stream.read(256)
                    if not more:
                        raise EOFError("shell exited")
                    pending += more
                    end = pending.find(b"\n", at + len(needle))
                out.feed(pending[:at])
                return out, pending[at + len(needle) : end]
            keep = len(needle)
            if len(pending) > keep:
                out.feed(pending[:-keep])
                pending = pending[-keep:]


async def _both_markers(
    stdout: Awaitable[tuple[CappedBuffer, bytes]], stderr: Awaitable[tuple[CappedBuffer, bytes]],
    timeout: float,
) -> tuple[tuple[CappedBuffer, bytes], tuple[CappedBuffer, bytes]]:
    """Both streams' reads, or the first one's error (``EOFError`` when the shell ended), or
    ``TimeoutError``. Neither read outlives the call: when one fails, the time is up or the
    caller is cancelled (a run's Ctrl-C), the other is cancelled and every outcome retrieved,
    so none is reported later as "never retrieved" (``asyncio.gather`` under ``wait_for``
    leaves its gathering future's cancellation unretrieved when the loop cancels the reads)."""
    reads = [asyncio.ensure_future(stdout), asyncio.ensure_future(stderr)]
    for read in reads:
        read.add_done_callback(lambda task: task.cancelled() or task.exception())
    try:
        done, _ = await asyncio.wait(reads, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
        for read in reads:
            error = read.exception() if read in done else None
            if error is not None:
                raise error
        if len(done) < len(reads):
            raise TimeoutError
        return reads[0].result(), reads[1].result()
    finally:
        for read in reads:
            read.cancel()


class PipeShellSession(ShellSession):
    """A shell session over the pipes of a process started by ``spawn``.

    Args:
        spawn: Starts ``bash`` (inside the sandbox) with stdin/stdout/stderr pipes.
        kill: Kills that process and everything it started.
        default_timeout: Seconds per command when ``run`` gets none.
        output_bytes: Cap on each of stdout and stderr per command.
    """

    def __init__(self, spawn: SpawnShell, kill: KillShell, default_timeout: float, output_bytes: int) -> None:
        self._spawn = spawn
        self._kill = kill
        self._default_timeout = default_timeout
        self._output_bytes = output_bytes
        self._proc: ShellProcess | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def run(self, command: str, timeout: float | None = None) -> ExecResult:
        timeout = self._default_timeout if timeout is None else timeout
        async with self._lock:
            if self._closed:
                raise RuntimeError("shell session is closed")
            note = ""
            if self._proc is None or self._proc.returncode is not None:
                if self._proc is not None:
                    note = "[a new shell was started: the previous one ended]\n"
                self._proc = await self._spawn()
            proc = self._proc
            assert proc.stdin and proc.stdout and proc.stderr
            marker = f"__agentrl_{secrets.token_hex(8)}__".encode()
            encoded = base64.b64encode(command.encode()).decode()
            script = (
                f"eval \"$(printf %s '{encoded}' | base64 -d)\" </dev/null; __agentrl_rc=$?; "
                f"printf '\\n%s %d\\n' '{marker.decode()}' \"$__agentrl_rc\"; "
                f"printf '\\n%s\\n' '{marker.decode()}' >&2\n"
            )
            start = time.perf_counter()
            try:
                proc.stdin.write(script.encode())
                await proc.stdin.drain()
                (out, status), (err, _) = await _both_markers(
                    _MarkerReader(proc.stdout, self._output_bytes).read_until(marker),
                    _MarkerReader(proc.stderr, self._output_bytes).read_until(marker),
                    timeout,
                )
            except TimeoutError:
                await self._kill(proc)
                self._proc = None
                return ExecResult(
                    None, "", note + "[the shell was killed and will restart: cwd and variables reset]",
                    timed_out=True, duration_s=time.perf_counter() - start,
                )
            except (EOFError, ConnectionResetError, BrokenPipeError):
                await self._kill(proc)
                self._proc = None
                return ExecResult(
                    None, "", note + "[the shell exited (e.g. `exit` was run); a new one starts "
                    "with the next command]", duration_s=time.perf_counter() - start,
                )
            code = int(status.strip() or b"-1")
            return ExecResult(
                code, out.text(), note + err.text(),
                truncated=bool(out.dropped or err.dropped),
                duration_s=time.perf_counter() - start,
            )

    async def close(self) -> None:
        # Not under the lock: a command still running holds it, and must end now (its run()
        # then sees the shell's end of file) rather than delay the close by its timeout.
        self._closed = True
        proc, self._proc = self._proc, None
        if proc is not None:
            await self._kill(proc)
