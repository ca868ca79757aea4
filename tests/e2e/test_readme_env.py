"""The README's "Write an environment" section, tried as a new user would: the env module and
the walkthrough exactly as the README prints them, then `agentrl eval` and `train.py` on it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def readme_blocks(language: str) -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Write an environment"):text.index("### The contract")]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_readme_env_walkthrough_scores_one(tmp_path):
    module, walkthrough = readme_blocks("python")
    (tmp_path / "my_envs.py").write_text(module)
    script = "import agentrl\n" + walkthrough + "\nassert terminated and reward == 1.0, (reward, obs)\nprint('ok')\n"
    done = run([sys.executable, "-c", script], tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_readme_env_checks_evaluates_and_trains_on_disjoint_tasks(tmp_path):
    (tmp_path / "my_envs.py").write_text(readme_blocks("python")[0])
    check = run([sys.executable, "-m", "agentrl", "check-env", "my_envs:glossary"], tmp_path)
    assert check.returncode == 0, check.stderr[-2000:]
    listed = run([sys.executable, "-m", "agentrl", "list-envs", "--module", "my_envs"], tmp_path)
    assert listed.returncode == 0 and "glossary-v0" in listed.stdout, listed.stderr[-2000:]

    out = tmp_path / "eval.json"
    evaluated = run([sys.executable, "-m", "agentrl", "eval", "--env", "my_envs:glossary",
                     "--n-samples", "4", "--output", str(out)], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    metrics = json.loads(out.read_text())["sets"]["my_envs:glossary"]
    assert metrics["n_prompts"] == 2 and metrics["n_samples"] == 8 and metrics["pass@4"] == 1.0
    episodes = [json.loads(line) for line in (tmp_path / "eval.episodes.jsonl").read_text().splitlines()]
    eval_prompts = {e["messages"][0]["content"] for e in episodes}
    assert eval_prompts == {"Define fig.", "Define kiwi."}

    trained = run([sys.executable, str(REPO / "train.py"), "--env", "my_envs:glossary",
                   "--eval-env", "my_envs:glossary", "--eval-interval", "1", "--num-rollout", "1",
                   "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
                   "--rollout-max-response-len", "12", "--output-dir", str(tmp_path / "run")], tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    evals = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 1]
    assert all(e["sets"]["my_envs:glossary"]["n_samples"] == 2 for e in evals)
    samples = [json.loads(line) for line in
               (tmp_path / "run" / "trajectories" / "rollout_00000.jsonl").read_text().splitlines()]
    train_prompts = {s["prompt"][0]["content"] for s in samples}
    assert train_prompts and not train_prompts & eval_prompts
