"""A hand-written Qwen2 / Qwen3 / Qwen3-MoE / Llama decoder for the embedded engine, with a
slot-based KV cache.

Plain torch, inference only. The math follows the Hugging Face implementations (pre-norm
RMSNorm, default rotary embeddings with the half-rotation layout, grouped-query attention,
per-head query/key RMSNorm for Qwen3, SwiGLU MLP or a mixture of SwiGLU experts) so the logits
match ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM`` / ``LlamaForCausalLM``
to float rounding.
Parameters use the Hugging Face names (``model.layers.N.self_attn.q_proj.weight``, ...), which is
what checkpoints, trainers and SGLang's weight-update calls speak.

Two fusions keep the per-token op count low, which is what bounds a tiny model's decode speed:
q/k/v live in one ``[q; k; v]`` matrix and gate/up in one ``[gate; up]`` matrix. The Hugging
Face names map to row-slices (views) of the fused tensors, so copying into a named parameter
updates the fused one in place.

The KV cache (:class:`KVCache`) holds ``num_slots`` sequences side by side, each at its own
length; :meth:`DecoderModel.prefill` writes new sequences into slots and
:meth:`DecoderModel.decode` advances a set of slots by one token each, masking every slot's
unused tail. For a mixture of experts the cache also keeps, per position and layer, the experts
the router chose (:attr:`KVCache.routes`): what routing replay gives the trainer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from agentrl.errors import EngineError
from agentrl.models.experts import experts_one_by_one
from agentrl.models.hf_config import (
    EMBEDDED_MODEL_TYPES,
    architecture,
    check_supported,
    mixture_of_experts,
    read_config,
    read_safetensors,
)

__all__ = ["DecoderConfig", "DecoderModel", "KVCache", "read_checkpoint"]

SUPPORTED_MODEL_TYPES = EMBEDDED_MODEL_TYPES
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
"""Buffers some older checkpoints saved; they are recomputed from the config, so skipped."""

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """The architecture fields the forward needs, read from a Hugging Face ``config.json``.

    Attributes:
        model_type: ``qwen2``, ``qwen3``, ``qwen3_moe`` or ``llama``.
        vocab_size: Embedding rows.
        hidden_size: Residual width.
        intermediate_size: MLP width.
        num_layers: Decoder layers.
        num_heads: Query heads.
        num_kv_heads: Key/value heads (grouped-query attention when fewer than ``num_heads``).
        head_dim: Width of one head.
        rms_norm_eps: RMSNorm epsilon.
        rope_theta: Rotary base.
        max_position_embeddings: Context length the model was built for.
        tie_word_embeddings: ``lm_head`` shares the embedding matrix.
        qkv_bias: q/k/v projections have a bias (always for Qwen2; ``attention_bias`` for Llama).
        o_bias: The output projection has a bias (Llama's ``attention_bias``).
        mlp_bias: gate/up/down projections have a bias (Llama's ``mlp_bias``).
        qk_norm: Per-head RMSNorm on queries and keys before the rotary (Qwen3, Qwen3-MoE).
        num_experts: Experts of each layer's mixture (0: dense MLPs).
        moe_topk: Experts each token is routed to.
        moe_intermediate_size: One expert's MLP width.
        norm_topk_prob: The chosen experts' scores are renormalised to sum to 1.
        dtype: Parameter dtype named by the config (used on GPU; CPU always runs float32).
        eos_token_ids: End-of-sequence ids named by the config.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    num_experts: int = 0
    moe_topk: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    dtype: torch.dtype = torch.float32
    eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_hf(cls, raw: Mapping[str, Any]) -> DecoderConfig:
        """Reads a Hugging Face config (the ``config.json`` dict, or a ``PretrainedConfig``).

        Raises:
            EngineError: The model type, activation, rotary scaling or sliding window is not
                supported; the message names the field.
        """
        if not isinstance(raw, Mapping):
            raw = raw.to_dict()
        model_type = check_supported(raw, SUPPORTED_MODEL_TYPES, "the embedded engine", EngineError)
        is_qwen2 = model_type == "qwen2"
        attention_bias = bool(raw.get("attention_bias", False))
        return cls(
            model_type=model_type,
            **architecture(raw, EngineError),
            qkv_bias=is_qwen2 or attention_bias,
            o_bias=not is_qwen2 and attention_bias,
            mlp_bias=not is_qwen2 and bool(raw.get("mlp_bias", False)),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            **mixture_of_experts(raw, EngineError),
            dtype=_config_dtype(raw),
            eos_token_ids=_as_ids(raw.get("eos_token_id")),
        )


def _config_dtype(raw: Mapping[str, Any]) -> torch.dtype:
    name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    return _DTYPES.get(str(name).removeprefix("torch."), torch.float32)


def _as_ids(value: Any) -> tuple[int, ...]:
    """An ``eos_token_id`` field (absent, an int or a list) as a tuple of ints."""
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def read_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """Reads every tensor of a Hugging Face model directory's safetensors files, on CPU.

    A ``model.safetensors.index.json`` selects the shards it names; otherwise every
    ``*.safetensors`` file in the directory is read.

    Raises:
        EngineError: The directory holds no safetensors file or a shard is missing.
    """
    root = Path(path)
    return read_safetensors(root, EngineError)


class KVCache:
    """Keys and values of up to ``num_slots`` sequences: ``[layers, slots, capacity, kv_heads,
    dim]``.

    Each slot holds one sequence from position 0; the caller tracks its length. Both the slots
    and the ``capacity`` (positions per slot) are allocated on demand, doubling, up to
    ``num_slots`` and ``max_len``: memory follows the sequences in use (an engine allowed 64
    requests that serves 16 holds 16 slots, each as long as the longest of them), which on a
    real model is the difference between a few GiB and tens of GiB.
    """

    def __init__(
        self, config: DecoderConfig, num_slots: int, max_len: int, *, device: torch.device,
        dtype: torch.dtype, initial_len: int = 512,
    ) -> None:
        self.num_slots = num_slots
        self.max_len = max_len
        self._shape = (config.num_layers, config.num_kv_heads, config.head_dim)
        self._route_shape = (config.num_layers, config.moe_topk) if config.num_experts else None
        self.capacity = 0
        self.slots = 0
        self.k = torch.empty(0, device=device, dtype=dtype)
        self.v = torch.empty(0, device=device, dtype=dtype)
        self.routes: torch.Tensor | None = None
        """``[slots, capacity, layers, topk]`` int16: the experts each cached position was
        routed to in each layer (``None`` for a dense model)."""
        self._initial_len = min(max_len, initial_len)
        self.ensure_capacity(self._initial_len, 1)

    @property
    def nbytes(self) -> int:
        """Bytes the keys and values hold now."""
        return self.k.numel() * self.k.element_size() * 2

    def ensure_capacity(self, length: int, slots: int = 0) -> None:
        """Makes room for positions ``0 .. length-1`` in slots ``0 .. slots-1`` (and every slot
        already allocated); keeps what is stored."""
        if length <= self.capacity and slots <= self.slots:
            return
        if length > self.max_len:
            raise EngineError(f"KV cache needs {length} positions; its limit is {self.max_len}")
        if slots > self.num_slots:
            raise EngineError(f"KV cache needs {slots} slots; its limit is {self.num_slots}")
        new_cap = (self.capacity if length <= self.capacity
                   else min(self.max_len, max(length, 2 * self.capacity)))
        new_slots = self.slots if slots <= self.slots else min(self.num_slots, max(slots, 2 * self.slots))
        layers, heads, dim = self._shape
        shape = (layers, new_slots, new_cap, heads, dim)
        # Zeros, not torch.empty: a decode step attends over every slot up to the batch's longest
        # sequence with masked-out positions weighted 0, and 0 x NaN is NaN - uninitialised
        # memory there (NaN bit patterns happen) turned whole logit rows into NaN.
        k = torch.zeros(shape, device=self.k.device, dtype=self.k.dtype)
        v = torch.zeros(shape, device=self.v.device, dtype=self.v.dtype)
        routes = None
        if self._route_shape is not None:
            routes = torch.zeros((new_slots, new_cap, *self._route_shape), device=self.k.device,
                                 dtype=torch.int16)
        if self.capacity and self.slots:
            with torch.inference_mode():
                k[:, : self.slots, : self.capacity] = self.k
                v[:, : self.slots, : self.capacity] = self.v
                if routes is not None and self.routes is not None:
                    routes[: self.slots, : self.capacity] = self.routes
        self.k, self.v, self.capacity, self.slots = k, v, new_cap, new_slots
        self.routes = routes

    def release(self) -> None:
        """Frees the storage; the next :meth:`ensure_capacity` allocates it again."""
        self.k = self.k.new_empty(0)
        self.v = self.v.new_empty(0)
        self.routes = None
        self.capacity = self.slots = 0

    def read_slot(self, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of slot ``slot``'s first ``length`` keys and values ``[layers, length,
        kv_heads, dim]``."""
        with torch.inference_mode():
            return self.k[:, slot, :length].clone(), self.v[:, slot, :length].clone()

    def read_routes(self, slot: int, length: int) -> torch.Tensor | None:
        """A copy of slot ``slot``'s first ``length`` routes ``[length, layers, topk]`` (``None``
        for a dense model)."""
        if self.routes is None:
            return None
        with torch.inference_mode():
            return self.routes[slot, :length].clone()

    def write_slot(self, slot: int, k: torch.Tensor, v: torch.Tensor,
                   routes: torch.Tensor | None = None) -> None:
        """Stores keys and values (as :meth:`read_slot` returns them), and routes (as
        :meth:`read_routes` does), at slot ``slot``'s first positions."""
        length = k.shape[1]
        self.ensure_capacity(length, slot + 1)
        with torch.inference_mode():
            self.k[:, slot, :length] = k
            self.v[:, slot, :length] = v
            if routes is not None and self.routes is not None:
                self.routes[slot, :length] = routes

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copies the first ``length`` positions of slot ``src`` into slot ``dst``."""
        with torch.inference_mode():
            self.k[:, dst, :length] = self.k[:, src, :length]
            self.v[:, dst, :length] = self.v[:, src, :length]
            if self.routes is not None:
                self.routes[dst, :length] = self.routes[src, :length]


@dataclasses.dataclass
class _Layer:
    """One decoder layer's tensors (fused q/k/v and gate/up; biases and the parts another
    architecture has are None when absent). A mixture-of-experts layer has ``router`` and the
    experts' ``[experts, 2 * width, hidden]`` / ``[experts, hidden, width]`` tensors instead of
    the dense MLP."""

    ln1: torch.Tensor
    w_qkv: torch.Tensor
    b_qkv: torch.Tensor | None
    w_o: torch.Tensor
    b_o: torch.Tensor | None
    ln2: torch.Tensor
    w_gate_up: torch.Tensor | None
    b_gate_up: torch.Tensor | None
    w_down: torch.Tensor | None
    b_down: torch.Tensor | None
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    router: torch.Tensor | None = None
    experts_gate_up: torch.Tensor | None = None
    experts_down: torch.Tensor | None = None
    w_qkv_t: torch.Tensor = dataclasses.field(init=False)
    w_o_t: torch.Tensor = dataclasses.field(init=False)
    w_gate_up_t: torch.Tensor | None = dataclasses.field(init=False)
    w_down_t: torch.Tensor | None = dataclasses.field(init=False)
    router_t: torch.Tensor | None = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        # Transposed views for addmm/mm, made once: they follow in-place weight updates.
        self.w_qkv_t = self.w_qkv.t()
        self.w_o_t = self.w_o.t()
        self.w_gate_up_t = self.w_gate_up.t() if self.w_gate_up is not None else None
        self.w_down_t = self.w_down.t() if self.w_down is not None else None
        self.router_t = self.router.t() if self.router is not None else None


class DecoderModel:
    """A Qwen2 / Qwen3 / Qwen3-MoE / Llama causal LM held as plain tensors, for inference.

    Build it with :meth:`from_pretrained` (a Hugging Face directory) or :meth:`from_state_dict`.
    All entry points run under ``torch.inference_mode``.
    """

    def __init__(self, config: DecoderConfig, *, device: str | torch.device | None = None) -> None:
        """Allocates zero parameters for ``config``; :meth:`load_state_dict_inplace` fills them.

        Args:
            config: The architecture.
            device: Where to run; default CUDA when available, else CPU. CPU always uses float32;
                CUDA uses the config's dtype.
        """
        self.config = config
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = config.dtype if self.device.type == "cuda" else torch.float32
        self._params: dict[str, torch.Tensor] = {}
        self._layers = [self._alloc_layer(i) for i in range(config.num_layers)]
        c = config
        self.embed = self._alloc("model.embed_tokens.weight", (c.vocab_size, c.hidden_size))
        self.final_norm = self._alloc("model.norm.weight", (c.hidden_size,))
        if c.tie_word_embeddings:
            self.lm_head = self.embed
        else:
            self.lm_head = self._alloc("lm_head.weight", (c.vocab_size, c.hidden_size))
        self.lm_head_t = self.lm_head.t()
        # 0-dim constants of the norm (see _rms_norm)
        self._eps = torch.tensor(c.rms_norm_eps, device=self.device)
        self._inv_width = torch.tensor(1.0 / c.hidden_size, device=self.device)
        self._ones = torch.ones((), device=self.device)
        self._rope_len = 0
        self._cos = self._sin = self._arange = torch.empty(0)
        self._ensure_rope(c.max_position_embeddings)

    # --- construction -------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, device: str | torch.device | None = None
    ) -> DecoderModel:
        """Loads ``config.json`` and the safetensors weights (sharded or not) of a directory."""
        root = Path(path)
        config = DecoderConfig.from_hf(read_config(root, EngineError))
        return cls.from_state_dict(config, read_checkpoint(root), device=device)

    @classmethod
    def from_state_dict(
        cls, config: DecoderConfig | Mapping[str, Any], state_dict: Mapping[str, torch.Tensor],
        *, device: str | torch.device | None = None,
    ) -> DecoderModel:
        """Builds a model from a config (ours or a Hugging Face one) and a complete state dict.

        Raises:
            EngineError: A parameter is missing, unknown or of the wrong shape.
        """
        if not isinstance(config, DecoderConfig):
            config = DecoderConfig.from_hf(config)
        if config.num_experts:
            state_dict = experts_one_by_one(state_dict)
        model = cls(config, device=device)
        missing = sorted(set(model._params) - set(state_dict))
        if config.tie_word_embeddings:
            missing = [name for name in missing if name != "lm_head.weight"]
        if missing:
            raise EngineError(f"state dict lacks {len(missing)} parameter(s): {missing}")
        model.load_state_dict_inplace(state_dict)
        return model

    def _alloc(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        tensor = torch.zeros(shape, device=self.device, dtype=self.dtype)
        self._params[name] = tensor
        return tensor

    def _alloc_layer(self, index: int) -> _Layer:
        c = self.config
        prefix = f"model.layers.{index}."
        q_rows, kv_rows = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        w_qkv = self._fused(prefix + "self_attn", "weight", (q_rows, kv_rows, kv_rows),
                            ("q_proj", "k_proj", "v_proj"), c.hidden_size)
        b_qkv = None
        if c.qkv_bias:
            b_qkv = self._fused(prefix + "self_attn", "bias", (q_rows, kv_rows, kv_rows),
                                ("q_proj", "k_proj", "v_proj"), None)
        norms = {}
        if c.qk_norm:
            norms = {"q_norm": self._alloc(prefix + "self_attn.q_norm.weight", (c.head_dim,)),
                     "k_norm": self._alloc(prefix + "self_attn.k_norm.weight", (c.head_dim,))}
        if c.num_experts:
            return _Layer(
                ln1=self._alloc(prefix + "input_layernorm.weight", (c.hidden_size,)),
                w_qkv=w_qkv, b_qkv=b_qkv,
                w_o=self._alloc(prefix + "self_attn.o_proj.weight", (c.hidden_size, q_rows)),
                b_o=self._alloc(prefix + "self_attn.o_proj.bias", (c.hidden_size,)) if c.o_bias
                else None,
                ln2=self._alloc(prefix + "post_attention_layernorm.weight", (c.hidden_size,)),
                w_gate_up=None, b_gate_up=None, w_down=None, b_down=None, **norms,
                **self._alloc_experts(prefix + "mlp"),
            )
        inter = c.intermediate_size
        w_gate_up = self._fused(prefix + "mlp", "weight", (inter, inter), ("gate_proj", "up_proj"),
                                c.hidden_size)
        b_gate_up = None
        if c.mlp_bias:
            b_gate_up = self._fused(prefix + "mlp", "bias", (inter, inter),
                                    ("gate_proj", "up_proj"), None)
        return _Layer(
            ln1=self._alloc(prefix + "input_layernorm.weight", (c.hidden_size,)),
            w_qkv=w_qkv,
            b_qkv=b_qkv,
            w_o=self._alloc(prefix + "self_attn.o_proj.weight", (c.hidden_size, q_rows)),
            b_o=self._alloc(prefix + "self_attn.o_proj.bias", (c.hidden_size,)) if c.o_bias
            else None,
            ln2=self._alloc(prefix + "post_attention_layernorm.weight", (c.hidden_size,)),
            w_gate_up=w_gate_up,
            b_gate_up=b_gate_up,
            w_down=self._alloc(prefix + "mlp.down_proj.weight", (c.hidden_size, inter)),
            b_down=self._alloc(prefix + "mlp.down_proj.bias", (c.hidden_size,)) if c.mlp_bias
            else None,
            **norms,
        )

    def _alloc_experts(self, prefix: str) -> dict[str, torch.Tensor]:
        """A mixture's router and experts, each expert's projections registered under its
        checkpoint names (``mlp.experts.{e}.gate_proj.weight``, ...) as views of the stacked
        tensors."""
        c = self.config
        width, hidden = c.moe_intermediate_size, c.hidden_size
        gate_up = torch.zeros((c.num_experts, 2 * width, hidden), device=self.device, dtype=self.dtype)
        down = torch.zeros((c.num_experts, hidden, width), device=self.device, dtype=self.dtype)
        for e in range(c.num_experts):
            self._params[f"{prefix}.experts.{e}.gate_proj.weight"] = gate_up[e, :width]
            self._params[f"{prefix}.experts.{e}.up_proj.weight"] = gate_up[e, width:]
            self._params[f"{prefix}.experts.{e}.down_proj.weight"] = down[e]
        return {"router": self._alloc(f"{prefix}.gate.weight", (c.num_experts, hidden)),
                "experts_gate_up": gate_up, "experts_down": down}

    def _fused(
        self, prefix: str, kind: str, rows: Sequence[int], parts: Sequence[str], cols: int | None
    ) -> torch.Tensor:
        """One tensor of ``sum(rows)`` rows whose row blocks are registered under ``parts``."""
        shape = (sum(rows), cols) if cols is not None else (sum(rows),)
        fused = torch.zeros(shape, device=self.device, dtype=self.dtype)
        start = 0
        for part, count in zip(parts, rows, strict=True):
            self._params[f"{prefix}.{part}.{kind}"] = fused[start : start + count]
            start += count
        return fused

    def _ensure_rope(self, length: int) -> None:
        """Cos/sin tables for positions ``0 .. length-1`` (Hugging Face's default rotary).

        The sine table carries the half-rotation's sign (``-sin`` on the first half), so the
        rotation is ``x * cos + roll(x, dim/2) * sin``: one roll instead of slice, negate, cat.
        """
        if length <= self._rope_len:
            return
        dim = self.config.head_dim
        inv_freq = 1.0 / (
            self.config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
        )
        freqs = torch.arange(length, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        sin = emb.sin()
        sin[:, : dim // 2] = -sin[:, : dim // 2]
        self._cos = emb.cos().to(self.device, self.dtype)
        self._sin = sin.to(self.device, self.dtype)
        self._arange = torch.arange(length, device=self.device)
        self._rope_len = length

    # --- parameters ---------------------------------------------------------------------

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """Hugging Face name -> tensor (views into the fused tensors; do not resize)."""
        return dict(self._params)

    def load_state_dict_inplace(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> int:
        """Copies tensors into the parameters of the same Hugging Face names.

        Every name and shape is checked before anything is copied, so a bad input changes
        nothing. A subset of the parameters may be given. ``lm_head.weight`` of a tied model is
        accepted as the embedding; ``*rotary_emb.inv_freq`` buffers are skipped.

        Returns:
            How many tensors were copied.

        Raises:
            EngineError: Listing the unknown names and the shape mismatches.
        """
        items = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        if self.config.num_experts:  # transformers 5's fused experts, as checkpoints name them
            items = list(experts_one_by_one(dict(items)).items())
        targets: list[tuple[torch.Tensor, torch.Tensor]] = []
        unknown, mismatched = [], []
        for name, tensor in items:
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            target = self._target(name)
            if target is None:
                unknown.append(name)
            elif tuple(tensor.shape) != tuple(target.shape):
                mismatched.append(f"{name}: got {tuple(tensor.shape)}, "
                                  f"expected {tuple(target.shape)}")
            else:
                targets.append((target, tensor))
        if unknown or mismatched:
            parts = []
            if unknown:
                parts.append(f"unknown names {unknown}")
            if mismatched:
                parts.append(f"shape mismatches {mismatched}")
            raise EngineError("weights do not match the model: " + "; ".join(parts))
        with torch.inference_mode():
            for target, tensor in targets:
                target.copy_(tensor)
        return len(targets)

    def _target(self, name: str) -> torch.Tensor | None:
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            return self.embed
        return self._params.get(name)

    # --- forward ------------------------------------------------------------------------

    def new_cache(self, num_slots: int, max_len: int, *, initial_len: int = 512) -> KVCache:
        """An empty KV cache of ``num_slots`` slots, each up to ``max_len`` positions (memory
        for ``initial_len`` of them at first; it grows on demand)."""
        self._ensure_rope(max_len)
        return KVCache(self.config, num_slots, max_len, device=self.device, dtype=self.dtype,
                       initial_len=initial_len)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Full causal forward without a cache: ``[batch, seq]`` ids -> float32 logits
        ``[batch, seq, vocab]``."""
        with torch.inference_mode():
            ids = input_ids.to(self.device)
            batch, seq = ids.shape
            self._ensure_rope(seq)
            cos, sin = self._cos[None, :seq, None], self._sin[None, :seq, None]

            def attend(_index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
                return _causal_attention(q, k, v)

            hidden = self._trunk(F.embedding(ids, self.embed), cos, sin, attend)
            return self._logits(hidden.reshape(batch * seq, -1)).view(batch, seq, -1)

    def prefill(self, cache: KVCache, sequences: Sequence[Sequence[int]],
                slots: Sequence[int]) -> torch.Tensor:
        """Runs new sequences from position 0 and stores their keys/values in ``slots``.

        Sequences of different lengths are right-padded into one batch; the causal mask keeps
        real tokens from seeing the padding, and the padding's cache entries lie past each
        slot's length, where decoding masks them and later overwrites them.

        Returns:
            Float32 logits ``[len(sequences), vocab]`` at each sequence's last token.
        """
        with torch.inference_mode():
            lengths = [len(s) for s in sequences]
            longest = max(lengths)
            cache.ensure_capacity(longest, max(slots) + 1)
            padded = torch.zeros((len(sequences), longest), dtype=torch.long)
            for row, seq in enumerate(sequences):
                padded[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
            ids = padded.to(self.device)
            slot_index = torch.as_tensor(list(slots), dtype=torch.long, device=self.device)
            cos, sin = self._cos[None, :longest, None], self._sin[None, :longest, None]

            def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
                cache.k[index, slot_index, :longest] = k
                cache.v[index, slot_index, :longest] = v
                return _causal_attention(q, k, v)

            def route(index: int, chosen: torch.Tensor) -> None:
                assert cache.routes is not None
                cache.routes[slot_index, :longest, index] = chosen.to(torch.int16)

            hidden = self._trunk(F.embedding(ids, self.embed), cos, sin, attend, route)
            last = torch.as_tensor([n - 1 for n in lengths], device=self.device)
            rows = torch.arange(len(sequences), device=self.device)
            return self._logits(hidden[rows, last])

    def extend(self, cache: KVCache, suffixes: Sequence[Sequence[int]], slots: Sequence[int],
               starts: Sequence[int]) -> torch.Tensor:
        """Runs each slot's next tokens after the ``starts[i]`` positions its cache already
        holds (a prefix-cache hit), storing their keys and values after them.

        The suffixes are right-padded into one batch; each query attends to its slot's cached
        positions and to the suffix up to itself. The padding's entries land past each slot's
        length, where decoding masks them and later overwrites them; so the cache must hold
        ``max(starts) + longest suffix`` positions (one row at a time needs only its own).

        Returns:
            Float32 logits ``[len(suffixes), vocab]`` at each suffix's last token.
        """
        with torch.inference_mode():
            lengths = [len(s) for s in suffixes]
            width, total = max(lengths), max(starts) + max(lengths)
            cache.ensure_capacity(total, max(slots) + 1)
            self._ensure_rope(total)
            padded = torch.zeros((len(suffixes), width), dtype=torch.long)
            for row, suffix in enumerate(suffixes):
                padded[row, : len(suffix)] = torch.as_tensor(suffix, dtype=torch.long)
            ids = padded.to(self.device)
            slot_index = torch.as_tensor(list(slots), dtype=torch.long, device=self.device)
            positions = (torch.as_tensor(list(starts), device=self.device)[:, None]
                         + self._arange[None, :width])  # [n, width]
            cos, sin = self._cos[positions][:, :, None], self._sin[positions][:, :, None]
            # additive mask [n, 1, width, total]: a query sees the keys up to its own position
            mask = torch.zeros((len(suffixes), 1, width, total), device=self.device, dtype=self.dtype)
            mask.masked_fill_((self._arange[:total][None, None] > positions[:, :, None])[:, None],
                              float("-inf"))

            def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
                cache.k[index][slot_index[:, None], positions] = k
                cache.v[index][slot_index[:, None], positions] = v
                k_ctx = cache.k[index].index_select(0, slot_index)[:, :total]
                v_ctx = cache.v[index].index_select(0, slot_index)[:, :total]
                out = F.scaled_dot_product_attention(
                    q.transpose(1, 2), k_ctx.transpose(1, 2), v_ctx.transpose(1, 2),
                    attn_mask=mask, enable_gqa=True)
                return out.transpose(1, 2)

            def route(index: int, chosen: torch.Tensor) -> None:
                assert cache.routes is not None
                cache.routes[slot_index[:, None], positions, index] = chosen.to(torch.int16)

            hidden = self._trunk(F.embedding(ids, self.embed), cos, sin, attend, route)
            last = torch.as_tensor([n - 1 for n in lengths], device=self.device)
            rows = torch.arange(len(suffixes), device=self.device)
            return self._logits(hidden[rows, last])

    def decode(
        self, cache: KVCache, tokens: torch.Tensor, positions: Sequence[int],
        slots: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Advances each slot by one token.

        Args:
            cache: The cache the slots live in.
            tokens: ``[n]`` token ids, one per slot.
            positions: Each slot's current length: where its token is written.
            slots: The slots, in ``tokens`` order; ``None`` means ``0 .. n-1``, the fast path
                (the cache is sliced, not gathered).

        Returns:
            Float32 logits ``[n, vocab]``.
        """
        with torch.inference_mode():
            count, span = len(positions), max(positions) + 1
            cache.ensure_capacity(span, count if slots is None else max(slots) + 1)
            pos = torch.tensor(positions, dtype=torch.long, device=self.device)
            if slots is None:
                slot_index = self._arange[:count]
            else:
                slot_index = torch.tensor(list(slots), dtype=torch.long, device=self.device)
            # additive mask over the cached span: a slot sees positions up to its own
            mask = torch.zeros((count, 1, 1, span), device=self.device, dtype=self.dtype)
            mask.masked_fill_((self._arange[:span] > pos[:, None])[:, None, None], float("-inf"))
            cos = self._cos.index_select(0, pos)[:, None]
            sin = self._sin.index_select(0, pos)[:, None]
            hidden = self.embed.index_select(0, tokens.to(self.device))
            rope_mask, gathered = (cos, sin, mask), slots is not None
            for index, layer in enumerate(self._layers):
                hidden, chosen = self._decode_layer(layer, hidden, cache.k[index], cache.v[index],
                                                    slot_index, pos, span, rope_mask, gathered)
                if chosen is not None and cache.routes is not None:
                    cache.routes[slot_index, pos, index] = chosen.to(torch.int16)
            return self._logits(hidden)

    def _decode_layer(
        self, layer: _Layer, hidden: torch.Tensor, k_all: torch.Tensor, v_all: torch.Tensor,
        slot_index: torch.Tensor, pos: torch.Tensor, span: int,
        rope_mask: tuple[torch.Tensor, torch.Tensor, torch.Tensor], gathered: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One layer for one token per row, on 2-D ``[n, hidden]`` activations; returns them and,
        for a mixture of experts, the experts each row was routed to ``[n, topk]``.

        Written apart from :meth:`_trunk` because at decode time the count of torch calls, not
        their arithmetic, bounds a small model: 2-D tensors avoid reshapes, and the residual
        additions ride on the output projections (``addmm``).
        """
        c = self.config
        cos, sin, mask = rope_mask
        count, heads, kv_heads = hidden.shape[0], c.num_heads, c.num_kv_heads
        normed = self._rms_norm(hidden, layer.ln1)
        qkv = _project(normed, layer.w_qkv_t, layer.b_qkv).view(count, -1, c.head_dim)
        qk = qkv[:, : heads + kv_heads]
        if layer.q_norm is not None:
            qk = self._head_norm(layer, qk)
        qk = torch.addcmul(qk * cos, qk.roll(c.head_dim // 2, dims=-1), sin)
        k_all.index_put_((slot_index, pos), qk[:, heads:])
        v_all.index_put_((slot_index, pos), qkv[:, heads + kv_heads :])
        if gathered:
            k_ctx = k_all.index_select(0, slot_index)[:, :span]
            v_ctx = v_all.index_select(0, slot_index)[:, :span]
        else:
            k_ctx, v_ctx = k_all[:count, :span], v_all[:count, :span]
        attn = F.scaled_dot_product_attention(
            qk[:, :heads, None], k_ctx.transpose(1, 2), v_ctx.transpose(1, 2), attn_mask=mask,
            enable_gqa=True,
        )
        hidden = _project(attn.reshape(count, -1), layer.w_o_t, layer.b_o, residual=hidden)
        normed = self._rms_norm(hidden, layer.ln2)
        if layer.router_t is not None:
            out, chosen = self._experts(layer, normed)
            return hidden + out, chosen
        assert layer.w_gate_up_t is not None and layer.w_down_t is not None
        gate_up = _project(normed, layer.w_gate_up_t, layer.b_gate_up)
        inter = c.intermediate_size
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        return _project(act, layer.w_down_t, layer.b_down, residual=hidden), None

    def _head_norm(self, layer: _Layer, qk: torch.Tensor) -> torch.Tensor:
        """Qwen3's RMSNorm of each query head (``q_norm``) and key head (``k_norm``) over the
        head width, on ``[..., heads + kv_heads, dim]``."""
        c = self.config
        assert layer.q_norm is not None and layer.k_norm is not None
        weight = torch.cat([layer.q_norm.expand(c.num_heads, -1), layer.k_norm.expand(c.num_kv_heads, -1)])
        return F.rms_norm(qk, (c.head_dim,), eps=c.rms_norm_eps) * weight

    def _experts(self, layer: _Layer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A mixture of experts on ``[n, hidden]`` rows, as ``Qwen3MoeSparseMoeBlock`` computes
        it: softmax router scores (float32), the ``moe_topk`` best kept (renormalised when
        ``norm_topk_prob``), each chosen expert's SwiGLU output weighted by its score and added
        in ascending expert order. Returns the output and the chosen experts ``[n, topk]``."""
        c = self.config
        assert layer.router_t is not None and layer.experts_gate_up is not None
        assert layer.experts_down is not None
        scores = torch.softmax(torch.mm(x, layer.router_t), dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(scores, c.moe_topk, dim=-1)
        if c.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        out = torch.zeros_like(x)
        for expert in torch.unique(chosen).tolist():
            rows, rank = (chosen == expert).nonzero(as_tuple=True)
            gate, up = torch.mm(x.index_select(0, rows), layer.experts_gate_up[expert].t()).chunk(2, dim=-1)
            y = torch.mm(F.silu(gate) * up, layer.experts_down[expert].t())
            out.index_add_(0, rows, y * weights[rows, rank, None])
        return out, chosen

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Hugging Face's RMSNorm: ``weight * (x * rsqrt(mean(x^2) + eps))``, statistics in
        float32.

        Written with tensor constants and in-place steps: Python scalars would each cost a
        tensor conversion, and at decode time op count, not arithmetic, is the bill.
        """
        if x.dtype != torch.float32:
            return weight * self._rms_norm(x.float(), self._ones).to(x.dtype)
        inv_rms = torch.addcmul(self._eps, (x * x).sum(-1, keepdim=True), self._inv_width)
        return torch.mul(x, inv_rms.rsqrt_()).mul_(weight)

    def _trunk(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
        attend: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
        route: Callable[[int, torch.Tensor], None] | None = None,
    ) -> torch.Tensor:
        """The decoder layers on ``[batch, seq, hidden]``; ``attend(layer, q, k, v)`` takes
        ``[batch, seq, heads, dim]`` tensors and returns the attention output in that layout;
        ``route(layer, chosen)`` is given a mixture of experts' choices ``[batch, seq, topk]``."""
        c = self.config
        batch, seq, _ = hidden.shape
        heads, kv_heads, dim = c.num_heads, c.num_kv_heads, c.head_dim
        for index, layer in enumerate(self._layers):
            normed = self._rms_norm(hidden, layer.ln1)
            qkv = F.linear(normed, layer.w_qkv, layer.b_qkv).view(batch, seq, -1, dim)
            # rotary on q and k together (the first heads + kv_heads heads)
            qk = qkv[:, :, : heads + kv_heads]
            if layer.q_norm is not None:
                qk = self._head_norm(layer, qk)
            qk = torch.addcmul(qk * cos, qk.roll(dim // 2, dims=-1), sin)
            attn = attend(index, qk[:, :, :heads], qk[:, :, heads:], qkv[:, :, heads + kv_heads :])
            hidden = hidden + F.linear(attn.reshape(batch, seq, heads * dim), layer.w_o, layer.b_o)
            normed = self._rms_norm(hidden, layer.ln2)
            if layer.router_t is not None:
                out, chosen = self._experts(layer, normed.reshape(batch * seq, -1))
                if route is not None:
                    route(index, chosen.view(batch, seq, -1))
                hidden = hidden + out.view(batch, seq, -1)
                continue
            assert layer.w_gate_up is not None and layer.w_down is not None
            gate, up = F.linear(normed, layer.w_gate_up, layer.b_gate_up).chunk(2, dim=-1)
            hidden = hidden + F.linear(F.silu(gate) * up, layer.w_down, layer.b_down)
        return hidden

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and ``lm_head`` on ``[n, hidden]`` rows -> float32 ``[n, vocab]``."""
        return torch.mm(self._rms_norm(hidden, self.final_norm), self.lm_head_t).float()


def _project(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """``residual + x @ weight_t + bias`` on 2-D tensors in as few torch calls as possible."""
    if residual is None:
        return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)
    out = torch.addmm(residual, x, weight_t)
    return out if bias is None else out + bias


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal grouped-query attention on ``[batch, seq, heads, dim]`` tensors."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
    )
    return out.transpose(1, 2)
