"""The tool-call record shared by parsers, environments and rollouts."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

TOOL_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
"""Valid tool names: a letter or underscore, then up to 63 letters, digits, ``_``, ``.`` or ``-``.

Every tool-call format can carry such a name (``pythonic`` additionally needs each dot-separated
part to be a Python identifier, so no ``-``)."""


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for.

    Attributes:
        name: Tool name as the model wrote it (may be unknown to the env).
        arguments: Decoded arguments. Always a ``dict`` once parsed; validation against the
            tool's schema happens later, at dispatch.
        id: Call id, if the format or the caller assigns one (used as ``tool_call_id`` in the
            ``role: tool`` reply).
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None

    def to_message_dict(self) -> dict[str, Any]:
        """The OpenAI / Hugging Face chat-template form of this call."""
        out: dict[str, Any] = {
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if self.id is not None:
            out["id"] = self.id
        return out


@dataclass(frozen=True)
class ParsedTurn:
    """An assistant turn split into free text and tool calls.

    Attributes:
        content: The text outside the tool-call markup, stripped of surrounding whitespace.
        tool_calls: The calls, in the order written.
    """

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
