"""``swe-bench-v0``: SWE-bench-format instances, each played in its own Docker image.

A row has ``instance_id``, ``repo``, ``base_commit``, ``problem_statement``, ``patch`` (the
reference fix), ``test_patch``, ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` (lists of test ids, or
JSON strings of them, as in the published datasets) and ``image`` (a local Docker image holding
the repository at ``repo_path``, ``/testbed`` by default). Optional: ``test_cmd`` (default
``python3 -m pytest -rA -p no:cacheprovider``) and ``test_directives`` (what it runs; default:
the files ``test_patch`` touches, as the official harness does).

The sandbox's root file system is read-only, so an episode starts by copying the repository
into the writable workspace (``/workspace``), where the agent works. By default
(``hide_git_history=True``) the agent sees no history beyond the base commit: the image's
``repo_path/.git`` is hidden under an empty folder, and the workspace gets a fresh git
repository whose one commit is the base tree (an image's history can hold the fix itself: a
later commit, a branch, a tag, the reflog). Grading follows the
official harness: the files ``test_patch`` touches are reset, ``test_patch`` is applied, the
test command runs, and its ``-rA`` report is parsed; reward 1.0 only when every FAIL_TO_PASS
test and every PASS_TO_PASS test passed (``PASSED`` or ``XFAIL``). Before that, what the
episode left running is killed, and every test file and pytest-configuration file
(``conftest.py``, ``pytest.ini``, ``.pytest.ini``, ``pytest.toml``, ``tox.ini``,
``setup.cfg``, ``pyproject.toml``) of the workspace is put back as it is in the image's
untouched ``repo_path`` (new ones deleted), so editing tests never earns reward; new symlinks
to directories and new top-level modules that shadow installed ones (a ``pytest.py``) are
deleted, and the test command runs without the user site (``$HOME`` is the workspace).

What this cannot prevent: the repository's own code runs inside the test process, so code the
agent writes there can rewrite pytest's report from inside (the official harness has the same
limit); see ``docs/grading-attacks.md``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl import EpisodeState
from agentrl.env import TaskFields, check_split
from agentrl.env.sandboxed import SandboxedToolEnv
from agentrl.sandbox import WORKSPACE, Limits, Sandbox, SandboxError
from agentrl.tools import ToolCall
from agentrl_envs.swe_tools import _grader, grading
from agentrl_envs.swe_tools.env import made_call
from agentrl_tools.bash import bash
from agentrl_tools.editor import editor
from agentrl_tools.run_tests import run_tests
from agentrl_tools.search import search
from agentrl_tools.submit import submit

DEFAULT_TEST_CMD = "python3 -m pytest -rA -p no:cacheprovider"
REQUIRED = ("instance_id", "base_commit", "problem_statement", "patch", "test_patch",
            "FAIL_TO_PASS", "PASS_TO_PASS")
PASSING = ("PASSED", "XFAIL")
TEST_ENV = {"PYTHONNOUSERSITE": "1"}
"""Environment of the grading test run: no user site (``$HOME`` is the workspace)."""
_STATUSES = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL", "XPASS")
FRESH_HISTORY = (
    "rm -rf .git && if command -v git >/dev/null 2>&1; then "
    "git -c init.defaultBranch=main init -q && git add -A && "
    "git -c user.name=agentrl -c user.email=agentrl@localhost -c commit.gpgsign=false "
    "commit -q --no-verify --allow-empty -m 'The repository at its base commit'; fi"
)
"""Replaces the workspace's git repository by one whose only commit is the tree as copied."""

SYSTEM_PROMPT = """\
You are a software engineer resolving an issue in the repository in /workspace (your working \
directory; no network). Tools: bash (persistent shell), editor (view and edit files), search \
(regex search), run_tests (pytest), submit (end the episode). Make the smallest change to the \
non-test code that resolves the issue. Tests are added when your work is graded; changes to \
test files are discarded. Call submit when you are done."""


def test_ids(value: Any) -> list[str]:
    """A FAIL_TO_PASS / PASS_TO_PASS field as a list (datasets store JSON strings)."""
    if isinstance(value, str):
        return list(json.loads(value)) if value.strip() else []
    return [str(v) for v in value or ()]


def parse_pytest_log(log: str) -> dict[str, str]:
    """Test id -> status from pytest's ``-rA`` short summary (``PASSED id``, ``FAILED id -
    message``), the way the official harness reads it."""
    statuses: dict[str, str] = {}
    for line in log.splitlines():
        status, _, rest = line.strip().partition(" ")
        if status in _STATUSES and rest:
            test = rest.split(" - ", 1)[0].strip()
            statuses[test] = status
    return statuses


def patched_paths(patch: str) -> list[str]:
    """Repository paths a unified diff touches."""
    paths = []
    for old, new, _ in _grader.patch_files(patch):
        for p in (new, old):
            if p != "/dev/null":
                path = p[2:] if p[:2] in ("a/", "b/") else p
                if path not in paths:
                    paths.append(path)
                break
    return paths


class SweBenchEnv(SandboxedToolEnv):
    """SWE-bench-format instances in their Docker images, graded like the official harness.

    Args:
        instances: The rows (see the module docstring).
        instances_path: A JSON or JSONL file of rows (instead of ``instances``).
        repo_path: Where the images hold the repository.
        test_timeout: Seconds the grading test run may take.
        hide_git_history: Hide the image's ``repo_path/.git`` (an empty folder is mounted
            over it) and give the workspace a fresh repository with the base tree as its only
            commit, so later commits, branches, tags or the reflog of the image cannot hand
            the agent the fix. ``False`` keeps the image's history as it is.
        **kwargs: Passed to :class:`agentrl.env.SandboxedToolEnv`; the backend must be docker.
    """

    tools = (bash, editor, search, run_tests, submit)
    default_max_turns = 30
    task_fields = TaskFields(
        {"instance_id": "the SWE-bench instance id", "problem_statement": "the issue",
         "base_commit": "the commit the issue is against", "patch": "the reference fix (a diff)",
         "test_patch": "the tests added with the fix (a diff)",
         "FAIL_TO_PASS": "the tests the fix makes pass", "PASS_TO_PASS": "the tests that must keep passing",
         "image": "the instance's Docker image"},
        prompt="problem_statement",
        public=("instance_id", "id", "split", "repo", "version", "base_commit", "problem_statement",
                "image", "created_at"),
        # the failing and passing test lists name the tests the fix is graded by; the hints are
        # SWE-bench's optional help, off as in its default setting
        private=("patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS", "hints_text"))
    default_limits = Limits(timeout_s=300, memory_mb=4096, cpu_s=1800, pids=512,
                            workspace_mb=4096, file_size_mb=512)

    def __init__(
        self,
        *,
        instances: Sequence[Mapping[str, Any]] | None = None,
        instances_path: str | Path | None = None,
        repo_path: str = "/testbed",
        test_timeout: float = 1800,
        hide_git_history: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("sandbox", "docker")
        super().__init__(**kwargs)
        if self.sandbox_backend != "docker":
            raise ValueError("swe-bench-v0 runs each instance in its Docker image: use sandbox='docker'")
        rows = list(instances or ())
        if instances_path is not None:
            text = Path(instances_path).read_text(encoding="utf-8")
            rows += json.loads(text) if text.lstrip().startswith("[") else [
                json.loads(line) for line in text.splitlines() if line.strip()
            ]
        for row in rows:
            missing = [k for k in (*REQUIRED, "image") if k not in row]
            if missing:
                raise ValueError(f"instance {row.get('instance_id')!r} lacks {missing}")
        self.instances = [dict(r) for r in rows]
        self.repo_path = repo_path
        self.test_timeout = test_timeout
        self.hide_git_history = hide_git_history
        self.last_report: dict[str, Any] | None = None

    def task_set(self, split: str = "test", limit: int | None = None) -> list[dict[str, Any]]:
        """The instances whose ``split`` field (default ``test``) is ``split``, in given order.

        Raises:
            UnknownSplitError: No instance is in ``split``.
        """
        splits = sorted({r.get("split", "test") for r in self.instances})
        check_split(self, split, splits, reason="" if self.instances else
                    "SweBenchEnv has no instances: pass instances= or instances_path=")
        rows = [r for r in self.instances if r.get("split", "test") == split]
        return rows if limit is None else rows[:limit]

    def sample_task(self) -> dict[str, Any]:
        """An instance drawn with ``self.np_random``."""
        if not self.instances:
            raise ValueError("SweBenchEnv has no instances: pass instances= or instances_path=")
        return self.instances[int(self.np_random.integers(len(self.instances)))]

    def sandbox_options_for(self, task: Mapping[str, Any]) -> Mapping[str, Any]:
        """The instance's image (one pool per image; all share ``max_concurrent_sandboxes``),
        with an empty folder over the image's ``repo_path/.git`` unless ``hide_git_history``
        is off."""
        options: dict[str, Any] = {**self.sandbox_options, "image": task["image"]}
        if self.hide_git_history:
            git = self.repo_path.rstrip("/") + "/.git"
            options["private_dirs"] = {**options.get("private_dirs", {}), git: "ro"}
        return options

    async def prepare_sandbox(self, sandbox: Sandbox, task: Mapping[str, Any]) -> None:
        """Copies the repository from ``repo_path`` into the workspace (with
        ``hide_git_history``, then makes its git history the base commit alone)."""
        src = shlex.quote(self.repo_path.rstrip("/") + "/.")
        copied = await sandbox.exec(f"cp -R {src} {WORKSPACE}/", timeout=600)
        if not copied.ok:
            raise SandboxError(f"cannot copy {self.repo_path} into the workspace: {copied.to_text()}")
        if self.hide_git_history:
            fresh = await sandbox.exec(FRESH_HISTORY, timeout=600)
            if not fresh.ok:
                raise SandboxError(f"cannot make the workspace's git history: {fresh.to_text()}")

    def make_prompt(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        """System message (tools, rules) and the issue."""
        repo = task.get("repo", "the repository")
        user = f"Repository: {repo} (in /workspace)\n\nPlease resolve this issue:\n\n{task['problem_statement']}"
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]

    async def compute_reward(
        self, task: Mapping[str, Any], final: Mapping[str, Any], state: EpisodeState
    ) -> float:
        """1.0 when the instance is resolved (``self.last_report`` keeps the report)."""
        if self.sandbox is None:
            return 0.0
        report = await self.grade(self.sandbox, task)
        self.last_report = report
        state.grade = report
        return 1.0 if report["resolved"] else 0.0

    async def grade(self, sandbox: Sandbox, task: Mapping[str, Any]) -> dict[str, Any]:
        """Applies the test patch and runs the tests; the report says which passed."""
        fail_to_pass, pass_to_pass = test_ids(task["FAIL_TO_PASS"]), test_ids(task["PASS_TO_PASS"])
        report: dict[str, Any] = {"resolved": False, "FAIL_TO_PASS": {}, "PASS_TO_PASS": {}}
        prepared = await grading.run_grader(sandbox, {
            "mode": "swebench", "root": WORKSPACE, "pristine": self.repo_path,
            "touched": patched_paths(task["test_patch"]), "patch": task["test_patch"],
        }, timeout=600)
        if not prepared.get("applied"):
            report["error"] = f"test patch not applied: {prepared.get('error')}"
            return report
        directives = task.get("test_directives") or [
            p for p in patched_paths(task["test_patch"]) if p.endswith(".py")
        ]
        command = f"{task.get('test_cmd') or DEFAULT_TEST_CMD} {' '.join(map(shlex.quote, directives))}"
        # The workspace is the sandbox's HOME: without this, .pth files or a usercustomize.py
        # under /workspace/.local would run inside the test process.
        result = await sandbox.exec(command, timeout=self.test_timeout, env=TEST_ENV)
        statuses = parse_pytest_log(result.stdout)
        report["FAIL_TO_PASS"] = {t: statuses.get(t, "MISSING") for t in fail_to_pass}
        report["PASS_TO_PASS"] = {t: statuses.get(t, "MISSING") for t in pass_to_pass}
        report["timed_out"] = result.timed_out
        report["resolved"] = not result.timed_out and all(
            s in PASSING for part in ("FAIL_TO_PASS", "PASS_TO_PASS") for s in report[part].values()
        )
        return report

    def oracle_action(self, task: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> str:
        """Applies ``patch`` hunk by hunk with the editor (one turn), then submits."""
        calls = []
        for old, new, hunks in _grader.patch_files(task["patch"]):
            path = (new if new != "/dev/null" else old)[2:]
            if old == "/dev/null":
                text = "".join(line for _, _, after in hunks for line in after)
                calls.append(ToolCall("editor", {"command": "create", "path": path, "file_text": text}))
            elif new == "/dev/null":
                calls.append(ToolCall("bash", {"command": f"rm -f -- {shlex.quote(path)}"}))
            else:
                for _, before, after in hunks:
                    calls.append(ToolCall("editor", {"command": "str_replace", "path": path,
                                                     "old_str": "".join(before), "new_str": "".join(after)}))
        if calls and made_call(history, calls[0]):
            return self.format.render("The patch is applied.", [ToolCall("submit", {})])
        return self.format.render("Applying the fix.", calls)
