"""A tiny sandboxed env for the sandbox-placement tests (named in tests/support/sandbox_env_ids.py).

``sandbox-exec-v0``: each task names a shell command; the model calls ``run`` with it (one
``exec`` in the episode's sandbox) and then answers with the command's output; the reward is 1
when the answer holds ``done``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import agentrl
from agentrl.sandbox import Limits, Sandbox
from agentrl.tools.mcp import McpServer


@agentrl.tool
async def run(command: str, sandbox: Sandbox) -> str:
    """Runs a shell command in the sandbox.

    Args:
        command: The command line.
    """
    return (await sandbox.exec(command)).to_text()


class SandboxExecEnv(agentrl.SandboxedToolEnv):
    """Tasks ``t0`` .. ``t<tasks - 1>``, each asking to run ``command``.

    Args:
        command: What every task asks the model to run.
        tasks: How many tasks the task set has.
        timeout_s: The sandbox's per-command limit.
        **kwargs: Passed to :class:`agentrl.SandboxedToolEnv`.
    """

    tools = (run,)
    default_max_turns = 3

    def __init__(self, *, command: str = "echo done", tasks: int = 8, timeout_s: float = 30.0,
                 **kwargs: Any) -> None:
        kwargs.setdefault("sandbox", "process")
        kwargs.setdefault("limits", Limits(timeout_s=timeout_s))
        super().__init__(**kwargs)
        self.command = command
        self.tasks = tasks

    def task_set(self, split: str = "test", limit: int | None = None) -> list[dict[str, Any]]:
        rows = [{"id": f"t{i}", "command": self.command} for i in range(self.tasks)]
        return rows if limit is None else rows[:limit]

    def make_prompt(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Run: {task['command']}"}]

    def compute_reward(self, task: Mapping[str, Any], final: Mapping[str, Any], state: Any) -> float:
        return 1.0 if "done" in str(final.get("content") or "") else 0.0


class McpInSandboxEnv(SandboxExecEnv):
    """The same tasks, with an MCP server that would run inside each sandbox (never started:
    ``--sandbox-placement ray`` refuses the env)."""

    mcp_servers = (McpServer(command="/bin/true", name="inside", sandbox=True),)


agentrl.register_env("sandbox-exec-v0", SandboxExecEnv)
agentrl.register_env("sandbox-mcp-v0", McpInSandboxEnv)
