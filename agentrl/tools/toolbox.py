"""Dispatch of parsed tool calls to tools, with every failure turned into a message."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agentrl.errors import (
    MalformedArgumentsError,
    ResourceLost,
    ToolCallError,
    ToolDefinitionError,
    ToolErrorKind,
    ToolExecutionError,
    ToolTimeoutError,
    UnknownToolError,
)
from agentrl.tools.calls import ToolCall
from agentrl.tools.tool import Tool, tool

MAX_ERROR_CHARS = 2000


@dataclass(frozen=True)
class ToolOutcome:
    """What one tool call produced.

    Attributes:
        call: The call as parsed.
        content: Text returned to the model (the tool's result, or an error explanation).
        error: The failure kind, or ``None`` when the tool ran and returned.
        duration_s: Wall time spent in validation and the tool itself.
    """

    call: ToolCall
    content: str
    error: ToolErrorKind | None
    duration_s: float

    def to_message(self) -> dict[str, Any]:
        """The ``role: tool`` chat message for this outcome."""
        message: dict[str, Any] = {"role": "tool", "name": self.call.name, "content": self.content}
        if self.call.id is not None:
            message["tool_call_id"] = self.call.id
        return message


class Toolbox:
    """The tools of one environment, by name.

    Args:
        tools: ``Tool`` objects, or plain typed functions (wrapped with :func:`agentrl.tool`).

    Raises:
        ToolDefinitionError: Two tools share a name.
    """

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            t = item if isinstance(item, Tool) else tool(item)
            if t.name in self._tools:
                raise ToolDefinitionError(f"two tools are named {t.name!r}")
            self._tools[t.name] = t
        self.schemas: list[dict[str, Any]] = [t.schema for t in self._tools.values()]
        """OpenAI-style schemas of all tools, in registration order (built once)."""

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self):
        return iter(self._tools.values())

    @property
    def names(self) -> list[str]:
        """Tool names in registration order."""
        return list(self._tools)

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or ``None``."""
        return self._tools.get(name)

    async def run(self, call: ToolCall, context: Mapping[type, Any]) -> ToolOutcome:
        """Runs one call. Failures the model caused, and exceptions inside the tool, come back
        as an outcome with ``error`` set; framework errors (:class:`ToolDefinitionError`, or any
        agentrl error that is not a tool-call error) propagate, and so does a
        :class:`~agentrl.errors.ResourceLost` raised inside the tool (a
        :class:`~agentrl.sandbox.SandboxLost`: the sandbox's node died; its episode fails rather
        than showing the model an error it did not cause).
        """
        start = time.perf_counter()
        try:
            content = result_text(await self._run(call, context))
            error = None
        except ToolCallError as exc:
            content, error = error_text(exc), exc.kind
        return ToolOutcome(call, content, error, time.perf_counter() - start)

    def _run(self, call: ToolCall, context: Mapping[type, Any]) -> Any:
        """Returns the awaitable of the tool's result (errors raised as ToolCallError)."""
        t = self._tools.get(call.name)
        if t is None:
            known = ", ".join(self._tools) or "(none)"
            raise UnknownToolError(
                f"unknown tool {call.name!r}. Available tools: {known}", tool_name=call.name
            )
        arguments = call.arguments
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError as exc:
                raise MalformedArgumentsError(
                    f"arguments of {call.name!r} are not valid JSON: {exc}", tool_name=call.name
                ) from None
        return self._invoke(t, arguments, context)

    @staticmethod
    async def _invoke(t: Tool, arguments: Any, context: Mapping[type, Any]) -> Any:
        deadline = None
        try:
            if t.timeout is None or t.inline:
                return await t.invoke(arguments, context)
            # asyncio.timeout cancels the current task in place: no extra task per call.
            async with asyncio.timeout(t.timeout) as deadline:
                return await t.invoke(arguments, context)
        except (ToolCallError, ToolDefinitionError, ResourceLost):  # ResourceLost: the episode fails
            raise
        except TimeoutError as exc:
            if deadline is None or not deadline.expired():  # the tool's own TimeoutError
                raise ToolExecutionError(
                    f"tool {t.name!r} failed: TimeoutError: {exc}", tool_name=t.name
                ) from exc
            raise ToolTimeoutError(
                f"tool {t.name!r} timed out after {t.timeout:g} s", tool_name=t.name
            ) from None
        except Exception as exc:  # the tool's own failure: the model should see it
            raise ToolExecutionError(
                f"tool {t.name!r} failed: {type(exc).__name__}: {exc}", tool_name=t.name
            ) from exc


def result_text(result: Any) -> str:
    """The text the model sees for a tool's return value (str as is, else JSON)."""
    if isinstance(result, str):
        return result
    if result is None:
        return ""
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(result)


def error_text(exc: ToolCallError) -> str:
    """The text the model sees for a failed call: the kind, then what to fix."""
    text = str(exc)
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS] + f"... [{len(text) - MAX_ERROR_CHARS} characters cut]"
    return f"Error ({exc.kind.value}): {text}"
