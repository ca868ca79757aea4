"""The Docker sandbox backend: one long-lived, locked-down container per sandbox.

Start a daemon with ``scripts/dockerd.sh start`` (no systemd needed) and export the
``DOCKER_HOST`` it prints; the base image is built on first use (see
:mod:`agentrl.sandbox.images`). The daemon plumbing is in :mod:`agentrl.sandbox._docker_api`,
the host side of the in-container command runner in :mod:`agentrl.sandbox._docker_runner`, and
the scripts run inside the container in :mod:`agentrl.sandbox.container_scripts`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.sandbox._docker_api import (
    OWNER_LABEL,
    ExecApi,
    ExecNotStarted,
    RawResult,
    docker_unavailable_reason,
    force_remove,
    get_client,
    remove_dead_owner_containers,
    remove_leftovers,
    resolve_docker_host,
    run_container,
)
from agentrl.sandbox._docker_process import DockerProcess, docker_cli_path, end_client, start_client
from agentrl.sandbox._docker_runner import CommandRunner, RunnerGone
from agentrl.sandbox._docker_workspace import make_private_dirs, make_workspace, remove_workspace
from agentrl.sandbox._io import read_workspace_file, write_workspace_file
from agentrl.sandbox.base import (
    WORKSPACE,
    ExecResult,
    Limits,
    Sandbox,
    SandboxError,
    SandboxProcess,
    ShellSession,
)
from agentrl.sandbox.container_scripts import script
from agentrl.sandbox.container_scripts.sweep import TOKEN_VAR, parse_answer
from agentrl.sandbox.egress import Egress, apply_egress
from agentrl.sandbox.shell import PipeShellSession

__all__ = [
    "DockerSandbox",
    "docker_unavailable_reason",
    "get_client",
    "remove_dead_owner_containers",
    "remove_leftovers",
    "resolve_docker_host",
]

BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": WORKSPACE,
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
}
HOST_GRACE_S = 1.0  # the host stops waiting at timeout * 1.05 + this
SWEEP_TIMEOUT_S = 10.0
RUNNER_RETRY_S = 5.0  # after the runner failed to start, commands use docker exec this long
_NO_FORK = b"timeout: fork system call failed"
_RESTARTED = (
    "\n[the sandbox container was restarted to kill the processes left behind: background "
    "processes and /tmp are gone; the workspace is kept]"
)


class DockerSandbox(Sandbox):
    """A sandbox that is one long-lived, locked-down Docker container (``sleep infinity`` under
    ``docker-init``).

    Commands run through a small command runner inside the container (one long-lived
    ``docker exec`` that forks each command: ~5 ms instead of ~80-100 ms of runc per command);
    when the runner is unavailable (disabled with ``fast_exec=False``, not yet restarted, or it
    cannot fork), a command is its own ``docker exec``. Both paths apply the same wrapper,
    limits and clean-up.

    What it guarantees:

    * **No network**: ``network_mode="none"`` (only a loopback interface), unless a network is
      named; then ``egress`` (:class:`~agentrl.sandbox.egress.Egress`) can still restrict what
      the processes reach, by rules the host loads into the container's network namespace
      (see :mod:`agentrl.sandbox.egress`), kept across restarts.
    * **Read-only root file system** from a local image; the writable places are the workspace
      (``/workspace``, a host directory bind-mounted read-write, the working directory) and a
      size-limited tmpfs ``/tmp`` (``Limits.file_size_mb``; it allows exec).
    * **Unprivileged**: commands run as ``uid:uid`` (default 65534, "nobody") with every
      capability dropped and ``no-new-privileges``. The container's own processes
      (docker-init, ``sleep``) run as another unprivileged uid, so sandboxed code cannot stop
      the container (``kill -9 -1`` only kills its own processes). Only a caller that asks
      for it (``exec(..., user="root")``, e.g. a grader once the sandboxed code is stopped)
      runs a command as uid 0, still without capabilities.
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
      dies, /tmp is emptied, the workspace stays, and the result's stderr says so.
    * **A command that cannot start because leftover processes fill the pids limit** (a
      detached fork bomb) is run once more after a clean-up, and its stderr says so. Which
      clean-up depends on how far it got: when ``timeout`` inside could not fork (status 125),
      the sweep above runs (it needs a new process but no fork, so it gets in the same way;
      restart if it fails). When runc could not start the ``docker exec`` process at all
      (status 126, "OCI runtime exec failed ... read init-p: connection reset by peer" or
      "resource temporarily unavailable", and the daemon reports that no process was started),
      anything run inside would need a pid too, so the container is restarted through the
      daemon, which needs none; several commands failing so at once cause one restart.
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
      the commands running at that moment and the open shells' processes.
    * The pids-limit recovery tries a command at most twice (the first try never ran it):
      when the limit is full again before the second try (e.g. a concurrent command started
      another bomb), the result is the failure (status 125 or 126 and the runtime's message).
      runc's init dying for lack of memory looks the same as for lack of pids and gets the
      same restart.
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
        image: Image to run (default: the locally built ``agentrl-base:bookworm-py3-v2``). It
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
        network: ``"none"`` (default: loopback only), ``"bridge"`` (Docker's default
            network: whatever the host can reach), or the name of a Docker network the
            sandbox joins (its other containers resolve by name). Only grant it on purpose.
        egress: What the processes may reach on ``network`` (None: all of it); change it
            with :meth:`set_egress`.
        env: Variables of every command, over the base ones (``PATH``, ``HOME``, ``LANG``,
            ``TMPDIR``); a command's own ``env`` goes over these.
        workspace_aliases: More absolute container paths where the workspace is mounted too
            (e.g. a task's ``/app``): the same files under another name.
        private_dirs: Container path -> ``"ro"`` or ``"rw"`` (the mount): a fresh, empty host
            directory per path, mounted there, that the sandbox's uid can read but not write
            (it belongs to the host's user, mode 0755) until the host hands it over; the host
            fills or reads it through :meth:`host_dir`. Removed with the workspace.
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
        network: str = "none",
        egress: Egress | None = None,
        env: Mapping[str, str] | None = None,
        workspace_aliases: Sequence[str] = (),
        private_dirs: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(limits)
        if not network or network in ("host",) or network.startswith("container:"):
            raise ValueError(f"network must be 'none', 'bridge' or a Docker network's name, not {network!r}")
        if egress is not None and network == "none":
            raise ValueError("egress restricts a network: give the sandbox one (network=...)")
        for path in (*workspace_aliases, *(private_dirs or {})):
            if not path.startswith("/") or path in ("/", WORKSPACE, "/tmp") or ".." in path.split("/"):
                raise ValueError(f"{path!r} cannot be mounted: give an absolute path other "
                                 f"than /, {WORKSPACE} and /tmp")
        for mode in (private_dirs or {}).values():
            if mode not in ("ro", "rw"):
                raise ValueError(f"private_dirs modes are 'ro' or 'rw', not {mode!r}")
        self.network = network
        self.egress = egress
        for key, value in (env or {}).items():
            if not key or "=" in key or "\0" in key or "\0" in str(value):
                raise ValueError(f"invalid environment variable {key!r}")
        self.env = {**BASE_ENV, **(env or {})}
        self._env_list = [f"{k}={v}" for k, v in self.env.items()]
        self.workspace_aliases = tuple(workspace_aliases)
        self.private_dirs = dict(private_dirs or {})
        self._private_hosts: dict[str, str] = {}
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
        self._exec_api: ExecApi | None = None
        # AGENTRL_EXEC tokens of the running commands, the runner and the open shells: the
        # processes that carry one survive a sweep.
        self._live_tokens: set[str] = set()
        self._client_tokens: dict[int, str] = {}  # docker exec -i clients (shells, spawned)
        self._processes: list[DockerProcess] = []
        self._shells: list[PipeShellSession] = []
        self._recover_lock = asyncio.Lock()
        self._oom_seen = 0
        self._pids_seen = 0
        self.fast_exec = fast_exec
        self._runner: CommandRunner | None = None
        self._runner_lock = asyncio.Lock()
        self._runner_retry_at = 0.0

    # -- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        if self.closed:
            raise SandboxError("sandbox is closed")
        if self._container is not None:
            return
        self._client = await asyncio.to_thread(get_client, self.docker_host)
        self._exec_api = ExecApi(self._client, self.docker_host)
        if self.image is None:
            from agentrl.sandbox.images import ensure_base_image

            self.image = await asyncio.to_thread(ensure_base_image, self._client)
        self.workspace = await asyncio.to_thread(
            make_workspace, self.workspace_root, self.uid, self.limits.workspace_mb
        )
        try:
            self._private_hosts = await asyncio.to_thread(
                make_private_dirs, self.workspace, self.private_dirs
            ) if self.private_dirs else {}
            self._container = await asyncio.to_thread(
                run_container, self._client, self.image, limits=self.limits, cpus=self.cpus,
                workspace=self.workspace, user=self._keeper_uid, env=self.env,
                labels={OWNER_LABEL: str(os.getpid()), **self.labels,
                        "agentrl.backend": self.backend},
                network=self.network, workspace_aliases=self.workspace_aliases,
                binds={p: (self._private_hosts[p], m) for p, m in self.private_dirs.items()},
            )
        except BaseException:
            await asyncio.to_thread(remove_workspace, self.workspace)
            raise
        self.container_id = self._container.id
        if self.egress is not None:
            try:
                await self._apply_egress()
            except BaseException:
                await self.close()
                raise
        await self._get_runner()  # best effort: a failure only means docker exec per command

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for shell in self._shells:
            with contextlib.suppress(Exception):
                await shell.close()
        self._shells.clear()
        for process in self._processes:
            with contextlib.suppress(Exception):
                await process.kill()
        self._processes.clear()
        if self._runner is not None:
            self._runner.close()
        container, self._container = self._container, None
        if container is not None:
            await asyncio.to_thread(force_remove, container)
        if self.workspace:
            await asyncio.to_thread(remove_workspace, self.workspace)

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
        user: str | None = None,
    ) -> ExecResult:
        """See :meth:`Sandbox.exec`. ``user`` is Docker's own: ``None`` (default) runs the
        command as the sandbox's uid; ``"root"`` runs it as uid 0, still with every capability
        dropped and ``no-new-privileges`` (root owns nothing writable but what the host gives
        it, e.g. a private dir), as its own ``docker exec`` (never through the runner, which
        runs as the sandbox's uid). A timed-out root command restarts the container, since the
        sweep (run as the sandbox's uid) cannot kill what root left running."""
        self._check()
        if user not in (None, "root"):
            raise SandboxError(f"user must be None (the sandbox's uid) or 'root', not {user!r}")
        as_root = user == "root"
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
        await self._restart_done()
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
                restarts = self.restarts
                result = None
                not_started = False
                runner = None if as_root else await self._get_runner()
                if runner is not None:
                    try:
                        result = await runner.run(
                            wrapped, [*self._env_list, *environment], cwd, stdin, bound,
                            self.limits.output_bytes,
                        )
                    except RunnerGone as gone:
                        orphaned = True
                        result = (None, gone.out, gone.err, False)
                        note = (
                            "\n[the sandbox's command runner was killed while this command ran "
                            "(e.g. by `kill -9 -1`); what the command left running was killed]"
                        )
                if result is None:
                    try:
                        result = await self._docker_exec(wrapped, environment, stdin, cwd, bound,
                                                         as_root=as_root)
                    except ExecNotStarted as failed:
                        result, not_started = failed.result, True
                code, out, err, host_timeout = result
                # The command never ran because processes left behind (a detached fork bomb)
                # fill the pids limit: kill them, then run it once more. When `timeout` got in
                # but could not fork, the sweep (which needs no fork) gets in as well and spares
                # the other running commands. When runc could not even start a process, the
                # sweep would need one too, so the daemon restarts the container instead.
                if not (not_started or (code == 125 and err.data.startswith(_NO_FORK))):
                    break
                if attempt:
                    note += "\n[the pids limit was full again: the command did not run]"
                    break
                if not_started:
                    note = await self._restart_unless_done(restarts)
                else:
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
        if timed_out and as_root:
            code = None
            note += await self._restart_unless_done(self.restarts)
            duration = time.perf_counter() - start
        elif timed_out:
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

    async def _get_runner(self) -> CommandRunner | None:
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
            assert self._exec_api is not None and self.container_id is not None
            runner = CommandRunner(self._exec_api, self.container_id, self.uid, self._live_tokens)
            if await runner.start():
                self._runner = runner
                return runner
            self._runner_retry_at = time.monotonic() + RUNNER_RETRY_S
            return None

    async def _docker_exec(
        self, argv: list[str], environment: list[str], stdin: bytes | None, cwd: str,
        bound: float, cap: int | None = None, as_root: bool = False,
    ) -> RawResult:
        """Runs one command as its own ``docker exec`` (as the sandbox uid, or root)."""
        assert self._exec_api is not None and self.container_id is not None
        uid = 0 if as_root else self.uid
        return await self._exec_api.run(
            self.container_id, argv, user=f"{uid}:{uid}", environment=environment,
            cwd=cwd, stdin=stdin, bound=bound,
            cap=self.limits.output_bytes if cap is None else cap,
        )

    # -- cleaning up after timeouts --------------------------------------------------------

    async def _in_container(self, mode: str) -> dict[str, Any] | None:
        """Runs the sweep script in ``mode`` (``sweep`` or ``probe``); its answer (``ok``,
        ``oom``, ``pids``), or None when it could not run."""
        try:
            code, out, _, host_timeout = await self._docker_exec(
                ["python3", "-c", script("sweep"), mode, *sorted(self._live_tokens)], [], None,
                "/", SWEEP_TIMEOUT_S, cap=4096,
            )
        except SandboxError:
            return None
        if host_timeout or code != 0:
            return None
        return parse_answer(out.data.decode("utf-8", "replace"))

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
            return answer or {}, _RESTARTED

    async def _restart_unless_done(self, seen: int) -> str:
        """Restarts the container unless it was restarted since ``self.restarts`` was
        ``seen`` (concurrent commands that failed alike then restart it once, not once each);
        returns the note for stderr."""
        if self.closed or self._container is None:
            return ""
        async with self._recover_lock:
            if self.restarts == seen:
                await self._restart()
        return _RESTARTED

    async def _restart_done(self) -> None:
        """Returns once no container restart (or sweep) is in progress."""
        async with self._recover_lock:
            return

    async def _restart(self) -> None:
        import docker.errors

        if self._runner is not None:
            self._runner.close()  # it dies with the restart; no command may be sent to it
        try:
            await asyncio.to_thread(self._container.restart, timeout=0)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot restart the sandbox container: {exc}") from exc
        if self.egress is not None:  # a restarted container has a new network namespace
            await self._apply_egress()
        self.restarts += 1
        self._oom_seen = 0
        self._pids_seen = 0

    # -- the host's side: egress, private directories, stopping everything --------------------

    async def set_egress(self, egress: Egress) -> None:
        """Changes what the sandbox's processes may reach (see :mod:`agentrl.sandbox.egress`):
        from the next packet on, also for connections already open.

        Raises:
            SandboxError: The sandbox has no network, or the host cannot enforce egress rules.
        """
        self._check()
        if self.network == "none":
            raise SandboxError("the sandbox has no network to restrict (network='none')")
        async with self._recover_lock:  # not while a restart makes a new namespace
            self.egress = egress
            await self._apply_egress()

    async def _apply_egress(self) -> None:
        assert self.egress is not None and self._container is not None
        if not self.docker_host.startswith("unix://"):
            raise SandboxError(f"egress rules need the Docker daemon on this machine, not {self.docker_host}")
        await asyncio.to_thread(self._container.reload)
        pid = self._container.attrs["State"]["Pid"]
        await asyncio.to_thread(apply_egress, pid, self._container.attrs.get("HostsPath"), self.egress)


    def host_dir(self, path: str) -> str:
        """The host directory behind the private directory ``path`` (see ``private_dirs``)."""
        self._check()
        if path not in self._private_hosts:
            raise SandboxError(f"{path!r} is not one of this sandbox's private_dirs {sorted(self.private_dirs)}")
        return self._private_hosts[path]

    async def join_network(self, network: str, aliases: Sequence[str] = ()) -> None:
        """Moves a sandbox started without network (``network="none"``) onto the Docker
        ``network``, where the other containers reach it by ``aliases``; it stays there across
        restarts. Use it for a network that exists only for one episode (a pool's sandboxes
        are made before it).

        Raises:
            SandboxError: The sandbox already has a network, or Docker refused.
        """
        import docker.errors

        self._check()
        if self.network != "none":
            raise SandboxError(f"the sandbox is already on the network {self.network!r}")

        def move() -> None:
            self._client.networks.get("none").disconnect(self._container)
            self._client.networks.get(network).connect(self._container, aliases=list(aliases))

        try:
            await asyncio.to_thread(move)
        except docker.errors.DockerException as exc:
            raise SandboxError(f"cannot move the sandbox onto the network {network!r}: {exc}") from exc
        self.network = network

    async def read_archive(self, path: str, max_bytes: int) -> bytes | None:
        """A tar archive of the container path ``path`` (a file or a folder, read through the
        container's own mounts, as ``docker cp`` reads it); None when nothing is there.

        Raises:
            SandboxError: The archive is larger than ``max_bytes``, or Docker failed.
        """
        import docker.errors

        self._check()

        def read() -> bytes | None:
            try:
                stream, _ = self._container.get_archive(path)
            except docker.errors.NotFound:
                return None
            except docker.errors.APIError as exc:
                raise SandboxError(f"cannot read {path!r} from the sandbox: {exc}") from exc
            chunks, size = [], 0
            for chunk in stream:
                size += len(chunk)
                if size > max_bytes:
                    raise SandboxError(f"{path!r} in the sandbox is larger than {max_bytes} bytes")
                chunks.append(chunk)
            return b"".join(chunks)

        return await asyncio.to_thread(read)

    async def stop_processes(self) -> None:
        """Stops every process of the sandbox (open shells, background jobs, the runner) by
        restarting the container: the workspace and private dirs are kept, /tmp is emptied.
        Commands run afterwards start from nothing the sandboxed code left behind."""
        self._check()
        for shell in self._shells:
            with contextlib.suppress(Exception):
                await shell.close()
        self._shells.clear()
        async with self._recover_lock:
            await self._restart()

    # -- shell -----------------------------------------------------------------------------

    async def open_shell(self) -> ShellSession:
        self._check()
        docker_cli = docker_cli_path(shutil.which, "open_shell")

        async def spawn() -> asyncio.subprocess.Process:
            self._check()
            await self._restart_done()
            return await start_client(self, docker_cli, ["bash", "--noprofile", "--norc"],
                                      cwd=WORKSPACE, env={})

        shell = PipeShellSession(spawn, self._end_client, self.limits.timeout_s, self.limits.output_bytes)
        self._shells.append(shell)
        return shell

    async def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str = WORKSPACE,
    ) -> SandboxProcess:
        """Starts ``argv`` as its own ``docker exec -i`` (see :meth:`Sandbox.spawn`); it survives
        sweeps until killed, and goes with the container."""
        self._check()
        if not argv:
            raise SandboxError("spawn needs a command")
        docker_cli = docker_cli_path(shutil.which, "spawn")
        await self._restart_done()
        process = DockerProcess(await start_client(self, docker_cli, list(argv), cwd=cwd,
                                                   env=dict(env or {})), self._end_client)
        self._processes.append(process)
        return process

    async def _end_client(self, proc: asyncio.subprocess.Process) -> None:
        await end_client(self, proc)

    # -- files -----------------------------------------------------------------------------

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        self._check()
        limit = max_bytes if max_bytes is not None else self.limits.file_size_mb * 1024 * 1024
        return await asyncio.to_thread(read_workspace_file, self.workspace, path, limit)

    async def write_file(self, path: str, data: str | bytes) -> None:
        self._check()
        if isinstance(data, str):
            data = data.encode()
        owner = (self.uid, self.uid) if os.geteuid() == 0 else None
        await asyncio.to_thread(
            write_workspace_file, self.workspace, path, data, owner,
            self.limits.file_size_mb * 1024 * 1024,
        )
