"""Sandboxes made of host processes: the shared machinery, and the ``process`` backend.

Each local sandbox has a host workspace directory under the sandbox root and, when agentrl runs
as root, a uid of its own (from ``UID_BASE`` up), so rlimits such as the process count are per
sandbox and ``kill -9 -1`` inside reaches only that sandbox's processes. As root the workspace is
also a size-capped tmpfs mount (a disk-fill stops at ``Limits.workspace_mb``).

Commands are started through small exec wrappers (``prlimit``, ``setpriv``, ``nsenter``) rather
than a ``preexec_fn``, so Python spawns them with vfork: forking a multi-GB trainer process for
every tool call would be slow.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from agentrl.sandbox import _procs
from agentrl.sandbox._io import (
    CappedBuffer,
    drain,
    kill_process_group,
    read_workspace_file,
    write_workspace_file,
)
from agentrl.sandbox.base import (
    WORKSPACE,
    ExecResult,
    Limits,
    Sandbox,
    SandboxError,
    SandboxProcess,
    ShellSession,
)
from agentrl.sandbox.shell import PipeShellSession

BASE_PATH = "/usr/local/bin:/usr/bin:/bin"
OUTPUT_GRACE_S = 1.0
"""How long output pipes may stay open after a command exits before their holders are killed."""
_SIGNAL_LIMITS = {signal.SIGXCPU: "cpu", signal.SIGXFSZ: "file_size"}


@dataclass
class Spawned:
    """A started command: the process, its pipe readers, and the pipes' inodes (so a timeout
    can find every process still holding them)."""

    process: asyncio.subprocess.Process
    stdin: asyncio.StreamWriter | None
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    inodes: tuple[int, ...]
    transports: list[asyncio.BaseTransport] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def close_pipes(self) -> None:
        for transport in self.transports:
            transport.close()


class _LocalProcess(SandboxProcess):
    """A :class:`SandboxProcess` of a local backend: a spawned command and its sandbox's kill."""

    def __init__(self, spawned: Spawned, kill: Callable[[Spawned], Awaitable[None]]) -> None:
        assert spawned.stdin is not None
        self.stdin = spawned.stdin
        self.stdout = spawned.stdout
        self.stderr = spawned.stderr
        self.pid = spawned.pid
        self._spawned = spawned
        self._kill = kill
        self._killed = False

    @property
    def returncode(self) -> int | None:
        return self._spawned.returncode

    async def wait(self) -> int:
        return await self._spawned.process.wait()

    async def kill(self) -> None:
        if self._killed:
            return
        self._killed = True
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            self.stdin.close()
        await self._kill(self._spawned)


class LocalSandbox(Sandbox):
    """Shared machinery of host-process backends: workspace, uid, limits, spawning, timeouts,
    file I/O. Subclasses say how a command line is wrapped (:meth:`_command`).

    Args:
        limits: Resource limits.
        tag: Part of the workspace's directory name.
        own_uid: As root, run as a uid of the sandbox's own (``False``: the caller's).
        ro_binds: Host directories made visible read-only at the same path (bwrap); the
            ``process`` backend sees the whole host anyway and only checks them. Each must be
            an absolute path to an existing directory the sandbox's uid can read.

    Raises:
        ValueError: An entry of ``ro_binds`` is not an absolute path to a directory.
    """

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        tag: str = "",
        own_uid: bool = True,
        ro_binds: Sequence[str] = (),
    ) -> None:
        if isinstance(ro_binds, str):
            raise ValueError(f"ro_binds must be a list of directories, got the string {ro_binds!r}")
        for path in ro_binds:
            if not isinstance(path, str) or not os.path.isabs(path) or not os.path.isdir(path):
                raise ValueError(f"ro_binds entries must be absolute paths of existing directories, "
                                 f"got {path!r}")
        self.ro_binds = tuple(os.path.normpath(p) for p in ro_binds)
        super().__init__(limits)
        # as root, a uid of its own (own_uid=False: the caller's, for code that must read the
        # caller's files, e.g. a command agent running the project's Python)
        self.own_uid = own_uid and _procs.IS_ROOT
        self.uid = _procs.allocate_uid() if self.own_uid else os.getuid()
        self.gid = self.uid if self.own_uid else os.getgid()
        self.tag = tag
        self.workspace: str | None = None
        self._mounted = False
        self._groups: set[int] = set()  # process groups started here (killed on close)
        _procs.become_subreaper()

    @abc.abstractmethod
    def _command(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> tuple[list[str], dict[str, str]]:
        """The host argv and environment that run ``argv`` in this sandbox at ``cwd``."""

    async def _ensure_running(self) -> str:
        """Brings the sandbox back if it died; returns a note for the model ("" when fine)."""
        return ""

    def _rlimits(self, *, cpu: bool = True) -> list[str]:
        """``prlimit`` options for the sandbox's limits (process count only with an own uid)."""
        limits = self.limits
        options = [f"--as={limits.memory_mb * 1024 * 1024}", "--core=0",
                   f"--fsize={limits.file_size_mb * 1024 * 1024}"]
        if cpu:
            options.append(f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}")
        if self.own_uid:
            options.append(f"--nproc={limits.pids}")
        return ["prlimit", *options, "--"]

    def _drop_to_uid(self) -> list[str]:
        """``setpriv`` switching to the sandbox uid with no privileges left (root only)."""
        if not self.own_uid:
            return ["setpriv", "--no-new-privs", "--"]
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.workspace is not None:
            return
        root = _procs.sandbox_root()
        os.makedirs(root, mode=0o711, exist_ok=True)
        # The name records the owning pid, so the reaper can tell leftovers of dead runs.
        self.workspace = tempfile.mkdtemp(prefix=f"ws-{os.getpid()}-{self.tag}", dir=root)
        if _procs.IS_ROOT:
            opts = (f"size={self.limits.workspace_mb}m,mode=0755,uid={self.uid},gid={self.gid},"
                    "nodev,nosuid")
            result = await asyncio.to_thread(
                subprocess.run, ["mount", "-t", "tmpfs", "-o", opts, "agentrl-ws", self.workspace],
                capture_output=True, text=True,
            )
            if result.returncode != 0:
                shutil.rmtree(self.workspace, ignore_errors=True)
                raise SandboxError(f"cannot mount the workspace tmpfs: {result.stderr.strip()}")
            self._mounted = True

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await asyncio.to_thread(self._cleanup)

    def _cleanup(self) -> None:
        if not self.own_uid:  # no uid to sweep: what is left of the commands' process groups
            for group in self._groups:
                kill_process_group(group)
        _procs.kill_uid(self.uid)
        _procs.reap_orphans(self.uid)
        if self.workspace is not None:
            if self._mounted:
                subprocess.run(["umount", "-l", self.workspace], capture_output=True)
            shutil.rmtree(self.workspace, ignore_errors=True)
        if self.own_uid:
            _procs.release_uid(self.uid)

    # -- running commands -----------------------------------------------------------------------

    async def _spawn(self, argv: list[str], env: dict[str, str], *, stdin: bool) -> Spawned:
        if self.workspace is None or self.closed:
            raise SandboxError("sandbox is not started (or already closed)")
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        inodes = (os.fstat(out_w).st_ino, os.fstat(err_w).st_ino)
        try:
            with _procs.spawning():
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
                    stdout=out_w, stderr=err_w, start_new_session=True, env=env, cwd=self.workspace,
                )
                _procs.track_child(process)
                self._groups.add(process.pid)
        except (OSError, subprocess.SubprocessError) as exc:
            for fd in (out_r, err_r):
                os.close(fd)
            raise SandboxError(f"{self.backend}: cannot start {argv[0]!r}: {exc}") from exc
        finally:
            os.close(out_w)
            os.close(err_w)
        loop = asyncio.get_running_loop()
        readers, transports = [], []
        for fd in (out_r, err_r):
            reader = asyncio.StreamReader(limit=2**20)
            transport, _ = await loop.connect_read_pipe(
                lambda r=reader: asyncio.StreamReaderProtocol(r), os.fdopen(fd, "rb", buffering=0)
            )
            readers.append(reader)
            transports.append(transport)
        return Spawned(process, process.stdin, readers[0], readers[1], inodes, transports)

    async def _kill(self, spawned: Spawned) -> None:
        """Kills the command's process group and every process still holding its pipes."""
        kill_process_group(spawned.pid)
        uid = self.uid if self.own_uid else None
        await asyncio.to_thread(_procs.kill_pipe_holders, spawned.inodes, uid)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(spawned.process.wait(), 5)
        spawned.close_pipes()

    async def exec(
        self,
        command: str | list[str],
        *,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str = WORKSPACE,
    ) -> ExecResult:
        timeout = self.limits.timeout_s if timeout is None else timeout
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        start = time.perf_counter()
        note = await self._ensure_running()
        host_argv, host_env = self._command(argv, env or {}, cwd)
        spawned = await self._spawn(host_argv, host_env, stdin=stdin is not None)
        out, err = CappedBuffer(self.limits.output_bytes), CappedBuffer(self.limits.output_bytes)
        readers = asyncio.gather(drain(spawned.stdout, out), drain(spawned.stderr, err))
        timed_out = False
        try:
            if stdin is not None and spawned.stdin is not None:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    spawned.stdin.write(stdin.encode() if isinstance(stdin, str) else stdin)
                    await spawned.stdin.drain()
                spawned.stdin.close()
            await asyncio.wait_for(asyncio.shield(spawned.process.wait()), timeout)
        except TimeoutError:
            timed_out = True
            await self._kill(spawned)
        try:
            await asyncio.wait_for(asyncio.shield(readers), OUTPUT_GRACE_S)
        except TimeoutError:
            # The command exited but background processes still hold its output pipes (a
            # server started without redirecting its output, a fork bomb): they are killed.
            await self._kill(spawned)
            note += "[background processes still holding the command's output were killed]\n"
            try:
                await asyncio.wait_for(readers, 2.0)
            except TimeoutError:
                readers.cancel()
        spawned.close_pipes()
        code = None if timed_out else spawned.returncode
        return ExecResult(
            code, out.text(), err.text() + note, timed_out=timed_out,
            limit_hit=None if timed_out else _limit_from_status(code, err),
            truncated=bool(out.dropped or err.dropped), duration_s=time.perf_counter() - start,
        )

    async def open_shell(self) -> ShellSession:
        async def spawn() -> Spawned:
            await self._ensure_running()
            host_argv, host_env = self._command(["/bin/bash", "--noprofile", "--norc"], {}, WORKSPACE)
            return await self._spawn(host_argv, host_env, stdin=True)

        return PipeShellSession(spawn, self._kill, self.limits.timeout_s, self.limits.output_bytes)

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str = WORKSPACE,
    ) -> SandboxProcess:
        """Starts ``argv`` with pipes (see :meth:`Sandbox.spawn`); the sandbox kills it, with
        everything it started, when it closes."""
        if not argv:
            raise SandboxError("spawn needs a command")
        await self._ensure_running()
        host_argv, host_env = self._command(list(argv), dict(env or {}), cwd)
        return _LocalProcess(await self._spawn(host_argv, host_env, stdin=True), self._kill)

    # -- files ----------------------------------------------------------------------------------

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        if self.workspace is None:
            raise SandboxError("sandbox is not started")
        cap = max_bytes if max_bytes is not None else self.limits.file_size_mb * 1024 * 1024
        return await asyncio.to_thread(read_workspace_file, self.workspace, path, cap)

    async def write_file(self, path: str, data: str | bytes) -> None:
        if self.workspace is None:
            raise SandboxError("sandbox is not started")
        raw = data.encode() if isinstance(data, str) else data
        owner = (self.uid, self.gid) if self.own_uid else None
        cap = self.limits.file_size_mb * 1024 * 1024
        await asyncio.to_thread(write_workspace_file, self.workspace, path, raw, owner, cap)


class ProcessSandbox(LocalSandbox):
    """A plain subprocess in the workspace directory. ISOLATES NOTHING: trusted code only.

    Guarantees: rlimits (memory, CPU time, file size; process count and a uid of its own as
    root, with no capabilities and no-new-privs), a cleared environment, a wall-clock timeout
    that kills the process group and every process still holding the command's output pipes,
    and, on close, every process of the sandbox's uid (root).
    Does not guarantee: anything else. The code sees the whole host filesystem and network and
    can read whatever its uid can; ``/workspace`` is not a real path (the working directory is
    the host workspace, ``$WORKSPACE`` holds its path). Without root, processes that detach from
    the command's pipes survive until the host cleans them up.
    """

    backend = "process"

    def _command(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> tuple[list[str], dict[str, str]]:
        assert self.workspace is not None
        host_cwd = self.workspace + cwd[len(WORKSPACE):] if cwd.startswith(WORKSPACE) else cwd
        ws = self.workspace
        host_env = {"PATH": BASE_PATH, "LANG": "C.UTF-8", "HOME": ws, "WORKSPACE": ws, "TMPDIR": ws, **env}
        script = 'cd "$1" && shift && exec "$@"'
        return [*self._rlimits(), *self._drop_to_uid(), "/bin/sh", "-c", script, "sh", host_cwd, *argv], host_env


def _limit_from_status(code: int | None, err: CappedBuffer) -> str | None:
    if code is None or code == 0:
        return None
    signum = -code if code < 0 else code - 128 if code > 128 else 0
    if signum in _SIGNAL_LIMITS:
        return _SIGNAL_LIMITS[signum]
    if b"MemoryError" in err.data or b"Cannot allocate memory" in err.data:
        return "memory"
    if b"Resource temporarily unavailable" in err.data and b"fork" in err.data:
        return "pids"
    return None
