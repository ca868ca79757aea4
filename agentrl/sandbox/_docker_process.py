"""Long-lived ``docker exec -i`` clients of a Docker sandbox: its shells and spawned processes.

Each one runs as the sandbox's uid with a token of its own in its environment (see
``container_scripts/sweep.py``): the processes carrying a live token survive a sweep, and ending
one (:func:`end_client`) retires its token and sweeps, which kills it and everything it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from agentrl.sandbox.base import SandboxError, SandboxProcess, SandboxUnavailableError
from agentrl.sandbox.container_scripts.sweep import TOKEN_VAR


async def start_client(
    sandbox: Any, docker_cli: str, argv: Sequence[str], *, cwd: str, env: Mapping[str, str]
) -> asyncio.subprocess.Process:
    """Starts ``docker exec -i`` of ``argv`` in ``sandbox``'s container with pipes."""
    variables: list[str] = []
    for key, value in {**env, TOKEN_VAR: secrets.token_hex(8)}.items():
        if not key or "=" in key or "\0" in key or "\0" in str(value):
            raise SandboxError(f"invalid environment variable {key!r}")
        variables += ["-e", f"{key}={value}"]
    proc = await asyncio.create_subprocess_exec(
        docker_cli, "exec", "-i", "-u", f"{sandbox.uid}:{sandbox.uid}", "-w", cwd, *variables,
        sandbox.container_id, *argv,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "DOCKER_HOST": sandbox.docker_host},
    )
    token = variables[-1].split("=", 1)[1]
    sandbox._live_tokens.add(token)
    sandbox._client_tokens[proc.pid] = token
    return proc


async def end_client(sandbox: Any, proc: asyncio.subprocess.Process) -> None:
    """Kills a client started by :func:`start_client` and what it started in the container."""
    token = sandbox._client_tokens.pop(proc.pid, None)
    if token is not None:
        sandbox._live_tokens.discard(token)
    if not sandbox.closed and sandbox._container is not None:
        await sandbox._sweep()
    # Signal the `docker exec` client by pid, not with proc.kill(): that polls the child first,
    # reaping it behind asyncio's child watcher, which then logs "Unknown child process" and
    # reports exit status 255.
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(proc.wait(), 10)


def docker_cli_path(which: Callable[[str], str | None], what: str) -> str:
    cli = which("docker")
    if cli is None:
        raise SandboxUnavailableError(f"{what} needs the docker CLI (apt-get install docker.io)")
    return cli


class DockerProcess(SandboxProcess):
    """A process spawned in a Docker sandbox: a ``docker exec -i`` client's pipes."""

    def __init__(self, proc: asyncio.subprocess.Process,
                 end: Callable[[asyncio.subprocess.Process], Awaitable[None]]) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.stdin, self.stdout, self.stderr = proc.stdin, proc.stdout, proc.stderr
        self._proc, self._end, self._killed = proc, end, False

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def wait(self) -> int:
        return await self._proc.wait()

    async def kill(self) -> None:
        if self._killed:
            return
        self._killed = True
        await self._end(self._proc)  # first: closing stdin first would let it exit on its own
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            self.stdin.close()
