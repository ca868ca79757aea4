"""Inference engines behind one token-in/token-out contract (:class:`Engine`).

:class:`EmbeddedEngine` runs the policy in process with torch (CPU or CUDA);
:mod:`~agentrl.engine.sglang` and :mod:`~agentrl.engine.vllm` are the clients of
SGLang and vLLM servers (over :mod:`~agentrl.engine.http`). The contract (:mod:`agentrl.engine.base`) does not import torch, and neither
does this package until ``EmbeddedEngine`` is first asked for, so that importing the contract
(which runs this file first) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrl.engine.base import Engine, FinishReason, GenerateOutput, RoutedExperts, SamplingParams

if TYPE_CHECKING:
    from agentrl.engine.embedded import EmbeddedEngine

__all__ = ["EmbeddedEngine", "Engine", "FinishReason", "GenerateOutput", "RoutedExperts", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "EmbeddedEngine":
        from agentrl.engine.embedded import EmbeddedEngine

        return EmbeddedEngine
    raise AttributeError(f"module 'agentrl.engine' has no attribute {name!r}")
