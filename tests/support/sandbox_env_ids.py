"""Names of the sandbox-placement tests' env and the scripted policy that plays it. The env
itself is in :mod:`tests.support.sandbox_envs`, which registers it when imported: the registry
imports it when a test makes the env by these names, not at collection (so the unit tests that
list every registered env see only the built-in ones).
"""

from __future__ import annotations

import json
import re

ENV_ID = "tests.support.sandbox_envs:sandbox-exec-v0"
"""How tests name the env."""
MCP_ENV_ID = "tests.support.sandbox_envs:sandbox-mcp-v0"
"""The env with an MCP server inside its sandboxes."""


def run_then_answer(text: str, rid: str) -> str:
    """A :class:`~tests.support.engines.ScriptedEngine` policy: calls ``run`` with the task's
    command, then answers with what it printed."""
    results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.S)
    if results:
        return f"Answer: {results[-1]}"
    command = re.findall(r"Run: (.*)", text)[-1].split("<|im_end|>")[0].strip()
    return f"<tool_call>\n{json.dumps({'name': 'run', 'arguments': {'command': command}})}\n</tool_call>"
