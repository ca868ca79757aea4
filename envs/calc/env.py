"""The ``calc`` environment and its scripted oracle."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl import EpisodeState, ToolEnv
from agentrl.tools import ToolCall
from agentrl_envs.calc.tasks import SPLITS, load_tasks, sample_task
from agentrl_tools.calculator import calculator

SYSTEM_PROMPT = (
    "Solve the arithmetic problem. Use the calculator tool for the arithmetic. "
    "When you know the result, reply with 'Answer: <integer>' and no tool call."
)
_ANSWER_RE = re.compile(r"Answer:\s*(-?\d+)")


class CalcEnv(ToolEnv):
    """Arithmetic word problems with a calculator tool; reward 1 for the right answer.

    Args:
        split: Task split that ``reset()`` without a task draws from (``train`` or ``test``).
        max_turns: Assistant turns before truncation (default 4: one call, one answer, slack).
        **kwargs: Passed to :class:`agentrl.ToolEnv`.
    """

    tools = (calculator,)
    default_max_turns = 4

    def __init__(self, *, split: str = "train", **kwargs: Any) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        super().__init__(**kwargs)
        self.split = split

    def sample_task(self) -> dict[str, Any]:
        return sample_task(self.np_random, self.split)

    def make_prompt(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": str(task["question"])},
        ]

    def compute_reward(self, task: Mapping[str, Any], final: Mapping[str, Any], state: EpisodeState) -> float:
        answers = _ANSWER_RE.findall(final.get("content", ""))
        return 1.0 if answers and int(answers[-1]) == int(task["answer"]) else 0.0

    def task_set(self, split: str = "test", limit: int | None = None) -> list[dict[str, Any]]:
        return load_tasks(split, 1000 if limit is None else limit)

    def oracle_action(self, task: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> str:
        return calc_oracle(self, task, history)


def calc_oracle(env: ToolEnv, task: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> str:
    """The scripted expert: call the calculator on the task's expression, then answer.

    Returns raw assistant text in the env's tool-call format, exactly as a model would write it.
    """
    last = history[-1] if history else None
    if last is not None and last.get("role") == "tool" and not last["content"].startswith("Error"):
        return f"The result is {last['content']}.\nAnswer: {last['content']}"
    call = ToolCall("calculator", {"expression": str(task["expression"])})
    return env.format.render("Let me compute this.", [call])
