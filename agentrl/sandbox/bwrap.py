"""The ``bwrap`` backend: one long-lived set of Linux namespaces per episode.

``start()`` launches bubblewrap around a ``sleep infinity`` holder; its namespaces (user, mount,
pid, net, ipc, uts, cgroup) live as long as the sandbox. Each command enters them with
``nsenter`` (a few setns calls instead of building a sandbox per command), as the sandbox's own
unprivileged uid, under ``prlimit`` limits and no-new-privs. So ``/tmp`` and background
processes persist between commands of an episode, as in a container, and a command costs about
what a plain subprocess costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import IO

from agentrl.sandbox import _procs
from agentrl.sandbox._io import kill_process_group
from agentrl.sandbox.base import WORKSPACE, Limits, SandboxError, SandboxUnavailableError
from agentrl.sandbox.local import BASE_PATH, LocalSandbox

_ETC_ALLOWED = (
    "/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
    "/etc/localtime", "/etc/ssl", "/etc/ca-certificates", "/etc/mime.types",
    "/etc/nsswitch.conf", "/etc/hosts", "/etc/protocols", "/etc/services",
)
_NAMESPACES = ("--user", "--mount", "--pid", "--net", "--ipc", "--uts")
_RESTART_NOTE = ("[the sandbox was restarted because its processes were gone (e.g. after "
                 "`kill -9 -1`): /tmp and background processes were reset; workspace files are kept]\n")


class BwrapSandbox(LocalSandbox):
    """Bubblewrap namespaces, entered per command.

    Guarantees:
        * No network: a private network namespace with only ``lo`` (connects fail), unless
          built with ``network=True`` (a command agent that must reach the gateway on the
          host's loopback): then the host's network, everything else as below.
        * Private PID namespace: sandboxed code sees only its own processes. A timeout kills the
          command's process group and every process holding its output pipes (``setsid``
          grandchildren included); closing kills the whole namespace.
        * No capabilities and no-new-privs, and as root an unprivileged uid of its own: no
          remount or chown escapes, root-owned host files are neither writable nor, when
          private, readable. With ``own_uid=False`` (a command agent, which must read a Python
          installation under a private home) it keeps the caller's uid: the read-only mounts
          and the private filesystem still hold, the per-uid process limit does not.
        * Filesystem: read-only root; ``/usr`` and a short allow-list of ``/etc`` files
          read-only; private ``/tmp`` (size-capped tmpfs) and ``/dev``; the workspace
          read-write at ``/workspace``; the directories of the ``ro_binds`` option read-only at
          their host paths. Home directories, the repository and every other host path are
          invisible.
        * Environment cleared: only PATH, HOME, LANG, TMPDIR and what the caller passes.
        * rlimits per command: address space, CPU time, file size, and (root) process count.
    Does not guarantee:
        * Kernel-level isolation: it shares the host kernel and has no seccomp filter, so a
          kernel exploit escapes. Use VMs for hostile multi-tenant code.
        * Without root: no per-sandbox uid (process limits are per user), no workspace cap.
        * Survival of ``kill -9 -1`` inside: it kills the namespace's processes; the next command
          restarts the sandbox (workspace kept) and says so.
    """

    backend = "bwrap"

    def __init__(self, limits: Limits | None = None, *, tag: str = "", ro_binds: Sequence[str] = (),
                 network: bool = False, own_uid: bool = True) -> None:
        for tool in ("bwrap", "nsenter", "prlimit", "setpriv"):
            if shutil.which(tool) is None:
                raise SandboxUnavailableError(
                    f"the bwrap backend needs `{tool}`: `apt-get install bubblewrap util-linux` "
                    "(Debian/Ubuntu), or choose another backend: `--env-kwarg sandbox=docker`, or "
                    "`--env-kwarg sandbox=process` for trusted code only"
                )
        super().__init__(limits, tag=tag, ro_binds=ro_binds, own_uid=own_uid)
        self.network = network
        self._holder: asyncio.subprocess.Process | None = None
        self._holder_stderr: IO[bytes] | None = None
        self._ns_pid: int | None = None

    async def start(self) -> None:
        await super().start()
        if self._holder is None:
            await self._start_holder()

    async def _start_holder(self) -> None:
        """Starts bwrap around ``sleep infinity`` and learns the namespace's init pid."""
        assert self.workspace is not None
        info_r, info_w = os.pipe()
        argv = [
            *self._rlimits(cpu=False), *self._drop_to_uid(), *self._bwrap_args(),
            "--info-fd", str(info_w), "--", "sleep", "infinity",
        ]
        # bwrap's stderr goes to a file, not a pipe: a pipe transport of a long-lived holder
        # could outlive the event loop (closed with the loop gone: a traceback at exit)
        self._holder_stderr = tempfile.TemporaryFile()
        try:
            with _procs.spawning():
                self._holder = await asyncio.create_subprocess_exec(
                    *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                    stderr=self._holder_stderr, pass_fds=(info_w,), start_new_session=True,
                    env={"PATH": BASE_PATH}, cwd=self.workspace,
                )
                _procs.track_child(self._holder)
        finally:
            os.close(info_w)
        try:
            info = await asyncio.wait_for(asyncio.to_thread(_read_info, info_r), 30)
        except (TimeoutError, ValueError) as exc:
            self._holder_stderr.seek(0)
            stderr = self._holder_stderr.read(8192)
            raise SandboxError(f"bwrap did not start: {exc} {stderr.decode(errors='replace')}") from exc
        self._ns_pid = int(info["child-pid"])
        await self._wait_ready()

    async def _wait_ready(self, timeout: float = 30.0) -> None:
        """Waits until bwrap has started the holder inside the namespace: only then are the
        uid map and the mounts complete, so ``nsenter`` finds a finished sandbox."""
        children = f"/proc/{self._ns_pid}/task/{self._ns_pid}/children"
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            assert self._holder is not None
            if self._holder.returncode is not None:
                raise SandboxError(f"bwrap exited with status {self._holder.returncode} while starting")
            try:
                with open(children) as f:
                    if f.read().strip():
                        return
            except OSError:
                pass
            await asyncio.sleep(0.001)
        raise SandboxError(f"bwrap did not finish starting within {timeout:g} s")

    def _bwrap_args(self) -> list[str]:
        assert self.workspace is not None
        args = [
            "bwrap", "--unshare-all", *(["--share-net"] if self.network else []),
            "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
            "--symlink", "usr/lib", "/lib",
        ]
        if os.path.isdir("/usr/lib64"):
            args += ["--symlink", "usr/lib64", "/lib64"]
        for path in _ETC_ALLOWED:
            args += ["--ro-bind-try", path, path]
        return [
            *args,
            "--proc", "/proc", "--dev", "/dev",
            "--size", str(self.limits.file_size_mb * 1024 * 1024), "--tmpfs", "/tmp",
            "--bind", self.workspace, WORKSPACE,
            # e.g. a Python package directory for a server run inside; after /tmp, so a bound
            # directory under /tmp is not hidden by the private one
            *(arg for path in self.ro_binds for arg in ("--ro-bind", path, path)),
            "--remount-ro", "/",
            "--chdir", WORKSPACE,
        ]

    async def _ensure_running(self) -> str:
        if self._holder is not None and self._holder.returncode is None:
            return ""
        if self.closed or self.workspace is None:
            raise SandboxError("sandbox is not started (or already closed)")
        await self._stop_holder()
        await self._start_holder()
        return _RESTART_NOTE

    def _command(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> tuple[list[str], dict[str, str]]:
        host_env = {"PATH": BASE_PATH, "HOME": WORKSPACE, "LANG": "C.UTF-8", "TMPDIR": "/tmp", **env}
        # nsenter resolves --wd=PATH on the host, so enter at the holder's cwd (/workspace) and
        # change directory inside when another one is asked for.
        enter = [
            "nsenter", "-t", str(self._ns_pid),
            *(ns for ns in _NAMESPACES if not (self.network and ns == "--net")), "--root", "--wd",
            "-S", str(self.uid), "-G", str(self.gid), "--", "setpriv", "--no-new-privs", "--",
        ]
        if cwd != WORKSPACE:
            argv = ["/bin/sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", cwd, *argv]
        return [*self._rlimits(), *enter, *argv], host_env

    async def _stop_holder(self) -> None:
        holder, self._holder = self._holder, None
        stderr, self._holder_stderr = self._holder_stderr, None
        try:
            if holder is not None:
                # Not holder.kill(): Popen.send_signal polls first and would reap the child
                # under asyncio's watcher, losing its status. The holder leads its own group.
                kill_process_group(holder.pid)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(holder.wait(), 5)
        finally:
            if stderr is not None:
                stderr.close()

    async def close(self) -> None:
        if self.closed:
            return
        await self._stop_holder()
        await super().close()
        await asyncio.to_thread(_procs.reap_orphans, self.uid)


def _read_info(fd: int) -> dict:
    """Reads bwrap's ``--info-fd`` JSON (blocking; run in a thread)."""
    data = b""
    decoder = json.JSONDecoder()
    try:
        while True:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise ValueError("bwrap exited before reporting its namespaces")
            data += chunk
            try:
                info, _ = decoder.raw_decode(data.decode())
                return info
            except ValueError:
                continue
    finally:
        os.close(fd)
