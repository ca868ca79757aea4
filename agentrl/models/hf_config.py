"""Reading Hugging Face ``config.json`` fields that both the engine and the trainer need.

Each reader takes the exception type to raise, so the engine reports ``EngineError`` and the
trainer ``ConfigError`` for the same unsupported field."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["EMBEDDED_MODEL_TYPES", "MOE_MODEL_TYPES", "architecture", "check_safetensors_headers",
           "check_supported", "load_tokenizer", "mixture_of_experts", "read_config", "read_safetensors", "rope_theta", "safetensors_files",
           "safetensors_specs"]

EMBEDDED_MODEL_TYPES = ("qwen2", "qwen3", "qwen3_moe", "llama")
"""Model types the embedded engine serves: every one the Megatron trainer trains."""


def read_config(source: str | Path, error: type[Exception]) -> dict[str, Any]:
    """A model directory's ``config.json`` (or that file itself) as a dict.

    Raises:
        error: The file is missing, is not JSON (a truncated download, say) or is not a JSON
            object; the message names the file.
    """
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise error(f"no Hugging Face config at {path}: a model directory holds a config.json")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{path} is not valid JSON ({exc}); re-download or re-export the "
                    "model") from exc
    if not isinstance(raw, dict):
        raise error(f"{path} holds a JSON {type(raw).__name__}, not an object of config fields")
    return raw


def check_supported(raw: Mapping[str, Any], supported: tuple[str, ...], who: str,
                    error: type[Exception]) -> str:
    """The config's model type, after refusing what neither the engine nor the trainer runs.

    Raises:
        error: Another model type, an activation other than SiLU, or sliding-window attention;
            the message names the config field.
    """
    model_type = raw.get("model_type")
    if model_type not in supported:
        raise error(f"config field 'model_type' is {model_type!r}; {who} supports "
                    f"{', '.join(supported)}")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise error(f"config field 'hidden_act' is {act!r}; only 'silu' is supported")
    if raw.get("use_sliding_window"):
        raise error("config field 'use_sliding_window' is true; sliding-window attention is not "
                    "supported")
    return str(model_type)


def architecture(raw: Mapping[str, Any], error: type[Exception]) -> dict[str, Any]:
    """The decoder's sizes, as both readers name them (heads default as transformers does)."""
    heads = int(raw["num_attention_heads"])
    return {
        "vocab_size": int(raw["vocab_size"]),
        "hidden_size": int(raw["hidden_size"]),
        "intermediate_size": int(raw["intermediate_size"]),
        "num_layers": int(raw["num_hidden_layers"]),
        "num_heads": heads,
        "num_kv_heads": int(raw.get("num_key_value_heads") or heads),
        "head_dim": int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
        "rms_norm_eps": float(raw.get("rms_norm_eps", 1e-6)),
        "rope_theta": rope_theta(raw, error),
        "max_position_embeddings": int(raw.get("max_position_embeddings", 4096)),
        "tie_word_embeddings": bool(raw.get("tie_word_embeddings", False)),
    }


MOE_MODEL_TYPES = ("qwen3_moe",)
"""Model types whose MLPs are mixtures of experts (read by :func:`mixture_of_experts`)."""


def mixture_of_experts(raw: Mapping[str, Any], error: type[Exception]) -> dict[str, Any]:
    """The mixture-of-experts fields of a config, as both readers name them; all zero / false
    for a dense model.

    Qwen3-MoE routes each token to its ``num_experts_per_tok`` experts of highest softmax
    score; ``norm_topk_prob`` renormalises the chosen scores to sum to 1. The expert count is
    ``num_experts`` (the name in Qwen's configs; transformers 5 writes ``num_local_experts``).

    Raises:
        error: A layout neither reader implements (dense layers among the sparse ones, more
            experts per token than experts); the message names the field.
    """
    if raw.get("model_type") not in MOE_MODEL_TYPES:
        return {"num_experts": 0, "moe_topk": 0, "moe_intermediate_size": 0, "norm_topk_prob": False}
    experts = raw.get("num_experts", raw.get("num_local_experts"))
    if not isinstance(experts, int) or experts < 1:
        raise error(f"config field 'num_experts' is {experts!r}; a mixture-of-experts model needs "
                    "a positive expert count")
    topk = int(raw.get("num_experts_per_tok", 0))
    if not 1 <= topk <= experts:
        raise error(f"config field 'num_experts_per_tok' is {topk}; it must be between 1 and "
                    f"num_experts ({experts})")
    if int(raw.get("decoder_sparse_step", 1)) != 1 or raw.get("mlp_only_layers"):
        raise error("config fields 'decoder_sparse_step' / 'mlp_only_layers' make some layers "
                    "dense; only models whose every layer is a mixture of experts are supported "
                    "(decoder_sparse_step = 1, mlp_only_layers = [])")
    return {"num_experts": experts, "moe_topk": topk,
            "moe_intermediate_size": int(raw["moe_intermediate_size"]),
            "norm_topk_prob": bool(raw.get("norm_topk_prob", False))}


def rope_theta(raw: Mapping[str, Any], error: type[Exception]) -> float:
    """The rotary base, refusing any rotary scaling (transformers 4 and 5 config layouts).

    Raises:
        error: The config asks for a rotary scaling other than the default; the message names
            the field.
    """
    params = raw.get("rope_parameters")
    if isinstance(params, Mapping):  # transformers >= 5
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in (None, "default"):
            raise error(f"config field 'rope_parameters.rope_type' is {kind!r}; only the "
                        "default rotary embedding is supported")
        return float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    scaling = raw.get("rope_scaling")
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind not in (None, "default"):
            raise error(f"config field 'rope_scaling' has type {kind!r}; only the "
                        "default rotary embedding is supported")
    return float(raw.get("rope_theta", 10000.0))


def safetensors_files(root: str | Path, error: type[Exception]) -> list[Path]:
    """The weight files of a Hugging Face model directory: the shards its
    ``model.safetensors.index.json`` names, else every ``*.safetensors`` file.

    Raises:
        error: No weights, an index that is not JSON, or one naming shards that are not there.
    """
    root = Path(root)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise error(f"{index} is not a safetensors index ({type(exc).__name__}: {exc})") from exc
        files = [root / name for name in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise error(f"{index} names shards that do not exist: {missing}")
    else:
        files = sorted(root.glob("*.safetensors"))
    if not files:
        raise error(f"no *.safetensors weights in {root}")
    return files


def check_safetensors_headers(root: str | Path, error: type[Exception]) -> None:
    """Reads the header of every weight file (not the tensors: milliseconds for any model).

    Raises:
        error: See :func:`safetensors_specs`.
    """
    safetensors_specs(root, error)


def safetensors_specs(root: str | Path, error: type[Exception]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor's dtype and shape, ``{name: (dtype, shape)}``, from the headers of a Hugging
    Face directory's weight files (not the tensors: milliseconds for any model).

    A safetensors file starts with the byte length of a JSON header (8 bytes, little-endian),
    then the header, which maps each tensor to its dtype, shape and byte range in the file.

    Raises:
        error: A missing weight file, or one that is cut short, not safetensors, or whose
            tensors reach past its end; names the file.
    """
    specs: dict[str, tuple[str, tuple[int, ...]]] = {}
    for file in safetensors_files(root, error):
        size = file.stat().st_size
        with file.open("rb") as f:
            head = f.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            if length < 2 or length > min(size - 8, 100 * 2**20):
                raise error(f"{file} is not a safetensors file (its header length is invalid: "
                            "damaged, cut short, or another format)")
            try:
                header = json.loads(f.read(length))
                tensors = {name: entry for name, entry in header.items() if name != "__metadata__"}
                ends = [int(entry["data_offsets"][1]) for entry in tensors.values()]
                specs.update({name: (str(entry["dtype"]), tuple(int(d) for d in entry["shape"]))
                              for name, entry in tensors.items()})
            except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
                raise error(f"{file} has a damaged safetensors header ({type(exc).__name__})") from exc
        if ends and 8 + length + max(ends) > size:
            raise error(f"{file} is cut short: its header describes {8 + length + max(ends)} "
                        f"bytes, the file has {size}")
    return specs


def read_safetensors(root: str | Path, error: type[Exception]) -> dict[str, Any]:
    """Every tensor of a Hugging Face model directory (sharded or not), on the CPU.

    Raises:
        error: No weights, or an index naming shards that are not there.
    """
    from safetensors.torch import load_file

    tensors: dict[str, Any] = {}
    for file in safetensors_files(root, error):
        tensors.update(load_file(str(file), device="cpu"))
    return tensors


def load_tokenizer(root: str | Path) -> Any | None:
    """The directory's Hugging Face tokenizer, or None when it has none."""
    root = Path(root)
    if not ((root / "tokenizer.json").is_file() or (root / "tokenizer_config.json").is_file()):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(root))
