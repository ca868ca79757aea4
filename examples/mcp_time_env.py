"""An env whose tools come from an MCP server: the reference ``mcp-server-time``.

The model is asked what time it is in one timezone when it is a given time in another; the
server's ``convert_time`` tool answers, and the reward checks the final answer. The server is
stateless, so one process serves every episode of the run (``lifetime="run"``).

    pip install 'agentrl[mcp]' mcp-server-time
    PYTHONPATH=examples agentrl check-env mcp_time_env:time-mcp
    python examples/mcp_time_env.py     # plays the scripted oracle and prints the transcripts
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import agentrl
from agentrl.env import check_split
from agentrl.tools.mcp import McpServer

# Timezones without daylight saving time, so the answers hold on every day of the year.
TASKS = [
    {"id": "utc-tokyo", "source": "UTC", "time": "12:00", "target": "Asia/Tokyo", "answer": "21:00"},
    {"id": "utc-kolkata", "source": "UTC", "time": "08:15", "target": "Asia/Kolkata", "answer": "13:45"},
    {"id": "tokyo-kathmandu", "source": "Asia/Tokyo", "time": "18:00", "target": "Asia/Kathmandu",
     "answer": "14:45"},
    {"id": "kolkata-phoenix", "source": "Asia/Kolkata", "time": "20:30", "target": "America/Phoenix",
     "answer": "08:00"},
]
_HHMM = re.compile(r"\b([01]\d|2[0-3]):[0-5]\d\b")


class TimeEnv(agentrl.ToolEnv):
    """Convert a time between timezones with the MCP time server's tools."""

    mcp_servers = (
        McpServer.python_module("mcp_server_time", "--local-timezone", "UTC", name="time",
                                lifetime="run", timeout=30),
    )
    default_max_turns = 3
    task_fields = agentrl.TaskFields(
        {"source": "the timezone the time is given in", "time": "HH:MM there",
         "target": "the timezone asked about", "answer": "HH:MM in the target timezone"},
        public=("id", "source", "time", "target"), private=("answer",))

    def sample_task(self) -> dict[str, Any]:
        return dict(TASKS[int(self.np_random.integers(len(TASKS)))])

    def task_set(self, split: str = "test", limit: int | None = None) -> list[dict[str, Any]]:
        check_split(self, split, ["test"])
        return [dict(t) for t in TASKS[:limit]]

    def make_prompt(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": "Use the tools to answer. Give the final time as HH:MM."},
            {"role": "user", "content": f"It is {task['time']} in {task['source']}. What time is it "
                                        f"in {task['target']}?"},
        ]

    def compute_reward(self, task: Mapping[str, Any], final: Mapping[str, Any],
                       state: agentrl.EpisodeState) -> float:
        found = _HHMM.search(final.get("content") or "")
        return float(found is not None and found.group(0) == task["answer"])

    def oracle_action(self, task: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> Any:
        """Calls ``convert_time``, then answers with the time the tool returned."""
        if history[-1]["role"] != "tool":
            return {"role": "assistant", "content": "", "tool_calls": [{"name": "convert_time", "arguments": {
                "source_timezone": task["source"], "time": task["time"],
                "target_timezone": task["target"]}}]}
        try:  # {"source": {...}, "target": {"datetime": "2026-01-01T21:00:00+09:00", ...}, ...}
            converted = json.loads(history[-1]["content"])["target"]["datetime"]
            answer = converted.split("T", 1)[1][:5]
        except (ValueError, KeyError, IndexError, TypeError):
            answer = "unknown"  # the tool failed: the reward says so
        return {"role": "assistant", "content": f"It is {answer} in {task['target']}."}


agentrl.register_env("time-mcp-v0", entry_point="mcp_time_env:TimeEnv",
                     description="timezone conversion with the tools of mcp-server-time")


def main() -> None:
    env = TimeEnv(render_mode="ansi")
    try:
        for task in env.task_set():
            _, info = env.reset(options={"task": task})
            terminated = truncated = False
            reward = 0.0
            while not (terminated or truncated):
                action = env.oracle_action(env.state.task, env.messages)
                _, reward, terminated, truncated, _ = env.step(action)
            print(f"--- {task['id']}\n{env.render()}\nreward {reward}\n")
    finally:
        env.close()


if __name__ == "__main__":
    sys.exit(main())
