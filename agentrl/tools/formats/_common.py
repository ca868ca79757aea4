"""Helpers shared by the tool-call formats: name checks, JSON writing and call-object decoding.

Everything here is on the parsing hot path, so the regexes and the JSON decoder are built once
at import time and the functions avoid needless allocation.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from agentrl.errors import ToolCallParseError, ToolCallRenderError
from agentrl.tools.calls import TOOL_NAME_PATTERN, ToolCall

is_valid_name: Callable[[str], re.Match[str] | None] = TOOL_NAME_PATTERN.fullmatch
"""``fullmatch`` of :data:`TOOL_NAME_PATTERN` (its ``$`` alone would accept a trailing newline)."""

skip_ws: Callable[..., re.Match[str]] = re.compile(r"\s*").match
"""``skip_ws(text, pos).end()`` is the first non-whitespace offset at or after ``pos``."""

raw_decode: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().raw_decode
"""Decodes one JSON value starting exactly at an offset; returns it and the offset after it."""

JSON_ERRORS = (ValueError, RecursionError)
"""What decoding untrusted JSON can raise (``JSONDecodeError`` is a ``ValueError``)."""

_ARGUMENT_KEYS = ("arguments", "parameters")


def parse_error(format_name: str, message: str, position: int | None = None) -> ToolCallParseError:
    """Builds the one exception type parsers may raise."""
    return ToolCallParseError(message, format_name=format_name, position=position)


def check_render_name(name: object, format_name: str) -> str:
    """Returns ``name`` if it is a valid tool name.

    Raises:
        ToolCallRenderError: ``name`` is not a string matching ``TOOL_NAME_PATTERN``.
    """
    if not isinstance(name, str) or not is_valid_name(name):
        raise ToolCallRenderError(f"{format_name}: invalid tool name {name!r}")
    return name


def _check_json(value: Any, format_name: str) -> None:
    """Raises ToolCallRenderError unless ``value`` survives a JSON round trip unchanged."""
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ToolCallRenderError(f"{format_name}: non-finite float {value!r}")
        return
    if isinstance(value, list):
        for item in value:
            _check_json(item, format_name)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ToolCallRenderError(f"{format_name}: non-string object key {key!r}")
            _check_json(item, format_name)
        return
    raise ToolCallRenderError(f"{format_name}: value of type {type(value).__name__} is not JSON")


def check_arguments(arguments: object, format_name: str) -> dict[str, Any]:
    """Returns ``arguments`` if it is a dict of JSON values with string keys.

    Raises:
        ToolCallRenderError: Not a dict, or holds something JSON cannot carry exactly (a tuple,
            a non-string key, NaN or infinity, an arbitrary object) or nests too deeply.
    """
    if not isinstance(arguments, dict):
        raise ToolCallRenderError(f"{format_name}: arguments must be a dict, got {arguments!r}")
    try:
        _check_json(arguments, format_name)
    except RecursionError:
        raise ToolCallRenderError(f"{format_name}: arguments nest too deeply") from None
    return arguments


def dumps(value: Any, format_name: str) -> str:
    """JSON text for an already checked value (``ensure_ascii=False``, no NaN)."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ToolCallRenderError(f"{format_name}: cannot write JSON: {exc}") from None


def call_from_object(
    obj: Any, format_name: str, position: int | None = None, *, require_arguments: bool = False
) -> ToolCall:
    """Turns a decoded ``{"name": ..., "arguments" | "parameters": ...}`` object into a call.

    ``arguments`` wins over ``parameters`` when both are present; either may be an object or a
    JSON string holding one. A missing argument key means no arguments, unless
    ``require_arguments``.

    Raises:
        ToolCallParseError: Not an object, a bad or missing name, or arguments that are not an
            object.
    """
    if type(obj) is not dict:
        raise parse_error(format_name, "tool call is not a JSON object", position)
    name = obj.get("name")
    if not isinstance(name, str) or not is_valid_name(name):
        raise parse_error(format_name, f"invalid or missing tool name {name!r}", position)
    for key in _ARGUMENT_KEYS:
        if key in obj:
            arguments = obj[key]
            break
    else:
        if require_arguments:
            raise parse_error(format_name, "tool call has no arguments", position)
        return ToolCall(name, {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except JSON_ERRORS:
            raise parse_error(format_name, "arguments string is not valid JSON", position) from None
    if type(arguments) is not dict:
        raise parse_error(format_name, "arguments are not a JSON object", position)
    return ToolCall(name, arguments)


def add_content(pieces: list[str], piece: str) -> None:
    """Keeps ``piece`` (stripped) if it is not blank; ``"\\n".join(pieces)`` is the content."""
    piece = piece.strip()
    if piece:
        pieces.append(piece)
