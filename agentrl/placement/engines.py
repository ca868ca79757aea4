"""The rollout's engines as Ray actors, supervised, behind one :class:`Engine`.

``EngineGroup`` is what the rollout talks to when ``--rollout-num-gpus`` (or ``--colocate``) puts
the policy engines in their own processes: it is an :class:`~agentrl.engine.Engine`, so
the episode runner does not know the difference. It

* routes a request to an engine, keeping every request of one episode on the same engine (the
  rid without its ``-t<turn>`` suffix is the episode) and sending a new episode to the engine
  with the fewest requests in flight;
* broadcasts ``update_weights`` / ``pause`` / ``resume`` / ``abort`` and, for colocated engines,
  ``release_memory`` while the trainer runs;
* under ``--use-fault-tolerance``, health-checks every engine every
  ``--rollout-health-check-interval`` seconds, restarts a dead or unresponsive one on its
  bundle with the latest weights, and retries the requests it had in flight on a live engine.
  A retried request has the same rid and sampling seed, so the episode continues as if nothing
  happened: no sample is lost or played twice. Without the flag a dead engine is an
  ``EngineError`` naming it.

Each engine actor serves an :class:`~agentrl.engine.EmbeddedEngine` (the SGLang backend
is another issue). Weights travel through Ray's shared-memory object store (one ``ray.put`` per
update, read by every engine) or as a Hugging Face directory on disk (``--weight-sync disk``).

Imported on first use: Ray, and the embedded engine and the tokenizer (torch, transformers) in the
actor that serves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from agentrl.engine.base import (
    Engine,
    EpisodeAffinity,
    GenerateOutput,
    SamplingParams,
    episode_key,
)
from agentrl.errors import EngineError
from agentrl.models.hf_config import load_tokenizer
from agentrl.placement.bundles import engine_bundles
from agentrl.placement.cluster import ClusterConfig, TrainerGroup

__all__ = ["EngineGroup", "engine_actor_name", "launch_engines"]

log = logging.getLogger(__name__)

"""Episode -> engine entries kept before the map is cleared (episodes then re-route freely)."""


def engine_actor_name(driver_pid: int, index: int, launch: int = 0) -> str:
    """The Ray actor name of engine ``index`` of the run whose driver is ``driver_pid``, its
    ``launch``-th actor (0 until its first restart; namespace ``agentrl``, see ``ray list
    actors``)."""
    return f"agentrl-engine-{driver_pid}-{index}.{launch}"


class _EngineServer:
    """One engine process (a Ray actor; see :class:`EngineGroup`)."""

    def __init__(self, checkpoint: str, *, seed: int, max_batch_size: int, threads: int,
                 version: str, max_context_len: int | None, prefix_cache_bytes: int) -> None:
        import torch

        from agentrl.engine.embedded import EmbeddedEngine

        torch.set_num_threads(threads)
        device = "cuda" if torch.cuda.is_available() else None
        self.engine = EmbeddedEngine.from_pretrained(checkpoint, device=device, seed=seed,
                                                     max_batch_size=max_batch_size,
                                                     max_context_len=max_context_len,
                                                     weight_version=version,
                                                     prefix_cache_bytes=prefix_cache_bytes)
        self.requests = 0  # generate calls received, for operators and drills

    async def info(self) -> dict[str, Any]:
        return {"max_context_len": self.engine.max_context_len, "pid": os.getpid(),
                "weight_version": self.engine.weight_version,
                "requests": self.requests}

    async def generate(self, input_ids: list[int], sampling: SamplingParams,
                       rid: str | None) -> GenerateOutput:
        self.requests += 1
        return await self.engine.generate(input_ids, sampling, rid)

    async def update_weights(self, state_dict: Mapping[str, Any] | None, path: str | None,
                             version: str) -> None:
        await self.engine.update_weights(state_dict=state_dict, path=path, version=version)

    async def pause(self, mode: str) -> None:
        await self.engine.pause(mode)  # type: ignore[arg-type]

    async def resume(self) -> None:
        await self.engine.resume()

    async def abort(self, rid_prefix: str) -> int:
        return await self.engine.abort(rid_prefix)

    async def alive(self) -> bool:
        return self.engine.alive

    async def release_memory(self) -> None:
        import torch

        await self.engine.release_memory()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # hand the freed cache back to the colocated trainer

    async def close(self) -> None:
        await self.engine.close()


@dataclasses.dataclass
class _Slot:
    """One engine's place: its bundle, its current actor, its state."""

    index: int
    bundle: int
    handle: Any = None
    alive: bool = False
    inflight: int = 0
    restarts: int = 0
    launches: int = 0  # actors started here, failed starts included (names must not repeat)
    restarting: asyncio.Task[None] | None = None


class EngineGroup(Engine):
    """``num_engines`` engine actors on bundles of a Ray placement group, as one engine.

    Build it with :meth:`launch` (or :func:`launch_engines`, from flags); call :meth:`close` at
    the end: it kills the actors, and removes the placement group when it owns it.

    Args:
        placement: A Ray placement group; engine ``i`` runs on bundle ``bundles[i]``.
        bundles: Bundle index of each engine.
        checkpoint: Hugging Face directory every engine loads at start.
        tokenizer: The checkpoint's tokenizer (the rollout renders chats in this process).
        resources: Ray resources of one engine actor (``{"num_cpus": 1}``, ``{"num_gpus": 1}``,
            fractions when colocated).
        seed: Base seed; engine ``i`` seeds its own stream with ``seed + i`` (requests that carry
            a ``sampling_seed`` do not depend on it).
        max_batch_size: Requests one engine decodes together.
        threads: torch threads per engine.
        fault_tolerance: Restart dead engines and retry their requests (see module docstring).
        health_check_interval: Seconds between health checks (fault tolerance only).
        health_check_timeout: Seconds an engine may take to answer one.
        max_retries: Times one request is retried after its engine died.
        max_context_len: Each engine's context length (default: the model's).
        prefix_cache_bytes: Each engine's memory for earlier turns' keys and values (0: off).
        owns_placement: :meth:`close` removes the placement group too.
    """

    takes_weight_refs = True

    def __init__(
        self, placement: Any, bundles: list[int], checkpoint: str | Path, *, tokenizer: Any,
        resources: Mapping[str, float], seed: int = 0, max_batch_size: int = 32, threads: int = 1,
        fault_tolerance: bool = False, health_check_interval: float = 10.0,
        health_check_timeout: float = 30.0, max_retries: int = 3,
        max_context_len: int | None = None, prefix_cache_bytes: int = 0,
        owns_placement: bool = False,
    ) -> None:
        if not bundles:
            raise EngineError("an EngineGroup needs at least one engine")
        self.placement = placement
        self.checkpoint = str(checkpoint)
        self.tokenizer = tokenizer
        self.resources = dict(resources)
        self.seed = seed
        self.max_batch_size = max_batch_size
        self.threads = threads
        self.fault_tolerance = fault_tolerance
        self.health_check_interval = health_check_interval
        self.health_check_timeout = health_check_timeout
        self.max_retries = max_retries
        self.owns_placement = owns_placement
        self.context_len_limit = max_context_len
        self.prefix_cache_bytes = prefix_cache_bytes
        self.max_context_len: int | None = None
        self.slots = [_Slot(index=i, bundle=b) for i, b in enumerate(bundles)]
        self._version = "0"
        self._weights: tuple[Any, str | None] | None = None  # (object ref, path) of the latest push
        self._affinity: EpisodeAffinity[int] = EpisodeAffinity()
        self._any_alive: asyncio.Event | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._closed = False
        self.stats = {"restarts": 0, "retried_requests": 0}

    @classmethod
    async def launch(cls, *args: Any, **kwargs: Any) -> EngineGroup:
        """Creates the group (same arguments as the constructor) and waits for every engine."""
        group = cls(*args, **kwargs)
        group._any_alive = asyncio.Event()
        start = group._restart if group.fault_tolerance else group._start  # retry failed starts?
        await asyncio.gather(*(start(slot) for slot in group.slots))
        if group.fault_tolerance:
            group._health_task = asyncio.create_task(group._watch(), name="agentrl-engine-health")
        return group

    # --- Engine API -----------------------------------------------------------------------

    @property
    def weight_version(self) -> str:
        return self._version

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, rid: str | None = None
    ) -> GenerateOutput:
        """See :meth:`Engine.generate`; retried on a live engine if its engine dies (fault
        tolerance), else ``EngineError``."""
        from ray.exceptions import RayActorError

        key = episode_key(rid)
        for attempt in range(self.max_retries + 1):
            slot = await self._route(key)
            handle = slot.handle
            slot.inflight += 1
            try:
                return await handle.generate.remote(input_ids, sampling, rid)
            except RayActorError as exc:
                if not self.fault_tolerance:
                    raise EngineError(
                        f"engine {slot.index} died serving {rid!r}: {exc.__class__.__name__}; "
                        "--use-fault-tolerance restarts engines and retries their requests"
                    ) from exc
                self._lost(slot, handle, f"request {rid!r} failed: {exc.__class__.__name__}")
                self.stats["retried_requests"] += 1
                log.warning("engine %d died; retrying %s (attempt %d)", slot.index, rid, attempt + 1)
            finally:
                slot.inflight -= 1
        raise EngineError(f"request {rid!r} failed on {self.max_retries + 1} engines in a row")

    async def update_weights(
        self, *, state_dict: Any = None, path: str | None = None, version: str
    ) -> None:
        """Pushes new weights to every live engine (restarted engines load them too).

        ``state_dict`` may be a dict of tensors or a Ray ``ObjectRef`` of one (the trainer's
        answer, never copied through this process); it goes to the object store once.
        """
        import ray

        if (state_dict is None) == (path is None):
            raise EngineError("update_weights needs exactly one of state_dict and path")
        ref = None
        if state_dict is not None:
            ref = state_dict if isinstance(state_dict, ray.ObjectRef) else ray.put(dict(state_dict))
        self._weights = (ref, path)
        self._version = str(version)
        await self._broadcast("update_weights", ref, path, self._version)

    async def pause(self, mode: Literal["abort", "in_place"] = "abort") -> None:
        await self._broadcast("pause", mode)

    async def resume(self) -> None:
        await self._broadcast("resume")

    async def abort(self, rid_prefix: str = "") -> int:
        counts = await self._broadcast("abort", rid_prefix)
        if not rid_prefix:
            self._affinity.clear()
        return sum(c for c in counts if isinstance(c, int))

    async def release_memory(self) -> None:
        """Every engine frees its KV cache (colocated: the trainer runs next)."""
        await self._broadcast("release_memory")

    async def health(self) -> bool:
        return any(slot.alive for slot in self.slots)

    async def close(self) -> None:
        """Stops health checks and kills every engine actor. Safe to call twice."""
        import ray

        if self._closed:
            return
        self._closed = True
        tasks = [t for t in (self._health_task, *(s.restarting for s in self.slots)) if t]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for slot in self.slots:
            if slot.handle is not None:
                ray.kill(slot.handle)
            slot.handle, slot.alive = None, False
        if self.owns_placement:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.placement)

    def kill_engine(self, index: int) -> None:
        """Kills engine ``index``'s process now, as a crash would (for fault-tolerance tests and
        drills); with fault tolerance it is restarted."""
        import ray

        ray.kill(self.slots[index].handle, no_restart=True)

    # --- supervision ----------------------------------------------------------------------

    async def _start(self, slot: _Slot) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote = ray.remote(_EngineServer).options(
            name=engine_actor_name(os.getpid(), slot.index, slot.launches),
            max_concurrency=10_000, **self.resources,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.placement, placement_group_bundle_index=slot.bundle),
        )
        slot.launches += 1
        handle = remote.remote(self.checkpoint, seed=self.seed + slot.index,
                               max_batch_size=self.max_batch_size, threads=self.threads,
                               version=self._version,
                               max_context_len=self.context_len_limit,
                               prefix_cache_bytes=self.prefix_cache_bytes)
        info = await handle.info.remote()
        if self._weights is not None:  # a restart: the weights it must serve are the latest push
            ref, path = self._weights
            await handle.update_weights.remote(ref, path, self._version)
        self.max_context_len = info["max_context_len"]
        slot.handle, slot.alive = handle, True
        assert self._any_alive is not None
        self._any_alive.set()

    def _lost(self, slot: _Slot, handle: Any, reason: str) -> None:
        """Marks ``slot`` dead (once per actor) and restarts it in the background."""
        if slot.handle is not handle or not slot.alive:
            return  # already handled for this actor
        slot.alive = False
        self._affinity.forget(slot.index)
        assert self._any_alive is not None
        if not any(s.alive for s in self.slots):
            self._any_alive.clear()
        log.warning("engine %d lost (%s); restarting it", slot.index, reason)
        slot.restarting = asyncio.create_task(self._restart(slot, handle))

    async def _restart(self, slot: _Slot, old: Any = None) -> None:
        """Replaces ``old`` (None: a first start) with a new actor, trying until one comes up."""
        import ray

        if old is not None:
            ray.kill(old, no_restart=True)
        what = "restart" if old is not None or slot.launches > 0 else "start"
        delay = 1.0
        while not self._closed:
            try:
                await self._start(slot)
                if what == "restart":
                    slot.restarts += 1
                    self.stats["restarts"] += 1
                    log.warning("engine %d restarted (weights %s)", slot.index, self._version)
                return
            except Exception as exc:  # noqa: BLE001 - the actor failed to come up: try again
                log.warning("engine %d failed to %s: %r; retrying in %.0f s", slot.index, what, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def _watch(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.health_check_interval)
            await asyncio.gather(*(self._check(slot) for slot in self.slots if slot.alive))

    async def _check(self, slot: _Slot) -> None:
        handle = slot.handle
        try:
            ok = await asyncio.wait_for(handle.alive.remote(), self.health_check_timeout)
            reason = "its scheduler stopped"
        except TimeoutError:
            ok, reason = False, f"no health answer in {self.health_check_timeout:.0f} s"
        except Exception as exc:  # noqa: BLE001 - any failure to answer is a dead engine
            ok, reason = False, f"health check failed: {exc.__class__.__name__}"
        if not ok:
            self._lost(slot, handle, reason)

    async def _route(self, key: str | None) -> _Slot:
        started = time.perf_counter()
        while True:
            if self._closed:
                raise EngineError("the engine group is closed")
            live = [s.index for s in self.slots if s.alive]
            if live:
                return self.slots[self._affinity.pick(key, live, lambda i: self.slots[i].inflight)]
            if not self.fault_tolerance:
                raise EngineError("no engine is alive")
            assert self._any_alive is not None
            await self._any_alive.wait()
            if time.perf_counter() - started > 600:
                raise EngineError("no engine came back within 10 minutes")

    async def _broadcast(self, method: str, *args: Any) -> list[Any]:
        """Calls ``method`` on every live engine; a dead one is handled like in generate."""
        from ray.exceptions import RayActorError

        async def one(slot: _Slot) -> Any:
            handle = slot.handle
            try:
                return await getattr(handle, method).remote(*args)
            except RayActorError as exc:
                if not self.fault_tolerance:
                    raise EngineError(f"engine {slot.index} died during {method}: "
                                      f"{exc.__class__.__name__}") from exc
                self._lost(slot, handle, f"{method} failed")
                return None

        return list(await asyncio.gather(*(one(s) for s in self.slots if s.alive)))


async def launch_engines(cluster: ClusterConfig, checkpoint: str | Path, *, seed: int, max_batch_size: int,
                         trainer: TrainerGroup | None = None, max_context_len: int | None = None,
                         prefix_cache_bytes: int = 0) -> EngineGroup:
    """Embedded engine actors on the bundles of :func:`engine_bundles`."""
    where = await engine_bundles(cluster, trainer)
    return await EngineGroup.launch(
        where.placement, where.bundles, checkpoint, tokenizer=load_tokenizer(checkpoint),
        resources=where.resources, seed=seed, max_batch_size=max_batch_size, threads=where.threads,
        fault_tolerance=cluster.use_fault_tolerance,
        health_check_interval=cluster.rollout_health_check_interval,
        health_check_timeout=cluster.rollout_health_check_timeout,
        max_context_len=max_context_len, prefix_cache_bytes=prefix_cache_bytes,
        owns_placement=where.owns_placement,
    )
