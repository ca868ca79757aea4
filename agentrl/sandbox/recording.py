"""``RecordingSandbox``: a sandbox that keeps a log of what was run in it.

:class:`~agentrl.env.sandboxed.SandboxedToolEnv` hands its tools and its grader this wrapper
around the episode's sandbox, so that each episode's sample carries the commands its sandbox
ran (``metadata["commands"]``, shown by ``agentrl view``): what a tool executed on the model's
behalf, what the set-up and the grader ran, with exit codes, durations and the head of each
output. The log is bounded (:data:`MAX_ENTRIES` entries, :data:`OUTPUT_HEAD` characters of
output each); the wrapper changes nothing else: every call goes to the wrapped sandbox.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentrl.sandbox.base import WORKSPACE, ExecResult, Sandbox, SandboxProcess, ShellSession

__all__ = ["MAX_ENTRIES", "OUTPUT_HEAD", "CommandLog", "RecordingSandbox"]

MAX_ENTRIES = 200
"""Entries kept per episode; later ones are counted in :attr:`CommandLog.dropped`."""
OUTPUT_HEAD = 2000
"""Characters of a command's output (stdout, then stderr) kept in its entry."""
COMMAND_HEAD = 1000
"""Characters of a command line kept in its entry."""


class CommandLog:
    """The bounded log of one episode's sandbox operations.

    Args:
        where: Returns ``(phase, turn)`` at the time of a call: ``phase`` is ``setup``,
            ``tools`` or ``grade``; ``turn`` the env's turn number.
    """

    def __init__(self, where: Callable[[], tuple[str, int]]) -> None:
        self.where = where
        self.entries: list[dict[str, Any]] = []
        self.dropped = 0

    def add(self, kind: str, command: str, started: float, result: ExecResult | None = None,
            **extra: Any) -> None:
        """Appends one entry (``kind``: ``exec``, ``shell``, ``spawn``, ``read``, ``write``)."""
        if len(self.entries) >= MAX_ENTRIES:
            self.dropped += 1
            return
        phase, turn = self.where()
        entry: dict[str, Any] = {"phase": phase, "turn": turn, "kind": kind,
                                 "command": _head(command, COMMAND_HEAD),
                                 "duration_s": round(time.perf_counter() - started, 4), **extra}
        if result is not None:
            output = result.stdout + (("\n" if result.stdout else "") + result.stderr if result.stderr else "")
            entry.update(exit_code=result.exit_code, timed_out=result.timed_out,
                         limit_hit=result.limit_hit, output=_head(output, OUTPUT_HEAD),
                         output_chars=len(output))
        self.entries.append(entry)

    def to_list(self) -> list[dict[str, Any]]:
        """The entries, plus a last ``{"kind": "dropped", "count": n}`` when any were dropped."""
        if not self.dropped:
            return list(self.entries)
        return [*self.entries, {"kind": "dropped", "count": self.dropped}]


class RecordingSandbox(Sandbox):
    """Forwards every call to ``inner`` and logs it in ``log``.

    It is a :class:`Sandbox`, so tools that ask for one by annotation receive it; attributes it
    lacks (a backend's own methods) are the wrapped sandbox's. Closing it does not close
    ``inner`` (the pool that lent ``inner`` takes it back); ``closed`` is ``inner``'s.
    """

    def __init__(self, inner: Sandbox, log: CommandLog) -> None:
        # not Sandbox.__init__: ``closed`` is the wrapped sandbox's (a property), no flag of ours
        self.inner = inner
        self.log = log
        self.limits = inner.limits
        self.backend = inner.backend

    @property
    def closed(self) -> bool:  # type: ignore[override]
        """Whether the wrapped sandbox is closed (the pool closes it when it is not reused)."""
        return self.inner.closed

    def __getattr__(self, name: str) -> Any:
        # a backend's own methods (docker's host_dir, say) stay reachable through the wrapper
        return getattr(self.__dict__["inner"], name)

    async def start(self) -> None:
        """The wrapped sandbox is already started; nothing to do."""

    async def exec(self, command: str | list[str], *, timeout: float | None = None,
                   stdin: str | bytes | None = None, env: Mapping[str, str] | None = None,
                   cwd: str = WORKSPACE, **options: Any) -> ExecResult:
        """Runs and logs one command; ``options`` are the backend's own (DockerSandbox's
        ``user``), passed on, and logged."""
        started = time.perf_counter()
        result = await self.inner.exec(command, timeout=timeout, stdin=stdin, env=env, cwd=cwd,
                                       **options)
        self.log.add("exec", _command_text(command), started, result, **options)
        return result

    async def open_shell(self) -> ShellSession:
        return _RecordingShell(await self.inner.open_shell(), self.log)

    async def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                    cwd: str = WORKSPACE) -> SandboxProcess:
        started = time.perf_counter()
        process = await self.inner.spawn(argv, env=env, cwd=cwd)
        self.log.add("spawn", _command_text(list(argv)), started)
        return process

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        started = time.perf_counter()
        data = await self.inner.read_file(path, max_bytes=max_bytes)
        self.log.add("read", path, started, bytes=len(data))
        return data

    async def write_file(self, path: str, data: str | bytes) -> None:
        started = time.perf_counter()
        await self.inner.write_file(path, data)
        self.log.add("write", path, started, bytes=len(data.encode() if isinstance(data, str) else data))

    async def close(self) -> None:
        """Does nothing: ``inner`` goes back to its pool through the env, which closes it."""


class _RecordingShell(ShellSession):
    def __init__(self, inner: ShellSession, log: CommandLog) -> None:
        self.inner = inner
        self.log = log

    async def run(self, command: str, timeout: float | None = None) -> ExecResult:
        started = time.perf_counter()
        result = await self.inner.run(command, timeout=timeout)
        self.log.add("shell", command, started, result)
        return result

    async def close(self) -> None:
        await self.inner.close()


def _command_text(command: str | list[str]) -> str:
    return command if isinstance(command, str) else shlex.join(command)


def _head(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters]"
