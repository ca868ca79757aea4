"""``agentrl eval --save-atif`` and ``train.py --save-atif`` write episodes Harbor's own
trajectory validator accepts (harbor 0.25.0, ``harbor.utils.trajectory_validator``, in the
Python 3.12 venv of ``scripts/setup-harbor-check.sh``): a scripted policy's multi-turn tool
calls, and a model's episodes from a training run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HARBOR_PYTHON = REPO / ".venv-harbor" / "bin" / "python"
pytestmark = pytest.mark.skipif(
    not HARBOR_PYTHON.exists(),
    reason="no .venv-harbor (Python 3.12 with harbor): run scripts/setup-harbor-check.sh")

VALIDATE = """
import sys
from harbor.utils.trajectory_validator import TrajectoryValidator
bad = []
for path in sys.argv[1:]:
    validator = TrajectoryValidator()
    if not validator.validate(path, validate_images=False):
        bad.append((path, validator.errors))
print(bad)
sys.exit(1 if bad else 0)
"""


def harbor_accepts(files: list[Path]) -> None:
    assert files, "no ATIF file was written"
    done = subprocess.run([str(HARBOR_PYTHON), "-c", VALIDATE, *map(str, files)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_agentrl_eval_writes_atif_that_harbor_validates(tmp_path):
    done = subprocess.run([sys.executable, "-m", "agentrl", "eval", "--env", "calc", "--limit", "3",
                           "--output", str(tmp_path / "eval.json"), "--save-atif"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted((tmp_path / "eval.atif").glob("*.json"))
    assert len(files) == 3
    harbor_accepts(files)
    doc = json.loads(files[0].read_text())
    agent_steps = [s for s in doc["steps"] if s["source"] == "agent"]
    assert agent_steps[0]["tool_calls"][0]["function_name"] == "calculator"  # the oracle's call
    assert agent_steps[0]["observation"]["results"][0]["source_call_id"] == \
        agent_steps[0]["tool_calls"][0]["tool_call_id"]
    assert doc["extra"]["reward"] == 1.0


def test_train_py_writes_each_rollouts_episodes_as_atif(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "train.py"), "--env", "calc", "--num-rollout", "1",
                           "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--max-turns", "2",
                           "--rollout-max-response-len", "12", "--no-use-ray", "--no-progress",
                           "--save-atif", "--output-dir", str(tmp_path / "run")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted((tmp_path / "run" / "trajectories" / "atif" / "rollout_00000").glob("*.json"))
    assert len(files) == 4
    harbor_accepts(files)
    doc = json.loads(files[0].read_text())
    assert doc["session_id"] == "run" and doc["final_metrics"]["total_completion_tokens"] > 0
