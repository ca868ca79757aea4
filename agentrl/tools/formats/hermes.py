"""The Hermes / Qwen2.5 tool-call format (``hermes``, alias ``qwen25``).

Each call is a JSON object in its own block::

    Let me look that up.
    <tool_call>
    {"name": "search", "arguments": {"query": "llamas"}}
    </tool_call>

Can carry: any number of calls, any valid tool name, any JSON-object arguments, and free text
before, between and after the blocks (parsed back as one stripped string, the pieces joined by
newlines; rendering puts all content first). Cannot carry: content containing ``<tool_call>``
(it would read as a block) or call ids.

Parsing also accepts ``"arguments"`` given as a JSON string holding an object and
``"parameters"`` as a synonym of ``"arguments"``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from agentrl.tools.calls import ParsedTurn, ToolCall
from agentrl.tools.formats._common import (
    JSON_ERRORS,
    add_content,
    call_from_object,
    check_arguments,
    check_render_name,
    dumps,
    parse_error,
    raw_decode,
    skip_ws,
)
from agentrl.tools.formats.base import ToolCallFormat

_OPEN = "<tool_call>"
_CLOSE = "</tool_call>"
_OPEN_LEN = len(_OPEN)
_NL_CLOSE = "\n" + _CLOSE
_NL_CLOSE_LEN = len(_NL_CLOSE)
_match_close = re.compile(r"\s*</tool_call>").match


class HermesFormat(ToolCallFormat):
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks."""

    name = "hermes"

    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        """Writes ``content``, then one ``<tool_call>`` block per call, newline-separated.

        Raises:
            ToolCallRenderError: An invalid tool name or non-JSON arguments.
        """
        blocks = [
            f"{_OPEN}\n"
            + dumps(
                {
                    "name": check_render_name(call.name, self.name),
                    "arguments": check_arguments(call.arguments, self.name),
                },
                self.name,
            )
            + f"\n{_CLOSE}"
            for call in calls
        ]
        if not blocks:
            return content
        body = "\n".join(blocks)
        return f"{content}\n{body}" if content else body

    def parse(self, text: str) -> ParsedTurn:
        """Splits ``text`` into content and the calls of its ``<tool_call>`` blocks.

        Raises:
            ToolCallParseError: An unclosed block, invalid JSON inside one, text between the
                JSON and ``</tool_call>``, a bad name or non-object arguments.
        """
        start = text.find(_OPEN)
        if start < 0:
            return ParsedTurn(text.strip())
        pieces: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        while start >= 0:
            add_content(pieces, text[pos:start])
            at = start + _OPEN_LEN
            # Fast path for the canonical layout, "<tool_call>\n{...}\n</tool_call>".
            at = at + 1 if text.startswith("\n{", at) else skip_ws(text, at).end()
            try:
                obj, end = raw_decode(text, at)
            except JSON_ERRORS:
                if text.find(_CLOSE, at) < 0:
                    raise parse_error(self.name, "unclosed <tool_call>", start) from None
                raise parse_error(self.name, "invalid JSON in <tool_call>", at) from None
            if text.startswith(_NL_CLOSE, end):
                pos = end + _NL_CLOSE_LEN
            else:
                close = _match_close(text, end)
                if close is None:
                    if text.find(_CLOSE, end) < 0:
                        raise parse_error(self.name, "unclosed <tool_call>", start)
                    raise parse_error(self.name, "unexpected text after the call's JSON", end)
                pos = close.end()
            calls.append(call_from_object(obj, self.name, start))
            start = text.find(_OPEN, pos)
        add_content(pieces, text[pos:])
        return ParsedTurn("\n".join(pieces), tuple(calls))
