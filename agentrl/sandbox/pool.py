"""A pool of sandboxes with admission control, pre-warming and a reaper.

Episodes ``acquire`` a sandbox (waiting, not failing, when ``max_concurrent`` are in use) and
``release`` it when they end; a released sandbox is closed (its workspace, processes and
container go with it) and never reused, so no state leaks between episodes. Up to ``prewarm``
started sandboxes wait ready, so acquiring one is a queue pop rather than a container start.

Leftovers of crashed runs (workspaces, mounts and processes of local backends whose owner pid
is dead; containers labelled with a dead owner pid) are removed by :func:`reap_leftovers`, which
the pool runs when it starts. A process that made sandboxes also reaps its own at exit
(:func:`reap_own_at_exit`, installed by :func:`agentrl.sandbox.create_sandbox`), so a run
stopped by a signal or an exception leaves nothing behind even when its episodes never got to
close their sandboxes.

:class:`SandboxPools` holds the pools of one run (one per backend, limits and options), made on
first use; every env of the run receives the same one, so admission control spans the run.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import subprocess
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

from agentrl.sandbox import _procs
from agentrl.sandbox.base import Limits, Sandbox

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
        slots: An admission semaphore shared with other pools, so that ``max_concurrent``
            bounds their sandboxes together (as :class:`SandboxPools` does); default: the
            pool's own, with ``max_concurrent`` slots.
    """

    def __init__(
        self,
        factory: SandboxFactory,
        *,
        max_concurrent: int = 16,
        prewarm: int = 0,
        reap: bool = True,
        slots: asyncio.Semaphore | None = None,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be >= 1")
        if prewarm < 0:
            raise ValueError("prewarm must be >= 0")
        self._factory = factory
        self.max_concurrent = max_concurrent
        self.prewarm = prewarm
        self._reap = reap
        self._slots = slots if slots is not None else asyncio.Semaphore(max_concurrent)
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
        """Ends an episode's use: closes the sandbox and frees its slot. After :meth:`close`
        (which closed every sandbox in use) it does nothing."""
        if self._closed and sandbox not in self._in_use:
            return
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


SandboxCreator = Callable[..., Sandbox]
"""``creator(backend, limits, **options)`` -> a new, not yet started sandbox."""


@dataclasses.dataclass
class _LoopPools:
    pools: dict[tuple[Any, ...], SandboxPool] = dataclasses.field(default_factory=dict)
    slots: dict[tuple[Any, ...], asyncio.Semaphore] = dataclasses.field(default_factory=dict)


class SandboxPools:
    """The sandbox pools of one run: a :class:`SandboxPool` per (event loop, backend, limits,
    ``max_concurrent``, options), made on first use.

    A run makes one and gives it to every env it builds (``SandboxedToolEnv(sandbox_pools=...)``),
    so ``max_concurrent`` bounds the sandboxes of all their episodes together. Pools that differ
    only in ``options`` (e.g. one Docker image per SWE-bench instance) share one admission
    limit as well: the bound holds for the run, not per image. Pools are per event loop because
    asyncio primitives are.

    Copying returns the same object: a copy (e.g. Gymnasium deep-copying an env spec's kwargs to
    make the env again) must still share the run's pools and their admission control.

    Args:
        prewarm: Started sandboxes each pool keeps ready.
        reap: Remove leftovers of dead runs when the first pool starts.
        creator: Builds one sandbox, ``creator(backend, limits, **options)``; default
            :func:`agentrl.sandbox.create_sandbox`.
    """

    remote: bool = False
    """Whether the sandboxes run on other machines (a subclass's): a backend name such as
    ``auto`` is then resolved where each sandbox runs, not here."""

    def __init__(
        self, *, prewarm: int = 0, reap: bool = True, creator: SandboxCreator | None = None
    ) -> None:
        if prewarm < 0:
            raise ValueError("prewarm must be >= 0")
        self.prewarm = prewarm
        self._reap = reap
        self._creator = creator
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopPools] = (
            weakref.WeakKeyDictionary()
        )

    def get(
        self,
        backend: str,
        limits: Limits,
        max_concurrent: int,
        options: Mapping[str, Any] | None = None,
    ) -> SandboxPool:
        """The pool of (the running event loop, ``backend``, ``limits``, ``max_concurrent``,
        ``options``), made on first use.

        Args:
            backend: A concrete backend name (``bwrap``, ``docker``, ``process``).
            limits: Resource limits of each sandbox.
            max_concurrent: Sandboxes in use at once, over all pools with the same backend,
                limits and ``max_concurrent``.
            options: Backend options (docker: ``image``).

        Raises:
            RuntimeError: No event loop is running.
        """
        loop = asyncio.get_running_loop()
        opts = dict(options or {})
        admission = (backend, limits, max_concurrent)
        # Options may hold unhashable values (docker labels are a dict): key on their JSON.
        key = (*admission, json.dumps(opts, sort_keys=True, default=repr))
        entry = self._loops.setdefault(loop, _LoopPools())
        pool = entry.pools.get(key)
        if pool is None:
            slots = entry.slots.setdefault(admission, asyncio.Semaphore(max_concurrent))
            creator = self._creator or _default_creator()
            pool = SandboxPool(
                lambda: creator(backend, limits, **opts), max_concurrent=max_concurrent,
                prewarm=self.prewarm, reap=self._reap, slots=slots,
            )
            self._reap = False  # reaping once per run is enough
            entry.pools[key] = pool
        return pool

    def __len__(self) -> int:
        """The number of open pools (over all event loops)."""
        return sum(len(entry.pools) for entry in self._loops.values())

    async def aclose(self) -> None:
        """Closes every pool of the running event loop (their warm and in-use sandboxes) and
        forgets them; a later :meth:`get` makes new ones. Call it in each loop that used the
        pools. Idempotent."""
        entry = self._loops.pop(asyncio.get_running_loop(), None)
        if entry is None:
            return
        results = await asyncio.gather(
            *(pool.close() for pool in entry.pools.values()), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def __copy__(self) -> SandboxPools:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> SandboxPools:
        return self


def _default_creator() -> SandboxCreator:
    from agentrl.sandbox import create_sandbox  # the package imports this module first

    return create_sandbox


def reap_leftovers(*, own: bool = False, docker_hosts: Iterable[str | None] | None = None
                   ) -> dict[str, int]:
    """Removes what sandboxes of dead agentrl processes left behind.

    Local backends: workspaces named ``ws-<pid>-...`` under the sandbox root whose owner is
    gone (unmounted, deleted) and, as root, processes still running under uids claimed by dead
    processes (then the claims). An owner is gone when no process has its pid, when that
    process is a zombie, or when it started after the workspace or claim was made (its pid was
    reused; see ``owner_alive`` in :mod:`agentrl.sandbox._procs`). Docker: containers labelled
    ``agentrl.sandbox=1`` whose ``agentrl.owner_pid`` is gone or a zombie (only when a daemon
    answers). Nothing a live process owns is touched.

    Args:
        own: Also remove this process's own sandboxes (it is about to exit: nothing of it may
            outlive it).
        docker_hosts: The Docker daemons to clean (``None`` in it: the default one); default:
            the default daemon.

    Returns:
        Counts of what was removed, by kind.
    """
    me = os.getpid()

    def gone(pid: int, since: float) -> bool:
        return (own and pid == me) or not _procs.owner_alive(pid, since)

    removed = {"workspaces": 0, "uids": 0, "containers": 0}
    root = _procs.sandbox_root()
    if _procs.IS_ROOT and os.path.isdir(root):
        # processes first: a workspace is unmounted once nothing of the sandbox runs in it
        for uid in _procs.stale_claims(gone):
            _procs.kill_uid(uid)
            _procs.release_uid(uid)
            removed["uids"] += 1
    if os.path.isdir(root):
        for name in os.listdir(root):
            parts = name.split("-")
            if len(parts) < 3 or parts[0] != "ws" or not parts[1].isdigit():
                continue
            path = os.path.join(root, name)
            try:
                made = os.lstat(path).st_ctime  # no later than the owner's last change to it
            except OSError:
                continue
            if not gone(int(parts[1]), made):
                continue
            if os.path.ismount(path):
                subprocess.run(["umount", "-l", path], capture_output=True)
            shutil.rmtree(path, ignore_errors=True)
            removed["workspaces"] += 1
    for host in docker_hosts if docker_hosts is not None else [None]:
        removed["containers"] += _reap_containers(
            lambda pid: not (own and pid == me) and _procs.owner_alive(pid, math.inf), host)
    return removed


def _reap_containers(pid_alive: Callable[[int], bool], docker_host: str | None) -> int:
    try:
        from agentrl.sandbox import docker as docker_backend
    except ImportError:  # the docker SDK is optional at run time
        return 0
    if docker_backend.docker_unavailable_reason(docker_host) is not None:
        return 0
    return docker_backend.remove_dead_owner_containers(pid_alive, docker_host)


_made_by_this_process: dict[str, set[str | None]] = {}
"""Backends this process made sandboxes of (docker: by daemon), for the exit reaper."""


def note_sandbox_made(backend: str, docker_host: str | None = None) -> None:
    """Records that this process made a ``backend`` sandbox; the first call installs
    :func:`reap_own_at_exit` (an ``atexit`` hook)."""
    if not _made_by_this_process:
        atexit.register(reap_own_at_exit)
    _made_by_this_process.setdefault(backend, set()).add(docker_host)


def reap_own_at_exit() -> dict[str, int]:
    """Removes every sandbox this process made that is still there (workspaces unmounted, uid
    claims released, processes killed, containers removed), and leftovers of dead runs.

    Runs at interpreter exit and on a second interrupt (which exits without the usual
    clean-up); closing sandboxes normally (``Sandbox.close``, ``SandboxPools.aclose``) leaves
    it nothing to do. Never raises: it is the last thing a process does.
    """
    hosts = _made_by_this_process.get("docker", set())
    try:
        return reap_leftovers(own=True, docker_hosts=hosts)
    except Exception as exc:  # noqa: BLE001 - at exit a report is all that can be done
        logger.warning("removing this run's sandboxes at exit failed: %r", exc)
        return {}
