"""The ``agentrl`` command on a user's env module that lives outside the repository."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

USER_MODULE = textwrap.dedent(
    '''
    """A user's env, written only against the public API."""
    import agentrl


    @agentrl.tool
    def lookup(word: str, state: agentrl.EpisodeState) -> str:
        """Looks a word up in the task's dictionary.

        Args:
            word: The word.
        """
        return state.task["dictionary"].get(word, "not found")


    class GlossaryEnv(agentrl.ToolEnv):
        """Define a word using the lookup tool."""

        tools = (lookup,)
        default_max_turns = 3

        def sample_task(self):
            words = ["apple", "pear", "plum"]
            word = words[int(self.np_random.integers(len(words)))]
            return {"word": word, "dictionary": {word: f"a fruit called {word}"}}

        def make_prompt(self, task):
            return [{"role": "user", "content": f"Define {task['word']}."}]

        def compute_reward(self, task, final, state):
            return float(task["dictionary"][task["word"]] in final["content"])


    class BrokenEnv(GlossaryEnv):
        def step(self, action):
            return super().step(action)[:4]


    agentrl.register_env("glossary-v0", entry_point=GlossaryEnv)
    agentrl.register_env("broken-v0", entry_point=BrokenEnv)
    '''
)


def _agentrl(args, cwd, extra_path):
    env = {**os.environ, "PYTHONPATH": str(extra_path), "COLUMNS": "100"}  # a terminal of 100
    return subprocess.run(
        [sys.executable, "-m", "agentrl", *args], cwd=cwd, env=env, capture_output=True,
        text=True, timeout=120,
    )


def test_check_env_on_user_module_outside_repo(tmp_path):
    (tmp_path / "my_module.py").write_text(USER_MODULE)
    result = _agentrl(["check-env", "my_module:glossary"], tmp_path, tmp_path)
    assert result.returncode == 0, result.stderr
    # it has no scripted oracle, no task set and no task fields: the output says those checks
    # were skipped, not "all passed"
    assert "glossary-v0: every check that ran passed (3 skipped)" in result.stdout
    assert "skipped: oracle: the env has no scripted oracle" in result.stdout
    assert "skipped: leakage: the env declares no task_fields" in result.stdout


def test_check_env_reports_broken_env(tmp_path):
    (tmp_path / "my_module.py").write_text(USER_MODULE)
    result = _agentrl(["check-env", "my_module:broken-v0"], tmp_path, tmp_path)
    assert result.returncode == 1
    assert "'final answer' failed" in result.stderr and "got a tuple of 4" in result.stderr


def test_unknown_env_suggests(tmp_path):
    result = _agentrl(["check-env", "calk"], tmp_path, tmp_path)
    assert result.returncode == 1 and "Did you mean 'calc'" in result.stderr


def test_list_envs_table_and_json(tmp_path):
    table = _agentrl(["list-envs"], tmp_path, tmp_path)
    assert table.returncode == 0
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["id", "max", "turns", "tools", "description"]
    assert any(line.startswith("calc-v0") and "calculator" in line for line in lines)
    # it fits the terminal (a pipe: 100 columns, or $COLUMNS) and an env that needs arguments
    # says so in a few words, the reason under --verbose
    assert max(len(line) for line in lines) <= 100
    assert any(line.startswith("openenv-v0") and "(needs arguments: EnvServerLost)" in line for line in lines)
    assert "Connection refused" not in table.stdout
    verbose = _agentrl(["list-envs", "--verbose"], tmp_path, tmp_path).stdout
    assert max(len(line) for line in verbose.splitlines()) <= 100
    assert "cannot build it without arguments: EnvServerLost" in verbose
    rows = json.loads(_agentrl(["list-envs", "--json"], tmp_path, tmp_path).stdout)
    calc = next(r for r in rows if r["id"] == "calc-v0")
    assert calc["tools"] == "calculator" and calc["max turns"] == "4"


def test_readme_example_runs(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "calc_episode.py"), "--episodes", "3"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("reward 1.0") == 3


def test_eval_command_writes_summary_and_episodes(tmp_path):
    out = tmp_path / "calc.json"
    result = _agentrl(
        ["eval", "--env", "calc", "--limit", "10", "--n-samples", "2", "--policy", "oracle",
         "--output", str(out)], tmp_path, tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "success rate" in result.stdout and "pass@2" in result.stdout
    metrics = json.loads(out.read_text())["sets"]["calc"]
    assert metrics["success_rate"] == 1.0 and metrics["n_samples"] == 20
    assert (tmp_path / "calc.episodes.jsonl").read_text().count("\n") == 20
    bad = _agentrl(["eval", "--env", "calc", "--policy", "nope"], tmp_path, tmp_path)
    assert bad.returncode == 2 and "invalid choice: 'nope'" in bad.stderr


def test_eval_with_a_model_policy(tmp_path):
    """The tiny model played through the rollout's episode runner (its answers are noise)."""
    out = tmp_path / "model.json"
    result = _agentrl(
        ["eval", "--env", "calc", "--limit", "3", "--n-samples", "2", "--policy", "model",
         "--max-response-len", "24", "--output", str(out)], tmp_path, tmp_path,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())
    metrics = summary["sets"]["calc"]
    assert metrics["n_samples"] == 6 and summary["policy"] == "model:tiny"
    assert metrics["failed"] == 0 and metrics["time_per_episode_s"]["policy"] > 0
    episodes = [json.loads(line) for line in (tmp_path / "model.episodes.jsonl").read_text().splitlines()]
    assert all(e["turns"] >= 1 and e["messages"] for e in episodes)
    assert {e["task_id"] for e in episodes} and all(e["sample"] in (0, 1) for e in episodes)


def test_check_env_on_the_mcp_example(tmp_path):
    """``examples/mcp_time_env.py`` through the CLI: its MCP server is started, its tools are
    listed and checked, and the output counts them."""
    if importlib.util.find_spec("mcp_server_time") is None:
        pytest.skip("needs mcp-server-time: pip install 'mcp-server-time>=2026.10.19' (in the dev extra)")
    result = _agentrl(["check-env", "mcp_time_env:time-mcp"], tmp_path, REPO / "examples")
    assert result.returncode == 0, result.stderr
    assert ("time-mcp-v0: all checks passed (2 tools, 2 from MCP servers: time (mcp-time "
            in result.stdout), result.stdout
