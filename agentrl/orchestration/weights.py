"""Getting the trainer's weights to the engines.

Two paths, chosen by ``--weight-sync``:

* ``tensor``: Hugging Face-named tensors gathered over tensor parallelism. The embedded engine in
  the driver copies them in place; engine actors read them from Ray's shared-memory object store,
  where the trainer's rank 0 put them (one copy per node, not one per engine).
* ``disk``: the trainer writes a Hugging Face directory (``<output-dir>/weights/v<version>``, the
  previous one deleted) and every engine loads it: the general fallback, for engines that share
  only a filesystem with the trainer.

The SGLang backend adds NCCL broadcast for engines on other GPUs and per-rank tensor handles for
colocated ones behind the same :func:`push_weights`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from agentrl.rollout.engine.base import Engine

__all__ = ["push_weights"]


async def push_weights(actor: Any, engine: Engine, *, version: str, mode: str = "auto",
                       output_dir: str | Path = ".") -> None:  # fmt: skip
    """Makes ``engine`` serve ``actor``'s current weights, tagged ``version``.

    Args:
        actor: A :class:`~agentrl.trainer.actor.MegatronActor` or
            :class:`~agentrl.orchestration.cluster.TrainerGroup`.
        engine: The rollout's engine (embedded or an engine group).
        version: Recorded on every sample generated with these weights.
        mode: ``"tensor"``, ``"disk"`` (see the module docstring) or ``"auto"``: disk for
            SGLang servers (tensor pushes to them are not implemented yet), else tensor.
        output_dir: The run's folder; ``disk`` writes under ``<output_dir>/weights``.
    """
    if mode == "auto":
        from agentrl.rollout.engine.sglang import SGLangEngine

        mode = "disk" if isinstance(engine, SGLangEngine) else "tensor"
    if mode == "disk":
        root = Path(output_dir) / "weights"
        previous = sorted(root.glob("v*")) if root.is_dir() else []
        path = actor.save_hf(root / f"v{version}")
        await engine.update_weights(path=str(path), version=version)
        for old in previous:  # engines have loaded the new one: the old ones are garbage
            if old != Path(path):
                shutil.rmtree(old, ignore_errors=True)
        return
    if mode != "tensor":
        raise ValueError(f"unknown weight sync mode {mode!r}")
    from agentrl.orchestration.engines import EngineGroup

    if isinstance(engine, EngineGroup) and hasattr(actor, "hf_state_dict_ref"):
        state = actor.hf_state_dict_ref()  # stays in the object store until the engines read it
    else:
        state = actor.hf_state_dict()
    await engine.update_weights(state_dict=state, version=version)
