"""Host side of grading: runs :mod:`._grader` in an episode's sandbox and reads its answer."""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.sandbox import WORKSPACE, Sandbox

GRADER_SOURCE = Path(__file__).with_name("_grader.py").read_text(encoding="utf-8")
MARKER = "__agentrl_grade__ "
GRADER_ENV = {"PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
"""The tests ran with hash seed 0 when the tasks were generated; grading matches that."""
BOOTSTRAP = (
    "import sys\n"
    "if sys.path[:1] == ['']:\n"
    "    del sys.path[0]\n"
    "exec(compile(sys.argv[1], '_grader.py', 'exec'), {'__name__': '__main__'})\n"
)
"""What ``python3 -s -c`` runs: it drops the working directory (the agent's workspace) that
``-c`` puts first on ``sys.path``, then runs the grader given as the first argument. ``-P``
would do the first part, but only Python 3.11 and later know it, and SWE-bench images often
have older ones."""


@dataclasses.dataclass(frozen=True)
class GradeResult:
    """What grading saw.

    Attributes:
        passed: Expected test ids that passed.
        expected: Every test id that has to pass.
        error: Why grading could not run the tests (timeout, crash), or ``None``.
        details: The grader's raw answer (outcomes, exit code, log tail) for debugging.
    """

    passed: frozenset[str]
    expected: tuple[str, ...]
    error: str | None = None
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def all_passed(self) -> bool:
        """Every expected test passed."""
        return self.error is None and bool(self.expected) and set(self.expected) <= self.passed

    @property
    def fraction(self) -> float:
        """Share of the expected tests that passed."""
        return len(self.passed & set(self.expected)) / len(self.expected) if self.expected else 0.0


async def run_grader(sandbox: Sandbox, request: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """Runs the in-sandbox grader with ``request``; returns its answer (``error`` set when it
    produced none).

    The answer counts only when the grader exited 0 within ``timeout`` and its last line is
    the answer line with this run's nonce (drawn here, sent on stdin): a line the graded code
    printed, before or after, or in a run it cut short, is not taken.
    """
    nonce = secrets.token_hex(16)
    result = await sandbox.exec(
        ["python3", "-s", "-c", BOOTSTRAP, GRADER_SOURCE], stdin=json.dumps({**request, "nonce": nonce}),
        timeout=timeout, env=GRADER_ENV,
    )
    lines = result.stdout.rstrip("\n").splitlines()
    prefix = f"{MARKER}{nonce} "
    if result.ok and lines and lines[-1].startswith(prefix):
        try:
            answer = json.loads(lines[-1][len(prefix):])
        except ValueError:
            answer = None
        if isinstance(answer, dict):
            return answer
    reason = "timed out" if result.timed_out else f"exit code {result.exit_code}"
    return {"error": f"grader {reason}: {(result.stderr or result.stdout)[-2000:]}"}


async def stop_leftovers(sandbox: Sandbox, timeout: float = 30) -> None:
    """Kills what the episode left running in the sandbox (see :mod:`._grader`)."""
    await run_grader(sandbox, {"mode": "stop"}, timeout)


async def grade_project(
    sandbox: Sandbox,
    *,
    sources: Sequence[str],
    files: Mapping[str, str],
    targets: Sequence[str],
    expected: Sequence[str],
    timeout: float,
    originals: Mapping[str, Sequence[str]] | None = None,
) -> GradeResult:
    """Grades a swe-tools project in a fresh copy: the agent's ``sources`` plus the original
    ``files`` (tests, config), pytest on ``targets``; ``expected`` ids must pass.

    ``originals`` maps a source to the task's texts of it (as given, and fixed): the agent's
    version may not add imports or uses of the interpreter's introspection and process hooks
    that none of those has (see :func:`._grader.screen_source`); a refused source is an error.
    Sources it does not list are not screened.
    """
    answer = await run_grader(sandbox, {
        "mode": "project", "root": WORKSPACE, "sources": list(sources), "files": dict(files),
        "targets": list(targets),
        "originals": {path: list(texts) for path, texts in (originals or {}).items()},
    }, timeout)
    if "error" in answer:
        return GradeResult(frozenset(), tuple(expected), answer["error"], answer)
    passed = frozenset(k for k, v in answer.get("outcomes", {}).items() if v == "passed")
    return GradeResult(passed, tuple(expected), None, answer)
