"""Sandboxes on Ray nodes (``--sandbox-placement ray``): one host actor per node that offers a
``sandbox`` resource.

What runs where: an episode (its turns, tool-call parsing, rewards computed outside the
sandbox) stays in the driver; every sandbox operation is a call to the host actor on the
sandbox's node: create, ``exec``, file reads and writes, shell sessions, close, and the
backend's own async methods (``DockerSandbox.stop_processes``). The host makes its sandboxes
with the usual backends (``auto`` resolved on that node), so a sandbox isolates exactly what its
backend isolates, on that node; nothing of the driver's machine is visible in it. Not carried
over: :meth:`Sandbox.spawn` (a long-running process's pipes, which sandboxed MCP stdio servers
use) and methods that hand out paths of the node's file system (``DockerSandbox.host_dir``).

Capacity: a node's whole ``sandbox`` amount (``ray start --resources '{"sandbox": 16}'``) is
the number of sandboxes its host holds at once, and the host reserves all of it, so one run uses
a sandbox node at a time. Each new sandbox goes to the host with the most free room; when every
host is full it waits. The driver-side pools (:class:`RemoteSandboxPools`) keep their admission
control (``max_concurrent_sandboxes``), which therefore spans the nodes.

Failures: a host whose node or process died is dropped: Ray reports its actor dead, or reports
it unreachable, or a call runs past its own timeout and :data:`CALL_MARGIN_S`, and in the last
two cases it does not answer a short probe either. The call that saw it, and every later call on
its sandboxes, raise :class:`~agentrl.sandbox.SandboxLost`: their episodes fail
with finish ``sandbox_lost`` (and are played again under ``--use-fault-tolerance``). Closing a
lost sandbox does nothing. Nodes that join later, such as a replacement, are found by polling
the cluster again. Sandboxes on surviving hosts are closed when released and when the pools
close, then the host actors are killed; if the driver dies, Ray ends its hosts with it and the
next run's host on each node removes what they left (:func:`~agentrl.sandbox.reap_leftovers`).

Imported on first use: Ray's start (``start_ray``), only when a host launcher starts one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import sys
import time
import weakref
from typing import TYPE_CHECKING, Any, Protocol

from agentrl.placement._sandbox_host import SandboxHostActor
from agentrl.placement.cluster import start_ray
from agentrl.placement.remote_sandbox import RemoteSandbox
from agentrl.rollout.build import env_factory
from agentrl.sandbox.base import (
    Limits,
    SandboxError,
    SandboxLost,
)
from agentrl.sandbox.pool import SandboxPools

if TYPE_CHECKING:
    from agentrl.env.factory import EnvFactory
    from agentrl.placement.cluster import ClusterConfig
    from agentrl.rollout.config import RolloutConfig

__all__ = [
    "SANDBOX_RESOURCE",
    "SANDBOX_RETRIES",
    "NodeInfo",
    "RayHostLauncher",
    "RemoteSandbox",
    "RemoteSandboxPools",
    "SandboxHost",
    "SandboxHosts",
]

log = logging.getLogger(__name__)

SANDBOX_RESOURCE = "sandbox"
"""The Ray resource that marks a node as a sandbox node; its amount is the node's capacity."""
SANDBOX_RETRIES = 3
"""How many times ``--use-fault-tolerance`` plays again an episode whose sandbox node died."""
CALL_MARGIN_S = 30.0
"""How long past its own timeout a call may take before its host is probed."""
PROBE_TIMEOUT_S = 10.0
"""How long a probed host has to answer before it is taken for dead."""
CLOSE_ALL_TIMEOUT_S = 120.0
"""How long a host may take to close the sandboxes it still holds when the run ends."""
HOST_START_TIMEOUT_S = 120.0
"""How long a new host has to start; one that is still waiting for its node's ``sandbox``
resource then (another run holds it) is given up, and tried again at a later poll. While no host
runs and the last start on every sandbox node failed, a new sandbox fails with the reasons."""
POLL_INTERVAL_S = 5.0
"""How often the cluster's nodes are listed again (new sandbox nodes join, gone ones leave)."""
NO_NODE_TIMEOUT_S = 120.0
"""How long a new sandbox waits for a sandbox node to exist before it fails."""
HOST_CONCURRENCY = 1000
"""Calls a host actor serves at once (sandbox calls mostly wait on subprocesses)."""


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    """A live node offering sandboxes.

    Attributes:
        node_id: Ray's node id (hex).
        address: The node's IP address, for messages.
        capacity: Its whole ``sandbox`` amount: sandboxes its host holds at once.
    """

    node_id: str
    address: str
    capacity: int


class HostLauncher(Protocol):
    """Finds sandbox nodes and starts and kills host actors (:class:`RayHostLauncher`; tests
    give handles of their own)."""

    def nodes(self) -> list[NodeInfo]:
        """The live sandbox nodes (blocking; called in a worker thread)."""

    def start(self, node: NodeInfo) -> Any:
        """A handle of a new host on ``node``: its methods have ``.remote(...)``, which returns
        an awaitable of the result."""

    def kill(self, handle: Any) -> None:
        """Stops a host (nothing that ran in it is closed first)."""


class RayHostLauncher:
    """Host actors on the Ray cluster of ``cluster`` (joined on first use when this process is
    not connected yet).

    Args:
        cluster: Where the cluster is (``--ray-address``).
    """

    def __init__(self, cluster: ClusterConfig) -> None:
        self.cluster = cluster

    def nodes(self) -> list[NodeInfo]:
        import ray

        start_ray(self.cluster)
        found = []
        for node in ray.nodes():
            amount = int(node.get("Resources", {}).get(SANDBOX_RESOURCE, 0))
            if node.get("Alive") and amount >= 1:
                found.append(NodeInfo(node["NodeID"], node.get("NodeManagerAddress", "?"), amount))
        return found

    def start(self, node: NodeInfo) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # the whole amount: a second run's host cannot start there and take sandboxes over it
        return ray.remote(SandboxHostActor).options(
            # never restarted: a new process would not have the sandboxes the driver counts
            num_cpus=0, resources={SANDBOX_RESOURCE: node.capacity}, max_restarts=0,
            max_concurrency=HOST_CONCURRENCY,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
        ).remote()

    def kill(self, handle: Any) -> None:
        import ray

        with contextlib.suppress(Exception):  # already dead with its node
            ray.kill(handle, no_restart=True)


@dataclasses.dataclass(eq=False)
class SandboxHost:
    """The driver's record of one host actor.

    Attributes:
        node: The node it runs on.
        handle: The actor handle.
        in_use: Sandboxes handed out on it and not yet closed.
        alive: ``False`` once it was found dead (its sandboxes are lost).
    """

    node: NodeInfo
    handle: Any
    in_use: int = 0
    alive: bool = True

    @property
    def free(self) -> int:
        return self.node.capacity - self.in_use

    def describe(self) -> str:
        return f"sandbox node {self.node.address} ({self.node.node_id[:8]})"


class SandboxHosts:
    """The run's sandbox hosts, one per live sandbox node, started on first use.

    Use it from one event loop at a time (a later loop gets new wake-ups; the hosts stay).

    Args:
        launcher: Finds nodes and starts hosts (:class:`RayHostLauncher` for a run).
        poll_interval_s: How often the nodes are listed again.
        no_node_timeout_s: How long :meth:`pick` waits while no sandbox node exists.
        call_margin_s: How long past its own timeout a call may run before its host is probed.
        probe_timeout_s: How long a probed host has to answer.
        host_start_timeout_s: How long a new host has to start.
    """

    def __init__(self, launcher: HostLauncher, *, poll_interval_s: float = POLL_INTERVAL_S,
                 no_node_timeout_s: float = NO_NODE_TIMEOUT_S, call_margin_s: float = CALL_MARGIN_S,
                 probe_timeout_s: float = PROBE_TIMEOUT_S,
                 host_start_timeout_s: float = HOST_START_TIMEOUT_S) -> None:
        self.launcher = launcher
        self.host_start_timeout_s = host_start_timeout_s
        self.poll_interval_s = poll_interval_s
        self.no_node_timeout_s = no_node_timeout_s
        self.call_margin_s = call_margin_s
        self.probe_timeout_s = probe_timeout_s
        self._hosts: dict[str, SandboxHost] = {}
        self._starting: dict[str, asyncio.Task[None]] = {}
        self._start_failures: dict[str, str] = {}  # node id -> why its last host did not start
        self._polled_at = -float("inf")
        self._changed: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Event] = (
            weakref.WeakKeyDictionary())

    @property
    def hosts(self) -> list[SandboxHost]:
        """The live hosts."""
        return list(self._hosts.values())

    def creator(self, backend: str, limits: Limits, **options: Any) -> RemoteSandbox:
        """A new, not yet started sandbox on one of the hosts (a ``SandboxPools`` creator)."""
        return RemoteSandbox(self, backend, limits, options)

    # -- choosing a host -------------------------------------------------------------------------

    async def pick(self) -> SandboxHost:
        """The host with the most free room (of equals, the lowest node id), its room taken by
        one sandbox (give it back with :meth:`release`); waits while every host is full or none
        has started yet.

        Raises:
            SandboxError: No sandbox node appeared within ``no_node_timeout_s``, or no host
                could start on any of them (each start gets ``host_start_timeout_s``).
        """
        since = time.monotonic()
        while True:
            changed = self._event()
            changed.clear()  # before looking: a release from now on wakes the wait below
            best = self._freest()
            now = time.monotonic()
            if best is None and not self._hosts and not self._starting and self._start_failures:
                raise SandboxError("no sandbox host could start on any Ray node offering a "
                                   f"`{SANDBOX_RESOURCE}` resource: " + "; ".join(self._start_failures.values()))
            if now - self._polled_at >= (self.poll_interval_s if best else 1.0):
                await self._poll()
                best = self._freest()
            if best is not None:
                best.in_use += 1
                return best
            if not self._hosts:
                if self._starting:
                    since = now  # a host is on its way: the wait for a node is over
                elif now - since > self.no_node_timeout_s:
                    raise SandboxError(
                        f"no live Ray node offers a `{SANDBOX_RESOURCE}` resource (waited "
                        f"{self.no_node_timeout_s:g} s): start one with `ray start --address HEAD "
                        f"--resources '{{\"{SANDBOX_RESOURCE}\": 16}}'`")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), self.poll_interval_s)

    def release(self, host: SandboxHost) -> None:
        """Gives back the room of one sandbox of ``host`` (closed, or never made)."""
        if self._hosts.get(host.node.node_id) is host:
            host.in_use -= 1
            self._wake()

    def _freest(self) -> SandboxHost | None:
        free = [h for h in self._hosts.values() if h.free > 0]
        return min(free, key=lambda h: (-h.free, h.node.node_id)) if free else None

    def _event(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        event = self._changed.get(loop)
        if event is None:
            event = self._changed[loop] = asyncio.Event()
            self._starting.clear()  # tasks of an earlier loop died with it
        return event

    def _wake(self) -> None:
        for loop, event in list(self._changed.items()):
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

    async def _poll(self) -> None:
        """Lists the sandbox nodes: hosts of nodes that left are dropped, new nodes get one."""
        self._polled_at = time.monotonic()
        nodes = {n.node_id: n for n in await asyncio.to_thread(self.launcher.nodes)}
        for node_id, host in list(self._hosts.items()):
            if node_id not in nodes:
                self.drop(host, "its node left the cluster")
        for node_id in list(self._start_failures):
            if node_id not in nodes:
                del self._start_failures[node_id]
        for node in nodes.values():
            if node.node_id not in self._hosts and node.node_id not in self._starting:
                task = asyncio.get_running_loop().create_task(self._start_host(node))
                self._starting[node.node_id] = task
                task.add_done_callback(self._started)

    def _started(self, task: asyncio.Task[None]) -> None:
        for node_id, starting in list(self._starting.items()):
            if starting is task:
                del self._starting[node_id]

    async def _start_host(self, node: NodeInfo) -> None:
        handle = self.launcher.start(node)
        try:
            await asyncio.wait_for(handle.stats.remote(), self.host_start_timeout_s)
        except asyncio.CancelledError:  # the pools are closing
            self.launcher.kill(handle)
            raise
        except Exception as exc:  # noqa: BLE001 - the node stays unused until a later poll
            why = (f"node {node.address} ({node.node_id[:8]}) started no host: {exc!r} (a host "
                   f"has {self.host_start_timeout_s:g} s); is another run using the node (one run "
                   "per sandbox node), or does this driver's RAY_AUTH_MODE differ from the cluster's?")
            log.warning("%s", why)
            self._start_failures[node.node_id] = why
            self.launcher.kill(handle)
            self._wake()
            return
        self._start_failures.pop(node.node_id, None)
        self._hosts[node.node_id] = SandboxHost(node, handle)
        log.info("sandbox host started on node %s (%s), %d sandboxes at once", node.address,
                 node.node_id[:8], node.capacity)
        self._wake()

    def drop(self, host: SandboxHost, why: str) -> None:
        """Forgets a dead host (its sandboxes are lost) and kills its actor, in case only its
        answers were lost. Idempotent."""
        if not host.alive:
            return
        host.alive = False
        if self._hosts.get(host.node.node_id) is host:
            del self._hosts[host.node.node_id]
        log.warning("%s lost (%s): its sandboxes' episodes fail", host.describe(), why)
        self.launcher.kill(host.handle)
        self._wake()

    # -- calls -----------------------------------------------------------------------------------

    async def call(self, host: SandboxHost, method: str, *args: Any, deadline: float) -> Any:
        """``method(*args)`` on ``host``'s actor, waiting at most ``deadline`` seconds before
        probing it.

        Raises:
            SandboxLost: The host is dead, or did not answer the probe.
            SandboxError: The host answers, but the call did not return (a stuck backend), or
                the call itself raised it.
        """
        if not host.alive:
            raise SandboxLost(f"{host.describe()} was lost")
        scope = asyncio.timeout(deadline)
        try:
            async with scope:
                return await getattr(host.handle, method).remote(*args)
        except Exception as exc:  # re-raised as the caller should see it
            if isinstance(exc, TimeoutError) and scope.expired():
                if not await self._answers(host):
                    self.drop(host, f"no answer within {self.probe_timeout_s:g} s after a "
                                    f"{method} ran {deadline:g} s")
                    raise SandboxLost(f"{host.describe()} stopped answering") from None
                raise SandboxError(f"{host.describe()}: {method} did not return within "
                                   f"{deadline:g} s, though the host answers") from None
            readable = await self._readable(host, exc)
            if readable is exc:
                raise
            raise readable from exc

    async def _answers(self, host: SandboxHost) -> bool:
        """Whether ``host`` answers a probe within ``probe_timeout_s``; while Ray says it is
        unreachable for now (its node may be dying), it is asked again."""
        deadline = time.monotonic() + self.probe_timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(host.handle.stats.remote(), left)
            except Exception as exc:  # noqa: BLE001 - any other failure to answer means the same
                if not _ray_error(exc, "ActorUnavailableError"):
                    return False
                await asyncio.sleep(min(0.5, left))
            else:
                return True
        return False

    async def _readable(self, host: SandboxHost, exc: Exception) -> Exception:
        """A host call's error as the caller should see it: the backend's own exception, or
        :class:`SandboxLost` when the actor died or became unreachable (the call's effect is
        then unknown); an unreachable host that does not answer a probe is dropped too."""
        if _ray_error(exc, "RayActorError"):
            unreachable = _ray_error(exc, "ActorUnavailableError")
            if not unreachable or not await self._answers(host):
                self.drop(host, type(exc).__name__)
            return SandboxLost(f"{host.describe()} died ({type(exc).__name__}); everything that "
                               "ran in its sandbox is gone")
        cause = getattr(exc, "cause", None)
        if _ray_error(exc, "RayTaskError") and isinstance(cause, Exception):
            return cause
        return exc

    async def stats(self) -> list[dict[str, Any]]:
        """Each live host's own account (:meth:`SandboxHostActor.stats`), plus ``handed_out``: the
        sandboxes the driver counts on it."""
        async def one(host: SandboxHost) -> dict[str, Any]:
            answer = await self.call(host, "stats", deadline=self.probe_timeout_s)
            return {**answer, "handed_out": host.in_use}

        return list(await asyncio.gather(*(one(h) for h in self.hosts)))

    async def close(self) -> None:
        """Closes every sandbox the live hosts still hold, then kills the hosts; a later
        :meth:`pick` starts new ones."""
        starting, self._starting = list(self._starting.values()), {}
        for task in starting:
            task.cancel()
        await asyncio.gather(*starting, return_exceptions=True)
        hosts, self._hosts = list(self._hosts.values()), {}
        closed = await asyncio.gather(
            *(self.call(h, "close_all", deadline=CLOSE_ALL_TIMEOUT_S) for h in hosts),
            return_exceptions=True)
        for host, result in zip(hosts, closed, strict=True):
            if isinstance(result, BaseException):
                log.warning("closing the sandboxes of %s failed: %r", host.describe(), result)
            host.alive = False
            self.launcher.kill(host.handle)
        self._polled_at = -float("inf")


def _ray_error(exc: BaseException, name: str) -> bool:
    """Whether ``exc`` is a ``ray.exceptions.<name>`` (one exists only once Ray is loaded)."""
    errors = sys.modules.get("ray.exceptions")
    return errors is not None and isinstance(exc, getattr(errors, name))


class RemoteSandboxPools(SandboxPools):
    """:class:`~agentrl.sandbox.SandboxPools` whose sandboxes run on ``hosts``: admission,
    pre-warming and release as for local ones; closing them also closes and kills the hosts.

    Args:
        hosts: Where the sandboxes go.
        prewarm: Started sandboxes each pool keeps ready.
    """

    remote = True

    def __init__(self, hosts: SandboxHosts, *, prewarm: int = 0) -> None:
        super().__init__(prewarm=prewarm, reap=False, creator=hosts.creator)
        self.hosts = hosts

    @classmethod
    def for_cluster(cls, cluster: ClusterConfig) -> RemoteSandboxPools:
        """The pools of a run with ``--sandbox-placement ray`` on ``cluster``."""
        return cls(SandboxHosts(RayHostLauncher(cluster)))

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            await self.hosts.close()


def placed_env_factory(config: RolloutConfig, cluster: ClusterConfig) -> EnvFactory | None:
    """The run's env factory (:func:`agentrl.rollout.build.env_factory`) with its sandboxes
    where ``--sandbox-placement`` puts them: local, or with ``ray`` on the Ray nodes that offer
    a ``sandbox`` resource. Under ``--use-fault-tolerance`` an episode whose sandbox node died,
    or whose environment server went away, is played again :data:`SANDBOX_RETRIES` times at
    most."""
    if cluster.sandbox_placement != "ray":
        return env_factory(config, sandbox_retries=SANDBOX_RETRIES if cluster.use_fault_tolerance else 0)
    return env_factory(config, make_sandbox_pools=functools.partial(RemoteSandboxPools.for_cluster, cluster),
                       sandbox_retries=SANDBOX_RETRIES if cluster.use_fault_tolerance else 0)
