"""``agentrl view`` on a big run: how long its pages take to open in a real browser.

Builds a run of 10,000 samples (100 rollouts of 100, each a copy of a real multi-turn
swe-tools demonstration written by a tiny ``train.py`` run, tokens and all, plus a metrics line
per rollout), serves it with ``agentrl view`` and opens, in headless Chromium (Playwright on the
distribution's browser), the overview (until every chart is drawn), a rollout's table (until
its rows are listed) and one episode (until its token view is drawn). Each figure is the
median of ``--rounds`` cold opens: a new browser context each, and each round a rollout file
the server has not read yet. The baseline, in the same
process, is the same pages over a run of one rollout of one sample: the ratio says what the
size costs.

    python bench/viewer.py [--rounds 5] [--samples 10000]

Ends with one JSON line per headline figure: viewer_overview_open_s (target < 2),
viewer_episode_open_s (target < 1), viewer_table_open_s (a rollout's table, reported), and
viewer_overview_vs_one_sample_ratio (reported).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentrl.models.tiny import build_tiny_model

CHROMIUM = shutil.which("chromium")
REPO = Path(__file__).resolve().parents[1]


def one_demonstration(folder: Path) -> dict:
    """A real swe-tools sample: the oracle's demonstration as a tiny ``train.py --loss-type
    sft_loss`` run plays (in a bubblewrap sandbox) and writes it: the task, the edit, the
    editor's answer, the submit; tokens, mask, turns, messages, grade and command log."""
    subprocess.run([sys.executable, str(REPO / "train.py"), "--env", "swe-tools", "--loss-type", "sft_loss",
                    "--num-rollout", "1", "--rollout-batch-size", "1", "--no-use-ray", "--no-progress",
                    "--output-dir", str(folder)], check=True, capture_output=True)
    return json.loads((folder / "trajectories" / "rollout_00000.jsonl").read_text().splitlines()[0])


def write_run(folder: Path, sample: dict, rollouts: int, per_rollout: int) -> None:
    (folder / "trajectories").mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"launches": [{
        "argv": ["--env", "calc"], "flags": {"advantage_estimator": "grpo"},
        "policy_dir": str(build_tiny_model())}]}))
    with (folder / "metrics.jsonl").open("w") as metrics:
        for r in range(rollouts):
            lines = []
            for i in range(per_rollout):
                copy = dict(sample, group_id=f"r{r}-g{i // 4}", index=i % 4, reward=float(i % 3 == 0))
                lines.append(json.dumps(copy))
            (folder / "trajectories" / f"rollout_{r:05d}.jsonl").write_text("\n".join(lines) + "\n")
            metrics.write(json.dumps({
                "rollout_id": r, "rollout/reward_mean": 0.34, "rollout/success_rate": 0.34,
                "train/loss": 0.1 / (r + 1), "train/pg_loss": 0.1, "train/entropy": 2.0,
                "train/grad_norm": 1.0, "train/clip_fraction": 0.01, "train/ppo_kl": 0.001,
                "train/train_tokens_per_s": 5000.0, "time/rollout_s": 3.0, "time/train_s": 2.0,
                "time/weight_sync_s": 0.2}) + "\n")


def open_times(folder: Path, rounds: int) -> dict[str, float]:
    from playwright.sync_api import sync_playwright

    viewer = subprocess.Popen([sys.executable, "-m", "agentrl", "view", str(folder), "--port", "0"],
                              stdout=subprocess.PIPE, text=True)
    try:
        url = re.search(r"at (http://\S+/)", viewer.stdout.readline()).group(1)
        times: dict[str, list[float]] = {"overview": [], "table": [], "episode": []}
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            for k in range(rounds):
                table, episode = f"rollout_{k:05d}.jsonl", f"rollout_{rounds + k:05d}.jsonl"
                if not (folder / "trajectories" / episode).exists():  # the one-sample run
                    table = episode = "rollout_00000.jsonl"
                for name, fragment, ready in (
                        ("overview", "#/run/.", "figure[data-metric='time'] circle.pt"),
                        ("table", f"#/run/./rollout/{table}", "#episodes tbody tr"),
                        ("episode", f"#/run/./sample/{episode}/1", "#tokens span.tok")):
                    context = browser.new_context()
                    page = context.new_page()
                    started = time.perf_counter()
                    page.goto(url + fragment)
                    page.wait_for_selector(ready, timeout=60000)
                    times[name].append(time.perf_counter() - started)
                    context.close()
            browser.close()
        return {name: statistics.median(values) for name, values in times.items()}
    finally:
        viewer.terminate()
        viewer.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=10_000)
    args = parser.parse_args()
    if CHROMIUM is None:
        sys.exit("bench/viewer.py: no chromium on PATH (apt-get install chromium; make test does)")
    with tempfile.TemporaryDirectory() as tmp:
        sample = one_demonstration(Path(tmp) / "demo")
        big, small = Path(tmp) / "big", Path(tmp) / "small"
        per_rollout = 100
        write_run(big, sample, max(1, args.samples // per_rollout), per_rollout)
        write_run(small, sample, 1, 1)
        size = sum(p.stat().st_size for p in (big / "trajectories").iterdir())
        print(f"run of {args.samples} samples ({size / 1e6:.0f} MB of trajectories, "
              f"{len(sample['tokens'])} tokens each)")
        baseline = open_times(small, args.rounds)
        measured = open_times(big, args.rounds)
    for name in measured:
        print(f"{name:9s} {measured[name]:.3f} s  (one-sample run {baseline[name]:.3f} s)")
    print(json.dumps({"name": "viewer_overview_open_s", "value": round(measured["overview"], 3), "target": "< 2"}))
    print(json.dumps({"name": "viewer_episode_open_s", "value": round(measured["episode"], 3), "target": "< 1"}))
    print(json.dumps({"name": "viewer_table_open_s", "value": round(measured["table"], 3), "target": "report"}))
    print(json.dumps({"name": "viewer_overview_vs_one_sample_ratio",
                      "value": round(measured["overview"] / baseline["overview"], 3), "target": "report"}))


if __name__ == "__main__":
    main()
