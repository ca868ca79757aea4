"""Core attention through ``torch.nn.functional.scaled_dot_product_attention`` for megatron's
local layer spec.

megatron-core's local ``DotProductAttention`` materialises the ``[b * heads, s, s]`` score
matrix (``baddbmm``, a masked softmax, ``bmm``) and repeats grouped key/value heads; on GPUs
Transformer Engine's fused attention replaces it, but without Transformer Engine (CPU, or GPUs
without it) that unfused path is the slowest part of a layer. This subclass sends the common
case - causal self-attention without an explicit mask, without attention dropout, with the
vanilla softmax - to torch's fused kernel (grouped-query attention included) and falls back to
megatron's own code for anything else, so behaviour is unchanged.

Packed sequences (the samples of a micro-batch concatenated into one sequence) are attended
sample by sample, each with its own causal kernel call, so no token attends across a sample
boundary; a loop over the samples needs no ``[t, t]`` mask, which a block-diagonal mask would.
Two forms come in: Megatron's ``thd`` format (``cu_seqlens``; megatron applies the rotary
embedding per sample, reading the boundaries back from the device at every layer), and
agentrl's own (:func:`agentrl.trainer.trained_positions.packed_trained_logprobs`): an ``sbhd``
batch of one row whose ``packed_seq_params`` carries the boundaries on the host
(``host_bounds``) and whose rotary embedding was taken at each token's own position, so no
layer reads the device. Without Transformer Engine, megatron's own attention has no packed
path.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

__all__ = ["SDPADotProductAttention", "use_sdpa_attention"]


class SDPADotProductAttention(DotProductAttention):
    """``DotProductAttention`` with torch's fused kernel for causal, mask-less attention."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: Any = None,
                attention_bias: Any = None, packed_seq_params: Any = None) -> torch.Tensor:
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        if packed_seq_params is not None and getattr(packed_seq_params, "qkv_format", None) == "thd":
            return self._packed(query, key, value, packed_seq_params)
        if getattr(packed_seq_params, "host_bounds", None) is not None:  # agentrl's packing (sbhd, b=1)
            context = self._packed(query[:, 0], key[:, 0], value[:, 0], packed_seq_params)
            return context.view(context.shape[0], 1, self.hidden_size_per_partition)
        fusable = (
            attention_mask is None and mask_type == AttnMaskType.causal
            and attention_bias is None and packed_seq_params is None
            and getattr(self.config, "softmax_type", "vanilla") == "vanilla"
            and not (self.training and self.config.attention_dropout > 0)
        )
        if not fusable:
            return super().forward(query, key, value, attention_mask, attn_mask_type,
                                   attention_bias, packed_seq_params)
        # [s, b, heads, dim] -> [b, heads, s, dim]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        context = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.softmax_scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )
        # [b, heads, s, dim] -> [s, b, heads * dim]
        context = context.permute(2, 0, 1, 3).contiguous()
        return context.view(*context.shape[:2], self.hidden_size_per_partition)

    def _packed(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                params: Any) -> torch.Tensor:
        """``[t, heads, dim]`` packed queries, keys and values -> ``[t, heads * dim]``, each
        sample (``params.cu_seqlens_q``) attending causally to itself only."""
        dropout = self.config.attention_dropout if self.training else 0.0
        bounds = getattr(params, "host_bounds", None)  # set by agentrl's packing: no device read
        if bounds is None:
            bounds = params.cu_seqlens_q.tolist()
        outputs = []
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            # [len, heads, dim] -> [1, heads, len, dim]
            q, k, v = (t[start:end].permute(1, 0, 2).unsqueeze(0) for t in (query, key, value))
            context = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale,
                                                     dropout_p=dropout, enable_gqa=q.shape[1] != k.shape[1])
            outputs.append(context[0].permute(1, 0, 2))  # [len, heads, dim]
        context = torch.cat(outputs).contiguous()
        return context.view(context.shape[0], self.hidden_size_per_partition)


def use_sdpa_attention(layer_spec: Any) -> Any:
    """Points a local layer spec's core attention at :class:`SDPADotProductAttention`."""
    layer_spec.submodules.self_attention.submodules.core_attention = SDPADotProductAttention
    return layer_spec
