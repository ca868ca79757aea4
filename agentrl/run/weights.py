"""Getting the trainer's weights to the engines: one strategy, chosen once at start-up.

:func:`weight_sync_for` picks the strategy from ``--weight-sync`` and the engine that serves the
rollout (``auto``: disk for SGLang and vLLM servers, tensors otherwise) and the trainer (in this process,
or ranks in Ray actors); ``train.py`` then calls :meth:`WeightSync.push` after every
``--update-weights-interval`` rollouts.

* ``tensor`` (:class:`TensorSync`): Hugging Face-named tensors gathered over tensor parallelism.
  The embedded engine in the driver copies them in place; engine actors read them from Ray's
  shared-memory object store, where the trainer's rank 0 put them (one copy per node, not one
  per engine).
* ``disk`` (:class:`DiskSync`): the trainer writes a Hugging Face directory
  (``<output-dir>/weights/v<version>``, the previous one deleted) and every engine loads it: the
  general fallback, for engines that share only a filesystem with the trainer.
* ``adapter`` (:class:`AdapterSync`, vLLM servers with ``--lora-rank``): the trainer writes only
  its LoRA adapters in PEFT's format (``<output-dir>/weights/adapter-v<version>``) and the servers
  load them onto the base model they started with; the base weights never move.
* ``broadcast`` (:class:`BroadcastSync`, SGLang servers): the trainer's rank 0 and every server
  TP rank form a process group (NCCL; gloo on CPU) on the first push; each push broadcasts the
  tensors from rank 0 while the servers receive them (``update_weights_from_distributed``): no
  disk, no copy through the driver.

Each strategy asks the engine and the trainer for what it needs by capability (the
``Engine`` attributes ``takes_tensors`` / ``takes_weight_refs``, the ``Trainer`` protocol's
methods), never by their class.
"""

from __future__ import annotations

import abc
import asyncio
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from agentrl.engine.base import Engine, JoinsWeightGroup, LoadsAdapters
from agentrl.errors import ConfigError
from agentrl.trainer.protocol import Trainer

__all__ = ["AdapterSync", "BroadcastSync", "DiskSync", "TensorSync", "WeightSync", "weight_sync_for"]


class WeightSync(abc.ABC):
    """Makes the rollout's engine serve the trainer's current weights.

    Args:
        engine: The rollout's engine.
        actor: The trainer.
    """

    mode: str = ""

    def __init__(self, engine: Engine, actor: Trainer) -> None:
        self.engine = engine
        self.actor = actor

    @abc.abstractmethod
    async def push(self, version: str) -> None:
        """Sends the trainer's weights; every sample generated with them records ``version``."""


class TensorSync(WeightSync):
    """In memory: the trainer's HF-named tensors (through Ray's object store for engine actors)."""

    mode = "tensor"

    async def push(self, version: str) -> None:
        # in a thread: with --async-training, episodes go on running on this event loop.
        # Engine actors read rank 0's object-store copy where the trainer has one (Ray ranks);
        # an engine in this process takes the tensors.
        state: Any = None
        if self.engine.takes_weight_refs:
            state = await asyncio.to_thread(self.actor.hf_state_dict_ref)
        if state is None:
            state = await asyncio.to_thread(self.actor.hf_state_dict)
        await self.engine.update_weights(state_dict=state, version=version)


class DiskSync(WeightSync):
    """Through a Hugging Face directory under ``root`` that every engine loads.

    Args:
        engine: The rollout's engine.
        root: Where versions are written (``<output-dir>/weights``).
    """

    mode = "disk"

    def __init__(self, engine: Engine, actor: Trainer, root: str | Path) -> None:
        super().__init__(engine, actor)
        self.root = Path(root)

    async def push(self, version: str) -> None:
        previous = sorted(self.root.glob("v*")) if self.root.is_dir() else []
        path = Path(await asyncio.to_thread(self.actor.save_hf, self.root / f"v{version}"))
        await self.engine.update_weights(path=str(path), version=version)
        for old in previous:  # engines have loaded the new one: the old ones are garbage
            if old != path:
                shutil.rmtree(old, ignore_errors=True)


class AdapterSync(WeightSync):
    """LoRA adapters alone, through a PEFT folder under ``root`` that vLLM servers load
    (:meth:`~agentrl.engine.vllm.VLLMEngine.update_adapter`).

    Args:
        engine: The rollout's vLLM servers, started with ``--enable-lora``.
        root: Where versions are written (``<output-dir>/weights``).
    """

    mode = "adapter"

    def __init__(self, engine: Engine, actor: Trainer, root: str | Path) -> None:
        if not isinstance(engine, LoadsAdapters):
            raise ConfigError("--weight-sync adapter is for vLLM servers (--rollout-backend vllm)")
        super().__init__(engine, actor)
        self.vllm: LoadsAdapters = engine
        self.root = Path(root)
        self.kept: list[Path] = []

    async def push(self, version: str) -> None:
        path = Path(await asyncio.to_thread(self.actor.save_adapter, self.root / f"adapter-v{version}"))
        await self.vllm.update_adapter(str(path), version=version)
        self.kept.append(path)
        while len(self.kept) > 2:  # the servers keep the previous adapters for requests in flight
            shutil.rmtree(self.kept.pop(0), ignore_errors=True)


class BroadcastSync(WeightSync):
    """SGLang's NCCL path (gloo on CPU): the first push forms a group of the trainer's rank 0
    and every server TP rank; each push then broadcasts the tensors while the servers receive.

    The group's name and the tensors' metadata are this strategy's state, set on the first push.
    """

    mode = "broadcast"

    def __init__(self, engine: Engine, actor: Trainer) -> None:
        if not isinstance(engine, JoinsWeightGroup):
            raise ConfigError("--weight-sync broadcast is for SGLang servers (--rollout-backend sglang*)")
        super().__init__(engine, actor)
        self.sglang: JoinsWeightGroup = engine
        self.group: str | None = None
        self.metadata: dict[str, list[Any]] | None = None

    async def push(self, version: str) -> None:
        if self.group is None:
            await self._open()
        assert self.group is not None and self.metadata is not None
        await asyncio.gather(
            self.sglang.update_weights_from_distributed(self.metadata, version, self.group),
            asyncio.to_thread(self.actor.broadcast_weights))

    async def _open(self) -> None:
        import torch

        engine, actor = self.sglang, self.actor
        master, port = await asyncio.to_thread(actor.rank0_address)  # rank 0's node, a free port
        if all(urlparse(u).hostname in ("127.0.0.1", "localhost") for u in engine.workers):
            master = "127.0.0.1"  # one machine: keep the group on loopback
        name = f"agentrl-weights-{port}"
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        world = 1 + engine.tp_size * (len(engine.workers) - len(engine.down))
        await asyncio.gather(engine.init_weight_group(master, port, name, backend),
                             asyncio.to_thread(actor.open_weight_group, master, port, world, name, backend))
        self.group = name
        self.metadata = await asyncio.to_thread(actor.weight_metadata)


def weight_sync_for(engine: Engine, actor: Trainer, mode: str, output_dir: str | Path) -> WeightSync:
    """The strategy ``--weight-sync mode`` means for ``engine`` and ``actor``.

    Args:
        engine: The rollout's engine (embedded, an engine group, or SGLang servers).
        actor: The trainer (in this process, or a :class:`~agentrl.placement.cluster.
            TrainerGroup` of Ray actors).
        mode: ``tensor``, ``disk``, ``broadcast``, ``adapter`` or ``auto`` (disk for SGLang
            and vLLM servers, else tensor).
        output_dir: The run's folder; ``disk`` writes under ``<output_dir>/weights``.

    Raises:
        ConfigError: ``broadcast`` for an engine that is not SGLang servers, ``adapter`` for one
            that is not vLLM servers, or an unknown mode.
    """
    if mode == "auto":  # servers in processes of their own load a directory
        mode = "tensor" if engine.takes_tensors else "disk"
    if mode == "tensor":
        return TensorSync(engine, actor)
    if mode == "disk":
        return DiskSync(engine, actor, Path(output_dir) / "weights")
    if mode == "broadcast":
        return BroadcastSync(engine, actor)
    if mode == "adapter":
        return AdapterSync(engine, actor, Path(output_dir) / "weights")
    raise ConfigError(f"--weight-sync must be auto, tensor, disk, broadcast or adapter, got {mode!r}")
