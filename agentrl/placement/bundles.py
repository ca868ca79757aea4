"""Where engine actors go: the placement bundles the placement flags ask for.

Shared by the embedded engine actors (:mod:`agentrl.placement.engines`) and the inference
servers (:mod:`agentrl.placement.servers`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from agentrl.errors import EngineError
from agentrl.placement.cluster import ClusterConfig, TrainerGroup

__all__ = ["EngineBundles", "engine_bundles"]


@dataclasses.dataclass
class EngineBundles:
    """Where engine actors go: a placement group, one bundle index per engine, and each
    actor's Ray resources."""

    placement: Any
    bundles: list[int]
    resources: dict[str, float]
    threads: int
    owns_placement: bool


async def engine_bundles(cluster: ClusterConfig, trainer: TrainerGroup | None = None) -> EngineBundles:
    """The bundles the placement flags ask for (see :class:`~agentrl.placement.cluster.
    ClusterConfig`): ``--colocate`` puts engine ``i`` on the trainer's bundle ``i``, sharing it
    half and half; otherwise ``--rollout-num-gpus`` devices in bundles of their own,
    ``--rollout-num-gpus-per-engine`` per engine (one CPU each on a machine without GPUs)."""
    import torch
    from ray.util.placement_group import placement_group

    gpu = torch.cuda.is_available()
    if cluster.colocate:
        if trainer is None:
            raise EngineError("--colocate needs the trainer's placement group")
        resources = {"num_cpus": cluster.cpus_per_rank / 2, **({"num_gpus": 0.5} if gpu else {})}
        return EngineBundles(trainer.placement, list(range(cluster.num_engines)), resources,
                             max(1, cluster.cpus_per_rank // 2), owns_placement=False)
    per_engine = cluster.rollout_num_gpus_per_engine
    bundle = {"CPU": 1, **({"GPU": per_engine} if gpu else {})}
    placement = placement_group([dict(bundle) for _ in range(cluster.num_engines)], strategy="PACK")
    await asyncio.wait_for(asyncio.wrap_future(placement.ready().future()), 300)
    resources = {"num_cpus": 1, **({"num_gpus": per_engine} if gpu else {})}
    return EngineBundles(placement, list(range(cluster.num_engines)), resources, 1, owns_placement=True)
