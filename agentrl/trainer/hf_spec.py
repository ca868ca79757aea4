"""The Hugging Face side of the trainer's model: which configs it trains and their
architecture fields (:class:`HFModelSpec`), and the padded vocabulary size Megatron uses.

Imports neither torch nor megatron, so flags can be checked against a checkpoint's config at
start-up (:mod:`agentrl.trainer.model_flags`) before anything heavy loads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.models.hf_config import architecture, check_supported, mixture_of_experts, read_config

__all__ = ["ARCHITECTURES", "SUPPORTED_MODEL_TYPES", "HFModelSpec", "padded_vocab_size", "read_hf_config"]

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "qwen3_moe", "llama")
ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "llama": "LlamaForCausalLM",
}

# --- config ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HFModelSpec:
    """The architecture fields of a supported Hugging Face config, validated.

    Attributes:
        raw: The ``config.json`` dict it was read from (written back by
            :func:`save_hf_checkpoint`).
        model_type: ``qwen2``, ``qwen3``, ``qwen3_moe`` or ``llama``.
        vocab_size: Real vocabulary size (before Megatron's padding).
        hidden_size: Residual width.
        intermediate_size: MLP width (of a dense layer).
        num_layers: Decoder layers.
        num_heads: Query heads.
        num_kv_heads: Key/value heads (query groups).
        head_dim: Width of one head (Megatron's ``kv_channels``).
        rms_norm_eps: RMSNorm epsilon.
        rope_theta: Rotary base.
        max_position_embeddings: Context length.
        tie_word_embeddings: The output layer shares the embedding matrix.
        qkv_bias: q/k/v projections have biases (Qwen2).
        qk_norm: Per-head RMSNorm on queries and keys (Qwen3, Qwen3-MoE).
        initializer_range: Std of the random init (used for models built from flags).
        num_experts: Experts of each layer's mixture (0: a dense model).
        moe_topk: Experts each token is routed to (``num_experts_per_tok``).
        moe_intermediate_size: One expert's MLP width.
        norm_topk_prob: The chosen experts' router scores are renormalised to sum to 1.
    """

    raw: dict[str, Any]
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    initializer_range: float
    num_experts: int = 0
    moe_topk: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False

    @property
    def is_moe(self) -> bool:
        """Whether every layer's MLP is a mixture of experts."""
        return self.num_experts > 0

    @classmethod
    def from_hf(cls, hf_config: Mapping[str, Any] | str | Path | Any) -> HFModelSpec:
        """Reads and validates a config (dict, directory, ``config.json`` path or
        ``PretrainedConfig``).

        Raises:
            ConfigError: The model type, activation, rotary scaling, sliding window or a bias
                layout is not supported; the message names the config field.
        """
        raw = read_hf_config(hf_config)
        model_type = check_supported(raw, SUPPORTED_MODEL_TYPES, "the Megatron trainer", ConfigError)
        if model_type == "llama" and raw.get("mlp_bias"):
            raise ConfigError("config field 'mlp_bias' is true; MLP biases are not supported")
        # Megatron has one bias switch for q/k/v (add_qkv_bias) and one for every other linear
        # layer; Llama's attention_bias also biases o_proj, which it cannot express alone.
        if model_type in ("llama", "qwen3", "qwen3_moe") and raw.get("attention_bias"):
            raise ConfigError("config field 'attention_bias' is true; attention output biases "
                              "are not supported")
        return cls(
            raw=raw,
            model_type=model_type,
            **architecture(raw, ConfigError),
            qkv_bias=model_type == "qwen2",
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            initializer_range=float(raw.get("initializer_range", 0.02)),
            **mixture_of_experts(raw, ConfigError),
        )


    def check_tensor_parallel(self, tp: int) -> None:
        """Raises ConfigError (naming ``--tensor-model-parallel-size``) unless ``tp`` ranks can
        each hold whole heads and key/value groups of this model."""
        for count, field in ((self.num_kv_heads, "num_key_value_heads"),
                             (self.num_heads, "num_attention_heads")):
            if count % tp:
                fits = [n for n in range(1, self.num_kv_heads + 1)
                        if self.num_kv_heads % n == 0 and self.num_heads % n == 0]
                raise ConfigError(
                    f"--tensor-model-parallel-size {tp} must divide the checkpoint's {field} "
                    f"({count}): each rank holds whole heads and key/value groups; this model "
                    f"splits into {' or '.join(map(str, fits))}")


def read_hf_config(source: Mapping[str, Any] | str | Path | Any) -> dict[str, Any]:
    """Returns a Hugging Face config as a plain dict.

    Args:
        source: A dict, a model directory, a ``config.json`` path, a ``PretrainedConfig`` or an
            :class:`HFModelSpec`.
    """
    if isinstance(source, HFModelSpec):
        return dict(source.raw)
    if isinstance(source, Mapping):
        return dict(source)
    if isinstance(source, str | Path):
        return read_config(source, ConfigError)
    if hasattr(source, "to_dict"):
        return dict(source.to_dict())
    raise TypeError(f"cannot read a Hugging Face config from {type(source).__name__}")


def padded_vocab_size(vocab_size: int, tp: int = 1, divisible_by: int = 128) -> int:
    """The embedding/output row count Megatron uses for a vocabulary of ``vocab_size``.

    Rounded up to a multiple of ``lcm(divisible_by, tp)``; for power-of-two ``tp <=
    divisible_by`` that is ``divisible_by``, so the result is the same at every TP size.
    """
    multiple = divisible_by * tp // math.gcd(divisible_by, tp)
    return -(-vocab_size // multiple) * multiple
