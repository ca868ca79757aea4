"""MCP servers as agentrl tools.

Declare servers next to an env's tools; their ``tools/list`` becomes tools the model can call,
with the servers' JSON schemas, validated like ``@agentrl.tool`` arguments::

    from agentrl.tools.mcp import McpServer

    class TimeEnv(agentrl.ToolEnv):
        mcp_servers = [McpServer(command="mcp-server-time", lifetime="run")]

* :class:`McpServer` - a stdio (``command=``) or streamable-HTTP (``url=``) server, with its
  lifetime (one per episode, or one per run) and whether it runs in the episode's sandbox.
* :class:`McpTool` - one listed tool as a :class:`~agentrl.tools.Tool`;
  :func:`render_result` - a call's result as the model's text.
* :class:`McpPool`, :class:`McpEpisode`, :class:`McpConnection` - the live connections (the
  env manages them); :func:`list_mcp_tools` - start a server, list its tools, stop it.

Importing this package does not import the MCP SDK (``pip install 'agentrl[mcp]'``); it is
imported when the first server starts.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentrl.tools.mcp._server import Lifetime, McpServer

_LAZY = {
    "McpTool": "agentrl.tools.mcp._tool",
    "render_result": "agentrl.tools.mcp._tool",
    "McpConnection": "agentrl.tools.mcp._client",
    "McpEpisode": "agentrl.tools.mcp._client",
    "McpPool": "agentrl.tools.mcp._client",
    "list_mcp_tools": "agentrl.tools.mcp._client",
}

__all__ = ["Lifetime", "McpConnection", "McpEpisode", "McpPool", "McpServer", "McpTool",
           "list_mcp_tools", "render_result"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
