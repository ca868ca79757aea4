"""The weight-broadcast group (SGLang's update_weights_from_distributed protocol) over gloo."""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.engine.weight_group import WeightGroup
from tests.support.distributed import free_port, spawn


def _member(rank: int, port: int, out: str) -> None:
    state = {"a.weight": torch.arange(6.0).reshape(2, 3), "b.bias": torch.tensor([1.5], dtype=torch.bfloat16)}
    group = WeightGroup("127.0.0.1", port, rank, 3, "test-group", "gloo", timeout_s=60)
    if rank == 0:
        group.send(state.values())
        return
    meta = WeightGroup.metadata(state)
    received = group.receive(meta["dtypes"], meta["shapes"])
    torch.save(dict(zip(meta["names"], received, strict=True)), Path(out) / f"rank{rank}.pt")


def test_rank0_broadcasts_every_tensor_in_order_to_every_member(tmp_path):
    spawn(_member, (free_port(), str(tmp_path)), nprocs=3)
    for rank in (1, 2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.equal(got["a.weight"], torch.arange(6.0).reshape(2, 3))
        assert got["b.bias"].dtype == torch.bfloat16 and float(got["b.bias"]) == 1.5


def test_metadata_names_dtypes_and_shapes():
    meta = WeightGroup.metadata({"x": torch.zeros(2, 3, dtype=torch.float16)})
    assert meta == {"names": ["x"], "dtypes": ["float16"], "shapes": [[2, 3]]}
