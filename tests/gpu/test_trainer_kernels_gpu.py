"""On a CUDA machine: the trainer's step in bf16 converts no activations per layer, and the
Transformer Engine layer spec (where it imports) gives the local spec's log-probs and round-trips
Hugging Face weights."""

from __future__ import annotations

import collections
import importlib.util
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from agentrl.models import build_tiny_model
from agentrl.records.sample import Sample, Status, Turn
from agentrl.trainer.actor import MegatronActor
from agentrl.trainer.config import TrainerConfig
from agentrl.trainer.hf_weights import export_hf_state_dict, read_hf_state_dict


class DtypeConversions(TorchDispatchMode):
    """Counts every copy that changes a tensor's dtype, by (source, destination, shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[tuple[str, str, tuple[int, ...]]] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and args[0].dtype != out.dtype:
            self.counts[(str(args[0].dtype), str(out.dtype), tuple(args[0].shape))] += 1
        elif func is torch.ops.aten.copy_.default and args[0].dtype != args[1].dtype:
            self.counts[(str(args[1].dtype), str(args[0].dtype), tuple(args[1].shape))] += 1
        return out


def samples(count: int = 8, length: int = 48) -> list[Sample]:
    generator = torch.Generator().manual_seed(0)
    out = []
    for i in range(count):
        n = length - 3 * i
        tokens = torch.randint(3, 200, (n + 6,), generator=generator).tolist()
        out.append(Sample(group_id=i // 4, index=i % 4, tokens=tokens, response_length=n,
                          loss_mask=[1] * n, rollout_log_probs=[-1.0] * n, reward=float(i % 2),
                          status=Status.COMPLETED, turns=[Turn("assistant", 0, n)]))
    return out


def activation_conversions(layers: int) -> int:
    """Dtype conversions of activation-sized tensors in one train step of a ``layers``-deep tiny
    model (the rotary tables megatron casts per layer are [s, 1, 1, d], not activations)."""
    shape = dict(num_layers=layers, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                 num_query_groups=2, vocab_size=256, max_position_embeddings=128)
    actor = MegatronActor(TrainerConfig(lr=1e-5, micro_batch_size=4, **shape), hf_checkpoint=None)
    counter = DtypeConversions()
    with warnings.catch_warnings(record=True) as caught, counter:
        warnings.simplefilter("always")
        actor.train(samples())
    assert not [w for w in caught if "Mismatch dtype" in str(w.message)]
    return sum(n for (_, _, shape), n in counter.counts.items()
               if len(shape) >= 2 and shape[-1] == actor.hf_config["hidden_size"])


def test_bf16_step_converts_no_activations_per_layer():
    assert activation_conversions(2) == activation_conversions(4)


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is None,
                    reason="Transformer Engine is not installed")
def test_transformer_engine_spec_equals_the_local_spec():
    data = samples()
    checkpoint = build_tiny_model()
    local = MegatronActor(TrainerConfig(lr=1e-5, micro_batch_size=4), hf_checkpoint=checkpoint)
    fused = MegatronActor(TrainerConfig(lr=1e-5, micro_batch_size=4, transformer_impl="transformer_engine"),
                          hf_checkpoint=checkpoint)
    source = read_hf_state_dict(checkpoint)
    exported = export_hf_state_dict(fused.model)
    assert exported.keys() <= source.keys()
    for name, tensor in exported.items():
        assert torch.equal(tensor.float(), source[name].to(tensor.dtype).float()), name
    diff = (fused.logprobs(data) - local.logprobs(data)).abs().max().item()
    assert diff <= 0.05, diff  # bf16 on both sides, different kernels
    metrics = fused.train(data)
    assert all(v == v for v in metrics.values())
