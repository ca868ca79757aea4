"""The Megatron-style model flags of :class:`~agentrl.trainer.config.TrainerConfig`
(``--num-layers``, ``--hidden-size``, ...): checked against a Hugging Face checkpoint's config,
or, without a checkpoint, turned into one."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agentrl.config import flag
from agentrl.errors import ConfigError
from agentrl.trainer.hf_spec import ARCHITECTURES, HFModelSpec, read_hf_config

__all__ = ["check_model_flags"]


_NUMERIC_FLAGS: tuple[tuple[str, str, Callable[[HFModelSpec], Any]], ...] = (
    ("num_layers", "num_hidden_layers", lambda s: s.num_layers),
    ("hidden_size", "hidden_size", lambda s: s.hidden_size),
    ("ffn_hidden_size", "intermediate_size", lambda s: s.intermediate_size),
    ("num_attention_heads", "num_attention_heads", lambda s: s.num_heads),
    ("num_query_groups", "num_key_value_heads", lambda s: s.num_kv_heads),
    ("kv_channels", "head_dim", lambda s: s.head_dim),
    ("vocab_size", "vocab_size", lambda s: s.vocab_size),
    ("max_position_embeddings", "max_position_embeddings", lambda s: s.max_position_embeddings),
    ("rotary_base", "rope_theta", lambda s: s.rope_theta),
    ("norm_epsilon", "rms_norm_eps", lambda s: s.rms_norm_eps),
)
"""(TrainerConfig field, HF field, value in the spec) of flags that must equal the checkpoint."""

_BOOL_FLAGS: tuple[tuple[str, Callable[[HFModelSpec], bool], Callable[[HFModelSpec], str]], ...] = (
    ("untie_embeddings_and_output_weights", lambda s: not s.tie_word_embeddings,
     lambda s: f"tie_word_embeddings = {s.tie_word_embeddings}"),
    ("add_qkv_bias", lambda s: s.qkv_bias,
     lambda s: f"model_type = {s.model_type!r} ({'with' if s.qkv_bias else 'no'} q/k/v biases)"),
    ("qk_layernorm", lambda s: s.qk_norm,
     lambda s: f"model_type = {s.model_type!r} ({'with' if s.qk_norm else 'no'} q/k norms)"),
)
"""(TrainerConfig field, value the checkpoint implies, how to describe the checkpoint's setting)."""


def _arg(args: Any, name: str) -> Any:
    """``args.name`` (object or mapping); ``None`` when absent, which means "not given"."""
    if isinstance(args, Mapping):
        return args.get(name)
    return getattr(args, name, None)


def check_model_flags(
    hf_config: Mapping[str, Any] | str | Path | Any | None, args: Any
) -> dict[str, Any]:
    """Checks the Megatron model flags against a checkpoint, or defines a model from them.

    A flag is "given" when ``args`` (a namespace, dataclass or mapping with the flags' dest
    names, e.g. ``num_layers``) has it and its value is not ``None``; give boolean flags a
    ``None`` default for this to work. Checked flags: ``--num-layers``, ``--hidden-size``,
    ``--ffn-hidden-size``, ``--num-attention-heads``, ``--num-query-groups``, ``--kv-channels``,
    ``--vocab-size``, ``--max-position-embeddings``, ``--rotary-base``, ``--norm-epsilon``,
    ``--untie-embeddings-and-output-weights``, ``--add-qkv-bias``, ``--qk-layernorm``,
    ``--normalization`` (must be RMSNorm), ``--swiglu`` (must not be false) and ``--seq-length``
    (must not exceed the context length); ``--tensor-model-parallel-size`` must split the heads
    and key/value groups whole.

    Args:
        hf_config: The checkpoint's config, or ``None`` to build one from the flags.
        args: The parsed flags.

    Returns:
        The Hugging Face config dict to build the model from: the checkpoint's, or (without one)
        a Qwen2 (with ``--add-qkv-bias``), Qwen3 (with ``--qk-layernorm``) or Llama config made
        from the flags, with Megatron's defaults (tied embeddings unless untied, query groups =
        heads, rotary base 10000, epsilon 1e-5).

    Raises:
        ConfigError: A flag contradicts the checkpoint (the message names the flag, its value
            and the checkpoint's), or a flag needed to define a model is missing.
    """
    normalization = _arg(args, "normalization")
    if normalization is not None and normalization != "RMSNorm":
        raise ConfigError(f"--normalization {normalization}: Qwen2/Qwen3/Llama models use RMSNorm")
    if _arg(args, "swiglu") is False:
        raise ConfigError("--swiglu is off: Qwen2/Qwen3/Llama models use a SwiGLU MLP")
    raw = _config_from_flags(args) if hf_config is None else read_hf_config(hf_config)
    spec = HFModelSpec.from_hf(raw)
    for name, field, value_of in _NUMERIC_FLAGS:
        given = _arg(args, name)
        if given is None:
            continue
        expected = value_of(spec)
        same = float(given) == float(expected) if isinstance(expected, float) else given == expected
        if not same:
            raise ConfigError(
                f"{flag(name)} is {given} but the checkpoint has {field} = {expected}; remove "
                f"the flag or set it to {expected}"
            )
    for name, value_of, describe in _BOOL_FLAGS:
        given = _arg(args, name)
        if given is not None and bool(given) != value_of(spec):
            raise ConfigError(
                f"{flag(name)} is {bool(given)} but the checkpoint has {describe(spec)}; set "
                f"the flag to {value_of(spec)}"
            )
    tp = _arg(args, "tensor_model_parallel_size")
    if tp is not None:
        spec.check_tensor_parallel(int(tp))
    _check_moe_flags(spec, args)
    seq_length = _arg(args, "seq_length")
    if seq_length is not None and int(seq_length) > spec.max_position_embeddings:
        raise ConfigError(
            f"--seq-length {seq_length} exceeds the checkpoint's max_position_embeddings "
            f"({spec.max_position_embeddings})"
        )
    return raw


def _check_moe_flags(spec: HFModelSpec, args: Any) -> None:
    """What a mixture-of-experts checkpoint (or a dense one) rules out among the flags."""
    coeff = _arg(args, "moe_aux_loss_coeff")
    ep = int(_arg(args, "expert_model_parallel_size") or 1)
    if not spec.is_moe:
        if ep > 1:
            raise ConfigError(f"--expert-model-parallel-size {ep} is for mixture-of-experts models; "
                              f"the checkpoint is a dense {spec.model_type} model: drop the flag")
        if coeff:
            raise ConfigError(f"--moe-aux-loss-coeff {coeff:g} is for mixture-of-experts models; "
                              f"the checkpoint is a dense {spec.model_type} model: drop the flag")
        if _arg(args, "routing_replay"):
            raise ConfigError(f"--routing-replay is for mixture-of-experts models; the checkpoint "
                              f"is a dense {spec.model_type} model: drop the flag")
        return
    if spec.num_experts % ep:
        fits = [n for n in range(1, spec.num_experts + 1) if spec.num_experts % n == 0]
        raise ConfigError(f"--expert-model-parallel-size {ep} must divide the checkpoint's "
                          f"num_experts ({spec.num_experts}): each rank holds whole experts; this "
                          f"model splits into {' or '.join(map(str, fits))}")
    tp = int(_arg(args, "tensor_model_parallel_size") or 1)
    if tp > 1 and not _arg(args, "sequence_parallel"):
        raise ConfigError(
            f"--tensor-model-parallel-size {tp} with a mixture-of-experts checkpoint "
            f"({spec.model_type}, {spec.num_experts} experts) needs --sequence-parallel: megatron's "
            "MoE layer refuses to train tensor-parallel without it (which needs CUDA and "
            "--transformer-impl transformer_engine); on this machine train it with "
            "--tensor-model-parallel-size 1")
    if _arg(args, "lora_rank"):
        named = {n.strip() for n in str(_arg(args, "lora_target_modules") or "").split(",")}
        mlp = sorted(named & {"gate_proj", "up_proj", "down_proj"})
        if mlp or "all-linear" in named:
            raise ConfigError(
                f"--lora-target-modules {_arg(args, 'lora_target_modules')}: LoRA on a "
                f"mixture-of-experts model's expert projections ({', '.join(mlp) or 'all-linear'}) "
                "is not supported: agentrl's LoRA adapts linear layers and exports them as PEFT "
                "per-module adapters, and transformers 5 holds a layer's experts as one fused "
                "parameter, not as linear modules (an export per expert is not written); adapt "
                "the attention with --lora-target-modules q_proj,k_proj,v_proj,o_proj")


def _config_from_flags(args: Any) -> dict[str, Any]:
    """A Hugging Face config dict from the Megatron model flags (no checkpoint)."""
    required = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size")
    missing = [flag(name) for name in required if _arg(args, name) is None]
    max_positions = _arg(args, "max_position_embeddings") or _arg(args, "seq_length")
    if max_positions is None:
        missing.append("--max-position-embeddings (or --seq-length)")
    if missing:
        raise ConfigError(f"without a Hugging Face checkpoint the model is defined by flags; "
                          f"missing: {', '.join(missing)}")
    if _arg(args, "qk_layernorm"):
        model_type = "qwen3"
    elif _arg(args, "add_qkv_bias"):
        model_type = "qwen2"
    else:
        model_type = "llama"
    heads = int(_arg(args, "num_attention_heads"))
    hidden = int(_arg(args, "hidden_size"))
    raw: dict[str, Any] = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": int(_arg(args, "vocab_size")),
        "hidden_size": hidden,
        "intermediate_size": int(_arg(args, "ffn_hidden_size")),
        "num_hidden_layers": int(_arg(args, "num_layers")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_arg(args, "num_query_groups") or heads),
        "head_dim": int(_arg(args, "kv_channels") or hidden // heads),
        "max_position_embeddings": int(max_positions),
        "rope_theta": float(_arg(args, "rotary_base") or 10000.0),
        "rms_norm_eps": float(_arg(args, "norm_epsilon") or 1e-5),
        "tie_word_embeddings": not _arg(args, "untie_embeddings_and_output_weights"),
        "hidden_act": "silu",
        "attention_bias": False,
        "initializer_range": 0.02,
    }
    return raw


# --- model -------------------------------------------------------------------------------------
