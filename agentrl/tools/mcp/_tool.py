"""``McpTool``: one tool of an MCP server as an agentrl :class:`~agentrl.tools.Tool`;
``McpCalls``, what its calls go through in an episode; and :func:`render_result`, the text the
model sees for a call's result.

Neither imports the MCP SDK: listings and results are read through their attributes.
"""

from __future__ import annotations

import abc
import base64
import binascii
import copy
import json
from collections.abc import Mapping
from typing import Any

from agentrl.errors import McpServerError, ToolDefinitionError
from agentrl.tools.mcp._server import McpServer
from agentrl.tools.tool import Injected, Tool


class McpCalls(Injected, abc.ABC):
    """What an :class:`McpTool`'s calls go through in an episode: its connections to the servers.
    The env injects one into the tool context; :class:`~agentrl.tools.mcp.McpEpisode` is the one
    implementation (this interface lets the tool find it without importing the client)."""

    @abc.abstractmethod
    async def call(self, tool: McpTool, arguments: dict[str, Any]) -> str:
        """Sends ``tool``'s call to its server and returns the result as the model's text."""


class McpTool(Tool):
    """One tool of an MCP server as an agentrl tool.

    The schema the model sees is the server's input schema, unchanged. Arguments are validated
    against it here, as for any ``@agentrl.tool``: a call that breaks it is an
    ``Error (schema_violation)`` message and the server never sees it. A valid call goes to the
    episode's connection to the server (the env injects it); what the server answers becomes
    the tool message (:func:`render_result`), and a failure an ``Error (tool_error)`` message.

    Args:
        server: The declaration of the server that lists the tool.
        spec: The tool as listed (an ``mcp.types.Tool``: ``name``, ``title``, ``description``,
            ``input_schema``, ``output_schema``, ``annotations``).

    Attributes:
        server: The server's declaration.
        remote_name: The name the server knows the tool by (``name`` without the prefix).
        output_schema: The server's declared output schema, or ``None``.
        annotations: The server's hints about the tool (read-only, destructive, ...), or ``None``.

    Raises:
        McpServerError: The tool cannot become an agentrl tool (its name, with the prefix, is
            not a valid tool name, or its input schema is not a valid JSON schema of type
            object); the message names the server and the tool and says how to work around it.
    """

    def __init__(self, server: McpServer, spec: Any) -> None:
        async def _remote(**arguments: Any) -> str:  # never called: invoke is overridden
            raise AssertionError("an MCP tool is called through its server")

        remote = str(spec.name)
        annotations = getattr(spec, "annotations", None)
        description = (
            getattr(spec, "description", None)
            or getattr(spec, "title", None)
            or (getattr(annotations, "title", None) if annotations is not None else None)
            or f"Tool {remote!r} of the MCP server {server.label!r}."
        )
        schema = getattr(spec, "input_schema", None)
        if not isinstance(schema, Mapping):
            raise McpServerError(f"MCP server {server.label!r} lists tool {remote!r} without an "
                                 "input schema object")
        try:
            super().__init__(
                _remote, name=server.tool_prefix + remote, description=description,
                parameters=copy.deepcopy(dict(schema)), timeout=server.timeout,
            )
        except ToolDefinitionError as exc:
            raise McpServerError(
                f"MCP server {server.label!r} lists tool {remote!r}, which cannot be offered: "
                f"{exc}. Set tool_prefix= on the McpServer (tool names must start with a letter or "
                "'_' and have at most 64 characters), or leave the tool out with tools=[...]"
            ) from exc
        self.server = server
        self.remote_name = remote
        self.output_schema = getattr(spec, "output_schema", None)
        self.annotations = annotations

    async def invoke(self, arguments: dict[str, Any], context: Mapping[type, Any]) -> str:
        """Validates ``arguments`` and sends the call to the episode's server.

        Raises:
            MalformedArgumentsError, SchemaViolationError: Bad arguments (nothing was sent).
            ToolServerError: The server failed the call, or is not running.
            ToolDefinitionError: No MCP connections in ``context`` (the tool was called outside
                an env episode).
        """
        self.validate(arguments)
        episode = next((v for v in context.values() if isinstance(v, McpCalls)), None)
        if episode is None:
            raise ToolDefinitionError(
                f"MCP tool {self.name!r} runs only inside an env episode (ToolEnv.mcp_servers); "
                "it cannot be called without its server's connection"
            )
        return await episode.call(self, arguments)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"MCP tool {self.name!r} is called through an env (step, arun_tool), "
                        "not directly")

    def __repr__(self) -> str:
        return f"McpTool(name={self.name!r}, server={self.server.label!r})"


def render_result(result: Any, max_chars: int) -> str:
    """The text the model sees for an MCP ``CallToolResult``.

    Content blocks are joined by newlines, in order: text as is; images and audio as
    ``[image: <mime>, <n> bytes]`` placeholders (a text model cannot read them); embedded
    resources as ``[resource: <uri>]`` and their text, or a placeholder for binary ones;
    resource links as ``[resource link: <name> <uri>]``. Structured content is shown as sorted
    JSON only when there is no text block (servers put the same data in a text block when they
    send both). The text is cut at ``max_chars`` with a marker. The same result always gives the
    same text (no wall-clock or random values are added).

    Args:
        result: The result (``content`` blocks and ``structured_content``).
        max_chars: Longest text returned.
    """
    parts: list[str] = []
    has_text = False
    for block in getattr(result, "content", None) or ():
        kind = getattr(block, "type", None)
        if kind == "text":
            has_text = True
            parts.append(str(block.text))
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {block.mime_type}, {_decoded_size(block.data)} bytes]")
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            if text is not None:
                parts.append(f"[resource: {resource.uri}]\n{text}")
            else:
                mime = getattr(resource, "mime_type", None) or "application/octet-stream"
                size = _decoded_size(getattr(resource, "blob", "") or "")
                parts.append(f"[resource: {resource.uri}, {mime}, {size} bytes]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {block.name} {block.uri}]")
        else:
            parts.append(f"[{kind or 'unknown'} content]")
    structured = getattr(result, "structured_content", None)
    if structured is not None and not has_text:
        parts.append(json.dumps(structured, ensure_ascii=False, sort_keys=True, default=str))
    return clip(("\n".join(parts)), max_chars)


def clip(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, with a marker saying how many were cut."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n[... {len(text) - max_chars} more characters cut ...]"


def _decoded_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data) * 3 // 4
