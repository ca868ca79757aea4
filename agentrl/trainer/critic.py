"""The PPO critic: a megatron GPT trunk with a scalar value head.

The trunk is the policy's architecture without its output layer (``post_process=False``),
initialised from the same Hugging Face weights; the head is the model's final RMSNorm (from
``model.norm.weight``) and a linear map to one value, initialised to zero so the first values are
0 and GAE starts from the plain reward. Values sit in the trainer's shifted layout (see
:mod:`agentrl.trainer.batch`): ``values[b, i]`` is computed from the hidden state at position
``i``, the state in which token ``i + 1`` is generated, i.e. the same positions as the log-probs.
The head's parameters are replicated over tensor-parallel ranks (their inputs are identical after
the trunk's all-reduces, so their gradients are too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from megatron.core.transformer.module import MegatronModule

from agentrl.trainer.hf_convert import build_gpt_model
from agentrl.trainer.hf_weights import load_hf_weights, read_hf_state_dict

__all__ = ["ValueModel"]


class ValueModel(MegatronModule):
    """``[b, L]`` token ids -> ``[b, L]`` values.

    Args:
        hf_config: The Hugging Face config of the trunk.
        params_dtype: Parameter dtype.
        hf_checkpoint: Weights for the trunk and the norm, or ``None`` (random trunk).
        **overrides: Passed to :func:`~agentrl.trainer.hf_convert.build_gpt_model`.
    """

    def __init__(self, hf_config: dict[str, Any], *, params_dtype: torch.dtype,
                 hf_checkpoint: str | Path | None, **overrides: Any) -> None:
        trunk = build_gpt_model(hf_config, post_process=False, params_dtype=params_dtype, **overrides)
        super().__init__(config=trunk.config)
        self.trunk = trunk
        hidden = int(hf_config["hidden_size"])
        self.norm_weight = torch.nn.Parameter(torch.ones(hidden, dtype=params_dtype))
        self.eps = float(hf_config.get("rms_norm_eps", 1e-6))
        self.head = torch.nn.Linear(hidden, 1, dtype=params_dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        if hf_checkpoint is not None:
            state = read_hf_state_dict(hf_checkpoint)
            load_hf_weights(self.trunk, {k: v for k, v in state.items()
                                         if k not in ("model.norm.weight", "lm_head.weight")})
            with torch.no_grad():
                self.norm_weight.copy_(state["model.norm.weight"])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        hidden = self.trunk(tokens, positions, None)  # [L, b, h]
        hidden = hidden.transpose(0, 1).float()  # [b, L, h]
        normed = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.eps)
        normed = (normed * self.norm_weight.float()).to(self.head.weight.dtype)
        return self.head(normed)[..., 0].float()  # [b, L]
