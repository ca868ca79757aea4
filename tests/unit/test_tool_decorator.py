"""@agentrl.tool: schema derivation, validation, injection, timeouts and error kinds."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import threading
import time
from typing import Annotated, Literal, Optional, TypedDict

import pytest

from agentrl import EpisodeState, tool
from agentrl.errors import ToolDefinitionError, ToolErrorKind
from agentrl.tools import Toolbox, ToolCall


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(TypedDict):
    """A point.

    Args:
        x: Horizontal.
        y: Vertical.
    """

    x: int
    y: int


@dataclasses.dataclass
class Window:
    """A window.

    Args:
        width: Pixels wide.
    """

    width: int
    title: str = "untitled"


def test_schema_from_hints_and_docstring():
    @tool
    def draw(
        label: str,
        count: int,
        scale: float,
        visible: bool,
        tags: list[str],
        meta: dict[str, int],
        mode: Literal["fast", "slow"],
        color: Color,
        where: Point,
        window: Window,
        note: Optional[str] = None,  # noqa: UP045 - testing the Optional spelling
        pair: tuple[int, str] = (1, "a"),
        depth: Annotated[int, "how deep"] = 3,
    ) -> str:
        """Draws a thing.

        Longer explanation.

        Args:
            label: The label
                spanning two lines.
            count: How many.
        """
        return "ok"

    params = draw.parameters
    assert draw.name == "draw"
    assert draw.description == "Draws a thing.\n\nLonger explanation."
    props = params["properties"]
    assert props["label"] == {"type": "string", "description": "The label spanning two lines."}
    assert props["count"] == {"type": "integer", "description": "How many."}
    assert props["scale"] == {"type": "number"}
    assert props["visible"] == {"type": "boolean"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["meta"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["mode"] == {"enum": ["fast", "slow"], "type": "string"}
    assert props["color"] == {"enum": ["red", "blue"], "type": "string"}
    assert props["where"] == {
        "type": "object",
        "properties": {
            "x": {"type": "integer", "description": "Horizontal."},
            "y": {"type": "integer", "description": "Vertical."},
        },
        "required": ["x", "y"],
        "additionalProperties": False,
    }
    assert props["window"]["required"] == ["width"]
    assert props["window"]["properties"]["width"]["description"] == "Pixels wide."
    assert props["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
    assert props["pair"]["prefixItems"] == [{"type": "integer"}, {"type": "string"}]
    assert props["pair"]["default"] == [1, "a"]
    assert props["depth"] == {"type": "integer", "description": "how deep", "default": 3}
    assert params["required"] == [
        "label", "count", "scale", "visible", "tags", "meta", "mode", "color", "where", "window",
    ]
    assert params["additionalProperties"] is False
    assert draw.schema["type"] == "function"
    assert draw.schema["function"]["name"] == "draw"


def test_direct_call_is_the_plain_function():
    @tool
    def add(a: int, b: int) -> int:
        """Adds."""
        return a + b

    assert add(2, 3) == 5


def test_explicit_schema_and_name():
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}

    @tool(name="web.search", description="Searches.", parameters=schema)
    def search(q):
        return q

    assert search.name == "web.search"
    assert search.parameters == schema


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"parameters": {"type": "objekt"}}, "must have \"type\": \"object\""),
        ({"parameters": {"type": "object", "properties": {"a": {"type": 5}}}}, "invalid JSON schema"),
        ({"name": "has space"}, "tool name 'has space' is invalid"),
        ({"timeout": 0}, "timeout must be > 0"),
    ],
)
def test_invalid_definitions_fail_at_decoration(kwargs, message):
    def fn(x: int) -> int:
        """Identity."""
        return x

    with pytest.raises(ToolDefinitionError, match=message):
        tool(fn, **kwargs)


def test_unschematisable_hint_names_the_parameter():
    with pytest.raises(ToolDefinitionError, match="parameter 'f' of tool 'bad'"):

        @tool
        def bad(f: complex) -> str:
            """Bad."""
            return ""


def test_varargs_rejected():
    with pytest.raises(ToolDefinitionError, match=r"\*args"):

        @tool
        def bad(*parts: str) -> str:
            """Bad."""
            return ""


def _run(toolbox: Toolbox, name: str, arguments, context=None):
    return asyncio.run(toolbox.run(ToolCall(name, arguments), context or {}))


def test_arguments_are_coerced_to_dataclass_and_enum():
    seen = {}

    @tool
    def configure(window: Window, color: Color, pair: tuple[int, str]) -> str:
        """Configures."""
        seen.update(window=window, color=color, pair=pair)
        return "done"

    outcome = _run(Toolbox([configure]), "configure", {
        "window": {"width": 3}, "color": "blue", "pair": [1, "x"],
    })
    assert outcome.error is None and outcome.content == "done"
    assert seen == {"window": Window(width=3), "color": Color.BLUE, "pair": (1, "x")}


def test_each_failure_kind_becomes_a_message():
    @tool
    def divide(a: int, b: int) -> float:
        """Divides."""
        return a / b

    box = Toolbox([divide])
    cases = [
        ("nope", {}, ToolErrorKind.UNKNOWN_TOOL, "unknown tool 'nope'. Available tools: divide"),
        ("divide", [1, 2], ToolErrorKind.MALFORMED_ARGUMENTS, "must be a JSON object, got list"),
        ("divide", "{not json", ToolErrorKind.MALFORMED_ARGUMENTS, "not valid JSON"),
        ("divide", {"a": 1, "b": "x"}, ToolErrorKind.SCHEMA_VIOLATION, "at $.b: 'x' is not of type"),
        ("divide", {"a": 1}, ToolErrorKind.SCHEMA_VIOLATION, "'b' is a required property"),
        ("divide", {"a": 1, "b": 0}, ToolErrorKind.TOOL_EXCEPTION, "ZeroDivisionError"),
    ]
    for name, args, kind, text in cases:
        outcome = _run(box, name, args)
        assert outcome.error is kind, (name, args)
        assert outcome.content.startswith(f"Error ({kind.value}):")
        assert text in outcome.content
    ok = _run(box, "divide", '{"a": 1, "b": 4}')
    assert ok.error is None and ok.content == "0.25"


def test_nested_schema_violation_reports_json_path():
    @tool
    def place(where: Point) -> str:
        """Places."""
        return "ok"

    outcome = _run(Toolbox([place]), "place", {"where": {"x": 1, "y": "up"}})
    assert outcome.error is ToolErrorKind.SCHEMA_VIOLATION
    assert "$.where.y" in outcome.content


def test_async_tool_timeout_is_reported():
    @tool(timeout=0.05)
    async def slow() -> str:
        """Sleeps."""
        await asyncio.sleep(5)
        return "late"

    start = time.perf_counter()
    outcome = _run(Toolbox([slow]), "slow", {})
    assert outcome.error is ToolErrorKind.TIMEOUT
    assert "timed out after 0.05 s" in outcome.content
    assert time.perf_counter() - start < 2


def test_sync_tool_timeout_is_reported():
    @tool(timeout=0.05)
    def slow() -> str:
        """Sleeps."""
        time.sleep(0.5)
        return "late"

    outcome = _run(Toolbox([slow]), "slow", {})
    assert outcome.error is ToolErrorKind.TIMEOUT


def test_sync_tools_run_off_the_event_loop():
    # Each call waits until all four run at once: on the event loop (or one at a time) the
    # barrier never fills and every call fails, however fast or slow the machine is.
    together = threading.Barrier(4, timeout=30)

    @tool
    def block() -> str:
        """Blocks until the other calls run too."""
        together.wait()
        return "ok"

    box = Toolbox([block])

    async def main():
        return await asyncio.gather(*(box.run(ToolCall("block"), {}) for _ in range(4)))

    outcomes = asyncio.run(main())
    assert [o.content for o in outcomes] == ["ok"] * 4


def test_injected_state_is_hidden_from_schema_and_passed():
    @tool
    def remember(value: str, state: EpisodeState) -> str:
        """Remembers a value.

        Args:
            value: What to remember.
        """
        state.data["value"] = value
        return "stored"

    assert list(remember.parameters["properties"]) == ["value"]
    state = EpisodeState({"id": 1})
    outcome = _run(Toolbox([remember]), "remember", {"value": "x"}, {EpisodeState: state})
    assert outcome.content == "stored" and state.data == {"value": "x"}


def test_missing_injected_value_is_a_framework_error():
    @tool
    def remember(state: EpisodeState) -> str:
        """Needs state."""
        return ""

    with pytest.raises(ToolDefinitionError, match="needs an injected EpisodeState"):
        _run(Toolbox([remember]), "remember", {})


def test_results_are_text_or_json():
    @tool
    def listing() -> dict:
        """Lists."""
        return {"a": [1, 2], "é": None}

    assert _run(Toolbox([listing]), "listing", {}).content == '{"a": [1, 2], "é": null}'


def test_duplicate_tool_names_rejected():
    def f() -> str:
        """F."""
        return ""

    with pytest.raises(ToolDefinitionError, match="two tools are named 'f'"):
        Toolbox([f, f])
