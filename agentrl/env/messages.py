"""Chat messages: validation, and the gymnasium spaces of a ToolEnv."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium

Message = dict[str, Any]
"""A chat message: ``{"role": ..., "content": str, ...}`` (see :func:`message_problem`)."""

ROLES = ("system", "user", "assistant", "tool")


def message_problem(message: Any, *, strict: bool = True) -> str | None:
    """Describes what makes ``message`` an invalid chat message, or returns ``None``.

    Strict (what a :class:`ToolEnv` returns and takes): a dict with ``role`` in :data:`ROLES`
    and string ``content``; assistant messages may carry ``tool_calls`` (a list of dicts with a
    string ``name`` and ``arguments``); tool messages carry a string ``name``.

    Not strict (a conversation in a data file, in the OpenAI chat format): any non-empty
    ``role``; ``content`` a string, a list of content parts, or ``null`` in an assistant message
    that has ``tool_calls``.
    """
    if not isinstance(message, Mapping):
        return f"must be a message object (a dict), got {type(message).__name__}"
    role = message.get("role")
    if strict and role not in ROLES:
        return f"role must be one of {ROLES}, got {role!r}"
    if not isinstance(role, str) or not role:
        return "has no 'role' (str)"
    if "content" not in message:
        return "has no 'content'"
    content = message["content"]
    if strict and not isinstance(content, str):
        return f"{role} message content must be a str, got {type(content).__name__}"
    if content is None and not message.get("tool_calls"):
        return "has content null and no tool_calls"
    if content is not None and not isinstance(content, str | list):
        return f"content must be a string or a list of parts, got {type(content).__name__}"
    if strict and role == "tool" and not isinstance(message.get("name"), str):
        return "a tool message needs the tool's 'name' (str)"
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            return "only assistant messages may have tool_calls"
        if not isinstance(calls, list):
            return "tool_calls must be a list"
        for i, call in enumerate(calls):
            if not isinstance(call, Mapping) or not isinstance(
                    call.get("name", (call.get("function") or {}).get("name")), str):
                return f"tool_calls[{i}] must be a dict with a str 'name'"
    return None


class MessageList(gymnasium.Space):
    """Observation space of a :class:`ToolEnv`: a list of valid chat messages."""

    def __init__(self, *, allow_empty: bool = True, seed: int | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.allow_empty = allow_empty

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        if not isinstance(x, list) or (not x and not self.allow_empty):
            return False
        return all(message_problem(m) is None for m in x)

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        n = int(self.np_random.integers(1, 3))
        return [{"role": "user", "content": f"sample message {i}"} for i in range(n)]

    def __repr__(self) -> str:
        return "MessageList()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessageList) and other.allow_empty == self.allow_empty


class AssistantTurn(gymnasium.Space):
    """Action space of a :class:`ToolEnv`: an assistant message dict, or its raw text."""

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return True
        return isinstance(x, Mapping) and x.get("role", "assistant") == "assistant" and (
            message_problem({"role": "assistant", "content": "", **x}) is None
        )

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return f"Answer: {int(self.np_random.integers(0, 100))}"

    def __repr__(self) -> str:
        return "AssistantTurn()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AssistantTurn)


def content_text(content: Any) -> str:
    """A message's content as one string (text parts joined; ``None`` is ``""``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content)
