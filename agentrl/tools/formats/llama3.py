"""The Llama 3.x JSON tool-call format (``llama3``).

Calls follow the ``<|python_tag|>`` token as JSON objects separated by ``; ``::

    Checking both.<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}

Can carry: any number of calls, any valid tool name, any JSON-object arguments, and free text
*before* the tag. Cannot carry: text after the calls, content containing ``<|python_tag|>``,
call ids, or (when there are no calls) content that is itself a bare JSON call, since that is
read as a call.

Parsing also accepts the calls without the tag when the whole message, stripped, is one or more
``{"name": ..., "parameters" | "arguments": ...}`` objects separated by ``;``. Bare text that
starts with ``{`` but is not such a call list is plain content, not an error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from agentrl.errors import ToolCallParseError
from agentrl.tools.calls import ParsedTurn, ToolCall
from agentrl.tools.formats._common import (
    JSON_ERRORS,
    call_from_object,
    check_arguments,
    check_render_name,
    dumps,
    parse_error,
    raw_decode,
)
from agentrl.tools.formats.base import ToolCallFormat

_TAG = "<|python_tag|>"
_skip_separators = re.compile(r"[\s;]*").match


class Llama3JsonFormat(ToolCallFormat):
    """``<|python_tag|>{"name": ..., "parameters": {...}}; ...`` after optional content."""

    name = "llama3"

    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        """Writes ``content``, the tag, then the calls joined by ``"; "``.

        Raises:
            ToolCallRenderError: An invalid tool name or non-JSON arguments.
        """
        if not calls:
            return content
        objects = "; ".join(
            dumps(
                {
                    "name": check_render_name(call.name, self.name),
                    "parameters": check_arguments(call.arguments, self.name),
                },
                self.name,
            )
            for call in calls
        )
        return f"{content}{_TAG}{objects}"

    def parse(self, text: str) -> ParsedTurn:
        """Splits ``text`` into content and the calls after ``<|python_tag|>`` (or bare JSON).

        Raises:
            ToolCallParseError: After the tag: no call, anything but JSON objects separated by
                ``;`` or whitespace, a bad name or non-object arguments.
        """
        tag = text.find(_TAG)
        if tag >= 0:
            calls = self._parse_calls(text, tag + len(_TAG), require_arguments=False)
            if not calls:
                raise parse_error(self.name, "no tool call after <|python_tag|>", tag)
            return ParsedTurn(text[:tag].strip(), calls)
        stripped = text.strip()
        if stripped.startswith("{"):
            try:
                return ParsedTurn("", self._parse_calls(stripped, 0, require_arguments=True))
            except ToolCallParseError:
                pass
        return ParsedTurn(stripped)

    def _parse_calls(self, text: str, pos: int, *, require_arguments: bool) -> tuple[ToolCall, ...]:
        """Decodes JSON call objects from ``pos`` to the end of ``text``."""
        calls: list[ToolCall] = []
        size = len(text)
        pos = _skip_separators(text, pos).end()
        while pos < size:
            if text[pos] != "{":
                raise parse_error(self.name, "expected a JSON object", pos)
            try:
                obj, end = raw_decode(text, pos)
            except JSON_ERRORS:
                raise parse_error(self.name, "invalid JSON in tool call", pos) from None
            calls.append(call_from_object(obj, self.name, pos, require_arguments=require_arguments))
            pos = _skip_separators(text, end).end()
        return tuple(calls)
