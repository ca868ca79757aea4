"""A minimal MCP server over stdio that needs nothing but Python's standard library, for task
images without the MCP SDK (the Harbor test's container): newline-delimited JSON-RPC 2.0 with
``initialize``, ``ping``, ``tools/list`` and ``tools/call``. Tools: ``whoami`` (uid, host name,
working directory) and ``read_text`` (a file relative to the working directory)."""

import json
import os
import socket
import sys

TOOLS = [
    {"name": "whoami", "description": "The server's uid, host name and working directory.",
     "inputSchema": {"type": "object", "properties": {}}},
    {"name": "read_text", "description": "The text of a file (relative to the working directory).",
     "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
]


def call(name, arguments):
    if name == "whoami":
        return f"uid={os.getuid()} host={socket.gethostname()} cwd={os.getcwd()}", False
    if name == "read_text":
        try:
            with open(arguments["path"], encoding="utf-8") as f:
                return f.read(), False
        except OSError as exc:
            return f"cannot read {arguments['path']}: {exc.strerror}", True
    raise KeyError(name)


def answer(request):
    method, params = request.get("method"), request.get("params") or {}
    if method == "initialize":
        return {"protocolVersion": params.get("protocolVersion", "2025-11-25"),
                "capabilities": {"tools": {}}, "serverInfo": {"name": "stdlib-test", "version": "1"}}
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        text, is_error = call(params["name"], params.get("arguments") or {})
        return {"content": [{"type": "text", "text": text}], "isError": is_error}
    raise LookupError(method)


for line in sys.stdin:
    if not line.strip():
        continue
    request = json.loads(line)
    if "id" not in request:  # a notification
        continue
    try:
        reply = {"jsonrpc": "2.0", "id": request["id"], "result": answer(request)}
    except (LookupError, KeyError) as exc:
        reply = {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": f"unknown: {exc}"}}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
