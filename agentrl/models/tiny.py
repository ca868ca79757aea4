"""Tiny random-init checkpoints for demos, tests and benchmarks, built offline.

:func:`build_tiny_model` writes a complete Hugging Face model directory (``config.json``,
``generation_config.json``, ``model.safetensors`` and the files of
:func:`~agentrl.chat.build_tiny_tokenizer`) that both ``transformers`` and agentrl's embedded
engine load. Its weights are random (seeded, so the same machine always builds the same model):
its outputs are noise until it is trained. It exists so every code path that needs "a model"
runs anywhere in seconds. :func:`build_tiny_moe_model` does the same for a mixture-of-experts
model (Qwen3-MoE, :data:`TINY_MOE_CONFIG`) with the same tokenizer; ``scripts/make-tiny-moe.py``
writes one into a folder of your choice.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from agentrl.chat.tiny_tokenizer import TINY_VOCAB_SIZE, build_tiny_tokenizer, cache_root

__all__ = ["TINY_MODEL_CONFIG", "TINY_MOE_CONFIG", "build_tiny_model", "build_tiny_moe_model"]

_SUBFOLDER = "tiny-qwen2-v1"
_MOE_SUBFOLDER = "tiny-qwen3-moe-v1"
_SEED = 0

TINY_MODEL_CONFIG: dict[str, Any] = {
    "vocab_size": TINY_VOCAB_SIZE,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 384,
    "tie_word_embeddings": True,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
}
"""The ``Qwen2Config`` arguments of the tiny model (about 1.3M parameters, 0.5M of them the tied
embeddings; the token ids of eos and pad come from the tokenizer)."""

TINY_MOE_CONFIG: dict[str, Any] = {
    "vocab_size": TINY_VOCAB_SIZE,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 384,
    "moe_intermediate_size": 64,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "tie_word_embeddings": True,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
}
"""The ``Qwen3MoeConfig`` arguments of the tiny mixture-of-experts model: 2 layers of 8 experts,
2 per token (hidden 128, a multiple of 32 as vLLM's CPU experts need)."""


def _write_checkpoint(directory: Path, cache_dir: Path, moe: bool = False) -> None:
    """Saves the tokenizer, then a seeded random Qwen2 (or Qwen3-MoE) model, into ``directory``."""
    import torch
    from transformers import (
        GenerationConfig,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    tokenizer = build_tiny_tokenizer(cache_dir)
    if len(tokenizer) != TINY_VOCAB_SIZE:
        raise RuntimeError(f"tiny tokenizer has {len(tokenizer)} tokens, "
                           f"expected {TINY_VOCAB_SIZE}")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config_class, model_class = (Qwen3MoeConfig, Qwen3MoeForCausalLM) if moe else (Qwen2Config, Qwen2ForCausalLM)
    config = config_class(
        **(TINY_MOE_CONFIG if moe else TINY_MODEL_CONFIG), eos_token_id=eos, pad_token_id=pad,
        bos_token_id=None, dtype="float32",
    )
    # fork_rng: seeding must not disturb the caller's global random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        model = model_class(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))


def build_tiny_model(cache_dir: str | Path | None = None) -> Path:
    """Returns the tiny model's directory, building it on first use.

    Args:
        cache_dir: Cache root; the model lives in its ``tiny-qwen2-v1`` subfolder (and the
            tokenizer in ``tiny-tokenizer-v1``). Defaults to
            :func:`~agentrl.chat.tiny_tokenizer.cache_root`. A first build writes to a temporary
            folder and renames it into place, so concurrent first uses are safe.

    Returns:
        The path of a Hugging Face model directory: a random-init Qwen2 (see
        :data:`TINY_MODEL_CONFIG`) with eos ``<|im_end|>`` and pad ``<|endoftext|>``. Its outputs
        are noise until it is trained.
    """
    return _built(_SUBFOLDER, cache_dir, moe=False)


def build_tiny_moe_model(cache_dir: str | Path | None = None) -> Path:
    """Returns the tiny Qwen3-MoE model's directory (``tiny-qwen3-moe-v1`` in the cache),
    building it on first use, as :func:`build_tiny_model` does: random weights (seeded) of
    :data:`TINY_MOE_CONFIG`, the tiny tokenizer."""
    return _built(_MOE_SUBFOLDER, cache_dir, moe=True)


def _built(subfolder: str, cache_dir: str | Path | None, *, moe: bool) -> Path:
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    final = root / subfolder
    if not (final / "model.safetensors").is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{subfolder}-", dir=root))
        try:
            _write_checkpoint(tmp, root, moe=moe)
            os.chmod(tmp, 0o755)  # mkdtemp makes it private
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / "model.safetensors").is_file():
                    raise  # not a lost race: a real error
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
