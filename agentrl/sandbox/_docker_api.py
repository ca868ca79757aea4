"""Talking to the Docker daemon: its address, shared SDK clients, the availability check,
starting and removing sandbox containers (leftovers included), and ``docker exec`` over a raw
API connection."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from agentrl.sandbox._docker_workspace import remove_workspace
from agentrl.sandbox._io import CappedBuffer
from agentrl.sandbox.base import WORKSPACE, Limits, SandboxError, SandboxUnavailableError

DEFAULT_DOCKER_DIR = "/var/lib/agentrl-docker"
SANDBOX_LABEL = "agentrl.sandbox"
WORKSPACE_LABEL = "agentrl.workspace"
OWNER_LABEL = "agentrl.owner_pid"
MAX_POOL_SIZE = 128

# (exit code, stdout, stderr, whether the host stopped waiting) of one command
RawResult = tuple[int | None, CappedBuffer, CappedBuffer, bool]

# How runc reports (as the exec's output, exit status 126) that it could not get its own
# process going: a clone in its init hit the pids limit (EAGAIN), or that init died before
# answering (read init-p: connection reset by peer), which a full pids or memory limit causes.
_RUNTIME_FAILED = b"oci runtime exec failed"
_NO_ROOM_MARKS = (
    b"resource temporarily unavailable", b"connection reset by peer", b"unable to spawn",
    b"failed to create new os thread",
)

_CLIENTS: dict[str, Any] = {}
_CLIENTS_LOCK = threading.Lock()


def _own_socket() -> str:
    """The socket of ``scripts/dockerd.sh``."""
    return os.path.join(os.environ.get("AGENTRL_DOCKER_DIR") or DEFAULT_DOCKER_DIR, "docker.sock")


def _hint() -> str:
    return (
        "run scripts/dockerd.sh start and export DOCKER_HOST=unix://" + _own_socket() + " (the "
        "line it prints)"
    )


def resolve_docker_host(docker_host: str | None = None) -> str:
    """The daemon address: ``docker_host`` > ``$DOCKER_HOST`` > the socket of
    ``scripts/dockerd.sh`` (``$AGENTRL_DOCKER_DIR/docker.sock``) when it exists > the SDK's
    default ``unix:///var/run/docker.sock``."""
    if docker_host:
        return docker_host
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    sock = _own_socket()
    if os.path.exists(sock):
        return "unix://" + sock
    return "unix:///var/run/docker.sock"


def _new_client(host: str, **kwargs: Any) -> Any:
    import docker

    # from_env also applies DOCKER_TLS_VERIFY / DOCKER_CERT_PATH when they are set.
    return docker.from_env(environment={**os.environ, "DOCKER_HOST": host}, **kwargs)


def get_client(docker_host: str | None = None) -> Any:
    """The shared ``docker.DockerClient`` for a daemon, made on first use with a connection pool
    for ~64 concurrent calls."""
    host = resolve_docker_host(docker_host)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(host)
        if client is None:
            try:
                client = _new_client(host, version="auto", timeout=120,
                                     max_pool_size=MAX_POOL_SIZE)
            except Exception as exc:
                raise SandboxUnavailableError(
                    f"cannot reach the Docker daemon at {host}: {exc}; {_hint()}"
                ) from exc
            _CLIENTS[host] = client
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
        reason = f"no Docker daemon answers at {host} ({type(exc).__name__}: {exc}); {_hint()}"
        private = "unix://" + os.path.join(
            os.environ.get("AGENTRL_DOCKER_DIR") or DEFAULT_DOCKER_DIR, "docker.sock")
        return reason + (_daemon_log_tail() if host == private else "")
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()


def _daemon_log_tail(lines: int = 3) -> str:
    """The last lines of our private daemon's log (its own start-up error), when there is one."""
    log = os.path.join(os.environ.get("AGENTRL_DOCKER_DIR") or DEFAULT_DOCKER_DIR, "dockerd.log")
    try:
        with open(log, errors="replace") as f:
            tail = [line.strip() for line in f.readlines()[-lines:] if line.strip()]
    except OSError:
        return ""
    return f"; the daemon's log ({log}) ends with: " + " | ".join(tail) if tail else ""


def run_container(
    client: Any, image: str, *, limits: Limits, cpus: float, workspace: str, user: int,
    env: Mapping[str, str], labels: Mapping[str, str], network: str = "none",
    workspace_aliases: Sequence[str] = (), binds: Mapping[str, tuple[str, str]] | None = None,
) -> Any:
    """Starts a locked-down sandbox container running ``sleep infinity`` under docker-init as
    ``user``: no network (unless ``network`` is ``"bridge"``), read-only root, a tmpfs /tmp,
    ``workspace`` bind-mounted at /workspace (and at each of ``workspace_aliases``), the
    ``binds`` (container path -> (host path, ``"ro"`` or ``"rw"``)), no capabilities, the
    memory/CPU/pids/file-size ``limits``. Labelled ``agentrl.sandbox=1``, with its name and
    workspace, over ``labels``."""
    import docker.errors
    from docker.types import Ulimit

    mb = 1024 * 1024
    name = f"agentrl-{secrets.token_hex(6)}"
    labels = {**labels, SANDBOX_LABEL: "1", "agentrl.container": name,
              WORKSPACE_LABEL: workspace}
    try:
        return client.containers.run(
            image,
            ["sleep", "infinity"],
            name=name,
            detach=True,
            init=True,
            network_mode=network,
            hostname="sandbox",
            mem_limit=f"{limits.memory_mb}m",
            memswap_limit=f"{limits.memory_mb}m",
            nano_cpus=int(cpus * 1e9),
            pids_limit=limits.pids,
            read_only=True,
            tmpfs={"/tmp": f"size={limits.file_size_mb}m,exec,mode=1777"},
            volumes=[f"{workspace}:{path}:rw" for path in (WORKSPACE, *workspace_aliases)]
            + [f"{host}:{path}:{mode}" for path, (host, mode) in (binds or {}).items()],
            working_dir=WORKSPACE,
            environment=dict(env),
            user=f"{user}:{user}",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            ulimits=[
                Ulimit(name="fsize", soft=limits.file_size_mb * mb,
                       hard=limits.file_size_mb * mb),
            ],
            labels=labels,
        )
    except docker.errors.ImageNotFound as exc:
        raise SandboxUnavailableError(
            f"image {image!r} is not on the daemon and cannot be pulled: {exc}"
        ) from exc
    except docker.errors.DockerException as exc:
        with contextlib.suppress(docker.errors.DockerException):  # created, not started
            client.containers.get(name).remove(force=True)
        raise SandboxError(f"cannot start a sandbox container: {exc}") from exc


def force_remove(container: Any) -> bool:
    """Force-removes a container; False when it is already gone or being removed."""
    import docker.errors

    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        return False
    except docker.errors.APIError as exc:
        if exc.status_code == 409:  # removal already in progress
            return False
        raise SandboxError(f"cannot remove container {container.short_id}: {exc}") from exc
    return True


def _list_sandboxes(client: Any, labels: list[str]) -> list[Any]:
    import docker.errors

    try:
        return client.containers.list(
            all=True, ignore_removed=True, filters={"label": [f"{SANDBOX_LABEL}=1", *labels]}
        )
    except docker.errors.DockerException as exc:
        raise SandboxUnavailableError(f"cannot list containers: {exc}") from exc


def remove_leftovers(label_selector: Mapping[str, str], docker_host: str | None = None) -> int:
    """Force-removes every sandbox container (label ``agentrl.sandbox=1``) that also has all
    the labels of ``label_selector``, and its workspace directory; returns how many."""
    found = _list_sandboxes(get_client(docker_host),
                            [f"{k}={v}" for k, v in label_selector.items()])
    removed = 0
    for container in found:
        if force_remove(container):
            removed += 1
            remove_workspace((container.labels or {}).get(WORKSPACE_LABEL))
    return removed


def remove_dead_owner_containers(
    pid_alive: Callable[[int], bool], docker_host: str | None = None
) -> int:
    """Removes the sandbox containers (and workspaces) whose ``agentrl.owner_pid`` label names
    a process of this machine that no longer runs (``pid_alive(pid)`` is False); returns how
    many. Containers without that label are left alone."""
    removed = 0
    client = get_client(docker_host)
    for container in _list_sandboxes(client, [OWNER_LABEL]):
        owner = (container.labels or {}).get(OWNER_LABEL, "")
        if not owner.isdigit() or pid_alive(int(owner)):
            continue
        removed += remove_leftovers({OWNER_LABEL: owner, "agentrl.container": container.name},
                                    docker_host)
    _remove_dead_owner_networks(client, pid_alive)
    return removed


def _remove_dead_owner_networks(client: Any, pid_alive: Callable[[int], bool]) -> None:
    """Removes the networks made for sandboxes (a Harbor task's compose services) whose owner
    no longer runs, once their containers are gone."""
    import docker.errors

    try:
        networks = client.networks.list(filters={"label": [f"{SANDBOX_LABEL}=1", OWNER_LABEL]})
    except docker.errors.DockerException:
        return
    for network in networks:
        owner = (network.attrs.get("Labels") or {}).get(OWNER_LABEL, "")
        if owner.isdigit() and not pid_alive(int(owner)):
            with contextlib.suppress(docker.errors.DockerException):
                network.remove()


class ExecNotStarted(SandboxError):
    """The container runtime could not start a ``docker exec``'s process because the container
    has no room for one more (its pids limit, or its memory, is full): nothing of the command
    ran. ``result`` is what the daemon answered (exit code 126, runc's message on stdout)."""

    def __init__(self, result: RawResult) -> None:
        said = bytes(result[1].data[:300]).decode("utf-8", "replace").strip()
        super().__init__(f"the container runtime could not start the process: {said}")
        self.result = result


def _no_room(code: int | None, pid: int | None, out: CappedBuffer, err: CappedBuffer) -> bool:
    """Whether an exec's outcome is runc failing to start its process for lack of room. A
    started exec has a pid, so a command that prints runc's message itself never counts."""
    if code != 126 or pid:
        return False
    said = bytes(out.data[:2048] + err.data[:2048]).lower()
    return _RUNTIME_FAILED in said and any(mark in said for mark in _NO_ROOM_MARKS)


async def demux(reader: asyncio.StreamReader) -> AsyncIterator[tuple[int, bytes]]:
    """Docker's multiplexed exec stream (frames of an 8-byte header: stream, 0, 0, 0, size;
    then the data) as (stream, chunk) pairs, chunks of at most 64 KiB, until EOF or a broken
    connection. Stream 1 is stdout, 2 stderr."""
    while True:
        try:
            header = await reader.readexactly(8)
        except (asyncio.IncompleteReadError, OSError):
            return
        size = int.from_bytes(header[4:8], "big")
        while size:
            try:
                chunk = await reader.read(min(size, 65536))
            except OSError:
                return
            if not chunk:
                return
            size -= len(chunk)
            yield header[0], chunk


class ExecApi:
    """``docker exec`` through the daemon's API: created with the SDK, started on a raw HTTP
    connection of its own whose hijacked stream is read with asyncio (a running command holds
    no thread)."""

    def __init__(self, client: Any, host: str) -> None:
        self.client = client
        self.host = host

    async def create(
        self, container_id: str, argv: list[str], *, user: str, environment: list[str],
        cwd: str, stdin: bool,
    ) -> str:
        """``POST /containers/{id}/exec``; returns the exec id."""
        import docker.errors

        try:
            created = await asyncio.to_thread(
                self.client.api.exec_create, container_id, argv, stdin=stdin, user=user,
                environment=environment, workdir=cwd,
            )
        except docker.errors.NotFound as exc:
            raise SandboxError(f"the sandbox container is gone: {exc}") from exc
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # container not running (e.g. being restarted)
                raise SandboxError(f"the sandbox container is not running: {exc}") from exc
            raise SandboxError(f"docker exec failed: {exc}") from exc
        return created["Id"]

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        parts = urlsplit(self.host)
        if parts.scheme == "unix":
            return await asyncio.open_unix_connection(parts.path)
        if parts.scheme in ("tcp", "http") and not os.environ.get("DOCKER_TLS_VERIFY"):
            return await asyncio.open_connection(parts.hostname, parts.port or 2375)
        raise SandboxUnavailableError(
            f"DockerSandbox needs a local daemon reached by a unix socket or plain tcp, not "
            f"{self.host!r} (the workspace is a bind-mounted host directory)"
        )

    async def start(self, exec_id: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """``POST /exec/{id}/start`` upgraded to a raw stream (see :func:`demux`); writing to
        it feeds the command's stdin."""
        reader, writer = await self._connect()
        body = b'{"Detach":false,"Tty":false}'
        writer.write(
            f"POST /v{self.client.api.api_version}/exec/{exec_id}/start HTTP/1.1\r\n"
            "Host: docker\r\nUser-Agent: agentrl\r\nContent-Type: application/json\r\n"
            f"Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
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

    async def outcome(self, exec_id: str) -> tuple[int | None, int | None]:
        """The exec's exit code (it can lag the end of the stream by a moment) and the pid its
        process had (0 when the runtime never started one); (None, None) when unknown."""
        import docker.errors

        for attempt in range(200):
            try:
                info = await asyncio.to_thread(self.client.api.exec_inspect, exec_id)
            except docker.errors.DockerException:
                return None, None
            if not info.get("Running"):
                return info.get("ExitCode"), info.get("Pid")
            await asyncio.sleep(0.005 if attempt < 20 else 0.02)
        return None, None

    async def run(
        self, container_id: str, argv: list[str], *, user: str, environment: list[str],
        cwd: str, stdin: bytes | None, bound: float, cap: int,
    ) -> RawResult:
        """Runs one ``docker exec``, waiting at most ``bound`` seconds for its output to end;
        each of stdout and stderr is kept up to ``cap`` bytes. Raises :class:`ExecNotStarted`
        when the runtime had no room to start the process."""
        out, err = CappedBuffer(cap), CappedBuffer(cap)
        exec_id = await self.create(container_id, argv, user=user, environment=environment,
                                    cwd=cwd, stdin=stdin is not None)
        reader, writer = await self.start(exec_id)
        feeder = None
        if stdin is not None:
            feeder = asyncio.create_task(_feed(writer, stdin))
        host_timeout = False
        try:
            async with asyncio.timeout(bound):
                async for stream, chunk in demux(reader):
                    (err if stream == 2 else out).feed(chunk)
        except TimeoutError:
            host_timeout = True
        finally:
            if feeder is not None:
                feeder.cancel()
                with contextlib.suppress(BaseException):
                    await feeder
            # abort, not close: close() would first flush stdin the command never read
            writer.transport.abort()
        if host_timeout:
            return None, out, err, True
        code, pid = await self.outcome(exec_id)
        if _no_room(code, pid, out, err):
            raise ExecNotStarted((code, out, err, False))
        return code, out, err, False


async def _feed(writer: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(OSError, RuntimeError):
        for at in range(0, len(data), 65536):
            writer.write(data[at : at + 65536])
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # the command's stdin sees EOF
