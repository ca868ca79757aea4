"""The Mistral tool-call format (``mistral``).

Calls follow the ``[TOOL_CALLS]`` token as one JSON array::

    Sure.[TOOL_CALLS] [{"name": "search", "arguments": {"query": "llamas"}}]

Can carry: any number of calls, any valid tool name, any JSON-object arguments, and free text
*before* the marker. Cannot carry: text after the calls, content containing ``[TOOL_CALLS]``, or
call ids (an ``"id"`` written by the model is ignored).

Parsing also accepts a single object instead of an array, ``"parameters"`` or a JSON string for
``"arguments"``, and several ``[TOOL_CALLS]`` arrays one after another.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentrl.tools.calls import ParsedTurn, ToolCall
from agentrl.tools.formats._common import (
    JSON_ERRORS,
    call_from_object,
    check_arguments,
    check_render_name,
    dumps,
    parse_error,
    raw_decode,
    skip_ws,
)
from agentrl.tools.formats.base import ToolCallFormat

_MARKER = "[TOOL_CALLS]"
_MARKER_LEN = len(_MARKER)


class MistralFormat(ToolCallFormat):
    """``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` after optional content."""

    name = "mistral"

    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        """Writes ``content``, the marker, then all calls as one JSON array.

        Raises:
            ToolCallRenderError: An invalid tool name or non-JSON arguments.
        """
        if not calls:
            return content
        array = dumps(
            [
                {
                    "name": check_render_name(call.name, self.name),
                    "arguments": check_arguments(call.arguments, self.name),
                }
                for call in calls
            ],
            self.name,
        )
        return f"{content}{_MARKER} {array}"

    def parse(self, text: str) -> ParsedTurn:
        """Splits ``text`` into the content before ``[TOOL_CALLS]`` and the calls after it.

        Raises:
            ToolCallParseError: Invalid JSON, something other than an array of call objects,
                text after the calls, a bad name or non-object arguments.
        """
        marker = text.find(_MARKER)
        if marker < 0:
            return ParsedTurn(text.strip())
        calls: list[ToolCall] = []
        size = len(text)
        pos = marker + _MARKER_LEN
        while True:
            pos = skip_ws(text, pos).end()
            try:
                obj, end = raw_decode(text, pos)
            except JSON_ERRORS:
                raise parse_error(self.name, "invalid JSON after [TOOL_CALLS]", pos) from None
            items = obj if type(obj) is list else [obj]
            calls.extend(call_from_object(item, self.name, pos) for item in items)
            pos = skip_ws(text, end).end()
            if pos == size:
                break
            if not text.startswith(_MARKER, pos):
                raise parse_error(self.name, "unexpected text after the tool calls", pos)
            pos += _MARKER_LEN
        return ParsedTurn(text[:marker].strip(), tuple(calls))
