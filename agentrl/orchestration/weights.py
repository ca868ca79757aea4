"""Getting the trainer's weights to the engines.

Two paths, chosen by ``--weight-sync``:

* ``tensor``: Hugging Face-named tensors gathered over tensor parallelism. The embedded engine in
  the driver copies them in place; engine actors read them from Ray's shared-memory object store,
  where the trainer's rank 0 put them (one copy per node, not one per engine).
* ``disk``: the trainer writes a Hugging Face directory (``<output-dir>/weights/v<version>``, the
  previous one deleted) and every engine loads it: the general fallback, for engines that share
  only a filesystem with the trainer.

* ``broadcast`` (SGLang servers): the trainer's rank 0 and every server TP rank form a process
  group (NCCL; gloo on CPU) on the first push; each push broadcasts the tensors from rank 0 while
  the servers receive them (``update_weights_from_distributed``): no disk, no copy through the
  driver.
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
        mode: ``"tensor"``, ``"disk"``, ``"broadcast"`` (see the module docstring) or
            ``"auto"``: disk for SGLang servers, else tensor.
        output_dir: The run's folder; ``disk`` writes under ``<output_dir>/weights``.
    """
    if mode == "auto":
        from agentrl.rollout.engine.sglang import SGLangEngine

        mode = "disk" if isinstance(engine, SGLangEngine) else "tensor"
    if mode == "broadcast":
        await _broadcast(actor, engine, version)
        return
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


async def _broadcast(actor: Any, engine: Any, version: str) -> None:
    """SGLang's NCCL path (gloo on CPU): the first push forms a group of the trainer's rank 0
    and every server TP rank; each push then broadcasts the tensors while the servers receive."""
    import asyncio
    import socket
    from urllib.parse import urlparse

    import torch

    from agentrl.rollout.engine.sglang import SGLangEngine

    if not isinstance(engine, SGLangEngine):
        raise ValueError("--weight-sync broadcast is for SGLang servers (--rollout-backend sglang*)")
    if engine.weight_group_name is None:
        if hasattr(actor, "rank0_address"):
            master, port = await asyncio.to_thread(actor.rank0_address)
        else:
            with socket.socket() as sock:
                sock.bind(("", 0))
                master, port = "127.0.0.1", int(sock.getsockname()[1])
        if all(urlparse(u).hostname in ("127.0.0.1", "localhost") for u in engine.workers):
            master = "127.0.0.1"  # one machine: keep the group on loopback
        name = f"agentrl-weights-{port}"
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        world = 1 + engine.tp_size * (len(engine.workers) - len(engine.down))
        await asyncio.gather(engine.init_weight_group(master, port, name, backend),
                             asyncio.to_thread(actor.open_weight_group, master, port, world, name, backend))  # fmt: skip
        engine.weight_group_name = name
        engine.weight_metadata = await asyncio.to_thread(actor.weight_metadata)
    assert engine.weight_metadata is not None
    await asyncio.gather(
        engine.update_weights_from_distributed(engine.weight_metadata, version, engine.weight_group_name),
        asyncio.to_thread(actor.broadcast_weights))  # fmt: skip
