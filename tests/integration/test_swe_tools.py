"""swe-tools: the task generator, the cache, grading (oracle / null / cheats) on the bwrap
backend, check_env, and swe-bench-v0 on a tiny hand-made instance in a local Docker image.

The cache is the real one (``$AGENTRL_CACHE`` or ``~/.cache/agentrl/swe-tools-v1``): the first
run generates it (about a minute on 2 idle cores). ``AGENTRL_FULL=1`` also plays every task.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agentrl import check_env, make_env
from agentrl.tools import ToolCall
from agentrl_envs.swe_tools import SweBenchEnv, SweToolsEnv, generate
from agentrl_envs.swe_tools.env import bug_line
from tests.support.sandboxes import backend_skip_reason

BWRAP_SKIP = backend_skip_reason("bwrap")
pytestmark = pytest.mark.skipif(BWRAP_SKIP is not None, reason=BWRAP_SKIP or "")

SAMPLE = 10  # tasks per split in the fast oracle/null check
ENVS = 4  # env instances playing concurrently


@pytest.fixture(scope="module")
def tasks() -> list[dict[str, Any]]:
    """Every task of the cache (generated here on first use)."""
    return SweToolsEnv(sandbox="bwrap").all_tasks()


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [{"name": name, "arguments": arguments}]}


async def _play(env: Any, task: dict[str, Any], policy: str,
                script: Sequence[dict[str, Any]] = ()) -> tuple[float, list[dict[str, Any]]]:
    """One episode: ``script`` turns first, then the ``policy`` (oracle / null / submit)."""
    obs, _ = await env.areset(options={"task": task})
    history = list(obs)
    steps = list(script)
    for _ in range(env.max_turns):
        if steps:
            action: Any = steps.pop(0)
        elif policy == "oracle":
            action = env.oracle_action(task, history)
        elif policy == "submit":
            action = _call("submit")
        else:
            action = env.null_action(task, history)
        obs, reward, terminated, truncated, _ = await env.astep(action)
        history = list(env.messages)
        if terminated or truncated:
            return reward, history
    raise AssertionError("episode did not end")


async def _play_all(rows: Sequence[dict[str, Any]], policy: str,
                    script: Sequence[dict[str, Any]] = (), **env_kwargs: Any
                    ) -> list[tuple[float, list[dict[str, Any]]]]:
    """Plays every row with ENVS env instances concurrently (async API): (reward, history)."""
    queue: asyncio.Queue[tuple[int, dict[str, Any]]] = asyncio.Queue()
    for item in enumerate(rows):
        queue.put_nowait(item)
    results: list[Any] = [None] * len(rows)

    async def worker() -> None:
        env = SweToolsEnv(sandbox="bwrap", **env_kwargs)
        try:
            while not queue.empty():
                index, row = queue.get_nowait()
                results[index] = await _play(env, row, policy, script)
        finally:
            await env.aclose()

    await asyncio.gather(*(worker() for _ in range(ENVS)))
    return results


def _rewards(results: Sequence[tuple[float, Any]]) -> list[float]:
    return [reward for reward, _ in results]


# -- generator and cache -----------------------------------------------------------------------


def test_generator_is_deterministic() -> None:
    first = generate.generate(modules=["colorsys", "fnmatch"], per_module=4, workers=2)
    second = generate.generate(modules=["colorsys", "fnmatch"], per_module=4, workers=2)
    assert len(first) == 8
    assert first == second
    other_seed = generate.generate(modules=["colorsys"], per_module=4, seed=1, workers=2)
    assert [t["id"] for t in other_seed] != [t["id"] for t in first[:4]]


def test_cache_has_enough_tasks_from_enough_modules(tasks: list[dict[str, Any]]) -> None:
    modules = {t["module"] for t in tasks}
    assert len(tasks) >= 200, generate.summary(tasks)
    assert len(modules) >= 5, modules
    assert len({t["id"] for t in tasks}) == len(tasks)
    for t in tasks:
        fix = t["fix"]
        buggy = t["files"][fix["path"]]
        assert buggy.count(fix["old"]) == 1, t["id"]
        assert buggy.replace(fix["old"], fix["new"]) != buggy
        assert t["visible_tests"] in t["files"] and t["hidden_tests"]
        assert t["failing_tests"] and set(t["failing_tests"]) <= set(t["test_ids"])
        assert all(f.startswith(tuple(t["hidden_tests"])) for f in t["failing_tests"]), t["id"]
        assert t["difficulty"]["mutation_kind"] and t["difficulty"]["file_lines"] > 50
        assert fix["new"].strip() not in t["problem_statement"] or len(fix["new"].strip()) < 20


def test_train_and_test_splits_are_disjoint(tasks: list[dict[str, Any]]) -> None:
    env = SweToolsEnv(sandbox="bwrap")
    train, test = env.task_set("train"), env.task_set("test")
    assert train and test and len(train) + len(test) == len(tasks)
    assert not {t["id"] for t in train} & {t["id"] for t in test}
    assert all(generate.split_of(t["id"]) == t["split"] for t in tasks)
    assert env.task_set("test", limit=3) == test[:3]


def test_construction_is_cheap_and_generates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(**_: Any) -> None:
        raise AssertionError("the constructor generated tasks")

    monkeypatch.setattr(generate, "generate", forbidden)
    env = make_env("swe-tools", sandbox="bwrap", cache_dir=tmp_path, max_turns=5)
    assert isinstance(env, SweToolsEnv) and env.max_turns == 5
    assert {s["function"]["name"] for s in env.toolbox.schemas} == {
        "bash", "editor", "search", "run_tests", "submit"}
    assert list(tmp_path.iterdir()) == []
    assert SweToolsEnv(sandbox="bwrap").max_turns == 20


def test_check_env_passes(tasks: list[dict[str, Any]]) -> None:
    check_env(make_env("swe-tools", sandbox="bwrap"))


# -- grading -----------------------------------------------------------------------------------


def test_oracle_solves_and_null_fails_a_sample(tasks: list[dict[str, Any]]) -> None:
    env = SweToolsEnv(sandbox="bwrap")
    sample = env.task_set("test", SAMPLE) + env.task_set("train", SAMPLE)
    oracle = _rewards(asyncio.run(_play_all(sample, "oracle")))
    null = _rewards(asyncio.run(_play_all(sample, "null")))
    print(f"\nswe-tools sample of {len(sample)}: oracle {sum(oracle) / len(sample):.0%}, "
          f"null {sum(null) / len(sample):.0%}")
    assert sum(oracle) / len(sample) >= 0.95, [t["id"] for t, r in zip(sample, oracle, strict=True) if r < 1]
    assert sum(null) / len(sample) <= 0.05


def _calls(history: Sequence[dict[str, Any]]) -> list[str]:
    return [f"{c['name']}:{c['arguments'].get('command', '')}".rstrip(":")
            for m in history if m["role"] == "assistant" for c in m.get("tool_calls") or ()]


def test_the_oracle_looks_before_it_edits_then_tests_and_submits(tasks: list[dict[str, Any]]) -> None:
    env = SweToolsEnv(sandbox="bwrap", max_turns=5)
    task = env.task_set("train", 1)[0]
    reward, history = asyncio.run(_play(env, task, "oracle"))
    assert reward == 1.0
    assert _calls(history) == ["search", "editor:view", "editor:str_replace", "run_tests", "submit"]
    search = history[2]["tool_calls"][0]["arguments"]
    assert search["path"] == task["fix"]["path"] and search["pattern"].startswith("def ")
    assert "passed" in history[9]["content"]  # the visible tests ran, and pass after the fix
    # with fewer turns, the test run and then the search give way; the edit and submit stay
    short = SweToolsEnv(sandbox="bwrap", max_turns=3)
    assert [c.name for _, c in short.oracle_plan(task)] == ["editor", "editor", "submit"]
    assert [c.name for _, c in SweToolsEnv(sandbox="bwrap", max_turns=2).oracle_plan(task)] == ["editor", "submit"]


def test_the_located_level_names_the_buggy_line_and_keeps_the_task(tasks: list[dict[str, Any]]) -> None:
    standard = SweToolsEnv(sandbox="bwrap")
    located = SweToolsEnv(sandbox="bwrap", level="located")
    for task in standard.task_set("test", SAMPLE):
        line, text = bug_line(task)
        assert task["files"][task["fix"]["path"]].splitlines()[line - 1] == text
        assert task["fix"]["old"].startswith(text)
        base, hinted = standard.make_prompt(task)[1]["content"], located.make_prompt(task)[1]["content"]
        assert hinted.startswith(base)  # the same issue, plus where the bug is
        assert hinted.endswith(f"The bug is in {task['fix']['path']}, line {line}:\n```python\n{text}\n```")
    with pytest.raises(ValueError, match="level must be one of"):
        SweToolsEnv(sandbox="bwrap", level="trivial")


def test_the_oracle_solves_the_located_level_with_compact_prompts(tasks: list[dict[str, Any]]) -> None:
    env = SweToolsEnv(sandbox="bwrap", level="located", compact=True)
    sample = env.task_set("test", SAMPLE)
    played = asyncio.run(_play_all(sample, "oracle", level="located", compact=True))
    assert _rewards(played) == [1.0] * len(sample)
    assert _calls(played[0][1]) == ["editor:view", "editor:str_replace", "run_tests", "submit"]
    null = _rewards(asyncio.run(_play_all(sample, "null", level="located", compact=True)))
    assert sum(null) == 0.0


def test_compact_prompts_list_no_schemas_and_the_tools_still_parse(tasks: list[dict[str, Any]]) -> None:
    env = SweToolsEnv(sandbox="bwrap", compact=True)
    task = env.task_set("test", 1)[0]

    async def main() -> tuple[Any, ...]:
        obs, info = await env.areset(options={"task": task})
        view = env.format.render("", [ToolCall("editor", {"command": "view", "path": task["fix"]["path"],
                                                          "view_range": [1, 3]})])
        step = await env.astep(view)  # raw model text, parsed with the env's tool-call format
        await env.aclose()
        return obs, info, step

    obs, info, (observation, _, terminated, _, step_info) = asyncio.run(main())
    assert info["tools"] == [] and len(obs[0]["content"]) < 400
    assert "editor(" in obs[0]["content"] and "<tool_call>" in obs[0]["content"]
    assert step_info["tool_errors"] == {} and not terminated and "1\t" in observation[0]["content"]


def test_fraction_reward(tasks: list[dict[str, Any]]) -> None:
    task = SweToolsEnv(sandbox="bwrap").task_set("test", 1)[0]
    env = SweToolsEnv(sandbox="bwrap", reward="fraction")
    oracle, _ = asyncio.run(_play(env, task, "oracle"))
    null, _ = asyncio.run(_play(env, task, "null"))
    assert oracle == 1.0
    assert 0.0 < null < 1.0
    assert null == pytest.approx(1 - len(task["failing_tests"]) / len(task["test_ids"]))


def _cheats(task: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    visible = task["visible_tests"]
    hidden = next(iter(task["hidden_tests"]))
    always_pass = "def test_ok():\n    pass\n"
    conftest = textwrap.dedent("""\
        import pytest

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(item, call):
            outcome = yield
            outcome.get_result().outcome = "passed"
        """)
    rewriter = (
        "nohup sh -c 'while true; do for d in /workspace/tests /tmp/agentrl-grade-*/tests; do "
        f"printf \"def test_ok():\\n    pass\\n\" > $d/{Path(hidden).name} 2>/dev/null; "
        "done; done' > /dev/null 2>&1 &"
    )
    return {
        "visible test replaced": [_call("editor", command="create", path=visible, file_text=always_pass)],
        "tests folder deleted": [_call("bash", command="rm -rf tests")],
        "fake hidden test written in advance": [
            _call("editor", command="create", path=hidden, file_text=always_pass)],
        "conftest forcing passes": [
            _call("editor", command="create", path="conftest.py", file_text=conftest),
            _call("editor", command="create", path="tests/conftest.py", file_text=conftest)],
        "pytest.ini deselecting everything": [
            _call("editor", command="create", path="pytest.ini",
                  file_text="[pytest]\npythonpath = .\naddopts = -k no_such_test\n")],
        "sitecustomize": [_call("editor", command="create", path="sitecustomize.py",
                                file_text="import unittest\nunittest.TestCase.run = lambda *a, **k: None\n")],
        "background rewriter": [_call("bash", command=rewriter)],
    }


def test_editing_or_deleting_tests_never_earns_reward(tasks: list[dict[str, Any]]) -> None:
    task = SweToolsEnv(sandbox="bwrap").task_set("test", 2)[1]
    cheats = _cheats(task)

    async def run() -> dict[str, float]:
        env = SweToolsEnv(sandbox="bwrap")
        results = {}
        for name, script in cheats.items():
            results[name], _ = await _play(env, task, "submit", script)
        fix = task["fix"]
        every = [turn for script in cheats.values() for turn in script]
        edit = _call("editor", command="str_replace", path=fix["path"], old_str=fix["old"], new_str=fix["new"])
        results["all cheats + the real fix"], _ = await _play(env, task, "submit", [edit, *every])
        await env.aclose()
        return results

    results = asyncio.run(run())
    assert results.pop("all cheats + the real fix") == 1.0
    assert results == dict.fromkeys(cheats, 0.0)


def test_visible_tests_pass_on_the_buggy_project(tasks: list[dict[str, Any]]) -> None:
    env = SweToolsEnv(sandbox="bwrap")
    for task in env.task_set("train", 2):
        _, history = asyncio.run(_play(env, task, "null", [_call("run_tests")]))
        report = history[-2]["content"]
        assert " passed" in report and "failed" not in report, report


@pytest.mark.skipif(os.environ.get("AGENTRL_FULL") != "1",
                    reason="plays every swe-tools task (minutes): set AGENTRL_FULL=1 to run it")
def test_every_task_oracle_solves_and_null_fails(tasks: list[dict[str, Any]]) -> None:
    """Every task: the oracle scores 1, the null policy 0, and the visible tests pass on the
    buggy project (run_tests before answering)."""
    oracle = _rewards(asyncio.run(_play_all(tasks, "oracle")))
    null = asyncio.run(_play_all(tasks, "null", [_call("run_tests")]))
    assert [t["id"] for t, r in zip(tasks, oracle, strict=True) if r != 1.0] == []
    assert [t["id"] for t, (r, _) in zip(tasks, null, strict=True) if r != 0.0] == []
    reports = {t["id"]: history[-2]["content"] for t, (_, history) in zip(tasks, null, strict=True)}
    assert {i: r for i, r in reports.items() if " passed" not in r or "failed" in r} == {}


# -- swe-bench-v0 on a hand-made instance ------------------------------------------------------

DOCKER_SKIP = backend_skip_reason("docker")

_CORE = '''\
def clamp(value, low, high):
    """Limits value to the range [low, high]."""
    if value < low:
        return low
    if value > high:
        return low
    return value


def mean(values):
    return sum(values) / len(values)
'''
_TESTS = '''\
from calcpkg.core import clamp, mean


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_mean():
    assert mean([1, 2, 3]) == 2
'''
_NEW_TEST = '''

def test_clamp_high():
    assert clamp(50, 0, 10) == 10
'''


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.com",
           "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@example.com",
           "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z"}
    return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def swebench_instance(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny git repository with a bug, as a SWE-bench row, in a local image built FROM the
    sandbox base image."""
    if DOCKER_SKIP:
        pytest.skip(DOCKER_SKIP)
    from agentrl.sandbox.docker import get_client
    from agentrl.sandbox.images import ensure_base_image

    root = tmp_path_factory.mktemp("swebench")
    repo = root / "repo"
    (repo / "calcpkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calcpkg" / "__init__.py").write_text("")
    (repo / "calcpkg" / "core.py").write_text(_CORE)
    (repo / "tests" / "test_core.py").write_text(_TESTS)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "calcpkg")
    base_commit = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "calcpkg" / "core.py").write_text(_CORE.replace("return low\n    return value", "return high\n    return value"))
    patch = _git(repo, "diff")
    _git(repo, "checkout", "-q", ".")
    (repo / "tests" / "test_core.py").write_text(_TESTS + _NEW_TEST)
    test_patch = _git(repo, "diff")
    _git(repo, "checkout", "-q", ".")
    client = get_client()
    base = ensure_base_image(client)
    (root / "Dockerfile").write_text(f"FROM {base}\nCOPY repo /testbed\n")
    tag = "agentrl-swebench-demo:" + hashlib.sha256((base + patch + test_patch).encode()).hexdigest()[:12]
    client.images.build(path=str(root), tag=tag, rm=True)
    return {
        "instance_id": "local__calcpkg-1", "repo": "local/calcpkg", "base_commit": base_commit,
        "problem_statement": "clamp(50, 0, 10) returns 0; values above the range should give the upper bound (10).",
        "patch": patch, "test_patch": test_patch, "image": tag,
        "FAIL_TO_PASS": '["tests/test_core.py::test_clamp_high"]',
        "PASS_TO_PASS": ["tests/test_core.py::test_clamp_low", "tests/test_core.py::test_clamp_inside",
                         "tests/test_core.py::test_mean"],
    }


def test_swebench_oracle_resolves_null_and_test_edits_do_not(swebench_instance: dict[str, Any]) -> None:
    conftest = ("import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
                "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
                "    outcome.get_result().outcome = 'passed'\n")
    cheats = {
        "test file replaced in advance": [_call(
            "editor", command="create", path="tests/test_core.py",
            file_text="def test_clamp_high():\n    pass\n")],
        "conftest forcing passes": [_call("editor", command="create", path="conftest.py", file_text=conftest)],
        "pytest.ini": [_call("editor", command="create", path="pytest.ini",
                             file_text="[pytest]\naddopts = -k 'not clamp_high'\n")],
        "tests deleted": [_call("bash", command="rm -rf tests")],
    }

    async def run() -> dict[str, Any]:
        env = SweBenchEnv(instances=[swebench_instance], sandbox="docker")
        assert env.task_set("test") == [swebench_instance]
        results: dict[str, Any] = {}
        results["oracle"], _ = await _play(env, swebench_instance, "oracle")
        results["oracle report"] = env.last_report
        results["null"], _ = await _play(env, swebench_instance, "null")
        for name, script in cheats.items():
            results[name], _ = await _play(env, swebench_instance, "submit", script)
        every = [turn for script in cheats.values() for turn in script]
        results["cheats + oracle"], _ = await _play(env, swebench_instance, "oracle", every)
        await env.aclose()
        return results

    results = asyncio.run(run())
    report = results.pop("oracle report")
    assert results.pop("oracle") == 1.0, report
    assert report["FAIL_TO_PASS"] == {"tests/test_core.py::test_clamp_high": "PASSED"}
    assert set(report["PASS_TO_PASS"].values()) == {"PASSED"}
    assert results.pop("cheats + oracle") == 1.0
    assert results == {"null": 0.0, **dict.fromkeys(cheats, 0.0)}


def test_swebench_env_passes_check_env(swebench_instance: dict[str, Any]) -> None:
    check_env(SweBenchEnv(instances=[swebench_instance], sandbox="docker"),
              options={"task": swebench_instance})


def test_swebench_sandbox_is_made_from_the_instance_image() -> None:
    row = {"instance_id": "x__y-1", "base_commit": "0" * 40, "problem_statement": "p", "patch": "",
           "test_patch": "", "FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]", "image": "img:one"}
    env = SweBenchEnv(instances=[row, {**row, "instance_id": "x__y-2", "image": "img:two"}],
                      sandbox="docker", sandbox_options={"docker_host": "unix:///run/d.sock"})
    hidden = {"/testbed/.git": "ro"}  # the image's git history: it holds the fix
    assert [env.sandbox_options_for(r) for r in env.instances] == [
        {"docker_host": "unix:///run/d.sock", "image": "img:one", "private_dirs": hidden},
        {"docker_host": "unix:///run/d.sock", "image": "img:two", "private_dirs": hidden},
    ]
