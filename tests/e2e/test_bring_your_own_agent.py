"""The black-box agent examples end to end on the built-in tiny model: a tiny ``train.py
--agent-function-path`` run each, whose loss and grad norm are nonzero, and ``agentrl eval
--agent`` from the command line (each example's evaluation, with a model that solves the tasks,
is in tests/integration/test_agents.py).

The tiny model writes noise, so the agents' tool calls rarely parse and the env scores 0; the
training runs add a reward with spread (``--custom-rm-path``) and an entropy bonus, so that the
gradient step is a real one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = {
    "openai-sdk": ("calc", "examples/openai_sdk_agent.py:run"),
    "openai-agents": ("calc", "examples/openai_agents_agent.py:run"),
    "mini-swe-agent": ("swe-tools", "examples/mini_swe_agent.py:run"),
}
ENV = {"AGENTRL_MSWEA_STEP_LIMIT": "2", "AGENTRL_AGENTS_MAX_TURNS": "2"}


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **ENV})


def test_agentrl_eval_runs_an_example_agent(tmp_path):
    env, agent = EXAMPLES["openai-sdk"]
    out = tmp_path / "eval.json"
    result = _run([sys.executable, "-m", "agentrl", "eval", "--env", env, "--agent",
                   str(REPO / agent), "--policy", "model", "--limit", "1", "--max-response-len", "24",
                   "--output", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(out.read_text())
    metrics = summary["sets"][env]
    assert summary["policy"].startswith("agent:") and metrics["failed"] == 0, metrics["errors"]
    assert metrics["usage"]["completion_tokens"] > 0
    [episode] = [json.loads(line) for line in (tmp_path / "eval.episodes.jsonl").read_text().splitlines()]
    assert episode["finish"] == "agent" and episode["messages"] and episode["response_length"] > 0
    assert episode["gateway"]["segments"] >= 1 and episode["segments"]  # recorded as training records it


def test_the_envs_oracle_can_play_the_model_behind_an_agent(tmp_path):
    """``--policy oracle`` with an agent: the env's scripted expert answers the agent's requests,
    so an agent's tool loop can be tried on tasks it then solves, before any model is trained."""
    env, agent = EXAMPLES["openai-sdk"]
    out = tmp_path / "eval.json"
    result = _run([sys.executable, "-m", "agentrl", "eval", "--env", env, "--agent",
                   str(REPO / agent), "--policy", "oracle", "--limit", "3", "--output", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(out.read_text())
    metrics = summary["sets"][env]
    assert summary["policy"].endswith(" on oracle") and metrics["success_rate"] == 1.0, metrics
    assert metrics["tool_calls"] == 3  # one calculator call per episode, made by the agent
    refused = _run([sys.executable, "-m", "agentrl", "eval", "--env", env, "--agent", str(REPO / agent),
                    "--policy", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"], tmp_path)
    assert refused.returncode != 0 and "--policy openai is a server of its own" in refused.stderr


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_train_py_trains_on_the_example_agents_episodes(name, tmp_path):
    env, agent = EXAMPLES[name]
    rm = tmp_path / "rm.py"
    rm.write_text("def rm(args, sample):\n    return float(sample.response_length % 2)\n")
    result = _run([sys.executable, str(REPO / "train.py"), "--env", env,
                   "--agent-function-path", str(REPO / agent), "--num-rollout", "1",
                   "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
                   "--rollout-max-response-len", "16", "--custom-rm-path", str(rm),
                   "--entropy-coef", "0.01", "--lr", "1e-4", "--output-dir", str(tmp_path / "run"),
                   # every segment trained: a rollout's sample count may vary (it does not here)
                   *(["--gateway-segments", "all"] if name == "openai-sdk" else [])],
                  tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["rollout/samples"] == 4 and metrics["rollout/failed"] == 0
    # the agents' sessions: a segment per episode, and one more per rewrite (mini-swe-agent drops
    # a reply cut at the token limit from its history, then asks again: a rewrite)
    segments, rewrites = metrics["rollout/gateway/segments"], metrics["rollout/gateway/rewrites"]
    assert segments == 4 + rewrites
    dropped = metrics["rollout/gateway/dropped_replies"]
    # "all" trains every segment (one draw per call here: nothing dropped); "last" leaves out at
    # least the reply of each earlier segment
    assert dropped == 0 if name == "openai-sdk" else dropped >= rewrites
    assert metrics["train/loss"] != 0 and metrics["train/grad_norm"] > 0
    trajectories = (tmp_path / "run" / "trajectories" / "rollout_00000.jsonl").read_text().splitlines()
    sample = json.loads(trajectories[0])
    assert sample["metadata"]["finish"] == "agent" and sample["metadata"]["segments"]
    # the conversation is kept in training too (the viewer shows the model's replies)
    assert any(m["role"] == "assistant" for m in sample["metadata"]["messages"])
