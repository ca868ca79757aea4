"""The sandbox interface: run model-written commands and files somewhere they cannot hurt.

A :class:`Sandbox` is one episode's execution environment: a private workspace directory
(``/workspace`` inside), a way to run commands in it, a stateful shell session, and file I/O
confined to the workspace. Backends differ in what they isolate; each backend's docstring lists
what it guarantees and what it does not.

Every failure of the *sandboxed code* (non-zero exit, timeout, a limit hit, output flood) is data
in :class:`ExecResult`, never an exception: tools turn it into an observation. Exceptions
(:class:`SandboxError`) mean the sandbox itself is broken or misused; :class:`SandboxLost`, that
it is gone (its episode fails instead of seeing a tool error).
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
from collections.abc import Mapping, Sequence

from agentrl.errors import AgentRLError, ResourceLost
from agentrl.injection import Injected

WORKSPACE = "/workspace"
"""Path of the episode's workspace inside every sandbox (the working directory by default)."""


class SandboxError(AgentRLError):
    """The sandbox cannot do what was asked (backend missing, start failed, closed, path
    outside the workspace). Tools report these to the model as tool errors (all but
    :class:`SandboxLost`)."""


class SandboxUnavailableError(SandboxError):
    """The requested backend cannot run on this machine; the message says how to fix that."""


class SandboxLost(SandboxError, ResourceLost):
    """The sandbox's host died (its node left the Ray cluster, or its host process stopped
    answering), with everything that ran in it.

    Unlike other sandbox errors it is not shown to the model: nothing the model wrote caused it.
    The tool call re-raises it and the episode fails with ``metadata["finish"] =
    "sandbox_lost"``; under ``--use-fault-tolerance`` the episode is played again from its
    start, in a new sandbox.
    """


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits applied to everything run in a sandbox.

    Attributes:
        timeout_s: Default wall-clock limit per command (``exec`` may override it).
        memory_mb: Address-space / memory limit of the sandboxed processes.
        cpu_s: CPU-time limit per command (RLIMIT_CPU where the backend uses rlimits).
        pids: Most processes/threads at once (fork bombs stop here).
        file_size_mb: Largest file a command may write (RLIMIT_FSIZE / tmpfs size).
        workspace_mb: Size cap of the workspace where the backend can enforce one.
        output_bytes: stdout and stderr are each cut at this size with a visible marker.
    """

    timeout_s: float = 30.0
    memory_mb: int = 1024
    cpu_s: int = 60
    pids: int = 128
    file_size_mb: int = 64
    workspace_mb: int = 256
    output_bytes: int = 64 * 1024


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """What one command did.

    Attributes:
        exit_code: The process's exit status (``-N`` when killed by signal N; ``None`` when it
            never finished because the timeout killed it).
        stdout: Decoded standard output (UTF-8, invalid bytes replaced), capped.
        stderr: Decoded standard error, capped.
        timed_out: The wall-clock timeout fired and everything the command started was killed.
        limit_hit: Name of a resource limit that killed or stopped it (``"memory"``, ``"cpu"``,
            ``"file_size"``, ``"pids"``), when the backend can tell; else ``None``.
        truncated: stdout or stderr was cut at ``Limits.output_bytes``.
        duration_s: Wall time of the command.
    """

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    limit_hit: str | None = None
    truncated: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Exited 0 within its limits."""
        return self.exit_code == 0 and not self.timed_out and self.limit_hit is None

    def to_text(self) -> str:
        """A compact rendering for a model: output, then a status line when not plain success."""
        parts = [self.stdout]
        if self.stderr:
            parts.append(self.stderr)
        text = "\n".join(p.rstrip("\n") for p in parts if p)
        if self.timed_out:
            text += f"\n[timed out after {self.duration_s:.1f} s; all its processes were killed]"
        elif self.limit_hit:
            text += f"\n[stopped: {self.limit_hit} limit reached]"
        elif self.exit_code != 0:
            text += f"\n[exit code {self.exit_code}]"
        return text.strip("\n")


class ShellSession(abc.ABC):
    """A long-lived shell inside a sandbox: ``cd`` and ``export`` persist between commands."""

    @abc.abstractmethod
    async def run(self, command: str, timeout: float | None = None) -> ExecResult:
        """Runs ``command`` in the session's shell. After a timeout the shell is restarted
        (state is lost, and the result says so in stderr)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Ends the shell. Idempotent."""


class SandboxProcess(abc.ABC):
    """A long-running process inside a sandbox, with pipes to its stdin, stdout and stderr (a
    server speaking over stdio, for example).

    It has no wall-clock limit: it runs until it exits, :meth:`kill` is called, or the sandbox
    closes. The sandbox's other limits apply to it as to any command (memory, CPU time over its
    whole life, file size, process count).

    Attributes:
        stdin: Writes to the process's standard input.
        stdout: Reads its standard output (a line longer than 1 MiB needs ``read``, not
            ``readline``).
        stderr: Reads its standard error; read it, or a chatty process blocks once the pipe is
            full.
    """

    stdin: asyncio.StreamWriter
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader

    @property
    @abc.abstractmethod
    def returncode(self) -> int | None:
        """The exit status (``-N`` for signal N), or ``None`` while it runs."""

    @abc.abstractmethod
    async def wait(self) -> int:
        """Waits for the process to exit; returns its status."""

    @abc.abstractmethod
    async def kill(self) -> None:
        """Kills the process and everything it started, and closes the pipes. Idempotent."""


class Sandbox(Injected, abc.ABC):
    """One episode's isolated execution environment (inject it into tools by annotation).

    Args:
        limits: Resource limits for everything run inside.
    """

    backend: str = "abstract"

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.closed = False

    @abc.abstractmethod
    async def start(self) -> None:
        """Creates the sandbox (workspace, container, ...). Called once before use."""

    @abc.abstractmethod
    async def exec(
        self,
        command: str | list[str],
        *,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str = WORKSPACE,
    ) -> ExecResult:
        """Runs one command (a shell string for ``sh -c``, or an argv list) to completion.

        Args:
            command: Shell command line or argv.
            timeout: Wall-clock seconds (default ``limits.timeout_s``); on expiry every process
                the command started is killed, grandchildren included.
            stdin: Data for standard input (none: empty stdin).
            env: Extra environment variables (the base environment is minimal and fixed).
            cwd: Working directory inside the sandbox.
        """

    @abc.abstractmethod
    async def open_shell(self) -> ShellSession:
        """A stateful shell session in this sandbox."""

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str = WORKSPACE,
    ) -> SandboxProcess:
        """Starts ``argv`` in the sandbox with piped stdin, stdout and stderr, and returns at
        once (see :class:`SandboxProcess`).

        Args:
            argv: The program and its arguments.
            env: Extra environment variables (over the same minimal base as :meth:`exec`).
            cwd: Working directory inside the sandbox.

        Raises:
            SandboxError: The backend cannot spawn long-running processes (this default), or
                the process cannot be started.
        """
        raise SandboxError(f"the {self.backend} sandbox cannot spawn long-running processes")

    @abc.abstractmethod
    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """Reads a file of the workspace. Paths are resolved inside the sandbox: symlinks and
        ``..`` that point outside the workspace are refused with :class:`SandboxError`."""

    @abc.abstractmethod
    async def write_file(self, path: str, data: str | bytes) -> None:
        """Writes a file of the workspace (parents created); same confinement as read."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Kills everything still running and removes the workspace. Idempotent."""

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
