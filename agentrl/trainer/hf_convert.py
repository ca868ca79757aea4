"""Hugging Face -> Megatron models for the Qwen2 / Qwen3 / Llama family, and vocab-parallel
log-probs, all for decoder-only models with RMSNorm, rotary embeddings, grouped-query attention
and a SwiGLU MLP:

* **Config.** :func:`transformer_config_from_hf` turns a ``config.json`` into megatron's
  ``TransformerConfig`` (:mod:`agentrl.trainer.model_flags` checks the Megatron model flags
  against it, or builds the config from the flags when there is no checkpoint).
* **Model.** :func:`build_gpt_model` builds a ``GPTModel`` from megatron's local layer spec
  (no Transformer Engine, so it runs on CPU), or from its Transformer Engine spec
  (``--transformer-impl transformer_engine``, CUDA only); :func:`unwrap_model` finds it inside
  its wrappers.
* **Log-probs.** :func:`vocab_parallel_logprobs` and :func:`vocab_parallel_entropy` (defined in
  :mod:`agentrl.trainer.vocab_parallel`, re-exported here) compute per-token quantities over the
  full vocabulary from one rank's vocab shard of the logits.

The weights, both ways (Hugging Face tensors into the model's tensor-parallel shards, and back
out as a Hugging Face folder or PEFT adapters), are :mod:`agentrl.trainer.hf_weights`'.

**Padded vocabulary.** Megatron shards the embedding and output layer by vocabulary rows, so the
row count must divide by the tensor-parallel size. :func:`padded_vocab_size` rounds the real
vocabulary up to a multiple of ``make_vocab_size_divisible_by`` (128 by default, like
Megatron-LM) and of the TP size; because 128 is a multiple of every power-of-two TP size up to
128, the padded size does not depend on TP, so a checkpoint saved at one TP size loads at
another. Padded rows are zero and never leave the trainer: exports slice them off, and the
log-prob functions mask them out of the softmax (their logits are 0, not -inf, so megatron's own
``labels=`` cross-entropy would count them; do not use it on a padded model).

Imported on first use: the attention patch, only when a Hugging Face model is built for a
comparison.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from agentrl.errors import AgentRLError, ConfigError
from agentrl.trainer.hf_spec import (
    SUPPORTED_MODEL_TYPES,
    HFModelSpec,
    padded_vocab_size,
    read_hf_config,
)
from agentrl.trainer.megatron_compat import apply_cpu_compat
from agentrl.trainer.vocab_parallel import vocab_parallel_entropy, vocab_parallel_logprobs

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "HFModelSpec",
    "build_gpt_model",
    "check_transformer_engine",
    "expert_parallel",
    "hf_spec_of",
    "moe_fields",
    "padded_vocab_size",
    "parallel_sizes",
    "read_hf_config",
    "tensor_parallel",
    "transformer_config_from_hf",
    "unwrap_model",
    "vocab_parallel_entropy",
    "vocab_parallel_logprobs",
]


def parallel_sizes() -> tuple[int, int]:
    """(tensor, pipeline) parallel sizes, (1, 1) before model parallelism is initialised."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 1, 1
    return (
        parallel_state.get_tensor_model_parallel_world_size(),
        parallel_state.get_pipeline_model_parallel_world_size(),
    )


def tensor_parallel() -> tuple[int, int]:
    """(rank, size) of this process in its tensor-parallel group, (0, 1) before model
    parallelism is initialised."""
    return _rank_and_size("tensor")


def expert_parallel() -> tuple[int, int]:
    """(rank, size) of this process in its expert-parallel group, (0, 1) before model
    parallelism is initialised."""
    return _rank_and_size("expert")


def _rank_and_size(kind: str) -> tuple[int, int]:
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 0, 1
    return (getattr(parallel_state, f"get_{kind}_model_parallel_rank")(),
            getattr(parallel_state, f"get_{kind}_model_parallel_world_size")())


def transformer_config_from_hf(
    hf_config: Mapping[str, Any] | str | Path | Any,
    *,
    params_dtype: torch.dtype = torch.float32,
    **overrides: Any,
) -> Any:
    """Builds megatron's ``TransformerConfig`` for a Hugging Face config.

    RMSNorm, gated SiLU MLP (a mixture of them for Qwen3-MoE: :func:`moe_fields`), no linear
    biases (q/k/v biases for Qwen2, per-head q/k RMSNorm for Qwen3), grouped-query attention, dropout 0 (RL fine-tuning; pass ``hidden_dropout`` /
    ``attention_dropout`` to change it), CPU initialisation without CUDA, and the parallel
    sizes of the initialised model-parallel groups. The rotary base is a ``GPTModel`` argument,
    not a config field: :func:`build_gpt_model` passes it.

    Args:
        hf_config: Anything :func:`read_hf_config` reads.
        params_dtype: Parameter dtype.
        **overrides: ``TransformerConfig`` fields set last (e.g. ``recompute_granularity``).

    Raises:
        ConfigError: The architecture is not supported, the TP size does not divide the head or
            group counts (the message names ``--tensor-model-parallel-size``), or
            ``sequence_parallel`` is asked for.
    """
    from megatron.core.transformer import TransformerConfig

    apply_cpu_compat()
    spec = hf_config if isinstance(hf_config, HFModelSpec) else HFModelSpec.from_hf(hf_config)
    tp, pp = parallel_sizes()
    tp = int(overrides.get("tensor_model_parallel_size", tp))
    pp = int(overrides.get("pipeline_model_parallel_size", pp))
    spec.check_tensor_parallel(tp)
    if overrides.get("sequence_parallel"):
        raise ConfigError("--sequence-parallel is not supported: megatron's local spec refuses "
                          "it, and agentrl's trainer has not been run with it under "
                          "--transformer-impl transformer_engine")
    if spec.num_layers % pp:
        raise ConfigError(f"--pipeline-model-parallel-size {pp} must divide num_hidden_layers "
                          f"({spec.num_layers})")
    fields: dict[str, Any] = dict(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        ffn_hidden_size=spec.intermediate_size,
        num_attention_heads=spec.num_heads,
        num_query_groups=spec.num_kv_heads,
        kv_channels=spec.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=spec.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=spec.qkv_bias,
        qk_layernorm=spec.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=spec.initializer_range,
        params_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        use_cpu_initialization=not torch.cuda.is_available(),
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
    )
    aux_loss_coeff = float(overrides.pop("moe_aux_loss_coeff", 0.0))
    if spec.is_moe:
        fields.update(moe_fields(spec, aux_loss_coeff))
        fields["expert_model_parallel_size"] = int(
            overrides.pop("expert_model_parallel_size", expert_parallel()[1]))
    elif aux_loss_coeff:
        raise ConfigError(f"--moe-aux-loss-coeff {aux_loss_coeff:g} is for mixture-of-experts "
                          f"models; the checkpoint is a dense {spec.model_type} model")
    fields.update(overrides)
    return TransformerConfig(**fields)


def moe_fields(spec: HFModelSpec, aux_loss_coeff: float = 0.0) -> dict[str, Any]:
    """``TransformerConfig`` fields of a mixture-of-experts model, routed as transformers'
    ``Qwen3MoeForCausalLM`` routes: softmax router scores over every expert, the ``moe_topk``
    highest kept, renormalised to sum to 1 when ``norm_topk_prob``. Megatron's top-k before
    softmax (``moe_router_pre_softmax=False``) is that renormalisation: a softmax over the
    chosen logits equals the chosen softmax scores divided by their sum.

    The experts run one after another (``SequentialMLP``: the expert names and shapes of a
    dense MLP, and no grouped-GEMM kernel to need), and tokens reach them by the all-gather
    dispatcher (the all-to-all one needs CUDA streams). The load-balancing loss is megatron's
    ``aux_loss`` with ``aux_loss_coeff`` (``--moe-aux-loss-coeff``; 0 turns it off: RL fine-tuning
    of a trained router rarely wants it, and Qwen3-MoE's ``router_aux_loss_coef`` is a
    pre-training setting).
    """
    return dict(
        num_moe_experts=spec.num_experts,
        moe_router_topk=spec.moe_topk,
        moe_ffn_hidden_size=spec.moe_intermediate_size,
        moe_router_pre_softmax=not spec.norm_topk_prob,
        moe_router_score_function="softmax",
        moe_grouped_gemm=False,
        moe_token_dispatcher_type="allgather",
        moe_router_load_balancing_type="aux_loss" if aux_loss_coeff else "none",
        moe_aux_loss_coeff=aux_loss_coeff,
    )


def build_gpt_model(
    hf_config: Mapping[str, Any] | str | Path | Any,
    *,
    pre_process: bool | None = None,
    post_process: bool | None = None,
    params_dtype: torch.dtype = torch.float32,
    make_vocab_size_divisible_by: int = 128,
    transformer_impl: str = "local",
    **config_overrides: Any,
) -> Any:
    """Builds a randomly initialised megatron ``GPTModel`` for a Hugging Face config.

    Uses ``get_gpt_layer_local_spec()`` (no Transformer Engine) with torch's fused attention
    kernel for causal attention (:mod:`agentrl.trainer.attention`), rotary embeddings with the
    config's base, tied embeddings when ``tie_word_embeddings`` is set, and a vocabulary padded
    by :func:`padded_vocab_size`. The model keeps ``vocab_parallel`` logits (``parallel_output``):
    a forward returns ``[batch, seq, padded_vocab / tp]``; see :func:`vocab_parallel_logprobs`.
    :func:`hf_spec_of` returns the config it was built from. Needs
    :func:`~agentrl.trainer.distributed.init_model_parallel` first.

    Args:
        hf_config: Anything :func:`read_hf_config` reads.
        pre_process: Whether this stage embeds tokens; defaults to "first pipeline stage".
        post_process: Whether this stage has the final norm and output layer; defaults to
            "last pipeline stage".
        params_dtype: Parameter dtype.
        make_vocab_size_divisible_by: Vocabulary padding multiple (Megatron's
            ``make_vocab_size_divisible_by``); must be the same when saving and loading Megatron
            checkpoints.
        transformer_impl: ``"local"`` (the default) or ``"transformer_engine"``: megatron's
            Transformer Engine layer spec (fused norm + linear layers, TE's attention; packed
            batches must then use the ``thd`` layout, see
            :func:`agentrl.trainer.trained_positions.packed_trained_logprobs`).
        **config_overrides: Passed to :func:`transformer_config_from_hf`.

    Raises:
        ConfigError: ``transformer_impl`` is unknown, or Transformer Engine is asked for where it
            cannot run (no CUDA, or the package does not import).
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from agentrl.trainer.attention import use_sdpa_attention

    spec = HFModelSpec.from_hf(hf_config)
    config = transformer_config_from_hf(spec, params_dtype=params_dtype, **config_overrides)
    if pre_process is None:
        pre_process = parallel_state.is_pipeline_first_stage(ignore_virtual=True)
    if post_process is None:
        post_process = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
    if transformer_impl == "transformer_engine":
        check_transformer_engine()
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_layer_with_transformer_engine_spec,
        )

        layer_spec = get_gpt_layer_with_transformer_engine_spec(
            num_experts=spec.num_experts or None, moe_grouped_gemm=False, qk_layernorm=spec.qk_norm)
    elif transformer_impl == "local":
        layer_spec = use_sdpa_attention(get_gpt_layer_local_spec(
            num_experts=spec.num_experts or None, moe_grouped_gemm=False, qk_layernorm=spec.qk_norm))
    else:
        raise ConfigError(f"--transformer-impl must be local or transformer_engine, got "
                          f"{transformer_impl!r}")
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=padded_vocab_size(
            spec.vocab_size, config.tensor_model_parallel_size, make_vocab_size_divisible_by
        ),
        max_sequence_length=spec.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=spec.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_base=spec.rope_theta,
    )
    _params_in(model, params_dtype)
    model.agentrl_hf_spec = spec
    return model


def _params_in(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Every floating-point parameter of ``model`` in ``dtype``.

    megatron's local spec builds its norms with ``torch.nn.RMSNorm``, which ignores
    ``params_dtype``: left in fp32 next to bf16 activations, each norm converts its input to fp32
    and its output back (no fused kernel runs), four copies per layer and step. The fp32 master
    weights of a bf16 run live in the optimizer only.
    """
    for param in model.parameters():
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)


def check_transformer_engine() -> None:
    """Raises ConfigError, saying why, where ``--transformer-impl transformer_engine`` cannot
    run: no CUDA device, or ``transformer_engine`` (with its PyTorch part) does not import."""
    if not torch.cuda.is_available():
        raise ConfigError("--transformer-impl transformer_engine needs a CUDA GPU (Transformer "
                          "Engine has no CPU kernels); use --transformer-impl local here")
    try:
        importlib.import_module("transformer_engine.pytorch")
    except (ImportError, OSError, RuntimeError) as exc:  # absent, or built for another torch/CUDA
        raise ConfigError(f"--transformer-impl transformer_engine: transformer_engine.pytorch does "
                          f"not import ({type(exc).__name__}: {exc}); install Transformer Engine "
                          "for this torch and CUDA (pip install 'transformer_engine[pytorch]'), or "
                          "use --transformer-impl local") from None


def unwrap_model(model: Any) -> Any:
    """The ``GPTModel`` inside DDP / Float16Module wrappers (and lists of one chunk)."""
    if isinstance(model, list | tuple):
        if len(model) != 1:
            raise ConfigError("virtual pipeline model chunks are not supported")
        model = model[0]
    while not hasattr(model, "agentrl_hf_spec") and hasattr(model, "module"):
        model = model.module
    if not hasattr(model, "agentrl_hf_spec"):
        raise AgentRLError("not a model built by agentrl.trainer.hf_convert.build_gpt_model")
    return model


def hf_spec_of(model: Any) -> HFModelSpec:
    """The :class:`HFModelSpec` a model from :func:`build_gpt_model` was built from."""
    return unwrap_model(model).agentrl_hf_spec
