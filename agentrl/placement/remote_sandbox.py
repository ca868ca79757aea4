"""The driver's side of a sandbox on a Ray node (``--sandbox-placement ray``): every
:class:`~agentrl.sandbox.Sandbox` operation becomes a call to the host actor that holds the
sandbox. Which hosts exist, where a new sandbox goes and when a host counts as dead is
:mod:`agentrl.placement.sandbox_hosts`'s business; this module only forwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from agentrl.sandbox.base import (
    WORKSPACE,
    ExecResult,
    Limits,
    Sandbox,
    SandboxError,
    SandboxLost,
    SandboxProcess,
    ShellSession,
)

__all__ = ["CREATE_TIMEOUT_S", "Hosts", "RemoteSandbox", "RemoteShellSession"]

CREATE_TIMEOUT_S = 600.0
"""How long creating a sandbox may take (a Docker image pulled, a container started)."""


class Hosts(Protocol):
    """What a :class:`RemoteSandbox` asks of the run's hosts
    (:class:`~agentrl.placement.sandbox_hosts.SandboxHosts`); a host is an opaque handle here."""

    call_margin_s: float
    """How long past its own timeout a call may run before its host is probed."""

    async def pick(self) -> Any:
        """The host a new sandbox goes to, its room taken (waits while every host is full)."""

    async def call(self, host: Any, method: str, *args: Any, deadline: float) -> Any:
        """``method(*args)`` on ``host``'s actor; raises SandboxLost if the host died."""

    def release(self, host: Any) -> None:
        """Gives back the room a sandbox took on ``host``."""


class RemoteSandbox(Sandbox):
    """A sandbox on one of the run's hosts (see the module docstring for what runs where).

    Every method is a call to the host. A host that died makes them raise
    :class:`~agentrl.sandbox.SandboxLost` (its episode fails); :meth:`close` then returns
    quietly. The backend's own async methods (``stop_processes`` of Docker) are carried over
    too, under their names.

    Args:
        hosts: The run's hosts.
        backend: The backend, resolved on the node the sandbox goes to (``auto`` there).
        limits: Resource limits, applied on that node.
        options: Backend options (docker: ``image``), used on that node.
    """

    def __init__(self, hosts: Hosts, backend: str, limits: Limits | None,
                 options: Mapping[str, Any]) -> None:
        super().__init__(limits)
        self.backend = backend  # the concrete one once started
        self.host: Any = None  # the host holding it, once started
        self._hosts = hosts
        self._options = dict(options)
        self._sid = ""
        self._methods: frozenset[str] = frozenset()

    async def start(self) -> None:
        """Picks the host with the most free room (waiting while all are full) and creates the
        sandbox there."""
        if self.host is not None:
            return
        host = await self._hosts.pick()
        try:
            self._sid, self.backend, methods = await self._hosts.call(
                host, "create", self.backend, self.limits, self._options, deadline=CREATE_TIMEOUT_S)
        except BaseException:
            self._hosts.release(host)
            raise
        self.host, self._methods = host, frozenset(methods)

    async def _call(self, method: str, *args: Any, timeout: float) -> Any:
        if self.closed:
            raise SandboxError("the sandbox is closed")
        if self.host is None:
            raise SandboxError("the sandbox is not started")
        return await self._hosts.call(self.host, method, self._sid, *args,
                                      deadline=timeout + self._hosts.call_margin_s)

    async def exec(self, command: str | list[str], *, timeout: float | None = None,
                   stdin: str | bytes | None = None, env: Mapping[str, str] | None = None,
                   cwd: str = WORKSPACE) -> ExecResult:
        options = {"timeout": timeout, "stdin": stdin, "env": dict(env) if env else None, "cwd": cwd}
        return await self._call("exec", command, options,
                                timeout=self.limits.timeout_s if timeout is None else timeout)

    async def open_shell(self) -> ShellSession:
        shell_id = await self._call("open_shell", timeout=self.limits.timeout_s)
        return RemoteShellSession(self, shell_id)

    async def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                    cwd: str = WORKSPACE) -> SandboxProcess:
        """Refused: a long-running process's pipes do not reach the driver.

        Raises:
            SandboxError: Always, saying so.
        """
        raise SandboxError("Sandbox.spawn (a long-running process with pipes, e.g. an MCP stdio "
                           "server in the sandbox) is not supported with --sandbox-placement ray: "
                           "use --sandbox-placement local")

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        return await self._call("read_file", path, max_bytes, timeout=self.limits.timeout_s)

    async def write_file(self, path: str, data: str | bytes) -> None:
        await self._call("write_file", path, data, timeout=self.limits.timeout_s)

    async def close(self) -> None:
        """Closes the sandbox on its host and frees its room there; a lost one is gone already."""
        if self.closed:
            return
        self.closed = True
        host, self.host = self.host, None
        if host is None:
            return
        try:
            with contextlib.suppress(SandboxLost):  # nothing of it is left on a dead node
                await self._hosts.call(host, "close", self._sid,
                                       deadline=self.limits.timeout_s + self._hosts.call_margin_s)
        finally:
            self._hosts.release(host)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self._methods:
            raise AttributeError(
                f"{type(self).__name__} ({self.backend} backend, on another node) has no "
                f"attribute {name!r}: only the backend's async methods are carried over")

        async def method(*args: Any, **kwargs: Any) -> Any:
            return await self._call("call", name, args, kwargs, timeout=self.limits.timeout_s)

        return method


class RemoteShellSession(ShellSession):
    """A shell session of a :class:`RemoteSandbox`, kept by its host."""

    def __init__(self, sandbox: RemoteSandbox, shell_id: str) -> None:
        self._sandbox = sandbox
        self._shell_id = shell_id
        self._closed = False

    async def run(self, command: str, timeout: float | None = None) -> ExecResult:
        if self._closed:
            raise RuntimeError("shell session is closed")
        limit = self._sandbox.limits.timeout_s if timeout is None else timeout
        return await self._sandbox._call("shell_run", self._shell_id, command, timeout, timeout=limit)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._sandbox.closed:
            return  # closing the sandbox closed its shells
        with contextlib.suppress(SandboxError):  # lost with its node, or closed there already
            await self._sandbox._call("shell_close", self._shell_id,
                                      timeout=self._sandbox.limits.timeout_s)
