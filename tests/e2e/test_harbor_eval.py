"""The shipped Harbor tasks through the CLI: `agentrl eval --env harbor` scores 1.0 with the
oracle and 0.0 with the null policy on every task, and a tiny `train.py --env harbor` run
completes on them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl_envs.harbor import SHIPPED_TASKS, load_tasks
from tests.support.sandboxes import backend_skip_reason

REPO = Path(__file__).resolve().parents[2]
DOCKER_SKIP = backend_skip_reason("docker")
pytestmark = pytest.mark.skipif(DOCKER_SKIP is not None, reason=DOCKER_SKIP or "")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize(("policy", "expected"), [("oracle", 1.0), ("null", 0.0)])
def test_every_shipped_task_oracle_1_null_0(tmp_path: Path, policy: str, expected: float) -> None:
    names = {task.name for task in load_tasks(SHIPPED_TASKS)}
    assert len(names) >= 12
    out = tmp_path / policy
    done = run("-m", "agentrl", "eval", "--env", "harbor", "--policy", policy,
               "--rollout-concurrency", "4", "--output", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    episodes = [json.loads(line) for line in Path(f"{out}.episodes.jsonl").read_text().splitlines()]
    rewards = {e["task_id"]: (e["reward"], e["status"], e["error"]) for e in episodes}
    assert rewards == {name: (expected, "completed", None) for name in names}


def test_train_py_on_harbor_tasks(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = run(str(REPO / "train.py"), "--env", "harbor", "--max-turns", "2", "--rollout-batch-size", "2",
               "--n-samples-per-prompt", "2", "--rollout-max-response-len", "16", "--num-rollout", "1",
               "--output-dir", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.jsonl").read_text())
    assert metrics["rollout/samples"] == 4 and metrics["rollout/failed"] == 0
    assert "train/grad_norm" in metrics and metrics["time/train_s"] > 0


NEW_KINDS = ("inventory-restock-steps", "csv-to-json-separate-verifier", "stock-report-from-api-service")


def test_train_py_on_each_harbor_1_4_kind(tmp_path: Path) -> None:
    # a multi-step task, a separate verifier, a compose environment with an allowlist: one
    # rollout plays each of them twice
    import shutil

    for name in NEW_KINDS:
        shutil.copytree(SHIPPED_TASKS / name, tmp_path / "tasks" / name)
    out = tmp_path / "run"
    done = run(str(REPO / "train.py"), "--env", "harbor", "--env-kwarg", f"path={tmp_path / 'tasks'}",
               "--max-turns", "2", "--rollout-batch-size", "3", "--n-samples-per-prompt", "2",
               "--rollout-max-response-len", "16", "--num-rollout", "1", "--output-dir", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.jsonl").read_text())
    assert metrics["rollout/samples"] == 6 and metrics["rollout/failed"] == 0
    played = [json.loads(line)["metadata"]["task_id"] for line in (out / "trajectories" / "rollout_00000.jsonl").read_text().splitlines()]
    assert sorted(played) == sorted(f"agentrl/{name}" for name in NEW_KINDS for _ in range(2))
