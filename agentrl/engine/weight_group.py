"""A process group between the trainer and inference servers, for broadcasting weights.

SGLang's ``init_weights_update_group`` / ``update_weights_from_distributed`` protocol: the
trainer's rank 0 is rank 0 of a group of its own (not the training world), each server's TP rank
``r`` joins as ``rank_offset + r``; the trainer then broadcasts every tensor from rank 0, in the
order of the names sent with ``update_weights_from_distributed``. The group rendezvouses through a
TCP store hosted by rank 0 at ``master_address:master_port``, keys prefixed by the group name.
NCCL between GPUs; gloo on CPU (how the tests run it).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from typing import Any

import torch

__all__ = ["DTYPES", "WeightGroup"]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}
"""Names of dtypes on the wire (SGLang's ``dtypes`` field), both ways."""


class WeightGroup:
    """One member of a weight-broadcast group.

    Args:
        master_address: Host of rank 0's TCP store (the trainer).
        master_port: Its port.
        rank: This member's rank (0: the trainer).
        world_size: 1 + every server's TP size.
        group_name: Prefix of the group's store keys.
        backend: ``"nccl"`` or ``"gloo"``.
        timeout_s: Rendezvous and collective timeout.
    """

    def __init__(self, master_address: str, master_port: int, rank: int, world_size: int,
                 group_name: str, backend: str = "gloo", timeout_s: float = 600.0) -> None:
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"backend must be nccl or gloo, got {backend!r}")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self._store = torch.distributed.TCPStore(master_address, master_port, world_size,
                                                 is_master=rank == 0, timeout=timeout)
        store = torch.distributed.PrefixStore(group_name, self._store)
        if backend == "gloo":
            self._group = torch.distributed.ProcessGroupGloo(store, rank, world_size, timeout)
        else:
            self._group = torch.distributed.ProcessGroupNCCL(store, rank, world_size)
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    def send(self, tensors: Iterable[torch.Tensor]) -> None:
        """Rank 0: broadcasts each tensor, in order."""
        for tensor in tensors:
            self._group.broadcast(tensor.detach().to(self.device).contiguous(), root=0).wait()

    def receive(self, dtypes: Sequence[str], shapes: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Other ranks: receives one tensor per (dtype, shape), in order."""
        out = []
        for dtype, shape in zip(dtypes, shapes, strict=True):
            tensor = torch.empty(tuple(shape), dtype=DTYPES[dtype], device=self.device)
            self._group.broadcast(tensor, root=0).wait()
            out.append(tensor)
        return out

    @staticmethod
    def metadata(state_dict: dict[str, Any]) -> dict[str, list[Any]]:
        """``names`` / ``dtypes`` / ``shapes`` of ``update_weights_from_distributed``."""
        names = {v: k for k, v in DTYPES.items()}
        return {"names": list(state_dict), "dtypes": [names[t.dtype] for t in state_dict.values()],
                "shapes": [list(t.shape) for t in state_dict.values()]}
