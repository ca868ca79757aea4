"""Models agentrl can build locally, without a download (see :mod:`agentrl.models.tiny`), the
warm starts it ships (:mod:`agentrl.models.defaults`: the embedded default per env; the command
that makes them, ``python -m agentrl.warm``, sits at the top of the layers since it drives
evaluation and training).

:mod:`agentrl.models.hf_config` (reading a checkpoint's ``config.json``) imports nothing heavy;
the tiny model's builder loads the tokenizer libraries on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["TINY_MODEL_CONFIG", "TINY_MOE_CONFIG", "build_tiny_model", "build_tiny_moe_model"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("agentrl.models.tiny"), name)
    raise AttributeError(f"module 'agentrl.models' has no attribute {name!r}")
