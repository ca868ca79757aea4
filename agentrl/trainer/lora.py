"""Low-rank adapters (LoRA) on the Megatron model's linear layers.

``y = W x + (alpha / r) * B (A dropout(x))`` (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
Language Models", eq. 3), with ``A: [r, in]`` drawn like PEFT's default (Kaiming-uniform with
``a = sqrt(5)``) and ``B: [out, r]`` zero, so the adapted model equals the base model until
the first step. The base weights are frozen: no gradient, no optimizer state.

**Where adapters go.** ``--lora-target-modules`` names the Hugging Face projections
(:data:`agentrl.trainer.config.LORA_TARGETS`). Megatron fuses some of them: ``q_proj``, ``k_proj`` and ``v_proj`` are one
``linear_qkv`` layer, ``gate_proj`` and ``up_proj`` one ``linear_fc1``; one adapter on the fused
layer equals PEFT adapters on each projection that share ``A`` (each takes its rows of ``B``),
so a fused group is adapted whole (listing part of it is refused).

**Tensor parallelism.** The adapter follows its layer's split, so TP=2 computes what TP=1 does:

* column-parallel (``linear_qkv``, ``linear_fc1``: output rows split): ``A`` is replicated,
  ``B`` holds this rank's rows; ``A x`` goes through Megatron's copy-to-TP-region (identity
  forward, all-reduce of its gradient backward), as the layer's own input does.
* row-parallel (``linear_proj``, ``linear_fc2``: input columns split): ``A`` holds this rank's
  columns, ``B`` is replicated; ``A x`` is summed over the ranks (reduce-from-TP-region) before
  ``B``.

Split parameters carry Megatron's tensor-parallel attributes (so the gradient norm counts them
once per shard, and replicated ones once), and the layer's checkpoint entries shard them on
the right axis (a TP=1 checkpoint resumes at TP=2).

Sequence parallelism is not supported with adapters (the actor refuses the two together).

Exported in PEFT's format by :func:`agentrl.trainer.hf_weights.save_peft_adapter`, beside the
other Hugging Face exports.
"""

from __future__ import annotations

import dataclasses
import math
import types
import zlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from agentrl.errors import ConfigError

__all__ = ["LoraConfig", "add_lora", "lora_modules", "merged_weight"]

_ROW_PARALLEL = ("self_attention.linear_proj", "mlp.linear_fc2")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """The adapters to add.

    Attributes:
        rank: ``r``, the adapters' inner width (>= 1).
        alpha: The scale's numerator: the update is ``(alpha / rank) * B A``.
        dropout: Dropout on the adapters' input while training.
        targets: Megatron layer suffixes (:func:`agentrl.trainer.config.lora_targets`).
        seed: Seeds ``A``'s draw (each layer's from this and its name, so every TP size draws
            the same full matrix).
    """

    rank: int
    alpha: float
    dropout: float
    targets: tuple[str, ...]
    seed: int = 0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def lora_modules(model: Any) -> Iterator[tuple[str, Any]]:
    """``(name, layer)`` of every adapted linear layer, names as in ``named_modules``."""
    for name, module in model.named_modules():
        if getattr(module, "lora_a", None) is not None:
            yield name, module


def add_lora(gpt: Any, config: LoraConfig) -> int:
    """Freezes every parameter of ``gpt`` (a ``GPTModel``, unwrapped: see
    :func:`agentrl.trainer.hf_convert.unwrap_model`) and adds adapters (trainable) on the target
    layers of each decoder layer; returns how many layers were adapted.

    Raises:
        ConfigError: A target layer is missing from the model.
    """
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    rank = parallel_state.get_tensor_model_parallel_rank()
    for param in gpt.parameters():
        param.requires_grad_(False)
    count = 0
    for layer in gpt.decoder.layers:
        for target in config.targets:
            module = layer.get_submodule(target)
            if not hasattr(module, "weight") or module.weight is None:
                raise ConfigError(f"--lora-target-modules: layer {layer.layer_number} has no {target} weight")
            _attach(module, config, row=target in _ROW_PARALLEL, tp=tp, rank=rank,
                    name=f"{layer.layer_number - 1}.{target}")
            count += 1
    return count


def _attach(module: Any, config: LoraConfig, *, row: bool, tp: int, rank: int, name: str) -> None:
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    out_local, in_local = module.weight.shape  # [out / tp, in] column-parallel, [out, in / tp] row-parallel
    full_in = in_local * tp if row else in_local
    a = torch.empty(config.rank, full_in, dtype=torch.float32)
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + zlib.crc32(name.encode()))
    bound = 1 / math.sqrt(full_in)  # kaiming_uniform_(a=sqrt(5)): gain sqrt(1/3) * sqrt(3 / fan_in)
    a.uniform_(-bound, bound, generator=generator)
    if row:
        a = a.chunk(tp, dim=1)[rank]
    b = torch.zeros(out_local, config.rank, dtype=torch.float32)  # B's rows follow W's
    device, dtype = module.weight.device, module.weight.dtype
    module.lora_a = torch.nn.Parameter(a.to(device=device, dtype=dtype).contiguous())
    module.lora_b = torch.nn.Parameter(b.to(device=device, dtype=dtype).contiguous())
    if tp > 1:
        split = module.lora_a if row else module.lora_b
        set_tensor_model_parallel_attributes(split, True, 1 if row else 0, 1)
    module.lora_scale = config.scale
    module.lora_dropout = config.dropout
    module.lora_row = row
    module.register_forward_hook(_adapted_output)
    axes = {"weight": 1, "lora_a": 1} if row else {"weight": 0, "bias": 0, "lora_b": 0}
    # a gated MLP's linear_fc1 holds [gate; up] rows per rank: megatron checkpoints its weight as
    # two halves sharded apart (so another TP size reads it back), and B's rows follow the weight's
    swiglu = not row and name.endswith("mlp.linear_fc1") and bool(module.config.gated_linear_unit)
    module.sharded_state_dict = types.MethodType(_sharded_state_dict(axes, swiglu), module)


def _adapted_output(module: Any, args: tuple[Any, ...], output: Any) -> Any:
    """The layer's ``(output, bias)`` plus the adapter's update (a forward hook)."""
    from megatron.core.tensor_parallel.mappings import (
        copy_to_tensor_model_parallel_region,
        reduce_from_tensor_model_parallel_region,
    )

    x = args[0]  # [s, b, in / tp] for a row-parallel layer, [s, b, in] otherwise
    if module.lora_dropout and module.training:
        if module.lora_row:  # each rank's input columns: masks of their own
            from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

            with get_cuda_rng_tracker().fork():
                x = F.dropout(x, module.lora_dropout, training=True)
        else:  # the same input on every rank: the same mask
            x = F.dropout(x, module.lora_dropout, training=True)
    h = F.linear(x, module.lora_a)  # [s, b, r]
    if module.lora_row:
        h = reduce_from_tensor_model_parallel_region(h)
    else:
        h = copy_to_tensor_model_parallel_region(h)
    delta = F.linear(h, module.lora_b) * module.lora_scale  # [s, b, out] or [s, b, out / tp]
    out, bias = output
    return out + delta.to(out.dtype), bias


def _sharded_state_dict(axes: dict[str, int], swiglu: bool) -> Any:
    """The layer's checkpoint entries with the adapters sharded on ``axes`` (a method)."""

    def sharded_state_dict(self: Any, prefix: str = "", sharded_offsets: Any = (), metadata: Any = None) -> Any:
        from megatron.core.transformer.mlp import apply_swiglu_sharded_factory
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        state = self.state_dict(prefix="", keep_vars=True)
        sharded = make_sharded_tensors_for_checkpoint(state, prefix, axes, sharded_offsets, tp_group=self.tp_group,
                                                      dp_cp_group=(metadata or {}).get("dp_cp_group"))
        if swiglu:
            key = f"{prefix}lora_b"
            sharded[key] = apply_swiglu_sharded_factory(sharded[key], sharded_offsets,
                                                        (metadata or {}).get("singleton_local_shards", False))
        return sharded

    return sharded_state_dict


def merged_weight(module: Any) -> torch.Tensor:
    """This rank's shard of ``W + (alpha / r) * B A`` for an adapted layer (its ``weight``
    otherwise), in the weight's dtype, computed in fp32."""
    weight = module.weight.detach()
    if getattr(module, "lora_a", None) is None:
        return weight
    delta = module.lora_b.detach().float() @ module.lora_a.detach().float()  # [out(/tp), in(/tp)]
    return (weight.float() + module.lora_scale * delta).to(weight.dtype)
