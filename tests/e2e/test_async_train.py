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
ITERATIONS = 18
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
    startup_s, iteration_s = 4.0, 1.0  # measured from the launches as they go

    def saved() -> str | None:
        return marker.read_text() if marker.is_file() else None

    def wait_for_a_save(process: subprocess.Popen[str], than: str | None) -> None:
        until = time.monotonic() + 120
        while saved() == than and process.poll() is None and time.monotonic() < until:
            time.sleep(0.02)

    # Kills are placed by the run's progress, not by the clock, so that a fast machine does not
    # finish the run before the tenth kill: a launch trains at most about two iterations.
    for i in range(10):
        before = saved()
        started = time.monotonic()
        process = launch(tmp_path, load=before is not None)
        if i % 3 == 0:  # anywhere in start-up or the first iteration
            delay = rng.uniform(1.0, startup_s)
            time.sleep(delay)
        else:  # once this launch has saved: a rollout, training, a push or the next save
            wait_for_a_save(process, before)
            startup_s = max(1.5, time.monotonic() - started)
            first = saved()
            if i == 1:  # one whole iteration of this machine, timed once
                wait_for_a_save(process, first)
                iteration_s = max(0.2, time.monotonic() - started - startup_s)
            delay = rng.uniform(0.0, 0.8 * iteration_s)
            time.sleep(delay)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        kills.append((i, round(delay, 2), process.wait(), saved()))
    final = launch(tmp_path, load=(tmp_path / "ckpt" / "latest").is_file())
    deadline = time.monotonic() + 300
    while final.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    if final.poll() is None:
        os.killpg(final.pid, signal.SIGKILL)
    log = (tmp_path / "log.txt").read_text()
    assert final.wait() == 0, f"kills {kills}\n{log[-4000:]}"
    assert all(code == -signal.SIGKILL for _, _, code, _ in kills), f"kills {kills}\n{log[-6000:]}"

    ckpt = tmp_path / "ckpt"
    last = ckpt / (ckpt / "latest").read_text().strip()
    assert last.name == f"rollout_{ITERATIONS:05d}"
    state = json.loads((last / "pipeline.json").read_text())["ledger"]
    ledger = state["entries"]
    trained = [e for e in ledger if e["state"] == "trained"]
    # 18 iterations of 2 groups: epoch 0 (16 rows, folded into a count by now: checked row by
    # row below, from the trajectories), epoch 1 (16 rows, kept row by row) and 4 groups of epoch 2
    assert state["folded"] == {"0": ROWS} and len(trained) == ITERATIONS * 2 - ROWS
    every_row = sorted(f"{tmp_path / 'tasks.jsonl'}:{i + 1}" for i in range(ROWS))
    assert sorted(e["row"] for e in trained if e["epoch"] == 1) == every_row
    rows_of_epoch_2 = [e["row"] for e in trained if e["epoch"] == 2]
    assert len(rows_of_epoch_2) == len(set(rows_of_epoch_2)) == 4
    # the trajectories the final lineage trained on: every group once, the ledger's among them
    files = sorted((tmp_path / "run" / "trajectories").glob("rollout_*.jsonl"))
    assert len(files) == ITERATIONS
    lines = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    groups = [line["group_id"] for line in lines]
    assert len(groups) == ITERATIONS * 2 * 2 and len(set(groups)) == ITERATIONS * 2
    assert {e["group_id"] for e in trained} <= set(groups)
    # epoch 0, folded into a count in the ledger, row by row: the groups the lineage trained that
    # are not among the ledger's entries are its 16, one per task, none lost and none repeated
    task_of = {line["group_id"]: line["metadata"]["task_id"] for line in lines}
    epoch_0 = [task_of[g] for g in sorted(set(groups) - {e["group_id"] for e in ledger})]
    assert sorted(epoch_0) == sorted(f"t{i}" for i in range(ROWS)), epoch_0
    # one metrics line per rollout: the lines of rollouts played again were moved aside
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["rollout_id"] for line in metrics] == list(range(ITERATIONS))
    # groups in flight at a kill were played again from their prompts, and say so
    assert "resumed from" in log and any(line["metadata"].get("restarted") for line in lines)
    # the random-init model never solves calc: every group is flat, which is said loudly
    assert "WARNING: dead run" in log
