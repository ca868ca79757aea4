"""``python``: run a Python snippet in the episode's sandbox."""

from __future__ import annotations

from agentrl import tool
from agentrl.sandbox import Sandbox, SandboxError
from agentrl_tools._common import TOOL_TIMEOUT_S, check_timeout, clip


@tool(timeout=TOOL_TIMEOUT_S)
async def python(code: str, timeout: int = 60, *, sandbox: Sandbox) -> str:
    """Runs a Python 3 program in the task's sandbox (working directory /workspace).

    Each call is a fresh interpreter (`python3 -`, the code read from standard input): no
    variables survive between calls; save state to files. There is no network. Print what you
    want to see; the result is stdout then stderr (tracebacks included), with a note on a
    non-zero exit code or a timeout.

    Args:
        code: The program, e.g. "import sys\\nprint(sys.version)".
        timeout: Seconds before the program and everything it started are killed (1-600).
    """
    if error := check_timeout(timeout):
        return error
    if not code.strip():
        return "Error: the code is empty"
    try:
        result = await sandbox.exec(["python3", "-"], stdin=code, timeout=timeout)
    except SandboxError as exc:
        return f"Error: the sandbox could not run python3: {exc}"
    return clip(result.to_text(), keep_tail=True) or "(no output)"
