"""Tool-call formats: how calls are written into, and read back from, assistant text.

Each format is a stateless :class:`ToolCallFormat`; look one up by its registry name (matching
SGLang's ``--tool-call-parser`` names where one exists) with :func:`get_format`.
"""

from __future__ import annotations

from agentrl.tools.formats.base import ToolCallFormat
from agentrl.tools.formats.hermes import HermesFormat
from agentrl.tools.formats.llama3 import Llama3JsonFormat
from agentrl.tools.formats.mistral import MistralFormat
from agentrl.tools.formats.pythonic import PythonicFormat
from agentrl.tools.formats.qwen3_coder import Qwen3CoderFormat

__all__ = [
    "FORMATS",
    "HermesFormat",
    "Llama3JsonFormat",
    "MistralFormat",
    "PythonicFormat",
    "Qwen3CoderFormat",
    "ToolCallFormat",
    "available_formats",
    "get_format",
]

FORMATS: dict[str, type[ToolCallFormat]] = {
    "hermes": HermesFormat,
    "qwen25": HermesFormat,
    "llama3": Llama3JsonFormat,
    "mistral": MistralFormat,
    "qwen3_coder": Qwen3CoderFormat,
    "pythonic": PythonicFormat,
}
"""Registry name (aliases included) -> format class."""


def available_formats() -> list[str]:
    """The registered format names, aliases included, sorted."""
    return sorted(FORMATS)


def get_format(name: str) -> ToolCallFormat:
    """Returns an instance of the format registered as ``name``.

    Args:
        name: A registry name such as ``"hermes"`` or the alias ``"qwen25"``.

    Raises:
        ValueError: No format has that name; the message lists the known names.
    """
    cls = FORMATS.get(name) if isinstance(name, str) else None
    if cls is None:
        known = ", ".join(available_formats())
        raise ValueError(f"unknown tool-call format {name!r}; known formats: {known}")
    return cls()
