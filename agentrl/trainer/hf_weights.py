"""Hugging Face weights <-> the Megatron model built by :mod:`agentrl.trainer.hf_convert`:

* :func:`load_hf_weights` puts Hugging Face tensors into this process's tensor parallel shards;
* :func:`export_hf_state_dict` gathers them back to Hugging Face names and shapes (also what the
  rollout engine's ``update_weights(state_dict=...)`` takes), LoRA adapters merged in;
  :func:`save_hf_checkpoint` writes a directory ``transformers`` loads;
* :func:`export_lora_state_dict` / :func:`save_peft_adapter`: LoRA adapters
  (:mod:`agentrl.trainer.lora`) alone, as PEFT loads them.

Weight layout (per layer; ``ng`` key/value groups, ``q/ng`` query heads per group, head width
``d``):

=============================================  ===============================================
Megatron (local spec)                          Hugging Face
=============================================  ===============================================
``self_attention.linear_qkv.weight`` / bias    per group g: [q rows of g's heads; k_g; v_g]
``self_attention.linear_proj.weight``          ``self_attn.o_proj.weight``
``self_attention.{q,k}_layernorm.weight``      ``self_attn.{q,k}_norm.weight`` (Qwen3)
``input_layernorm.weight``                     ``input_layernorm.weight``
``pre_mlp_layernorm.weight``                   ``post_attention_layernorm.weight``
``mlp.linear_fc1.weight``                      [``gate_proj``; ``up_proj``]
``mlp.linear_fc2.weight``                      ``down_proj``
``mlp.router.weight``                          ``mlp.gate.weight`` (Qwen3-MoE)
``mlp.experts.local_experts.{e}.linear_fc1``   [``mlp.experts.{e}.gate_proj``; ``up_proj``]
``mlp.experts.local_experts.{e}.linear_fc2``   ``mlp.experts.{e}.down_proj``
=============================================  ===============================================

A mixture-of-experts layer (Qwen3-MoE) has a router and experts instead of the dense MLP; each
expert is laid out and split like a dense MLP, and the router is whole on every rank. With
expert parallelism a rank holds ``num_experts / N`` of them (``local_experts`` 0.. are its
experts from ``rank * num_experts / N``), and the export gathers every rank's. The
Hugging Face names are those of the checkpoint files (transformers 5 fuses the experts into
``mlp.experts.gate_up_proj`` in memory, and writes them per expert).

Transformer Engine's spec folds each pre-norm into the linear layer after it: there
``input_layernorm.weight`` is ``self_attention.linear_qkv.layer_norm_weight`` and
``pre_mlp_layernorm.weight`` is ``mlp.linear_fc1.layer_norm_weight`` (:data:`_TE_FUSED_NORMS`);
everything else keeps its name.

Tensor parallelism splits linear_qkv by whole groups (rows), linear_fc1 by rows of gate and of
up separately (each rank holds [gate shard; up shard]), linear_proj and linear_fc2 by input
columns, and embedding / output layer by (padded) vocabulary rows.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agentrl.errors import AgentRLError, ConfigError
from agentrl.models.experts import experts_one_by_one
from agentrl.models.hf_config import read_safetensors
from agentrl.trainer.config import LORA_TARGETS
from agentrl.trainer.hf_convert import (
    expert_parallel,
    hf_spec_of,
    parallel_sizes,
    tensor_parallel,
    unwrap_model,
)
from agentrl.trainer.hf_spec import (
    ARCHITECTURES,
    HFModelSpec,
    read_hf_config,
)
from agentrl.trainer.lora import LoraConfig, merged_weight

__all__ = [
    "WeightMappingError",
    "export_hf_state_dict",
    "export_lora_state_dict",
    "load_hf_weights",
    "read_hf_state_dict",
    "save_hf_checkpoint",
    "save_peft_adapter",
]

_IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)
"""Buffers some older checkpoints saved; Megatron recomputes them from the config."""

_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
    "generation_config.json",
)
"""Files :func:`save_hf_checkpoint` copies from ``tokenizer_dir`` when present
(``generation_config.json`` too: engines read eos ids from it)."""


class WeightMappingError(AgentRLError):
    """Hugging Face weights do not fit the Megatron model: the message lists unknown and missing
    names and shape mismatches."""


@dataclasses.dataclass(frozen=True)
class _Rule:
    """One Megatron parameter and the Hugging Face tensors it is made of.

    ``kind`` says how: ``replicated`` (same on every rank), ``vocab`` (rows of the padded
    vocabulary), ``columns`` (input columns), ``qkv`` (grouped q/k/v rows) or ``gated``
    ([gate; up] rows).
    """

    megatron: str
    hf: tuple[str, ...]
    kind: str


_LAYER_RULES: tuple[tuple[str, tuple[str, ...], str, str | None], ...] = (
    ("input_layernorm.weight", ("input_layernorm.weight",), "replicated", None),
    ("self_attention.linear_qkv.weight",
     ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
     "qkv", None),
    ("self_attention.linear_qkv.bias",
     ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
     "qkv", "qkv_bias"),
    ("self_attention.q_layernorm.weight", ("self_attn.q_norm.weight",), "replicated", "qk_norm"),
    ("self_attention.k_layernorm.weight", ("self_attn.k_norm.weight",), "replicated", "qk_norm"),
    ("self_attention.linear_proj.weight", ("self_attn.o_proj.weight",), "columns", None),
    ("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), "replicated", None),
    ("mlp.linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"), "gated", None),
    ("mlp.linear_fc2.weight", ("mlp.down_proj.weight",), "columns", None),
)
"""Per decoder layer: (Megatron suffix, Hugging Face suffixes, kind, the :class:`HFModelSpec`
flag the parameter exists under, or ``None`` for always)."""

_TE_FUSED_NORMS = {
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
}
"""The local spec's pre-norm names -> where Transformer Engine's spec keeps them (inside the
fused norm + linear layer that follows the norm)."""


_DENSE_MLP = ("mlp.linear_fc1.weight", "mlp.linear_fc2.weight")
"""The Megatron names of a dense layer's MLP, which a mixture-of-experts layer replaces by
:func:`_expert_rules`."""


def _expert_rules(spec: HFModelSpec, ep_rank: int = 0, ep_size: int = 1
                  ) -> list[tuple[str, tuple[str, ...], str]]:
    """A mixture-of-experts layer's MLP: the router (replicated over TP and EP) and this
    expert-parallel rank's experts (``num_experts / ep_size`` of them, from expert
    ``ep_rank * that``), each an MLP laid out and split like a dense one (megatron's
    ``SequentialMLP``, whose ``local_experts`` count from 0 on every rank)."""
    rules = [("mlp.router.weight", ("mlp.gate.weight",), "replicated")]
    per_rank = spec.num_experts // ep_size
    for j in range(per_rank):
        e = ep_rank * per_rank + j
        local = f"mlp.experts.local_experts.{j}"
        rules += [(f"{local}.linear_fc1.weight",
                   (f"mlp.experts.{e}.gate_proj.weight", f"mlp.experts.{e}.up_proj.weight"), "gated"),
                  (f"{local}.linear_fc2.weight", (f"mlp.experts.{e}.down_proj.weight",), "columns")]
    return rules


def _layer_rules(spec: HFModelSpec, *, fused_norms: bool = False, ep_rank: int = 0, ep_size: int = 1
                 ) -> list[tuple[str, tuple[str, ...], str]]:
    """The per-layer rules this architecture has; ``fused_norms``: with Transformer Engine's
    names for the pre-norms (a mixture-of-experts layer keeps its pre-MLP norm apart: there is
    no single linear layer after it to fold it into)."""
    names = dict(_TE_FUSED_NORMS) if fused_norms else {}
    if spec.is_moe:
        names.pop("pre_mlp_layernorm.weight", None)
    rules = [(names.get(m, m), h, kind) for m, h, kind, flag in _LAYER_RULES
             if (flag is None or getattr(spec, flag)) and not (spec.is_moe and m in _DENSE_MLP)]
    return rules + _expert_rules(spec, ep_rank, ep_size) if spec.is_moe else rules


def _has_fused_norms(layer: Any) -> bool:
    """Whether a decoder layer was built from Transformer Engine's spec (its attention input
    projection holds the pre-norm's weight)."""
    return getattr(layer.self_attention.linear_qkv, "layer_norm_weight", None) is not None


def _rules(model: Any, spec: HFModelSpec) -> list[_Rule]:
    """The rules of every parameter this pipeline stage holds."""
    rules: list[_Rule] = []
    ep_rank, ep_size = expert_parallel()
    if model.pre_process:
        rules.append(
            _Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab")
        )
    for j, layer in enumerate(model.decoder.layers):
        i = layer.layer_number - 1  # global index: layer_number counts from 1 across stages
        for megatron, hf, kind in _layer_rules(spec, fused_norms=_has_fused_norms(layer),
                                               ep_rank=ep_rank, ep_size=ep_size):
            hf_names = tuple(f"model.layers.{i}.{name}" for name in hf)
            rules.append(_Rule(f"decoder.layers.{j}.{megatron}", hf_names, kind))
    if model.post_process:
        rules.append(_Rule("decoder.final_layernorm.weight", ("model.norm.weight",), "replicated"))
        # A tied model's last pipeline stage (without the embedding) keeps its own copy of the
        # embedding as output_layer.weight; with one stage there is no output weight at all.
        if getattr(model.output_layer, "weight", None) is not None:
            source = "model.embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"
            rules.append(_Rule("output_layer.weight", (source,), "vocab"))
    return rules


def _hf_shapes(rule: _Rule, spec: HFModelSpec) -> list[tuple[int, ...]]:
    """The Hugging Face shapes of a rule's tensors."""
    d, hidden = spec.head_dim, spec.hidden_size
    if rule.kind == "qkv":
        rows = (spec.num_heads * d, spec.num_kv_heads * d, spec.num_kv_heads * d)
        bias = rule.megatron.endswith(".bias")
        return [(r,) if bias else (r, hidden) for r in rows]
    width = spec.moe_intermediate_size if ".experts." in rule.megatron else spec.intermediate_size
    if rule.kind == "gated":
        return [(width, hidden)] * 2
    if rule.kind == "vocab":
        return [(spec.vocab_size, hidden)]
    if rule.kind == "columns":
        if "linear_proj" in rule.megatron:
            return [(hidden, spec.num_heads * d)]
        return [(hidden, width)]
    if rule.megatron.endswith("mlp.router.weight"):
        return [(spec.num_experts, hidden)]
    if "_layernorm" in rule.megatron and "self_attention" in rule.megatron:
        return [(d,)]  # Qwen3's per-head q/k norms
    return [(hidden,)]


def _shard(rule: _Rule, tensors: list[torch.Tensor], spec: HFModelSpec, padded_vocab: int,
           tp: int, rank: int) -> torch.Tensor:
    """This rank's Megatron tensor for a rule, from the full Hugging Face tensors."""
    if rule.kind == "replicated":
        return tensors[0]
    if rule.kind == "vocab":
        full = tensors[0]
        padding = full.new_zeros((padded_vocab - full.shape[0], *full.shape[1:]))
        return torch.cat([full, padding]).chunk(tp)[rank]
    if rule.kind == "columns":
        return tensors[0].chunk(tp, dim=1)[rank]
    if rule.kind == "gated":
        gate, up = tensors
        return torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])
    # qkv: [ng, (q/ng + 2) * d, ...] in group order, then whole groups per rank.
    q, k, v = tensors
    ng, d = spec.num_kv_heads, spec.head_dim
    tail = q.shape[1:]
    grouped = torch.cat(
        [q.reshape(ng, -1, d, *tail), k.reshape(ng, 1, d, *tail), v.reshape(ng, 1, d, *tail)],
        dim=1,
    )
    return grouped.reshape(-1, *tail).chunk(tp)[rank]


def _merge(rule: _Rule, shards: list[torch.Tensor], spec: HFModelSpec) -> list[torch.Tensor]:
    """The full Hugging Face tensors of a rule, from every TP rank's Megatron shard."""
    if rule.kind == "replicated":
        return [shards[0]]
    if rule.kind == "vocab":
        return [torch.cat(shards)[: spec.vocab_size]]
    if rule.kind == "columns":
        return [torch.cat(shards, dim=1)]
    if rule.kind == "gated":
        halves = [s.chunk(2) for s in shards]
        return [torch.cat([g for g, _ in halves]), torch.cat([u for _, u in halves])]
    ng, d = spec.num_kv_heads, spec.head_dim
    full = torch.cat(shards)
    tail = full.shape[1:]
    grouped = full.reshape(ng, -1, d, *tail)
    q_per_group = grouped.shape[1] - 2
    q, k, v = grouped.split([q_per_group, 1, 1], dim=1)
    return [t.reshape(-1, *tail) for t in (q, k, v)]


def read_hf_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Reads every tensor of a Hugging Face model directory's safetensors files, on CPU.

    A ``model.safetensors.index.json`` selects the shards it names; otherwise every
    ``*.safetensors`` file in the directory is read.

    Raises:
        WeightMappingError: No safetensors file, or a shard the index names is missing.
    """

    root = Path(path)
    return read_safetensors(root, WeightMappingError)


def load_hf_weights(model: Any, source: str | Path | Mapping[str, torch.Tensor]) -> None:
    """Copies Hugging Face weights into this process's shards of a model, in place.

    Every rank passes the full tensors (a directory or a full state dict) and keeps its own
    tensor-parallel slice and pipeline stage's layers; names of other stages' layers are
    skipped, not reported. Works on a wrapped model (DDP) too.

    Args:
        model: A model from :func:`build_gpt_model` (or a wrapper of one).
        source: A Hugging Face model directory or a ``{hf_name: tensor}`` mapping (a
            mixture of experts' tensors per expert, as files hold them, or fused, as
            transformers 5 holds them in memory).

    Raises:
        WeightMappingError: Names the model does not know, names it needs that are missing,
            and tensors whose shape differs from the config's; all listed at once.
    """
    model = unwrap_model(model)
    spec = hf_spec_of(model)
    state = read_hf_state_dict(source) if isinstance(source, str | Path) else dict(source)
    if spec.is_moe:
        state = experts_one_by_one(state)
    rank, tp = tensor_parallel()
    params = dict(model.named_parameters())
    padded_vocab = model.vocab_size
    rules = _rules(model, spec)
    known = _all_hf_names(spec)
    unknown = sorted(n for n in state if n not in known and not n.endswith(_IGNORED_HF_SUFFIXES))
    needed = {name for rule in rules for name in rule.hf}
    missing = sorted(needed - state.keys())
    wrong_shape = []
    for rule in rules:
        for name, shape in zip(rule.hf, _hf_shapes(rule, spec), strict=True):
            if name in state and tuple(state[name].shape) != shape:
                wrong_shape.append(f"{name}: {tuple(state[name].shape)}, expected {shape}")
    if unknown or missing or wrong_shape:
        parts = [f"{label}: {', '.join(items)}" for label, items in (
            ("unknown names", unknown), ("missing names", missing), ("wrong shapes", wrong_shape)
        ) if items]
        raise WeightMappingError(f"Hugging Face weights do not fit the {spec.model_type} model; "
                                 + "; ".join(parts))
    with torch.no_grad():
        for rule in rules:
            param = params[rule.megatron]
            value = _shard(rule, [state[n] for n in rule.hf], spec, padded_vocab, tp, rank)
            if value.shape != param.shape:
                raise WeightMappingError(
                    f"{rule.megatron}: shard shape {tuple(value.shape)} does not match the "
                    f"parameter's {tuple(param.shape)}"
                )
            param.copy_(value)


def _all_hf_names(spec: HFModelSpec) -> set[str]:
    """Every Hugging Face name a checkpoint of this architecture may hold.

    ``lm_head.weight`` is known for tied models too: some tied checkpoints store the (identical)
    head anyway; it is accepted and unused.
    """
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(spec.num_layers):
        names.update(
            f"model.layers.{i}.{hf}" for _, suffixes, _ in _layer_rules(spec) for hf in suffixes
        )
    return names


def export_hf_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Gathers a model's weights to Hugging Face names and shapes (real vocabulary); LoRA
    adapters are merged into the weights they adapt.

    Collective over the tensor-parallel group: every TP rank must call it, and every rank gets
    the full dict (CPU tensors in the parameter dtype). A tied model has no ``lm_head.weight``,
    like ``transformers``' own checkpoints.

    Raises:
        ConfigError: Pipeline parallelism is on (each stage holds only its own layers).
    """
    model = unwrap_model(model)
    spec = hf_spec_of(model)
    if parallel_sizes()[1] > 1:
        raise ConfigError("exporting Hugging Face weights with --pipeline-model-parallel-size "
                          "> 1 is not supported")
    out: dict[str, torch.Tensor] = {}
    ep_rank, ep_size = expert_parallel()
    for rule in _rules(model, spec):
        shards = _tp_shards(_exported(model, rule.megatron))
        if rule.megatron == "output_layer.weight" and spec.tie_word_embeddings:
            continue  # a stage copy of the embedding, already exported
        for name, tensor in zip(rule.hf, _merge(rule, shards, spec), strict=True):
            if ep_size > 1 and ".local_experts." in rule.megatron:  # every rank's experts
                per_rank = spec.num_experts // ep_size
                for rank, theirs in enumerate(_ep_gathered(tensor)):
                    out[_expert_renamed(name, rank * per_rank + _local_index(rule.megatron))] = theirs
            else:
                out[name] = tensor.to("cpu").clone().contiguous()
    return out


def _local_index(megatron: str) -> int:
    """The ``local_experts`` index in a Megatron parameter name."""
    return int(megatron.split(".local_experts.")[1].split(".")[0])


def _expert_renamed(hf_name: str, expert: int) -> str:
    """``model.layers.N.mlp.experts.E.<proj>.weight`` with ``E`` replaced by ``expert``."""
    head, _, tail = hf_name.partition(".mlp.experts.")
    return f"{head}.mlp.experts.{expert}.{tail.split('.', 1)[1]}"


def _ep_gathered(tensor: torch.Tensor) -> list[torch.Tensor]:
    """``tensor`` from every rank of this process's expert-parallel group, in rank order (the
    same local expert of each rank), on the host."""
    from megatron.core import parallel_state

    return [t.to("cpu").clone().contiguous()
            for t in _gathered(tensor, parallel_state.get_expert_model_parallel_group())]


def export_lora_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Gathers a model's LoRA adapters (:mod:`agentrl.trainer.lora`) under PEFT's names:
    ``base_model.model.<hf module>.lora_A.weight`` (``[r, in]``) and ``.lora_B.weight``
    (``[out, r]``). A fused Megatron layer's adapter becomes one adapter per projection, sharing
    ``A`` and taking its rows of ``B`` (the same layout split as the weight's), which is the same
    update. Collective over the tensor-parallel group like :func:`export_hf_state_dict`."""
    model = unwrap_model(model)
    spec = hf_spec_of(model)
    out: dict[str, torch.Tensor] = {}
    for rule in _rules(model, spec):
        owner, _, leaf = rule.megatron.rpartition(".")
        module = model.get_submodule(owner) if owner else model
        if leaf != "weight" or getattr(module, "lora_a", None) is None:
            continue
        a, b = module.lora_a.detach(), module.lora_b.detach()
        if module.lora_row:  # input columns split: A's columns; B whole
            full_a, parts_b = torch.cat(_tp_shards(a), dim=1), [b]
        else:  # output rows split: A whole; B's rows, split per projection like the weight's
            full_a, parts_b = a, _merge(rule, _tp_shards(b), spec)
        for hf_name, part in zip(rule.hf, parts_b, strict=True):
            prefix = "base_model.model." + hf_name.removesuffix(".weight")
            out[f"{prefix}.lora_A.weight"] = full_a.to("cpu").clone().contiguous()
            out[f"{prefix}.lora_B.weight"] = part.to("cpu").clone().contiguous()
    return out


def _tp_shards(local: torch.Tensor) -> list[torch.Tensor]:
    """Every tensor-parallel rank's ``local``, in rank order (a collective; ``[local]`` at TP=1)."""
    from megatron.core import parallel_state

    if tensor_parallel()[1] == 1:
        return [local]
    return _gathered(local, parallel_state.get_tensor_model_parallel_group())


def _gathered(local: torch.Tensor, group: Any) -> list[torch.Tensor]:
    """Every rank's ``local`` over ``group``, in rank order (a collective: every rank of the
    group calls it, in the same order)."""
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, local.contiguous(), group=group)
    return gathered


def _exported(model: Any, name: str) -> torch.Tensor:
    """This rank's value of parameter ``name`` as exported: a weight with LoRA adapters
    (:mod:`agentrl.trainer.lora`) merged into it, any other parameter as it is."""
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner)
    if leaf == "weight":
        return merged_weight(module)
    return getattr(module, leaf).detach()


def save_hf_checkpoint(
    model: Any,
    hf_config: Mapping[str, Any] | str | Path | Any,
    out_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
) -> Path:
    """Writes a Hugging Face model directory (``config.json``, ``model.safetensors``, tokenizer
    files) that ``AutoModelForCausalLM.from_pretrained`` loads.

    Collective: every rank calls it; global rank 0 writes, then all ranks wait for the files.

    Args:
        model: A model from :func:`build_gpt_model` (or a wrapper of one).
        hf_config: The config to write (its ``dtype`` is set to the weights' dtype).
        out_dir: Destination directory (created; existing files are overwritten).
        tokenizer_dir: A directory whose tokenizer files (see ``_TOKENIZER_FILES``) are copied.

    Returns:
        ``out_dir``.
    """
    from safetensors.torch import save_file

    state = export_hf_state_dict(model)
    out = Path(out_dir)
    if not dist.is_initialized() or dist.get_rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
        raw = read_hf_config(hf_config)
        raw.setdefault("architectures", [ARCHITECTURES[raw["model_type"]]])
        dtype = next(iter(state.values())).dtype
        raw["dtype"] = str(dtype).removeprefix("torch.")
        if "torch_dtype" in raw:
            raw["torch_dtype"] = raw["dtype"]
        (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer_dir is not None:
            for name in _TOKENIZER_FILES:
                src = Path(tokenizer_dir) / name
                if src.is_file():
                    shutil.copyfile(src, out / name)
    if dist.is_initialized():
        dist.barrier()
    return out


def save_peft_adapter(model: Any, config: LoraConfig, out_dir: str | Path, *, base_model: str | None) -> Path:
    """Writes the adapters in PEFT's format: ``adapter_config.json`` and
    ``adapter_model.safetensors``, which ``peft.PeftModel.from_pretrained`` loads onto the
    Hugging Face base model.

    Collective: every rank calls it (the adapters are gathered over tensor parallelism);
    global rank 0 writes, then all ranks wait for the files.

    Args:
        model: The adapted model.
        config: Its adapters.
        out_dir: Destination folder (created).
        base_model: The base model's directory or hub name, recorded in the config.
    """
    from safetensors.torch import save_file

    state = export_lora_state_dict(model)
    out = Path(out_dir)
    if not dist.is_initialized() or dist.get_rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
        adapter = {
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": config.rank, "lora_alpha": config.alpha, "lora_dropout": config.dropout,
            "target_modules": sorted(n for n, layer in LORA_TARGETS.items() if layer in config.targets),
            "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
            "inference_mode": True, "init_lora_weights": True, "modules_to_save": None,
        }
        (out / "adapter_config.json").write_text(json.dumps(adapter, indent=2, sort_keys=True) + "\n")
        save_file(state, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    if dist.is_initialized():
        dist.barrier()
    return out
