"""The policy, as the flags ask for it: the Megatron trainer that learns it and the engine that
serves it for rollouts. The one place that knows every backend.

Start-up overlaps what it can. The trainer's Ray ranks build their models in the background
until the first call that needs them (:meth:`~agentrl.placement.cluster.TrainerGroup.ready`),
and an engine that runs in this process (the embedded default) loads in a thread while Ray
starts, so the first rollout begins before the trainer is ready.

Imported on first use: the Megatron actor (megatron-core, torch) and the server launcher (aiohttp,
Ray), only for the backend and placement the flags ask for.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from agentrl.engine.base import Engine
from agentrl.placement.cluster import ClusterConfig, TrainerGroup, start_ray
from agentrl.placement.engines import launch_engines
from agentrl.placement.remote_errors import readable
from agentrl.rollout.build import load_policy_engine
from agentrl.rollout.config import RolloutConfig
from agentrl.run.config import Args
from agentrl.trainer.protocol import Trainer

__all__ = ["serve_policy", "start_policy", "start_trainer"]


async def start_policy(args: Args, checkpoint: str | Path,
                       closing: contextlib.AsyncExitStack) -> tuple[Trainer, Engine]:
    """The trainer and the engine, both starting from ``checkpoint``.

    Args:
        args: The run's flags.
        checkpoint: The Hugging Face folder both start from.
        closing: Gets the trainer's shutdown and the engine's close as soon as each exists,
            so that an error or an interrupt while the other still starts stops both.

    Returns:
        ``(trainer, engine)``: a :class:`TrainerGroup` of Ray ranks (or one
        :class:`~agentrl.trainer.actor.MegatronActor` in this process with ``--no-use-ray``), and
        the rollout's engine.
    """
    rollout, cluster = args.rollout, args.cluster
    # the embedded engine needs nothing of the trainer's: it loads while Ray and the ranks start
    background = (rollout.rollout_backend == "embedded" and not cluster.engine_actors)
    trainer = start_trainer(args, checkpoint, in_background=background and not cluster.ray_address)
    if isinstance(trainer, TrainerGroup):
        closing.callback(trainer.shutdown)
    try:
        # --weight-sync adapter: vLLM servers that load LoRA adapters of this rank
        adapters = args.trainer.lora_rank if args.run.weight_sync == "adapter" else 0
        # --colocate: engines share the trainer's placement group (Ray ranks, not in background)
        placed = trainer if isinstance(trainer, TrainerGroup) and not background else None
        engine = await serve_policy(rollout, cluster, checkpoint, trainer=placed, lora_rank=adapters)
    except Exception as exc:  # a Ray actor's error is made readable; others go as they are
        shown = readable(exc, "starting the rollout engines", debug=args.run.debug) if cluster.use_ray else exc
        if shown is exc:
            raise
        raise shown from None
    closing.push_async_callback(engine.close)
    return trainer, engine


def start_trainer(args: Args, checkpoint: str | Path, *, in_background: bool = False) -> Trainer:
    """The Megatron trainer: ``--actor-num-nodes`` x ``--actor-num-gpus-per-node`` ranks as Ray
    actors (their set-up runs on in the background; with ``in_background`` Ray's local start
    too), or one rank here with ``--no-use-ray``."""
    rollout, trainer, run = args.rollout, args.trainer, args.run
    assert trainer.num_steps_per_rollout is not None  # solved while parsing
    kwargs = {"hf_checkpoint": checkpoint, "rollout_temperature": rollout.rollout_temperature,
              "total_steps": run.num_rollout * trainer.num_steps_per_rollout}
    if args.cluster.use_ray:
        if not in_background:
            start_ray(args.cluster)
        return TrainerGroup(args.cluster, trainer, start_ray_here=in_background,
                            debug=run.debug, **kwargs)
    from agentrl.trainer.actor import MegatronActor

    return MegatronActor(trainer, **kwargs)


def prefix_cache_bytes(rollout: RolloutConfig) -> int:
    """The embedded engine's memory for earlier turns' keys and values (0: off)."""
    from agentrl.engine.embedded import DEFAULT_PREFIX_CACHE_BYTES

    return DEFAULT_PREFIX_CACHE_BYTES if rollout.engine_prefix_cache else 0


async def serve_policy(rollout: RolloutConfig, cluster: ClusterConfig, checkpoint: str | Path,
                       trainer: TrainerGroup | None = None, lora_rank: int = 0) -> Engine:
    """The rollout's engine: inference servers (``--rollout-backend sglang`` / ``sglang-compat`` /
    ``vllm``; with ``lora_rank``, vLLM servers that load LoRA adapters of that rank),
    embedded engine actors when ``--rollout-num-gpus`` / ``--colocate`` ask for them, else the
    embedded engine in this process (loaded in a thread). ``--rollout-concurrency`` is split
    evenly over engines."""
    if rollout.rollout_backend != "embedded":
        from agentrl.placement.servers import launch_servers  # imports aiohttp

        return await launch_servers(rollout, cluster, checkpoint, trainer=trainer, lora_rank=lora_rank)
    if not cluster.engine_actors:
        return await asyncio.to_thread(load_policy_engine, rollout, max_batch_size=rollout.rollout_concurrency,
                                       max_context_len=rollout.engine_context_len,
                                       prefix_cache_bytes=prefix_cache_bytes(rollout))
    per_engine = -(-rollout.rollout_concurrency // cluster.num_engines)
    return await launch_engines(cluster, checkpoint, seed=rollout.rollout_seed,
                                max_batch_size=per_engine, trainer=trainer,
                                max_context_len=rollout.engine_context_len,
                                prefix_cache_bytes=prefix_cache_bytes(rollout))
