"""Tools: typed functions with validated JSON-Schema arguments, their dispatch, and the
tool-call formats models write them in.

Imports neither Ray, Megatron nor SGLang.
"""

from agentrl.tools.calls import TOOL_NAME_PATTERN, ParsedTurn, ToolCall
from agentrl.tools.formats import ToolCallFormat, available_formats, get_format
from agentrl.tools.tool import DEFAULT_TIMEOUT_S, Injected, Tool, tool
from agentrl.tools.toolbox import Toolbox, ToolOutcome

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "TOOL_NAME_PATTERN",
    "Injected",
    "ParsedTurn",
    "Tool",
    "ToolCall",
    "ToolCallFormat",
    "ToolOutcome",
    "Toolbox",
    "available_formats",
    "get_format",
    "tool",
]
