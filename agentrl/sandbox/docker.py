"""The Docker sandbox backend: one long-lived, locked-down container per sandbox.

Start a daemon with ``scripts/dockerd.sh start`` (no systemd needed) and export the
``DOCKER_HOST`` it prints; the base image is built on first use (see
:mod:`agentrl.sandbox.images`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from agentrl.sandbox._io import CappedBuffer, read_workspace_file, write_workspace_file
from agentrl.sandbox.base import (
    WORKSPACE,
    ExecResult,
    Limits,
    Sandbox,
    SandboxError,
    SandboxUnavailableError,
    ShellSession,
)
from agentrl.sandbox.shell import PipeShellSession

DEFAULT_DOCKER_DIR = "/var/lib/agentrl-docker"
SANDBOX_LABEL = "agentrl.sandbox"
WORKSPACE_LABEL = "agentrl.workspace"
OWNER_LABEL = "agentrl.owner_pid"
WORKSPACE_PREFIX = "agentrl-docker-"
TOKEN_VAR = "AGENTRL_EXEC"
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": WORKSPACE,
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
}
_BASE_ENV_LIST = [f"{k}={v}" for k, v in BASE_ENV.items()]
MAX_POOL_SIZE = 128
HOST_GRACE_S = 1.0  # the host stops waiting at timeout * 1.05 + this
SWEEP_TIMEOUT_S = 10.0
_NO_FORK = b"timeout: fork system call failed"


def _hint() -> str:
    sock = os.path.join(os.environ.get("AGENTRL_DOCKER_DIR") or DEFAULT_DOCKER_DIR, "docker.sock")
    return (
        "run scripts/dockerd.sh start and export DOCKER_HOST=unix://" + sock + " (the line it "
        "prints)"
    )

# Runs inside the container as the sandbox uid, as the exec'd process itself (no fork needed,
# so it works while a fork bomb fills the pids limit). argv: mode ("sweep" | "probe"), then the
# AGENTRL_EXEC tokens whose processes must survive. It first SIGSTOPs every other process of
# the sandbox uid (stopped processes cannot fork), repeating until no new one appears, then
# SIGKILLs them all. docker-init and the container's `sleep` run as another uid and are never
# touched. Prints whether that worked and the cgroup's OOM-kill and pids-limit counters
# (python3-minimal has no json module).
_SWEEP = r"""
import os, signal, sys, time
mode, keep = sys.argv[1], {("AGENTRL_EXEC=" + t).encode() for t in sys.argv[2:]}
me, uid = os.getpid(), os.getuid()
def state(pid):
    with open("/proc/%d/stat" % pid, "rb") as f:
        s = f.read()
    return s[s.rindex(b")") + 2:].split()[0]
def kept(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return bool(keep.intersection(f.read().split(b"\0")))
    except OSError:
        return False
def victims():
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat("/proc/" + name).st_uid != uid or state(int(name)) == b"Z":
                continue
        except (OSError, ValueError, IndexError):
            continue
        if not kept(int(name)):
            out.add(int(name))
    return out
def counter(paths, key):
    for path in paths:
        try:
            with open(path) as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if k == key:
                        return int(v)
        except (OSError, ValueError):
            pass
    return None
ok = True
if mode == "sweep":
    ok, seen = False, set()
    for _ in range(300):
        vs = victims()
        new = vs - seen
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        seen |= vs
        if new:
            time.sleep(0.002)
            continue
        for pid in vs:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)
        if not victims():
            ok = True
            break
        seen = set()
print("agentrl-sweep ok=%d oom=%s pids=%s" % (ok,
    counter(["/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"], "oom_kill"),
    counter(["/sys/fs/cgroup/pids/pids.events", "/sys/fs/cgroup/pids.events"], "max")))
"""

# The command runner: one long-lived process per sandbox (started by one `docker exec` with its
# stdin attached) that forks the commands itself, so a command costs a fork instead of a runc
# exec (~100 ms of CPU each on our machines). It runs as the sandbox uid. Frames both ways are
# a 9-byte header (kind, request id, payload length) and the payload. Host -> runner:
# START (payload: NUL-joined cwd, output cap, has-stdin, number of env entries, env, argv),
# STDIN (data; empty = EOF), KILL. Runner -> host: OUT, ERR (at most `cap` bytes each), EXIT
# ("status dropped-out dropped-err"), FAIL (could not fork: the host falls back to docker exec),
# HELLO. A child that exited is reported once its pipes close, or 1 s later (like docker).
_RUNNER = r"""
import errno, os, selectors, signal, struct, subprocess, sys, time
H = struct.Struct(">BII")
sel = selectors.DefaultSelector()
jobs = {}
def send(kind, rid, data=b""):
    view = memoryview(H.pack(kind, rid, len(data)) + data)
    while view:
        view = view[os.write(1, view):]
def close_fd(job, fd):
    try:
        sel.unregister(fd)
    except (KeyError, ValueError):
        pass
    os.close(fd)
    job["fds"].discard(fd)
def finish(job, report=True):
    for fd in list(job["fds"]):
        close_fd(job, fd)
    if job["stdin"] is not None:
        if job["wreg"]:
            sel.unregister(job["stdin"])
        os.close(job["stdin"])
        job["stdin"] = None
    code = job["p"].poll()
    if code is not None and code < 0:
        code = 128 - code
    jobs.pop(job["rid"], None)
    if report:
        send(3, job["rid"], ("%s %d %d" % (code, job["drop"][0], job["drop"][1])).encode())
def start(rid, payload):
    f = payload.split(b"\0")
    cwd, cap, has_stdin, nenv = f[0].decode(), int(f[1]), f[2] == b"1", int(f[3])
    env = dict(e.split(b"=", 1) for e in f[4:4 + nenv])
    argv = f[4 + nenv:]
    try:
        p = subprocess.Popen(argv, stdin=subprocess.PIPE if has_stdin else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env,
                             start_new_session=True)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE):
            send(4, rid, str(e).encode())
            return
        send(2, rid, ("agentrl: cannot run the command: %s\n" % e).encode())
        send(3, rid, b"%d 0 0" % (126 if e.filename == cwd else 127))
        return
    job = {"rid": rid, "p": p, "cap": cap, "kept": [0, 0], "drop": [0, 0], "fds": set(),
           "stdin": None, "wreg": False, "buf": bytearray(), "eof": False, "exited": None}
    for i, pipe in enumerate((p.stdout, p.stderr)):
        fd = os.dup(pipe.fileno())
        pipe.close()
        os.set_blocking(fd, False)
        job["fds"].add(fd)
        sel.register(fd, selectors.EVENT_READ, (job, i))
    if has_stdin:
        fd = os.dup(p.stdin.fileno())
        p.stdin.close()
        os.set_blocking(fd, False)
        job["stdin"] = fd
    jobs[rid] = job
def pump_stdin(job):
    fd = job["stdin"]
    if fd is None:
        return
    try:
        while job["buf"]:
            del job["buf"][:os.write(fd, job["buf"][:65536])]
    except BlockingIOError:
        pass
    except OSError:
        job["buf"].clear()
        job["eof"] = True
    if job["buf"]:
        if not job["wreg"]:
            sel.register(fd, selectors.EVENT_WRITE, ("in", job))
            job["wreg"] = True
        return
    if job["wreg"]:
        sel.unregister(fd)
        job["wreg"] = False
    if job["eof"]:
        os.close(fd)
        job["stdin"] = None
def on_request(kind, rid, payload):
    if kind == 1:
        start(rid, payload)
        return
    job = jobs.get(rid)
    if job is None:
        return
    if kind == 2:
        if payload:
            job["buf"] += payload
        else:
            job["eof"] = True
        pump_stdin(job)
    elif kind == 3:
        try:
            os.killpg(job["p"].pid, signal.SIGKILL)
        except OSError:
            pass
        job["p"].wait()
        finish(job, report=False)
wake_r, wake_w = os.pipe()
os.set_blocking(wake_r, False)
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *a: None)
os.set_blocking(0, False)
sel.register(0, selectors.EVENT_READ, "host")
sel.register(wake_r, selectors.EVENT_READ, "wake")
inbuf = bytearray()
send(9, 0, b"agentrl-runner 1")
while True:
    now = time.monotonic()
    wait = None
    for job in list(jobs.values()):
        if job["exited"] is None and job["p"].poll() is not None:
            job["exited"] = now
        if job["exited"] is not None:
            if not job["fds"] or now - job["exited"] >= 1.0:
                finish(job)
            else:
                left = job["exited"] + 1.0 - now
                wait = left if wait is None else min(wait, left)
    for key, _ in sel.select(wait):
        tag = key.data
        if tag == "wake":
            try:
                while os.read(wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
        elif tag == "host":
            try:
                chunk = os.read(0, 262144)
            except BlockingIOError:
                continue
            if not chunk:
                for job in list(jobs.values()):
                    try:
                        os.killpg(job["p"].pid, signal.SIGKILL)
                    except OSError:
                        pass
                sys.exit(0)
            inbuf += chunk
            while len(inbuf) >= 9:
                kind, rid, size = H.unpack_from(inbuf)
                if len(inbuf) < 9 + size:
                    break
                payload = bytes(inbuf[9:9 + size])
                del inbuf[:9 + size]
                on_request(kind, rid, payload)
        elif tag[0] == "in":
            pump_stdin(tag[1])
        else:
            job, i = tag
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                close_fd(job, key.fd)
                continue
            room = max(0, job["cap"] - job["kept"][i])
            if room:
                send(1 + i, job["rid"], chunk[:room])
                job["kept"][i] += min(room, len(chunk))
            job["drop"][i] += max(0, len(chunk) - room)
"""

_CLIENTS: dict[tuple[type, str], Any] = {}
_CLIENTS_LOCK = threading.Lock()


def resolve_docker_host(docker_host: str | None = None) -> str:
    """The daemon address: ``docker_host`` > ``$DOCKER_HOST`` > the socket of
    ``scripts/dockerd.sh`` (``$AGENTRL_DOCKER_DIR/docker.sock``) when it exists > the SDK's
    default ``unix:///var/run/docker.sock``."""
    if docker_host:
        return docker_host
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    sock = os.path.join(os.environ.get("AGENTRL_DOCKER_DIR") or DEFAULT_DOCKER_DIR, "docker.sock")
    if os.path.exists(sock):
        return "unix://" + sock
    return "unix:///var/run/docker.sock"


def _new_client(host: str, **kwargs: Any) -> Any:
    import docker

    # from_env also applies DOCKER_TLS_VERIFY / DOCKER_CERT_PATH when they are set.
    return docker.from_env(environment={**os.environ, "DOCKER_HOST": host}, **kwargs)


def get_client(docker_host: str | None = None, owner: type | None = None) -> Any:
    """The shared ``docker.DockerClient`` of ``owner`` (default :class:`DockerSandbox`) for a
    daemon, made on first use with a connection pool for ~64 concurrent calls."""
    host = resolve_docker_host(docker_host)
    key = (owner or DockerSandbox, host)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            try:
                client = _new_client(host, version="auto", timeout=120,
                                     max_pool_size=MAX_POOL_SIZE)
            except Exception as exc:
                raise SandboxUnavailableError(
                    f"cannot reach the Docker daemon at {host}: {exc}; {_hint()}"
                ) from exc
            _CLIENTS[key] = client
        return client


def docker_unavailable_reason(docker_host: str | None = None) -> str | None:
    """``None`` when a Docker daemon answers ``ping`` at the resolved address; otherwise why
    not, with how to start one."""
    host = resolve_docker_host(docker_host)
    try:
        import docker  # noqa: F401
    except ImportError as exc:
        return f"the docker Python SDK is not installed ({exc}); pip install 'docker>=7'"
    client = None
    try:
        client = _new_client(host, version="1.41", timeout=5)
        client.ping()
        return None
    except Exception as exc:  # noqa: BLE001 - report whatever the connection said
        return f"no Docker daemon answers at {host} ({type(exc).__name__}: {exc}); {_hint()}"
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()


def _make_capped_dir(path: str, size_mb: int) -> None:
    """Mounts a fresh ext4 file system of ``size_mb`` (a sparse image file beside ``path``, on a
    loop device) at ``path``: a disk-fill inside stops there. Unlike a tmpfs, its pages are
    ordinary reclaimable page cache, not memory charged to the container for good."""
    image = path + ".img"
    steps = [
        ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
         "-E", "lazy_itable_init=1", image],
        ["mount", "-o", "loop,nodev,nosuid,noatime", image, path],
    ]
    with open(image, "wb") as f:
        f.truncate(size_mb * 1024 * 1024)
    for cmd in steps:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailableError(f"cannot make the workspace file system: {exc}") from exc
        if proc.returncode != 0:
            raise SandboxUnavailableError(
                f"cannot make the workspace file system: `{' '.join(cmd)}` failed: "
                f"{(proc.stderr or proc.stdout).strip()[-500:]}"
            )
    with contextlib.suppress(OSError):
        os.rmdir(os.path.join(path, "lost+found"))


def _remove_workspace(path: str | None) -> None:
    """Deletes a sandbox workspace (unmounting its file system, removing its image), only when
    ``path`` looks like one of ours."""
    if not path or not os.path.isabs(path) or ".." in path.split("/"):
        return
    if not os.path.basename(path).startswith(WORKSPACE_PREFIX):
        return
    if os.path.ismount(path):
        subprocess.run(["umount", "-l", path], capture_output=True, check=False)
    if os.path.isdir(path) and not os.path.islink(path) and not os.path.ismount(path):
        shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        image = path + ".img"
        if os.path.isfile(image) and not os.path.islink(image):
            os.unlink(image)


def remove_leftovers(label_selector: Mapping[str, str], docker_host: str | None = None) -> int:
    """Force-removes every sandbox container (label ``agentrl.sandbox=1``) that also has all
    the labels of ``label_selector``, and its workspace directory; returns how many."""
    import docker.errors

    client = get_client(docker_host)
    filters = [f"{SANDBOX_LABEL}=1", *(f"{k}={v}" for k, v in label_selector.items())]
    try:
        found = client.containers.list(all=True, filters={"label": filters})
    except docker.errors.DockerException as exc:
        raise SandboxUnavailableError(f"cannot list containers: {exc}") from exc
    removed = 0
    for container in found:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            continue
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # removal already in progress
                continue
            raise SandboxError(f"cannot remove container {container.short_id}: {exc}") from exc
        removed += 1
        _remove_workspace((container.labels or {}).get(WORKSPACE_LABEL))
    return removed


def remove_dead_owner_containers(
    pid_alive: Callable[[int], bool], docker_host: str | None = None
) -> int:
    """Removes the sandbox containers (and workspaces) whose ``agentrl.owner_pid`` label names
    a process of this machine that no longer runs (``pid_alive(pid)`` is False); returns how
    many. Containers without that label are left alone."""
    import docker.errors

    client = get_client(docker_host)
    try:
        found = client.containers.list(all=True, filters={"label": [f"{SANDBOX_LABEL}=1",
                                                                     OWNER_LABEL]})
    except docker.errors.DockerException as exc:
        raise SandboxUnavailableError(f"cannot list containers: {exc}") from exc
    removed = 0
    for container in found:
        owner = (container.labels or {}).get(OWNER_LABEL, "")
        if not owner.isdigit() or pid_alive(int(owner)):
            continue
        removed += remove_leftovers({OWNER_LABEL: owner, "agentrl.container": container.name},
                                    docker_host)
    return removed


class _ApiConnection:
    """One raw HTTP connection to the daemon, for the hijacked stream of ``exec start``
    (read with asyncio: a running command holds no thread)."""

    def __init__(self, host: str) -> None:
        self.host = host

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        parts = urlsplit(self.host)
        if parts.scheme == "unix":
            return await asyncio.open_unix_connection(parts.path)
        if parts.scheme in ("tcp", "http") and not os.environ.get("DOCKER_TLS_VERIFY"):
            return await asyncio.open_connection(parts.hostname, parts.port or 2375)
        raise SandboxUnavailableError(
            f"DockerSandbox needs a local daemon reached by a unix socket or plain tcp, not "
            f"{self.host!r} (the workspace is a bind-mounted host directory)"
        )


_FRAME = struct.Struct(">BII")
_START, _STDIN, _KILL = 1, 2, 3
_OUT, _ERR, _EXIT, _FAIL, _HELLO = 1, 2, 3, 4, 9


class _RunnerGone(Exception):
    """The command runner died while a command ran (e.g. ``kill -9 -1``, a restart)."""

    def __init__(self, out: CappedBuffer, err: CappedBuffer) -> None:
        super().__init__("command runner died")
        self.out, self.err = out, err


class _Job:
    __slots__ = ("done", "err", "out")

    def __init__(self, cap: int) -> None:
        self.out, self.err = CappedBuffer(cap), CappedBuffer(cap)
        self.done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()


class _Runner:
    """Host side of the in-container command runner (see ``_RUNNER``)."""

    def __init__(self, sandbox: DockerSandbox) -> None:
        self.sandbox = sandbox
        self.token = secrets.token_hex(8)
        self.jobs: dict[int, _Job] = {}
        self.next_id = 1
        self.dead = False
        self.writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None
        self.hello: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.diag = CappedBuffer(4096)

    async def start(self) -> bool:
        """Starts the runner; False when it does not come up (then commands use docker exec)."""
        import docker.errors

        sb = self.sandbox
        sb._live_tokens.add(self.token)
        try:
            created = await asyncio.to_thread(
                sb._client.api.exec_create, sb.container_id, ["python3", "-u", "-c", _RUNNER],
                stdin=True, user=f"{sb.uid}:{sb.uid}",
                environment=[f"{TOKEN_VAR}={self.token}"], workdir="/",
            )
            reader, self.writer = await sb._start_exec(created["Id"], sb._client.api.api_version)
        except (SandboxError, docker.errors.DockerException):
            self.close()
            return False
        self.task = asyncio.create_task(self._read(reader))
        try:
            return await asyncio.wait_for(asyncio.shield(self.hello), 15)
        except TimeoutError:
            self.close()
            return False

    def close(self) -> None:
        if self.dead:
            return
        self.dead = True
        self.sandbox._live_tokens.discard(self.token)
        if not self.hello.done():
            self.hello.set_result(False)
        for job in self.jobs.values():
            if not job.done.done():
                job.done.set_exception(_RunnerGone(job.out, job.err))
        if self.writer is not None:
            self.writer.transport.abort()
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        buf = bytearray()
        try:
            while True:
                header = await reader.readexactly(8)
                data = await reader.readexactly(int.from_bytes(header[4:8], "big"))
                if header[0] == 2:
                    self.diag.feed(data)
                    continue
                buf += data
                while len(buf) >= _FRAME.size:
                    kind, rid, size = _FRAME.unpack_from(buf)
                    if len(buf) < _FRAME.size + size:
                        break
                    payload = bytes(buf[_FRAME.size : _FRAME.size + size])
                    del buf[: _FRAME.size + size]
                    self._on_frame(kind, rid, payload)
        except (asyncio.IncompleteReadError, OSError):
            pass
        finally:
            self.close()

    def _on_frame(self, kind: int, rid: int, payload: bytes) -> None:
        if kind == _HELLO:
            if not self.hello.done():
                self.hello.set_result(True)
            return
        job = self.jobs.get(rid)
        if job is None or job.done.done():
            return
        if kind == _OUT:
            job.out.feed(payload)
        elif kind == _ERR:
            job.err.feed(payload)
        elif kind == _EXIT:
            code, dropped_out, dropped_err = payload.decode().split()
            job.out.dropped += int(dropped_out)
            job.err.dropped += int(dropped_err)
            job.done.set_result(None if code == "None" else int(code))
        elif kind == _FAIL:
            job.done.set_result(_FAIL_MARK)

    def _send(self, kind: int, rid: int, payload: bytes = b"") -> None:
        if self.dead or self.writer is None:
            raise ConnectionResetError("runner is gone")
        self.writer.write(_FRAME.pack(kind, rid, len(payload)) + payload)

    async def run(
        self, argv: list[str], env: list[str], cwd: str, stdin: bytes | None, bound: float,
        cap: int,
    ) -> tuple[int | None, CappedBuffer, CappedBuffer, bool] | None:
        """Runs one command; None when it did not start: the runner is gone or could not fork
        it (then use docker exec)."""
        if self.dead:
            return None
        rid, self.next_id = self.next_id, self.next_id + 1
        job = self.jobs[rid] = _Job(cap)
        fields = [cwd, str(cap), "0" if stdin is None else "1", str(len(env)), *env, *argv]
        try:
            async with asyncio.timeout(bound):
                try:
                    self._send(_START, rid, b"\0".join(f.encode() for f in fields))
                    if stdin is not None:
                        for at in range(0, len(stdin), 65536):
                            self._send(_STDIN, rid, stdin[at : at + 65536])
                        self._send(_STDIN, rid)
                    assert self.writer is not None
                    await self.writer.drain()
                except (OSError, RuntimeError) as exc:
                    raise _RunnerGone(job.out, job.err) from exc
                code = await asyncio.shield(job.done)
        except TimeoutError:
            self._kill(rid)
            return None, job.out, job.err, True
        except asyncio.CancelledError:
            self._kill(rid)
            raise
        finally:
            self.jobs.pop(rid, None)
        if code is _FAIL_MARK:
            return None
        return code, job.out, job.err, False

    def _kill(self, rid: int) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self._send(_KILL, rid)


_FAIL_MARK = object()


class DockerSandbox(Sandbox):
    """A sandbox that is one long-lived, locked-down Docker container (``sleep infinity`` under
    ``docker-init``).

    Commands run through a small command runner inside the container (one long-lived
    ``docker exec`` that forks each command: ~5 ms instead of ~80-100 ms of runc per command);
    when the runner is unavailable (disabled with ``fast_exec=False``, not yet restarted, or it
    cannot fork), a command is its own ``docker exec``. Both paths apply the same wrapper,
    limits and clean-up.

    What it guarantees:

    * **No network**: ``network_mode="none"`` (only a loopback interface).
    * **Read-only root file system** from a local image; the writable places are the workspace
      (``/workspace``, a host directory bind-mounted read-write, the working directory) and a
      size-limited tmpfs ``/tmp`` (``Limits.file_size_mb``; it allows exec).
    * **Unprivileged**: commands run as ``uid:uid`` (default 65534, "nobody") with every
      capability dropped and ``no-new-privileges``. The container's own processes
      (docker-init, ``sleep``) run as another unprivileged uid, so sandboxed code cannot stop
      the container (``kill -9 -1`` only kills its own processes).
    * **Resource limits** on the whole container: memory with no swap (``Limits.memory_mb``),
      ``cpus`` CPUs (``nano_cpus``), ``Limits.pids`` processes and threads; per process
      RLIMIT_CPU (``Limits.cpu_s``) and RLIMIT_FSIZE (``Limits.file_size_mb``).
    * **Timeouts kill everything the command started**: the command runs under
      ``timeout -s KILL N`` inside, and the host stops waiting at ``1.05 N + 1`` s. After a
      timeout a sweep run inside the container stops (SIGSTOP, so a fork bomb cannot refill),
      then kills every process of the sandbox uid that does not belong to a still-running
      command, the runner or an open shell (each carries a random token in its environment),
      so a ``setsid`` grandchild holding the output pipe dies too. When the sweep cannot run
      or does not finish, the container is restarted (``docker restart -t 0``): every process
      dies, /tmp is emptied, the workspace stays, and the result's stderr says so. A command
      that cannot even start because leftover processes fill the pids limit triggers the same
      clean-up and is then run once more.
    * **Bounded output**: stdout and stderr are streamed separately and each cut at
      ``Limits.output_bytes`` with a visible marker (the runner already cuts them inside the
      container; memory on the host stays bounded either way).
    * ``limit_hit`` is ``"memory"`` when a command died with status 137 and the container's
      cgroup counted a new OOM kill, ``"cpu"``/``"file_size"`` for statuses 152/153 (SIGXCPU,
      SIGXFSZ), ``"pids"`` when a timed-out command had hit the pids limit.
    * :meth:`read_file`/:meth:`write_file` work on the host directory and never follow a
      symlink or ``..`` out of the workspace.
    * :meth:`close` force-removes the container and deletes the workspace. Every container is
      labelled ``agentrl.sandbox=1``, ``agentrl.owner_pid`` (this process, unless ``labels``
      says otherwise), the caller's ``labels`` and its workspace path, so
      :func:`remove_leftovers` and :func:`remove_dead_owner_containers` can clean up after a
      crash.

    What it does not guarantee:

    * It shares the host kernel: a kernel exploit escapes. There is no seccomp profile beyond
      Docker's default, no AppArmor/SELinux policy of its own, no user-namespace remapping.
    * The workspace is capped at ``Limits.workspace_mb`` only when running as root (then it is
      a fresh ext4 file system on a loop device, mounted on the host directory); otherwise it
      is a plain, uncapped host directory. /tmp (tmpfs) counts against the memory limit.
    * Commands of one sandbox are not isolated from each other (same uid: they can signal or
      ptrace each other and the runner). Killing the runner (``kill -9 -1``) ends the commands
      running at that moment: their results say so (exit code None) and it restarts.
    * Processes a command leaves running in the background *without* timing out survive until
      the next sweep (after a timeout, or when a shell session ends), restart or
      :meth:`close`, like on a real machine. Concurrent
      commands share the container's memory/pids limits, and a container restart also kills
      the commands running at that moment.
    * ``exit_code`` follows the shell convention (128 + N for signal N), as ``timeout`` and
      ``sh`` report it; a timed-out command has ``exit_code`` None.
    * The daemon must run on this machine (bind mount) and be reached by a unix socket or plain
      tcp. An ``image`` given by name must exist locally or be pullable, which needs a
      reachable registry; the default image is built locally (see
      :func:`agentrl.sandbox.images.ensure_base_image`).
    * Whoever can talk to the Docker daemon is root on the host: the daemon socket is never
      mounted into a sandbox; keep it that way.

    Args:
        limits: Resource limits.
        image: Image to run (default: the locally built ``agentrl-base:bookworm-py3``). It
            needs ``timeout`` (coreutils) and ``sh``; ``python3`` for the runner and the
            timeout sweep (without it every command is a docker exec and every timeout
            restarts the container); ``bash`` for :meth:`open_shell`.
        docker_host: Daemon address (default: see :func:`resolve_docker_host`).
        workspace_root: Host directory under which each sandbox's workspace is created
            (default ``$AGENTRL_SANDBOX_ROOT`` or ``/tmp/agentrl-sandboxes``).
        labels: Extra container labels (the pool tags its sandboxes with them).
        uid: User and group id of everything run inside (the workspace is chowned to it).
        cpus: CPUs the container may use.
        fast_exec: Run commands through the in-container runner (else one docker exec each).
    """

    backend = "docker"

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        image: str | None = None,
        docker_host: str | None = None,
        workspace_root: str | None = None,
        labels: Mapping[str, str] | None = None,
        uid: int = 65534,
        cpus: float = 1.0,
        fast_exec: bool = True,
    ) -> None:
        super().__init__(limits)
        self.image = image
        self.docker_host = resolve_docker_host(docker_host)
        self.workspace_root = (
            workspace_root or os.environ.get("AGENTRL_SANDBOX_ROOT") or "/tmp/agentrl-sandboxes"
        )
        self.labels = dict(labels or {})
        self.uid = int(uid)
        self.cpus = float(cpus)
        # docker-init and `sleep infinity` run as this other unprivileged uid, so that the
        # sandboxed code (uid) cannot kill them and stop the container (`kill -9 -1`).
        self._keeper_uid = 65533 if self.uid != 65533 else 65532
        self.workspace: str | None = None
        self.container_id: str | None = None
        self.restarts = 0
        self._container: Any = None
        self._client: Any = None
        self._conn = _ApiConnection(self.docker_host)
        self._live_tokens: set[str] = set()
        self._shell_tokens: dict[int, str] = {}
        self._shells: list[PipeShellSession] = []
        self._recover_lock = asyncio.Lock()
        self._oom_seen = 0
        self._pids_seen = 0
        self.fast_exec = fast_exec
        self._runner: _Runner | None = None
        self._runner_lock = asyncio.Lock()
        self._runner_retry_at = 0.0

    # -- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        if self.closed:
            raise SandboxError("sandbox is closed")
        if self._container is not None:
            return
        self._client = await asyncio.to_thread(get_client, self.docker_host, type(self))
        if self.image is None:
            from agentrl.sandbox.images import ensure_base_image

            self.image = await asyncio.to_thread(ensure_base_image, self._client)
        await asyncio.to_thread(self._make_workspace)
        try:
            self._container = await asyncio.to_thread(self._run_container)
        except BaseException:
            await asyncio.to_thread(_remove_workspace, self.workspace)
            raise
        self.container_id = self._container.id
        await self._get_runner()  # best effort: a failure only means docker exec per command

    def _make_workspace(self) -> None:
        os.makedirs(self.workspace_root, mode=0o711, exist_ok=True)
        path = tempfile.mkdtemp(prefix=WORKSPACE_PREFIX, dir=self.workspace_root)
        try:
            if os.geteuid() == 0:
                _make_capped_dir(path, self.limits.workspace_mb)
            os.chmod(path, 0o700)
            if os.geteuid() == 0 or self.uid != os.geteuid():
                os.chown(path, self.uid, self.uid)
        except PermissionError as exc:
            _remove_workspace(path)
            raise SandboxUnavailableError(
                f"cannot give the workspace to uid {self.uid} ({exc}): run as root or pass "
                f"uid={os.geteuid()}"
            ) from exc
        except BaseException:
            _remove_workspace(path)
            raise
        self.workspace = path

    def _run_container(self) -> Any:
        import docker.errors
        from docker.types import Ulimit

        lim = self.limits
        mb = 1024 * 1024
        name = f"agentrl-{secrets.token_hex(6)}"
        labels = {OWNER_LABEL: str(os.getpid()), **self.labels, SANDBOX_LABEL: "1",
                  "agentrl.backend": self.backend, "agentrl.container": name,
                  WORKSPACE_LABEL: self.workspace or ""}
        try:
            return self._client.containers.run(
                self.image,
                ["sleep", "infinity"],
                name=name,
                detach=True,
                init=True,
                network_mode="none",
                hostname="sandbox",
                mem_limit=f"{lim.memory_mb}m",
                memswap_limit=f"{lim.memory_mb}m",
                nano_cpus=int(self.cpus * 1e9),
                pids_limit=lim.pids,
                read_only=True,
                tmpfs={"/tmp": f"size={lim.file_size_mb}m,exec,mode=1777"},
                volumes={self.workspace: {"bind": WORKSPACE, "mode": "rw"}},
                working_dir=WORKSPACE,
                environment=dict(BASE_ENV),
                user=f"{self._keeper_uid}:{self._keeper_uid}",
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                ulimits=[
                    Ulimit(name="fsize", soft=lim.file_size_mb * mb, hard=lim.file_size_mb * mb),
                ],
                labels=labels,
            )
        except docker.errors.ImageNotFound as exc:
            raise SandboxUnavailableError(
                f"image {self.image!r} is not on the daemon and cannot be pulled: {exc}"
            ) from exc
        except docker.errors.DockerException as exc:
            with contextlib.suppress(docker.errors.DockerException):  # created, not started
                self._client.containers.get(name).remove(force=True)
            raise SandboxError(f"cannot start a sandbox container: {exc}") from exc

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for shell in self._shells:
            with contextlib.suppress(Exception):
                await shell.close()
        self._shells.clear()
        if self._runner is not None:
            self._runner.close()
        container, self._container = self._container, None
        if container is not None:
            await asyncio.to_thread(self._remove_container, container)
        if self.workspace:
            await asyncio.to_thread(_remove_workspace, self.workspace)

    @staticmethod
    def _remove_container(container: Any) -> None:
        import docker.errors

        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                raise SandboxError(f"cannot remove container {container.short_id}: {exc}") from exc

    def _check(self) -> None:
        if self.closed:
            raise SandboxError("sandbox is closed")
        if self._container is None:
            raise SandboxError("sandbox is not started: call start() first")

    # -- exec ------------------------------------------------------------------------------

    async def exec(
        self,
        command: str | list[str],
        *,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str = WORKSPACE,
    ) -> ExecResult:
        self._check()
        timeout = self.limits.timeout_s if timeout is None else float(timeout)
        if timeout <= 0:
            raise SandboxError(f"timeout must be positive, not {timeout}")
        argv = ["sh", "-c", command] if isinstance(command, str) else [str(a) for a in command]
        if not argv:
            raise SandboxError("empty command")
        if any("\0" in a for a in (*argv, cwd)):
            raise SandboxError("command and cwd must not contain NUL characters")
        if isinstance(stdin, str):
            stdin = stdin.encode()
        token = secrets.token_hex(8)
        environment = [f"{TOKEN_VAR}={token}"]
        for key, value in (env or {}).items():
            if not key or "=" in key or "\0" in key or "\0" in str(value):
                raise SandboxError(f"invalid environment variable {key!r}")
            environment.append(f"{key}={value}")
        async with self._recover_lock:  # wait for a restart in progress
            pass
        note = ""
        orphaned = False
        # RLIMIT_CPU is set per command, not on the container: the long-lived runner would
        # otherwise use up its own CPU allowance over many commands.
        cpu = self.limits.cpu_s
        wrapped = [
            "sh", "-c", f'ulimit -S -t {cpu}; ulimit -H -t {cpu + 2}; exec "$@"', "sh",
            "timeout", "-s", "KILL", f"{timeout:g}", *argv,
        ]
        bound = timeout + HOST_GRACE_S + 0.05 * timeout
        self._live_tokens.add(token)
        try:
            for attempt in range(2):
                start = time.perf_counter()
                result = None
                runner = await self._get_runner()
                if runner is not None:
                    try:
                        result = await runner.run(
                            wrapped, [*_BASE_ENV_LIST, *environment], cwd, stdin, bound,
                            self.limits.output_bytes,
                        )
                    except _RunnerGone as gone:
                        orphaned = True
                        result = (None, gone.out, gone.err, False)
                        note = (
                            "\n[the sandbox's command runner was killed while this command ran "
                            "(e.g. by `kill -9 -1`); what the command left running was killed]"
                        )
                if result is None:
                    result = await self._run_exec(wrapped, environment, stdin, cwd, bound)
                code, out, err, host_timeout = result
                # `timeout` itself could not fork: the command never ran, because processes
                # left behind (a detached fork bomb) fill the pids limit. Kill them; run again.
                if attempt or code != 125 or not err.data.startswith(_NO_FORK):
                    break
                _, note = await self._sweep()
                note += (
                    "\n[processes left behind filled the pids limit; they were killed before "
                    "this command ran]"
                )
        finally:
            self._live_tokens.discard(token)
        duration = time.perf_counter() - start
        timed_out = host_timeout or (code == 137 and duration >= timeout)
        limit_hit = None
        if orphaned and self.closed:
            note = "\n[the sandbox was closed while this command ran]"
        elif orphaned:
            note = (await self._sweep())[1] + note
        if timed_out:
            code = None
            counters, swept = await self._sweep()
            note += swept
            if counters.get("pids") is not None and counters["pids"] > self._pids_seen:
                self._pids_seen = counters["pids"]
                limit_hit = "pids"
            duration = time.perf_counter() - start
        elif code == 137:
            counters = await self._probe()
            if counters.get("oom") is not None and counters["oom"] > self._oom_seen:
                self._oom_seen = counters["oom"]
                limit_hit = "memory"
        elif code == 152:
            limit_hit = "cpu"
        elif code == 153:
            limit_hit = "file_size"
        return ExecResult(
            code, out.text(), err.text() + note, timed_out=timed_out, limit_hit=limit_hit,
            truncated=bool(out.dropped or err.dropped), duration_s=duration,
        )

    async def _get_runner(self) -> _Runner | None:
        """The live command runner, started on first use; None when disabled or when it could
        not start lately (commands then go through docker exec)."""
        if not self.fast_exec:
            return None
        runner = self._runner
        if runner is not None and not runner.dead:
            return runner
        async with self._runner_lock:
            if self._runner is not None and not self._runner.dead:
                return self._runner
            if time.monotonic() < self._runner_retry_at or self.closed:
                return None
            runner = _Runner(self)
            if await runner.start():
                self._runner = runner
                return runner
            self._runner_retry_at = time.monotonic() + 5.0
            return None

    async def _run_exec(
        self, argv: list[str], environment: list[str], stdin: bytes | None, cwd: str,
        bound: float, cap: int | None = None,
    ) -> tuple[int | None, CappedBuffer, CappedBuffer, bool]:
        """Runs one ``docker exec``; returns (exit code, stdout, stderr, host bound hit)."""
        import docker.errors

        cap = self.limits.output_bytes if cap is None else cap
        out, err = CappedBuffer(cap), CappedBuffer(cap)
        api = self._client.api
        try:
            created = await asyncio.to_thread(
                api.exec_create, self.container_id, argv, stdin=stdin is not None,
                user=f"{self.uid}:{self.uid}", environment=environment, workdir=cwd,
            )
        except docker.errors.NotFound as exc:
            raise SandboxError(f"the sandbox container is gone: {exc}") from exc
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # container not running (e.g. being restarted)
                raise SandboxError(f"the sandbox container is not running: {exc}") from exc
            raise SandboxError(f"docker exec failed: {exc}") from exc
        exec_id = created["Id"]
        reader, writer = await self._start_exec(exec_id, api.api_version)
        feeder = None
        if stdin is not None:
            feeder = asyncio.create_task(self._feed(writer, stdin))
        host_timeout = False
        try:
            await asyncio.wait_for(self._pump(reader, out, err), bound)
        except TimeoutError:
            host_timeout = True
        finally:
            if feeder is not None:
                feeder.cancel()
                with contextlib.suppress(BaseException):
                    await feeder
            # abort, not close: close() would first flush stdin the command never read
            writer.transport.abort()
        code = None if host_timeout else await self._exit_code(exec_id)
        return code, out, err, host_timeout

    async def _start_exec(
        self, exec_id: str, api_version: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """``POST /exec/{id}/start`` upgraded to a raw stream (multiplexed stdout/stderr)."""
        reader, writer = await self._conn.open()
        body = b'{"Detach":false,"Tty":false}'
        writer.write(
            f"POST /v{api_version}/exec/{exec_id}/start HTTP/1.1\r\nHost: docker\r\n"
            "User-Agent: agentrl\r\nContent-Type: application/json\r\nConnection: Upgrade\r\n"
            f"Upgrade: tcp\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        )
        try:
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                TimeoutError) as exc:
            writer.close()
            raise SandboxError(f"docker exec start failed: {exc!r}") from exc
        status = head.split(b"\r\n", 1)[0].split()
        if len(status) < 2 or status[1] not in (b"101", b"200"):
            with contextlib.suppress(Exception):
                head += await asyncio.wait_for(reader.read(4096), 5)
            writer.close()
            raise SandboxError(
                f"docker exec start failed: {head.decode('utf-8', 'replace').strip()[-500:]}"
            )
        return reader, writer

    @staticmethod
    async def _feed(writer: asyncio.StreamWriter, data: bytes) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            for at in range(0, len(data), 65536):
                writer.write(data[at : at + 65536])
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()  # the command's stdin sees EOF

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, out: CappedBuffer, err: CappedBuffer) -> None:
        """Reads docker's multiplexed frames (8-byte header: stream, 0, 0, 0, size) to EOF."""
        while True:
            try:
                header = await reader.readexactly(8)
            except (asyncio.IncompleteReadError, OSError):
                return
            target = err if header[0] == 2 else out
            size = int.from_bytes(header[4:8], "big")
            while size:
                try:
                    chunk = await reader.read(min(size, 65536))
                except OSError:
                    return
                if not chunk:
                    return
                size -= len(chunk)
                target.feed(chunk)

    async def _exit_code(self, exec_id: str) -> int | None:
        """The exec's exit code (it can lag the end of the stream by a moment)."""
        import docker.errors

        for attempt in range(200):
            try:
                info = await asyncio.to_thread(self._client.api.exec_inspect, exec_id)
            except docker.errors.DockerException:
                return None
            if not info.get("Running"):
                return info.get("ExitCode")
            await asyncio.sleep(0.005 if attempt < 20 else 0.02)
        return None

    # -- cleaning up after timeouts --------------------------------------------------------

    async def _in_container(self, mode: str) -> dict[str, Any] | None:
        """Runs the sweep/probe script; its answer (``ok``, ``oom``, ``pids``), or None when
        it could not run."""
        try:
            code, out, _, host_timeout = await self._run_exec(
                ["python3", "-c", _SWEEP, mode, *sorted(self._live_tokens)], [], None, "/",
                SWEEP_TIMEOUT_S, cap=4096,
            )
        except SandboxError:
            return None
        if host_timeout or code != 0:
            return None
        lines = out.data.decode("utf-8", "replace").split()
        if "agentrl-sweep" not in lines:
            return None
        answer: dict[str, Any] = {}
        for word in lines[lines.index("agentrl-sweep") + 1 :]:
            key, _, value = word.partition("=")
            answer[key] = int(value) if value.isdigit() else None
        return answer

    async def _probe(self) -> dict[str, Any]:
        return await self._in_container("probe") or {}

    async def _sweep(self) -> tuple[dict[str, Any], str]:
        """Kills every process not owned by a live command or shell; restarts the container
        when that fails. Returns (cgroup counters, a note for stderr)."""
        if self.closed or self._container is None:
            return {}, ""
        async with self._recover_lock:
            answer = await self._in_container("sweep")
            if answer and answer.get("ok") == 1:
                return answer, ""
            await self._restart()
            return answer or {}, (
                "\n[the sandbox container was restarted to kill the processes left behind: "
                "background processes and /tmp are gone; the workspace is kept]"
            )

    async def _restart(self) -> None:
        import docker.errors

        if self._runner is not None:
            self._runner.close()  # it dies with the restart; no command may be sent to it
        try:
            await asyncio.to_thread(self._container.restart, timeout=0)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot restart the sandbox container: {exc}") from exc
        self.restarts += 1
        self._oom_seen = 0
        self._pids_seen = 0

    # -- shell -----------------------------------------------------------------------------

    async def open_shell(self) -> ShellSession:
        self._check()
        docker_cli = shutil.which("docker")
        if docker_cli is None:
            raise SandboxUnavailableError("open_shell needs the docker CLI (apt-get install docker.io)")

        async def spawn() -> asyncio.subprocess.Process:
            self._check()
            async with self._recover_lock:
                pass
            token = secrets.token_hex(8)
            self._live_tokens.add(token)
            proc = await asyncio.create_subprocess_exec(
                docker_cli, "exec", "-i", "-u", f"{self.uid}:{self.uid}", "-w", WORKSPACE,
                "-e", f"{TOKEN_VAR}={token}", self.container_id,
                "bash", "--noprofile", "--norc",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "DOCKER_HOST": self.docker_host},
            )
            self._shell_tokens[proc.pid] = token
            return proc

        async def kill(proc: asyncio.subprocess.Process) -> None:
            token = self._shell_tokens.pop(proc.pid, None)
            if token is not None:
                self._live_tokens.discard(token)
            if not self.closed and self._container is not None:
                await self._sweep()
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 10)

        shell = PipeShellSession(spawn, kill, self.limits.timeout_s, self.limits.output_bytes)
        self._shells.append(shell)
        return shell

    # -- files -----------------------------------------------------------------------------

    def _owner(self) -> tuple[int, int] | None:
        return (self.uid, self.uid) if os.geteuid() == 0 else None

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        self._check()
        limit = max_bytes if max_bytes is not None else self.limits.file_size_mb * 1024 * 1024
        return await asyncio.to_thread(read_workspace_file, self.workspace, path, limit)

    async def write_file(self, path: str, data: str | bytes) -> None:
        self._check()
        if isinstance(data, str):
            data = data.encode()
        await asyncio.to_thread(
            write_workspace_file, self.workspace, path, data, self._owner(),
            self.limits.file_size_mb * 1024 * 1024,
        )
