"""An MCP server for the tests, written with the SDK's server API (``MCPServer``).

    python tests/support/mcp_test_server.py               # stdio
    python tests/support/mcp_test_server.py --http PORT   # streamable HTTP on 127.0.0.1:PORT/mcp
    python tests/support/mcp_test_server.py --bad-schema  # stdio, lists a tool with an invalid schema

Its tools cover every kind of result and failure an agentrl env must turn into a tool message.
"""

from __future__ import annotations

import argparse
import os
import sys

import mcp.types as types
from mcp import MCPError
from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("agentrl-test", version="0.1")
_state = {"counter": 0, "calls": 0}

# 1x1 transparent PNG
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6300010000050001fc3fe5ee0000000049454e44ae426082"
)


def _count() -> None:
    _state["calls"] += 1


@server.tool(description="Returns text repeated `times` times.")
def echo(text: str, times: int = 1) -> str:
    _count()
    return text * times


@server.tool(description="Adds two integers.")
def add(a: int, b: int) -> int:
    _count()
    return a + b


@server.tool(description="Returns structured content only, without a text block.")
def structured() -> types.CallToolResult:
    _count()
    return types.CallToolResult(content=[], structured_content={"k": 1})


@server.tool(description="Counts its own calls in this server process.")
def counter() -> int:
    _count()
    _state["counter"] += 1
    return _state["counter"]


@server.tool(description="The server's process id.")
def pid() -> int:
    _count()
    return os.getpid()


@server.tool(description="How many tool calls this server process has handled (this one included).")
def calls() -> int:
    _count()
    return _state["calls"]


@server.tool(description="Always fails with the given message.")
def fail(message: str) -> str:
    _count()
    raise ToolError(message)


@server.tool(description="Answers with a JSON-RPC error.")
def protocol_error() -> str:
    _count()
    raise MCPError(types.INVALID_PARAMS, "bad thing")


@server.tool(description="Kills the server process in the middle of the call.")
def crash() -> str:
    sys.stderr.write("crashing\n")
    sys.stderr.flush()
    os._exit(3)


@server.tool(description="Sleeps, then answers.")
async def sleep(seconds: float) -> str:
    import anyio

    _count()
    await anyio.sleep(seconds)
    return "slept"


@server.tool(description="Returns a tiny PNG image.")
def picture() -> Image:
    _count()
    return Image(data=PNG, format="png")


@server.tool(description="Returns an embedded text resource.")
def resource() -> types.EmbeddedResource:
    _count()
    return types.EmbeddedResource(
        type="resource",
        resource=types.TextResourceContents(uri="file:///notes.txt", mime_type="text/plain", text="hello"),
    )


@server.tool(description="The server's working directory.")
def cwd() -> str:
    _count()
    return os.getcwd()


async def _bad_schema() -> None:
    """A low-level server listing one tool whose input schema is not valid JSON Schema."""
    from mcp.server import Server
    from mcp.server.stdio import stdio_server

    async def on_list_tools(ctx, params):
        return types.ListToolsResult(tools=[types.Tool(
            name="broken", description="A tool with an invalid schema.",
            input_schema={"type": "object", "properties": {"x": {"type": "nonsense"}}},
        )])

    async def on_call_tool(ctx, params):
        return types.CallToolResult(content=[types.TextContent(type="text", text="called")])

    low = Server("agentrl-bad", on_list_tools=on_list_tools, on_call_tool=on_call_tool)
    async with stdio_server() as (read, write):
        await low.run(read, write, low.create_initialization_options())


def main() -> None:
    parser = argparse.ArgumentParser(description="agentrl's MCP test server")
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on this port")
    parser.add_argument("--bad-schema", action="store_true", help="list a tool with an invalid schema")
    parser.add_argument("tag", nargs="?", help="ignored: lets a test find this process by its command line")
    args = parser.parse_args()
    if args.bad_schema:
        import anyio

        anyio.run(_bad_schema)
    elif args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run()


if __name__ == "__main__":
    main()
