"""Mixture-of-experts weights in the one layout agentrl's parts exchange: per expert, as
checkpoint files name them (``model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight``).

transformers 5 holds a Qwen3-MoE layer's experts in memory as two fused parameters
(``mlp.experts.gate_up_proj`` ``[experts, 2 * width, hidden]``, gate rows first, and
``mlp.experts.down_proj`` ``[experts, hidden, width]``) and writes them per expert when it
saves; :func:`experts_one_by_one` turns a state dict of either form into the per-expert one, so
``model.state_dict()`` loads into the trainer and the embedded engine like a checkpoint does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["experts_one_by_one"]


def experts_one_by_one(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with every fused expert tensor split into per-expert ones (views, no copy);
    other entries are kept as they are."""
    out: dict[str, Any] = {}
    for name, tensor in state.items():
        prefix, _, fused = name.rpartition("mlp.experts.")
        if fused == "gate_up_proj" and tensor.dim() == 3:
            for e, rows in enumerate(tensor):
                gate, up = rows.chunk(2)
                out[f"{prefix}mlp.experts.{e}.gate_proj.weight"] = gate
                out[f"{prefix}mlp.experts.{e}.up_proj.weight"] = up
        elif fused == "down_proj" and tensor.dim() == 3:
            out.update({f"{prefix}mlp.experts.{e}.down_proj.weight": w for e, w in enumerate(tensor)})
        else:
            out[name] = tensor
    return out
