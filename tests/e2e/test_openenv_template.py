"""An environment written with openenv's own template (`openenv init`) and served by openenv's own
server, not agentrl code: `train.py` trains on it for two rollouts and `agentrl eval` evaluates
it, through `--env openenv --env-kwarg url=...`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.distributed import free_port
from tests.support.openenv_servers import OPENENV_PYTHON, openenv_missing, running

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(openenv_missing() is not None, reason=str(openenv_missing()))


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_an_env_from_openenvs_template_trains_and_evaluates(tmp_path: Path) -> None:
    made = subprocess.run([str(OPENENV_PYTHON.parent / "openenv"), "init", "echo_env"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stdout + made.stderr
    env_dir = tmp_path / "echo_env"
    assert (env_dir / "server" / "app.py").is_file()
    port = free_port()
    # the template's own server: one session at a time (its max_concurrent_envs=1), so the
    # run's concurrent episodes also go through agentrl's admission waits
    with running([str(OPENENV_PYTHON), "-m", "uvicorn", "server.app:app", "--port", str(port)],
                 port=port, cwd=env_dir) as (url, server):
        out = tmp_path / "run"
        done = run(str(REPO / "train.py"), "--env", "openenv", "--env-kwarg", f"url={url}",
                   "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--max-turns", "2",
                   "--rollout-max-response-len", "12", "--num-rollout", "2", "--no-use-ray",
                   "--no-progress", "--output-dir", str(out), cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        trained = [r for r in rows if "rollout/failed" in r]
        assert [r["rollout_id"] for r in trained] == [0, 1]
        assert all(r["rollout/failed"] == 0 for r in trained)

        summary = tmp_path / "eval.json"
        done = run("-m", "agentrl", "eval", "--env", "openenv", "--env-kwarg", f"url={url}",
                   "--policy", "model", "--limit", "4", "--max-turns", "2",
                   "--rollout-max-response-len", "12", "--output", str(summary), cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        episodes = [json.loads(line) for line in Path(f"{tmp_path / 'eval'}.episodes.jsonl").read_text().splitlines()]
        assert len(episodes) == 4 and all(e["error"] is None for e in episodes)
        assert server.poll() is None
