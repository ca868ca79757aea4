"""The evaluation runner on calc: oracle vs null, pass@k aggregation, errors, outputs."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentrl import ToolEnv, register_env
from agentrl.env import registry
from agentrl.errors import AgentRLError
from agentrl.eval.runner import EpisodeRecord, evaluate, format_table, summarize, write_outputs


def run(**kwargs):
    return asyncio.run(evaluate("calc", **kwargs))


def test_oracle_solves_and_null_fails():
    oracle, records = run(policy="oracle", limit=20, concurrency=4)
    assert oracle.success_rate == 1.0 and oracle.n_episodes == 20 and oracle.n_tasks == 20
    assert oracle.pass_at_k == {"1": 1.0}
    assert oracle.mean_turns == 2.0 and oracle.tool_calls == 20 and oracle.tool_errors == {}
    assert {r.task_id for r in records} == {f"calc-test-0-{i}" for i in range(20)}
    null, _ = run(policy="null", limit=20)
    assert null.success_rate == 0.0 and null.mean_turns == 1.0


def test_samples_per_task_and_pass_at_k_keys():
    result, records = run(limit=3, n_samples=4)
    assert result.n_episodes == 12 and result.pass_at_k == {"1": 1.0, "4": 1.0}
    assert sorted(r.sample for r in records if r.task_id == "calc-test-0-0") == [0, 1, 2, 3]


def _record(task_id, success, sample=0):
    return EpisodeRecord(task_id, sample, float(success), success, True, False, 1, 0, {}, 0, 0, 0, 0)


def test_pass_at_k_is_averaged_over_tasks():
    # task a: 1 of 2 samples solved -> pass@1 = 0.5, pass@2 = 1; task b: none solved.
    records = [_record("a", True), _record("a", False, 1), _record("b", False), _record("b", False, 1)]
    result = summarize("x", "oracle", "test", 2, 2, records, 1.0)
    assert result.pass_at_k == {"1": 0.25, "2": 0.5}
    assert result.success_rate == 0.25


def test_unknown_policy_explains():
    with pytest.raises(AgentRLError, match="choose 'oracle', 'null' or 'model'"):
        run(policy="gpt-17")


class Exploding(ToolEnv):
    """Raises in compute_reward for odd numbers."""

    def sample_task(self):
        return {"n": int(self.np_random.integers(100))}

    def make_prompt(self, task):
        return [{"role": "user", "content": str(task["n"])}]

    def compute_reward(self, task, final, state):
        if task["n"] % 2:
            raise RuntimeError("grader bug")
        return 1.0


def test_env_errors_are_recorded_not_fatal(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    register_env("exploding-v0", entry_point=Exploding)
    result, records = asyncio.run(evaluate("exploding", policy="null", limit=30))
    failed = [r for r in records if r.error]
    assert failed and all("grader bug" in r.error for r in failed)
    assert result.failed_episodes == len(failed) and result.n_episodes == 30


def test_outputs_and_table(tmp_path):
    result, records = run(limit=5)
    episodes = write_outputs(tmp_path / "out" / "calc.json", result, records)
    summary = json.loads((tmp_path / "out" / "calc.json").read_text())
    assert summary["success_rate"] == 1.0 and summary["n_episodes"] == 5
    assert summary["pass_at_k"] == {"1": 1.0} and summary["tool_errors"] == {}
    lines = episodes.read_text().splitlines()
    assert len(lines) == 5 and json.loads(lines[0])["messages"][0]["role"] == "system"
    table = format_table(result)
    assert "success rate" in table and "pass@1" in table and "grading" in table
