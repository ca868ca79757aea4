"""Serving agentrl environments to other trainers over the network.

:mod:`agentrl.serve.openenv_server` serves a registered env with the ``openenv`` package's own
server (``agentrl serve-env``). It imports ``openenv`` at import time, so this package's
``__init__`` imports nothing: ``openenv`` 0.10 needs the MCP SDK 1.x while agentrl's MCP tools
need 2.x, and the two live in different Python environments (docs/guides/openenv.md).
"""
