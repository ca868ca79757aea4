"""Reading Hugging Face ``config.json`` fields that both the engine and the trainer need."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["rope_theta"]


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
                        "default rotary embedding is supported")  # fmt: skip
        return float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    scaling = raw.get("rope_scaling")
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind not in (None, "default"):
            raise error(f"config field 'rope_scaling' has type {kind!r}; only the "
                        "default rotary embedding is supported")  # fmt: skip
    return float(raw.get("rope_theta", 10000.0))
