"""``train.py --async-training`` end to end on the built-in tiny model: killed with SIGKILL at
random instants and resumed, it trains every prompt exactly once and completes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROWS = 16
ITERATIONS = 12
RUN = ["--env", "calc", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
       "--max-turns", "2", "--rollout-max-response-len", "12", "--num-rollout", str(ITERATIONS),
       "--async-training", "--save-interval", "1", "--no-use-ray", "--no-progress"]


def launch(tmp_path: Path, load: bool) -> subprocess.Popen[str]:
    data = tmp_path / "tasks.jsonl"
    flags = [*RUN, "--prompt-data", str(data), "--output-dir", str(tmp_path / "run"),
             "--save", str(tmp_path / "ckpt")]
    if load:
        flags += ["--load", str(tmp_path / "ckpt")]
    log = (tmp_path / "log.txt").open("a")
    return subprocess.Popen([sys.executable, str(REPO / "train.py"), *flags], cwd=tmp_path,
                            stdout=log, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def test_sigkill_at_random_instants_ten_times_loses_and_repeats_no_prompt(tmp_path):
    (tmp_path / "tasks.jsonl").write_text("".join(
        json.dumps({"task_id": f"t{i}", "question": f"What is {i} * 3?", "expression": f"{i} * 3",
                    "answer": 3 * i}) + "\n" for i in range(ROWS)))
    rng = random.Random(18)
    marker = tmp_path / "ckpt" / "latest"
    kills = []
    for i in range(10):
        before = marker.read_text() if marker.is_file() else None
        process = launch(tmp_path, load=before is not None)
        if i % 3 == 0:  # anywhere: most often during start-up
            delay = rng.uniform(1.0, 12.0)
            time.sleep(delay)
        else:  # once this launch has saved: a rollout, training, a push or the next save
            until = time.monotonic() + 120
            while (marker.read_text() if marker.is_file() else None) == before and \
                    process.poll() is None and time.monotonic() < until:
                time.sleep(0.05)
            delay = rng.uniform(0.0, 2.5)
            time.sleep(delay)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        kills.append((i, round(delay, 2), process.wait()))
    final = launch(tmp_path, load=(tmp_path / "ckpt" / "latest").is_file())
    deadline = time.monotonic() + 300
    while final.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    if final.poll() is None:
        os.killpg(final.pid, signal.SIGKILL)
    log = (tmp_path / "log.txt").read_text()
    assert final.wait() == 0, f"kills {kills}\n{log[-4000:]}"
    assert all(code == -signal.SIGKILL for *_, code in kills), kills

    ckpt = tmp_path / "ckpt"
    last = ckpt / (ckpt / "latest").read_text().strip()
    assert last.name == f"rollout_{ITERATIONS:05d}"
    ledger = json.loads((last / "pipeline.json").read_text())["ledger"]["entries"]
    trained = [e for e in ledger if e["state"] == "trained"]
    assert len(trained) == ITERATIONS * 2  # two groups an iteration
    first_epoch = sorted(e["row"] for e in trained if e["epoch"] == 0)
    assert first_epoch == sorted(f"{tmp_path / 'tasks.jsonl'}:{i + 1}" for i in range(ROWS))
    rows_of_epoch_1 = [e["row"] for e in trained if e["epoch"] == 1]
    assert len(rows_of_epoch_1) == len(set(rows_of_epoch_1))
    # the trajectories the final lineage trained on are the ledger's trained groups, each once
    files = sorted((tmp_path / "run" / "trajectories").glob("rollout_*.jsonl"))
    assert len(files) == ITERATIONS
    groups = [json.loads(line)["group_id"] for f in files for line in f.read_text().splitlines()]
    assert len(groups) == ITERATIONS * 2 * 2 and len(set(groups)) == ITERATIONS * 2
    assert set(groups) == {e["group_id"] for e in trained}
    assert "resumed from" in log and any(e["restarts"] for e in ledger)
    # the random-init model never solves calc: every group is flat, which is said loudly
    assert "WARNING: dead run" in log
