"""A pool of sandboxes with admission control, pre-warming and a reaper.

Episodes ``acquire`` a sandbox (waiting, not failing, when ``max_concurrent`` are in use) and
``release`` it when they end; a released sandbox is closed (its workspace, processes and
container go with it) and never reused, so no state leaks between episodes. Up to ``prewarm``
started sandboxes wait ready, so acquiring one is a queue pop rather than a container start.

Leftovers of crashed runs (workspaces, mounts and processes of local backends whose owner pid
is dead; containers labelled with a dead owner pid) are removed by :func:`reap_leftovers`, which
the pool runs when it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from typing import Any

from agentrl.sandbox import _procs
from agentrl.sandbox.base import Sandbox

SandboxFactory = Callable[[], Sandbox]
logger = logging.getLogger(__name__)


class SandboxPool:
    """Hands out started sandboxes to episodes, at most ``max_concurrent`` at a time.

    Args:
        factory: Builds one (not yet started) sandbox, e.g.
            ``lambda: create_sandbox("bwrap", limits)``.
        max_concurrent: Sandboxes in use at once; further ``acquire`` calls wait in FIFO order.
        prewarm: Started sandboxes kept ready (counted within ``max_concurrent`` only when
            handed out).
        reap: Remove leftovers of dead runs when the pool starts.
    """

    def __init__(
        self, factory: SandboxFactory, *, max_concurrent: int = 16, prewarm: int = 0, reap: bool = True
    ) -> None:
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be >= 1")
        if prewarm < 0:
            raise ValueError("prewarm must be >= 0")
        self._factory = factory
        self.max_concurrent = max_concurrent
        self.prewarm = prewarm
        self._reap = reap
        self._slots = asyncio.Semaphore(max_concurrent)
        self._warm: asyncio.Queue[Sandbox] = asyncio.Queue()
        self._in_use: set[Sandbox] = set()
        self._refills: set[asyncio.Task[None]] = set()
        self._waiting = 0
        self.refill_errors = 0
        """Pre-warm starts that failed (each is logged); acquire starts sandboxes itself then."""
        self._started = False
        self._closed = False

    @property
    def stats(self) -> dict[str, int]:
        """Sandboxes in use, callers waiting for a slot, and warm sandboxes ready."""
        return {"in_use": len(self._in_use), "waiting": self._waiting, "warm": self._warm.qsize()}

    async def start(self) -> None:
        """Reaps leftovers (if enabled) and fills the warm queue. Called by the first acquire."""
        if self._started:
            return
        self._started = True
        if self._reap:
            await asyncio.to_thread(reap_leftovers)
        await asyncio.gather(*(self._add_warm() for _ in range(self.prewarm)))

    async def _new_started(self) -> Sandbox:
        """A new started sandbox; one whose start fails or is cancelled (pool closing, caller
        cancelled) is closed, after its start has finished, so nothing it made is left."""
        sandbox = self._factory()
        start = asyncio.ensure_future(sandbox.start())
        try:
            await asyncio.shield(start)
        except BaseException:
            with contextlib.suppress(BaseException):
                await start  # a mount or container create may still be finishing
            await asyncio.shield(sandbox.close())
            raise
        return sandbox

    async def _add_warm(self) -> None:
        sandbox = await self._new_started()
        if self._closed:
            await sandbox.close()
        else:
            self._warm.put_nowait(sandbox)

    def _refill(self) -> None:
        if self._closed or self._warm.qsize() + len(self._refills) >= self.prewarm:
            return
        task = asyncio.get_running_loop().create_task(self._add_warm())
        self._refills.add(task)
        task.add_done_callback(self._refill_done)

    def _refill_done(self, task: asyncio.Task[None]) -> None:
        self._refills.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # acquire() still works (it starts a sandbox itself when none is warm); say why the
            # warm queue is short instead of failing an episode for it.
            self.refill_errors += 1
            logger.warning("pre-warming a sandbox failed: %r", task.exception())

    async def acquire(self) -> Sandbox:
        """A started sandbox for one episode; waits while ``max_concurrent`` are in use."""
        if self._closed:
            raise RuntimeError("the sandbox pool is closed")
        await self.start()
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        try:
            if not self._warm.empty():
                sandbox = self._warm.get_nowait()
            else:
                sandbox = await self._new_started()
        except BaseException:
            self._slots.release()
            raise
        self._in_use.add(sandbox)
        self._refill()
        return sandbox

    async def release(self, sandbox: Sandbox) -> None:
        """Ends an episode's use: closes the sandbox and frees its slot."""
        if sandbox not in self._in_use:
            raise ValueError("this sandbox was not acquired from this pool (or already released)")
        self._in_use.discard(sandbox)
        try:
            await sandbox.close()
        finally:
            self._slots.release()

    @contextlib.asynccontextmanager
    async def sandbox(self) -> AsyncIterator[Sandbox]:
        """``async with pool.sandbox() as sb:`` acquires and always releases."""
        sandbox = await self.acquire()
        try:
            yield sandbox
        finally:
            await self.release(sandbox)

    async def close(self) -> None:
        """Closes warm and in-use sandboxes. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._refills):
            task.cancel()
        await asyncio.gather(*self._refills, return_exceptions=True)
        doomed = list(self._in_use)
        self._in_use.clear()
        while not self._warm.empty():
            doomed.append(self._warm.get_nowait())
        await asyncio.gather(*(s.close() for s in doomed), return_exceptions=True)

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()


def reap_leftovers() -> dict[str, int]:
    """Removes what sandboxes of dead agentrl processes left behind.

    Local backends: workspaces named ``ws-<pid>-...`` under the sandbox root whose pid is gone
    (unmounted, deleted) and, as root, processes still running under uids claimed by dead
    processes (then the claims). Docker: containers labelled ``agentrl.sandbox=1`` whose
    ``agentrl.owner_pid`` is gone (only when a daemon answers).

    Returns:
        Counts of what was removed, by kind.
    """
    removed = {"workspaces": 0, "uids": 0, "containers": 0}
    root = _procs.sandbox_root()
    if os.path.isdir(root):
        for name in os.listdir(root):
            parts = name.split("-")
            if len(parts) < 3 or parts[0] != "ws" or not parts[1].isdigit():
                continue
            if _procs.pid_alive(int(parts[1])):
                continue
            path = os.path.join(root, name)
            if os.path.ismount(path):
                subprocess.run(["umount", "-l", path], capture_output=True)
            shutil.rmtree(path, ignore_errors=True)
            removed["workspaces"] += 1
    if _procs.IS_ROOT and os.path.isdir(root):
        for uid in _procs.stale_claims():
            _procs.kill_uid(uid)
            _procs.release_uid(uid)
            removed["uids"] += 1
    removed["containers"] = _reap_containers()
    return removed


def _reap_containers() -> int:
    try:
        from agentrl.sandbox import docker as docker_backend
    except ImportError:  # the docker SDK is optional at run time
        return 0
    if docker_backend.docker_unavailable_reason() is not None:
        return 0
    return docker_backend.remove_dead_owner_containers(_procs.pid_alive)

