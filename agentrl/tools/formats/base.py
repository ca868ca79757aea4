"""The interface every tool-call format implements."""

from __future__ import annotations

import abc
from collections.abc import Sequence

from agentrl.tools.calls import ParsedTurn, ToolCall


class ToolCallFormat(abc.ABC):
    """Writes and reads tool calls inside an assistant message's text.

    ``parse(render(content, calls))`` gives back ``content`` (stripped) and ``calls`` exactly,
    for any valid tool name and JSON-compatible arguments the format can carry.
    """

    name: str
    """Registry name, matching SGLang's ``--tool-call-parser`` names where one exists."""

    @abc.abstractmethod
    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        """Writes ``content`` followed by ``calls`` as the model would emit them.

        Raises:
            ToolCallRenderError: A name or argument this format cannot represent.
        """

    @abc.abstractmethod
    def parse(self, text: str) -> ParsedTurn:
        """Splits assistant text into content and tool calls.

        Text with no tool-call markup is plain content with no calls.

        Raises:
            ToolCallParseError: The text contains tool-call markup that is malformed. No other
                exception escapes, whatever the input.
        """
