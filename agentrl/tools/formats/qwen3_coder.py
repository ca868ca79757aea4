"""The Qwen3-Coder XML-ish tool-call format (``qwen3_coder``).

Each call is a block with one ``<parameter>`` element per argument::

    <tool_call>
    <function=search>
    <parameter=query>
    llamas
    </parameter>
    </function>
    </tool_call>

A value is read by dropping exactly one leading and one trailing newline, then decoding it as
JSON if that works and keeping the raw text otherwise. So a string is written raw only when it
is not valid JSON and holds no ``<``; every other value is written as JSON with ``<`` escaped as
``\\u003c``, which makes every JSON value round-trip exactly.

Can carry: any number of calls, any valid tool name, any JSON-object arguments whose keys hold
no ``<``, ``>``, ``=`` or newline, and free text before, between and after the blocks (parsed
back as one stripped string; rendering puts all content first). Cannot carry: such keys, content
containing ``<tool_call>``, or call ids.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from agentrl.errors import ToolCallRenderError
from agentrl.tools.calls import ParsedTurn, ToolCall
from agentrl.tools.formats._common import (
    JSON_ERRORS,
    add_content,
    check_arguments,
    check_render_name,
    dumps,
    is_valid_name,
    parse_error,
)
from agentrl.tools.formats.base import ToolCallFormat

_OPEN = "<tool_call>"
_OPEN_LEN = len(_OPEN)
_PARAM_CLOSE = "</parameter>"
_match_function = re.compile(r"\s*<function=([^>\n]*)>").match
_match_parameter = re.compile(r"\s*<parameter=([^>\n]*)>").match
_match_end = re.compile(r"\s*</function>\s*</tool_call>").match
_BAD_KEY_CHARS = frozenset("<>=\n\r")


def _render_value(value: Any, format_name: str) -> str:
    """The text between ``<parameter=KEY>\\n`` and ``\\n</parameter>`` for ``value``."""
    if isinstance(value, str) and "<" not in value:
        try:
            json.loads(value)
        except JSON_ERRORS:
            return value
    return dumps(value, format_name).replace("<", "\\u003c")


def _parse_value(raw: str) -> Any:
    """Decodes a parameter's raw text (already stripped of its framing newlines)."""
    try:
        return json.loads(raw)
    except JSON_ERRORS:
        return raw


class Qwen3CoderFormat(ToolCallFormat):
    """``<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>``."""

    name = "qwen3_coder"

    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        """Writes ``content``, then one block per call, newline-separated.

        Raises:
            ToolCallRenderError: An invalid tool name, non-JSON arguments, or a key holding
                ``<``, ``>``, ``=`` or a newline.
        """
        blocks = []
        for call in calls:
            parts = [f"{_OPEN}\n<function={check_render_name(call.name, self.name)}>\n"]
            for key, value in check_arguments(call.arguments, self.name).items():
                if not _BAD_KEY_CHARS.isdisjoint(key):
                    raise ToolCallRenderError(f"{self.name}: cannot write argument key {key!r}")
                parts.append(
                    f"<parameter={key}>\n{_render_value(value, self.name)}\n{_PARAM_CLOSE}\n"
                )
            parts.append("</function>\n</tool_call>")
            blocks.append("".join(parts))
        if not blocks:
            return content
        body = "\n".join(blocks)
        return f"{content}\n{body}" if content else body

    def parse(self, text: str) -> ParsedTurn:
        """Splits ``text`` into content and the calls of its ``<tool_call>`` blocks.

        Raises:
            ToolCallParseError: A block that is unclosed or not ``<function=...>`` followed by
                ``<parameter=...>`` elements, or a bad tool name.
        """
        start = text.find(_OPEN)
        if start < 0:
            return ParsedTurn(text.strip())
        pieces: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        while start >= 0:
            add_content(pieces, text[pos:start])
            call, pos = self._parse_block(text, start)
            calls.append(call)
            start = text.find(_OPEN, pos)
        add_content(pieces, text[pos:])
        return ParsedTurn("\n".join(pieces), tuple(calls))

    def _parse_block(self, text: str, start: int) -> tuple[ToolCall, int]:
        """Parses the block opening at ``start``; returns the call and the offset after it."""
        function = _match_function(text, start + _OPEN_LEN)
        if function is None:
            raise parse_error(self.name, "expected <function=NAME> after <tool_call>", start)
        name = function.group(1).strip()
        if not is_valid_name(name):
            raise parse_error(self.name, f"invalid tool name {name!r}", function.start(1))
        arguments: dict[str, Any] = {}
        pos = function.end()
        while True:
            end = _match_end(text, pos)
            if end is not None:
                return ToolCall(name, arguments), end.end()
            parameter = _match_parameter(text, pos)
            if parameter is None:
                raise parse_error(
                    self.name, "expected <parameter=KEY> or </function></tool_call>", pos
                )
            close = text.find(_PARAM_CLOSE, parameter.end())
            if close < 0:
                raise parse_error(self.name, "unclosed <parameter>", parameter.start())
            raw = text[parameter.end() : close]
            if raw.startswith("\n"):
                raw = raw[1:]
            if raw.endswith("\n"):
                raw = raw[:-1]
            arguments[parameter.group(1)] = _parse_value(raw)
            pos = close + len(_PARAM_CLOSE)
