"""The Ray actor that holds one sandbox node's sandboxes (``--sandbox-placement ray``; the
driver's side, and what runs where, is :mod:`agentrl.placement.sandbox_hosts`).

Its sandboxes are made here with :func:`agentrl.sandbox.create_sandbox` (``auto`` resolved on
this node), so each isolates what its backend isolates, on this node, and its leftovers are
what the reaper of this node's next host removes."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.sandbox import create_sandbox, reap_leftovers
from agentrl.sandbox.base import ExecResult, Limits, Sandbox, SandboxError, ShellSession

__all__ = ["SandboxHostActor"]

log = logging.getLogger(__name__)


class SandboxHostActor:
    """The Ray actor holding one node's sandboxes.

    Its methods take the sandbox's id (``sid``) and do what the same method of the sandbox does;
    errors (a :class:`SandboxError` for a path outside the workspace, say) reach the driver as
    they are. When it starts it removes what sandboxes of dead processes left on this node.
    """

    def __init__(self) -> None:
        self._sandboxes: dict[str, Sandbox] = {}
        self._shells: dict[str, tuple[str, ShellSession]] = {}
        # the leftovers of runs whose hosts died with their node, or were killed with the driver
        self._reaped = reap_leftovers()

    def stats(self) -> dict[str, Any]:
        """What the host holds, and where it runs: ``in_use``, ``shells``, ``node_id``, ``pid``,
        ``reaped`` (what it removed when it started)."""
        import ray

        return {"in_use": len(self._sandboxes), "shells": len(self._shells),
                "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "reaped": self._reaped}

    async def create(self, backend: str, limits: Limits, options: dict[str, Any]
                     ) -> tuple[str, str, list[str]]:
        """Starts a sandbox; returns its id, its concrete backend and its extra async methods."""
        sandbox = create_sandbox(backend, limits, **options)
        try:
            await sandbox.start()
        except BaseException:
            await asyncio.shield(sandbox.close())
            raise
        sid = uuid.uuid4().hex
        self._sandboxes[sid] = sandbox
        return sid, sandbox.backend, sorted(_extra_methods(sandbox))

    def _get(self, sid: str) -> Sandbox:
        sandbox = self._sandboxes.get(sid)
        if sandbox is None:
            raise SandboxError("the sandbox is closed")
        return sandbox

    async def exec(self, sid: str, command: str | list[str], options: dict[str, Any]) -> ExecResult:
        return await self._get(sid).exec(command, **options)

    async def read_file(self, sid: str, path: str, max_bytes: int | None) -> bytes:
        return await self._get(sid).read_file(path, max_bytes=max_bytes)

    async def write_file(self, sid: str, path: str, data: str | bytes) -> None:
        await self._get(sid).write_file(path, data)

    async def open_shell(self, sid: str) -> str:
        shell = await self._get(sid).open_shell()
        shell_id = uuid.uuid4().hex
        self._shells[shell_id] = (sid, shell)
        return shell_id

    def _shell(self, sid: str, shell_id: str) -> ShellSession:
        owner, shell = self._shells.get(shell_id, (None, None))
        if owner != sid or shell is None:
            raise SandboxError("the shell session is closed")
        return shell

    async def shell_run(self, sid: str, shell_id: str, command: str, timeout: float | None
                        ) -> ExecResult:
        return await self._shell(sid, shell_id).run(command, timeout)

    async def shell_close(self, sid: str, shell_id: str) -> None:
        shell = self._shell(sid, shell_id)
        del self._shells[shell_id]
        await shell.close()

    async def call(self, sid: str, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        sandbox = self._get(sid)
        if name not in _extra_methods(sandbox):
            raise SandboxError(f"the {sandbox.backend} sandbox has no async method {name!r}")
        return await getattr(sandbox, name)(*args, **kwargs)

    async def close(self, sid: str) -> None:
        """Closes the sandbox and its shells; an unknown (already closed) one is ignored."""
        for shell_id in [k for k, (owner, _) in self._shells.items() if owner == sid]:
            _, shell = self._shells.pop(shell_id)
            with contextlib.suppress(Exception):  # the sandbox's close kills it anyway
                await shell.close()
        sandbox = self._sandboxes.pop(sid, None)
        if sandbox is not None:
            await sandbox.close()

    async def close_all(self) -> int:
        """Closes every sandbox still open (the run ends); returns how many there were."""
        sids = list(self._sandboxes)
        results = await asyncio.gather(*(self.close(sid) for sid in sids), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.warning("closing a sandbox at the run's end failed: %r", result)
        return len(sids)


def _extra_methods(sandbox: Sandbox) -> frozenset[str]:
    """The public async methods of ``sandbox``'s backend that the interface does not have."""
    return _extra_methods_of(type(sandbox))


@functools.cache
def _extra_methods_of(backend: type[Sandbox]) -> frozenset[str]:
    return frozenset(name for name, _ in inspect.getmembers(backend, inspect.iscoroutinefunction)
                     if not name.startswith("_") and not hasattr(Sandbox, name))
