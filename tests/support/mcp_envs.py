"""Envs for the MCP tests: any servers (``McpTestEnv``) and the git server in the episode's
sandbox (``GitEnv``); plus how to run the test server and step one call."""

from __future__ import annotations

import importlib.util
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import agentrl
from agentrl.sandbox import Sandbox
from agentrl.tools.mcp import McpServer

SERVER = str(Path(__file__).with_name("mcp_test_server.py"))
"""The SDK-based test server (``python SERVER [--http PORT | --bad-schema]``)."""
SITE_PACKAGES = sysconfig.get_paths()["purelib"]
"""This venv's packages: what a sandboxed ``/usr/bin/python3`` imports the servers from."""
SYSTEM_PYTHON = "/usr/bin/python3"


def sdk_server(**kwargs: Any) -> McpServer:
    """The test server over stdio on the host (``name="test"`` unless given)."""
    kwargs.setdefault("name", "test")
    return McpServer(command=sys.executable, args=[SERVER, *kwargs.pop("extra_args", ())], **kwargs)


REQUIREMENTS = {
    "mcp": "mcp>=2.3,<3",
    "mcp_server_time": "mcp-server-time>=2026.10.19",
    "mcp_server_git": "mcp-server-git>=2026.10.19",
}
"""What to install for each module the MCP tests import (all in the dev extra)."""


def missing(module: str) -> str | None:
    """Why a test needing ``module`` must be skipped, or ``None`` when it is installed."""
    if importlib.util.find_spec(module) is None:
        return f"needs {module}: pip install '{REQUIREMENTS[module]}' (in agentrl's dev extra)"
    return None


def system_python_reason() -> str | None:
    """Why the sandboxed-server tests cannot use /usr/bin/python3 with this venv's packages."""
    if not Path(SYSTEM_PYTHON).exists():
        return f"needs {SYSTEM_PYTHON} (the sandbox cannot see this venv's interpreter): apt-get install python3"
    import subprocess

    version = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    if version != str(tuple(sys.version_info[:2])):
        return (f"needs {SYSTEM_PYTHON} of Python {sys.version_info[0]}.{sys.version_info[1]} (this "
                f"venv's compiled packages), found {version}: apt-get install python3.{sys.version_info[1]}")
    return None


class McpTestEnv(agentrl.ToolEnv):
    """One user message, reward 0; the servers come from the constructor."""

    default_max_turns = 50

    def make_prompt(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "Use the tools."}]

    def compute_reward(self, task: Mapping[str, Any], final: Any, state: Any) -> float:
        return 0.0

    def sample_task(self) -> dict[str, Any]:
        return {"n": int(self.np_random.integers(100))}


class GitEnv(agentrl.SandboxedToolEnv):
    """mcp-server-git inside the episode's sandbox, over a repository made there."""

    default_max_turns = 50
    mcp_servers = (
        McpServer.python_module(
            "mcp_server_git", "--repository", ".", python=SYSTEM_PYTHON, name="git",
            env={"PYTHONPATH": SITE_PACKAGES}, sandbox=True, startup_timeout=60,
        ),
    )

    def sample_task(self) -> dict[str, Any]:
        return {"id": "commit-notes"}

    async def prepare_sandbox(self, sandbox: Sandbox, task: Mapping[str, Any]) -> None:
        script = ("git init -q -b main . && git config user.name agentrl && "
                  "git config user.email agentrl@example.invalid && echo one > README && "
                  "git add README && git commit -q -m initial")
        result = await sandbox.exec(script, timeout=60)
        if not result.ok:
            raise RuntimeError(f"cannot make the repository: {result.to_text()}")
        await sandbox.write_file("notes.txt", "remember\n")

    def make_prompt(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "Commit notes.txt."}]

    def compute_reward(self, task: Mapping[str, Any], final: Any, state: Any) -> float:
        return 0.0


def call(env: agentrl.ToolEnv, name: str, arguments: Any) -> tuple[str, dict[str, int], bool]:
    """Steps one call; returns (tool message text, the step's tool_errors, terminated)."""
    obs, _, terminated, _, info = env.step(
        {"role": "assistant", "content": "", "tool_calls": [{"name": name, "arguments": arguments}]})
    assert len(obs) == 1 and obs[0]["role"] == "tool", obs
    return obs[0]["content"], info["tool_errors"], terminated
