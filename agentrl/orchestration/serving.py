"""The rollout's policy engine, as the flags ask for it: the one place that knows every backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.orchestration.engines import launch_engines
from agentrl.rollout.engine.base import Engine

__all__ = ["serve_policy"]


async def serve_policy(rollout: Any, cluster: Any, checkpoint: str | Path, trainer: Any = None) -> Engine:
    """The rollout's engine: SGLang servers (``--rollout-backend sglang`` / ``sglang-compat``),
    embedded engine actors when ``--rollout-num-gpus`` / ``--colocate`` ask for them, else the
    embedded engine in this process. ``--rollout-concurrency`` is split evenly over engines."""
    if rollout.rollout_backend != "embedded":
        from agentrl.orchestration.sglang_servers import launch_sglang  # imports aiohttp

        return await launch_sglang(rollout, cluster, checkpoint, trainer=trainer)
    if not cluster.engine_actors:
        from agentrl.rollout.build import load_policy_engine

        return load_policy_engine(rollout, max_batch_size=rollout.rollout_concurrency,
                                  max_context_len=rollout.engine_context_len)  # fmt: skip
    per_engine = -(-rollout.rollout_concurrency // cluster.num_engines)
    return await launch_engines(cluster, checkpoint, seed=rollout.rollout_seed,
                                max_batch_size=per_engine, trainer=trainer,
                                max_context_len=rollout.engine_context_len)  # fmt: skip
