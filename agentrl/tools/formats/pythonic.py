"""The pythonic tool-call format (``pythonic``, as used by Llama 3.2 / Llama 4).

The calls are a Python list of function calls with keyword arguments, ending the message::

    Let me check.
    [get_weather(city="Paris", days=3), geo.lookup(query="Paris")]

Can carry: any number of calls; names whose dot-separated parts are Python identifiers (no
``-``, no keywords); argument keys that are Python identifiers (no keywords, NFKC-normalised);
values that are ``None``, bools, ints, finite floats, strings, lists and dicts with string keys;
free text *before* the list. Cannot carry: text after the list, positional arguments, call ids,
or content that itself contains a call list such as ``[f(``.
"""

from __future__ import annotations

import ast
import keyword
import math
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

from agentrl.errors import ToolCallParseError, ToolCallRenderError
from agentrl.tools.calls import ParsedTurn, ToolCall
from agentrl.tools.formats._common import check_render_name, is_valid_name, parse_error
from agentrl.tools.formats.base import ToolCallFormat

_CALL_LIST_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_MAX_CANDIDATES = 64
"""Start positions tried before giving up, bounding the cost of adversarial text."""
_AST_ERRORS = (SyntaxError, ValueError, TypeError, RecursionError, MemoryError, OverflowError)


def _is_identifier(text: str) -> bool:
    """Whether ``text`` survives as a Python identifier (keyword arg or name part) unchanged."""
    return (
        text.isidentifier()
        and not keyword.iskeyword(text)
        and unicodedata.normalize("NFKC", text) == text
    )


def _literal(value: Any, format_name: str) -> str:
    """Python source for a JSON value, readable back with ``ast.literal_eval``."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ToolCallRenderError(f"{format_name}: non-finite float {value!r}")
        return float.__repr__(value)
    if isinstance(value, str):
        return str.__repr__(value)
    if isinstance(value, list):
        return "[" + ", ".join(_literal(item, format_name) for item in value) + "]"
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise ToolCallRenderError(f"{format_name}: non-string dict key {key!r}")
            items.append(f"{str.__repr__(key)}: {_literal(item, format_name)}")
        return "{" + ", ".join(items) + "}"
    raise ToolCallRenderError(f"{format_name}: cannot write a {type(value).__name__} value")


def _to_json(value: Any) -> Any:
    """Checks a ``literal_eval`` result is JSON-like; tuples become lists. Raises ValueError."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("non-finite float")
        return value
    if isinstance(value, (list, tuple)):
        return [_to_json(item) for item in value]
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise ValueError("dict with a non-string key")
        return {key: _to_json(item) for key, item in value.items()}
    raise ValueError(f"{type(value).__name__} is not a JSON value")


def _dotted_name(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attribute accesses on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


class PythonicFormat(ToolCallFormat):
    """``[f(a=1, b="x"), g()]`` at the end of the message."""

    name = "pythonic"

    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        """Writes ``content``, a newline, then the call list.

        Raises:
            ToolCallRenderError: A name or key that is not an identifier, or a non-JSON value.
        """
        if not calls:
            return content
        written = []
        for call in calls:
            name = check_render_name(call.name, self.name)
            if not all(map(_is_identifier, name.split("."))):
                raise ToolCallRenderError(f"{self.name}: name {name!r} is not a dotted identifier")
            if not isinstance(call.arguments, dict):
                raise ToolCallRenderError(f"{self.name}: arguments must be a dict")
            arguments = []
            for key, value in call.arguments.items():
                if not isinstance(key, str) or not _is_identifier(key):
                    raise ToolCallRenderError(f"{self.name}: key {key!r} is not an identifier")
                try:
                    arguments.append(f"{key}={_literal(value, self.name)}")
                except (RecursionError, ValueError) as exc:
                    raise ToolCallRenderError(f"{self.name}: cannot write value: {exc}") from None
            written.append(f"{name}({', '.join(arguments)})")
        body = "[" + ", ".join(written) + "]"
        return f"{content}\n{body}" if content else body

    def parse(self, text: str) -> ParsedTurn:
        """Splits ``text`` into content and the call list that ends it.

        Raises:
            ToolCallParseError: The text contains something like ``[name(`` but does not end
                with a valid call list of keyword-only calls with literal values.
        """
        first = _CALL_LIST_START.search(text)
        if first is None:
            return ParsedTurn(text.strip())
        end = len(text.rstrip())
        if not text.endswith("]", 0, end):
            raise parse_error(
                self.name, "call list is not at the end of the message", first.start()
            )
        error: ToolCallParseError | None = None
        for count, match in enumerate(_CALL_LIST_START.finditer(text, first.start())):
            if count == _MAX_CANDIDATES:
                break
            try:
                calls = self._parse_list(text[match.start() : end], match.start())
            except ToolCallParseError as exc:
                error = error or exc
                continue
            return ParsedTurn(text[: match.start()].strip(), calls)
        raise error or parse_error(self.name, "too many candidate call lists", first.start())

    def _parse_list(self, source: str, offset: int) -> tuple[ToolCall, ...]:
        """Parses ``source``, which must be exactly one list of calls."""
        try:
            tree = ast.parse(source, mode="eval")
        except _AST_ERRORS:
            raise parse_error(self.name, "invalid Python call list", offset) from None
        if not isinstance(tree.body, ast.List):
            raise parse_error(self.name, "not a list of calls", offset)
        calls = []
        for element in tree.body.elts:
            if not isinstance(element, ast.Call):
                raise parse_error(self.name, "list element is not a call", offset)
            name = _dotted_name(element.func)
            if name is None or not is_valid_name(name):
                raise parse_error(self.name, f"invalid tool name {name!r}", offset)
            if element.args:
                raise parse_error(self.name, "positional arguments are not supported", offset)
            arguments: dict[str, Any] = {}
            for kw in element.keywords:
                if kw.arg is None or kw.arg in arguments:
                    raise parse_error(self.name, "**kwargs or a repeated keyword", offset)
                try:
                    arguments[kw.arg] = _to_json(ast.literal_eval(kw.value))
                except _AST_ERRORS:
                    raise parse_error(
                        self.name, f"argument {kw.arg!r} is not a JSON-like literal", offset
                    ) from None
            calls.append(ToolCall(name, arguments))
        return tuple(calls)
