"""The ``swe-tools`` environment: fix an injected bug in a small real Python project."""

from __future__ import annotations

import ast
import asyncio
import hashlib
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl import EpisodeState
from agentrl.env import TaskFields, check_split
from agentrl.env.sandboxed import SandboxedToolEnv
from agentrl.sandbox import Limits, Sandbox
from agentrl.tools import ToolCall
from agentrl_envs.swe_tools import generate, grading
from agentrl_tools.bash import bash
from agentrl_tools.editor import editor
from agentrl_tools.run_tests import run_tests
from agentrl_tools.search import search
from agentrl_tools.submit import submit

SPLITS = ("train", "test")
REWARDS = ("binary", "fraction")

SYSTEM_PROMPT = """\
You are a software engineer fixing a bug in a Python project. The project is in /workspace, \
your working directory; there is no network.

Tools:
- bash: run shell commands in a persistent shell.
- editor: view files, and edit them (str_replace needs an exact, unique match).
- search: search file contents (or names) with a regular expression.
- run_tests: run the project's tests with pytest (by default {visible}).
- submit: submit your fix and end the episode.

Find the cause of the issue in the source code and fix it with a small change. Do not change \
the tests: your fix is graded with the project's full test suite, including tests you cannot \
see, and changes to test files are discarded. Call submit when you are done."""

COMPACT_SYSTEM_PROMPT = """\
Fix the bug in the Python project in /workspace. Tools: search(pattern, path), \
editor(command=view|str_replace, path, view_range, old_str, new_str), run_tests(), submit(). \
Call one like this:
{example}
Look before you edit, run the tests, then submit."""
"""The ``compact=True`` system prompt; ``{example}`` is one call in the env's tool-call format."""
_EXAMPLE_CALL = ToolCall("editor", {"command": "view", "path": "app.py", "view_range": [10, 20]})
LEVELS = ("standard", "located")
"""``standard``: the issue as a user reports it. ``located``: the issue also names the file and
line of the bug and quotes that line (for small models; see :class:`SweToolsEnv`)."""
VIEW_MARGIN = 4
"""Lines the oracle views on each side of the line it fixes."""

_LOADED: dict[tuple, list[dict[str, Any]]] = {}
_LOAD_LOCK = threading.Lock()


def _order_key(task: Mapping[str, Any]) -> str:
    return hashlib.blake2b(str(task["id"]).encode(), digest_size=8).hexdigest()


class SweToolsEnv(SandboxedToolEnv):
    """Fix a bug in a small real Python project (a stdlib module and its CPython tests).

    Each task is a standard-library module under a new name with one injected bug, the visible
    part of its tests and an issue text (see :mod:`agentrl_envs.swe_tools.generate`). Tools:
    bash, editor, search, run_tests, submit. The episode is graded when the agent submits or
    answers without a tool call: what the episode left running is killed, the project's source
    files are copied from the workspace into a fresh directory next to the *original* visible
    tests and the hidden tests (whatever the agent did to test files, ``conftest.py`` or pytest
    configuration in the workspace is not used), and pytest runs them all there. The source
    files run inside that test process, so before the run they are screened: one that imports a
    module its original does not, or uses more of the interpreter's introspection and process
    hooks than the original (``sys.modules``, frames, ``gc``, ``getattr``, ``os._exit``, dunders
    such as ``__globals__``...), is refused and the episode scores 0 (see
    ``docs/grading-attacks.md``).

    Args:
        split: Tasks that ``reset()`` without a task draws from: ``train`` or ``test``.
        reward: ``binary`` (1.0 when every test passes, else 0.0) or ``fraction`` (the share of
            tests that pass).
        seed: Generation seed of the task set.
        tasks_path: A JSONL file of task rows to use instead of the cache.
        cache_dir: Where the generated tasks are cached (default
            ``$AGENTRL_CACHE/swe-tools-v1`` or ``~/.cache/agentrl/swe-tools-v1``).
        modules: Standard-library modules to draw from (default: all nine).
        per_module: Most tasks per module.
        test_timeout: Seconds the grading test run may take.
        level: ``standard`` (default): the issue as a user would report it (the failing check,
            its error, the API it exercises). ``located``: the issue also says in which file
            and on which line the bug is, and quotes that line; the agent still has to see what
            is wrong, edit it, and is graded by the same hidden tests. A level for small models
            (the built-in tiny model cannot find a bug from a test failure alone).
        compact: A short system prompt that names the tools and shows one call, instead of
            the chat template's listing of every tool's JSON schema (about 1,500 tokens with
            the built-in tiny tokenizer); ``reset`` then returns no schemas in
            ``info["tools"]``. The tools run and are parsed exactly as before.
        **kwargs: Passed to :class:`agentrl.env.SandboxedToolEnv` (``sandbox``, ``limits``,
            ``max_turns``, ...).
    """

    tools = (bash, editor, search, run_tests, submit)
    default_max_turns = 20
    task_fields = TaskFields(
        {"id": "the task's id",
         "files": "the buggy project: path -> content",
         "problem_statement": "the issue, as the user reports it",
         "fix": "the reference fix: path, old and new text",
         "visible_tests": "the test file the agent sees and may run",
         "hidden_tests": "the grading tests: path -> content",
         "test_ids": "the pytest ids that must pass"},
        prompt="problem_statement",
        example={"id": "my-task-1", "files": {"mod.py": "def double(x):\n    return x + x + 1\n",
                                              "tests/test_visible.py": "from mod import double\n"},
                 "problem_statement": "double(2) returns 5, not 4.",
                 "fix": {"path": "mod.py", "old": "x + x + 1", "new": "x + x"},
                 "visible_tests": "tests/test_visible.py",
                 "hidden_tests": {"tests/test_hidden.py": "from mod import double\n\n"
                                  "def test_double():\n    assert double(2) == 4\n"},
                 "test_ids": ["tests/test_hidden.py::test_double"]},
        public=("id", "split", "module", "files", "problem_statement", "visible_tests"),
        # the mutation, its difficulty record and the failing hidden tests all point at the fix
        private=("fix", "hidden_tests", "test_ids", "failing_tests", "mutation", "difficulty"))
    default_limits = Limits(timeout_s=120, memory_mb=2048, cpu_s=300)

    def __init__(
        self,
        *,
        split: str = "train",
        reward: str = "binary",
        seed: int = 0,
        tasks_path: str | Path | None = None,
        cache_dir: str | Path | None = None,
        modules: Sequence[str] | None = None,
        per_module: int = generate.DEFAULT_PER_MODULE,
        test_timeout: float = 300,
        level: str = "standard",
        compact: bool = False,
        **kwargs: Any,
    ) -> None:
        check_split(type(self), split, SPLITS)
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
        if level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
        if not isinstance(compact, bool):
            raise ValueError(f"compact must be true or false, got {compact!r}")
        super().__init__(**kwargs)
        self.level = level
        self.compact = compact
        self.show_tool_schemas = not compact  # the compact prompt names the tools itself
        self.split = split
        self.reward = reward
        self.seed = seed
        self.tasks_path = Path(tasks_path) if tasks_path else None
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.modules = tuple(modules) if modules else None
        self.per_module = per_module
        self.test_timeout = test_timeout
        self.last_grade: grading.GradeResult | None = None

    # -- tasks -------------------------------------------------------------------------------

    def all_tasks(self) -> list[dict[str, Any]]:
        """Every task row (loaded once per process; generated into the cache on first use)."""
        key = (self.tasks_path, self.cache_dir, self.seed, self.modules, self.per_module)
        with _LOAD_LOCK:
            if key not in _LOADED:
                if self.tasks_path is not None:
                    rows = generate.read_jsonl(self.tasks_path)
                else:
                    rows = generate.load_or_generate(
                        self.cache_dir, seed=self.seed, modules=self.modules,
                        per_module=self.per_module,
                    )
                _LOADED[key] = sorted(rows, key=_order_key)
            return _LOADED[key]

    def task_set(self, split: str = "test", limit: int | None = None) -> list[dict[str, Any]]:
        """The tasks of ``split`` in a fixed order that mixes modules (a hash of the id).

        Args:
            split: ``train`` or ``test``.
            limit: Keep only the first ``limit`` tasks.

        Raises:
            UnknownSplitError: Another split.
        """
        check_split(self, split, SPLITS)
        rows = [t for t in self.all_tasks() if t["split"] == split]
        return rows if limit is None else rows[:limit]

    async def sample_task(self) -> dict[str, Any]:
        """A task of ``self.split`` drawn with ``self.np_random`` (loading or generating the
        tasks in a worker thread on first use)."""
        rows = await asyncio.to_thread(self.task_set, self.split)
        return rows[int(self.np_random.integers(len(rows)))]

    # -- episode -----------------------------------------------------------------------------

    async def prepare_sandbox(self, sandbox: Sandbox, task: Mapping[str, Any]) -> None:
        """Writes the buggy project and its visible tests into the workspace."""
        for path, content in task["files"].items():
            await sandbox.write_file(path, content)

    def make_prompt(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        """System message (tools, rules) and user message (files, issue)."""
        visible = task.get("visible_tests", "tests")
        listing = "\n".join(
            f"  {path} ({len(content.splitlines())} lines)"
            for path, content in sorted(task["files"].items())
        )
        user = (
            f"The project in /workspace has these files:\n{listing}\n\n"
            f"Please fix this issue:\n\n{task['problem_statement']}"
        )
        if self.level == "located":
            line, text = bug_line(task)
            user += f"\n\nThe bug is in {task['fix']['path']}, line {line}:\n```python\n{text}\n```"
        system = (COMPACT_SYSTEM_PROMPT.format(example=self.format.render("", [_EXAMPLE_CALL]))
                  if self.compact else SYSTEM_PROMPT.format(visible=visible))
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]


    async def compute_reward(
        self, task: Mapping[str, Any], final: Mapping[str, Any], state: EpisodeState
    ) -> float:
        """Grades the workspace (see the class docstring); ``self.last_grade`` keeps details."""
        if self.sandbox is None:
            return 0.0
        result = await grade_task(self.sandbox, task, self.test_timeout)
        self.last_grade = result
        state.grade = {"passed": sorted(result.passed & set(result.expected)),
                       "expected": list(result.expected), "error": result.error,
                       "log_tail": str(result.details.get("log_tail", ""))[-2000:]}
        if self.reward == "fraction":
            return result.fraction
        return 1.0 if result.all_passed else 0.0

    def oracle_action(self, task: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> str:
        """The next step of an engineer's procedure that knows the fix (:meth:`oracle_plan`):
        the first planned call not made yet, with a short note."""
        for note, call in self.oracle_plan(task):
            if not made_call(history, call):
                return self.format.render(note, [call])
        return self.format.render("Done.", [ToolCall("submit", {})])

    def oracle_plan(self, task: Mapping[str, Any]) -> list[tuple[str, ToolCall]]:
        """Look, then edit: search for the function the bug is in (``standard`` level; the
        ``located`` issue already says where), view the lines around it, replace the buggy
        text, run the visible tests, submit. With fewer than five turns (``max_turns``) the
        test run goes first, then the search: the edit and the submit always stay."""
        fix = task["fix"]
        line, _ = bug_line(task)
        last = task["files"][fix["path"]].count("\n") + 1
        view = [max(1, line - VIEW_MARGIN), min(last, line + VIEW_MARGIN)]
        function = enclosing_function(task["files"][fix["path"]], line)
        steps: list[tuple[str, str, ToolCall]] = []
        if self.level == "standard" and function is not None:
            steps.append(("search", f"I will find `{function}`.",
                          ToolCall("search", {"pattern": f"def {function}\\b", "path": fix["path"]})))
        steps += [
            ("view", "Let me look at the code.",
             ToolCall("editor", {"command": "view", "path": fix["path"], "view_range": view})),
            ("edit", "This line is wrong; I will fix it.",
             ToolCall("editor", {"command": "str_replace", "path": fix["path"],
                                 "old_str": fix["old"], "new_str": fix["new"]})),
            ("test", "Now the tests.", ToolCall("run_tests", {})),
            ("submit", "The tests pass.", ToolCall("submit", {})),
        ]
        for optional in ("test", "search", "view"):
            if len(steps) <= self.max_turns:
                break
            steps = [step for step in steps if step[0] != optional]
        return [(note, call) for _, note, call in steps]


def bug_line(task: Mapping[str, Any]) -> tuple[int, str]:
    """The 1-based line of the buggy file where the fix's old text starts, and that line."""
    buggy = task["files"][task["fix"]["path"]]
    start = buggy.index(task["fix"]["old"]) if task["fix"]["old"] else 0
    number = buggy.count("\n", 0, start) + 1
    return number, buggy.splitlines()[number - 1] if buggy else ""


def enclosing_function(source: str, line: int) -> str | None:
    """The name of the innermost function (or method) whose body holds ``line``."""
    best: tuple[int, str] | None = None
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.lineno <= line <= (node.end_lineno or 0):
            if best is None or node.lineno > best[0]:
                best = (node.lineno, node.name)
    return best[1] if best else None


def made_call(history: Sequence[Mapping[str, Any]], call: ToolCall) -> bool:
    """Whether an assistant turn of ``history`` already made ``call`` (same name and
    arguments)."""
    return any(
        made.get("name") == call.name and made.get("arguments") == call.arguments
        for message in history if message.get("role") == "assistant"
        for made in message.get("tool_calls") or ()
    )


async def grade_task(sandbox: Sandbox, task: Mapping[str, Any], timeout: float) -> grading.GradeResult:
    """Grades a swe-tools task in ``sandbox`` (see :class:`SweToolsEnv`)."""
    originals = {p: c for p, c in task["files"].items() if not _is_source(p, task)}
    hidden = dict(task["hidden_tests"])
    sources = [p for p in task["files"] if _is_source(p, task)]
    fix = task["fix"]
    texts = {p: [task["files"][p]] for p in sources}
    if fix["path"] in texts:
        texts[fix["path"]].append(task["files"][fix["path"]].replace(fix["old"], fix["new"], 1))
    return await grading.grade_project(
        sandbox,
        sources=sources,
        files={**originals, **hidden},
        targets=sorted({task["visible_tests"], *hidden}),
        expected=task["test_ids"],
        timeout=timeout,
        originals=texts,
    )


def _is_source(path: str, task: Mapping[str, Any]) -> bool:
    """A file the agent is meant to change: a ``.py`` file that is not a test file."""
    return path.endswith(".py") and path != task.get("visible_tests") and not path.startswith("tests/")
