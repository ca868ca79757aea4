"""Asynchronous vs synchronous training: the same train steps on ``calc`` with 100 ms of tool
latency (``bench/_slow_calc.py``), disaggregated on CPU (one engine actor, one trainer actor),
from the same SFT warm start (bench/learning.py's, calc's compact prompts).

Per seed: the warm start; then ``--rollouts`` GRPO rollouts of 8 prompts x 8 samples, once
synchronously and once with ``--async-training --max-staleness 1`` (every other flag equal);
then held-out success of both results (bench/learning.py's evaluation).

Prints per seed the wall time of both arms (from the first to the last rollout's metrics line,
so start-up and the first step's build are left out), the share of time each stage took, the
staleness histogram and the correction's figures, and ends with one JSON line per headline
figure: ``async_speedup`` (sync wall / async wall; target >= 1.6 on 2 cores),
``async_learning_gap`` (mean |held-out success sync - async|; target <= 0.05) and
``staleness_histogram``.

    python bench/async.py [--seeds 0] [--rollouts 20] [--warm-start DIR] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import statistics
from pathlib import Path

import _slow_calc  # noqa: F401 - registers calc-slow in this process, where envs run
import learning  # bench/learning.py: run_train, held_out_success, the warm start's recipe


def arm(name: str, seed: int, warm: Path, run: Path, rollouts: int, extra: list[str]) -> dict:
    out = run / name
    env_flags = [f"--env-kwarg={k}={json.dumps(v)}" for k, v in learning.ENV_KWARGS.items()]
    learning.run_train([
        "--env", "_slow_calc:calc-slow", *env_flags, "--hf-checkpoint", str(warm),
        "--max-turns", "3", "--rollout-max-response-len", "64", "--micro-batch-size", "8",
        "--rollout-batch-size", "8", "--n-samples-per-prompt", "8", "--lr", "3e-4",
        "--rollout-shuffle", "--rollout-seed", str(seed), "--seed", str(seed),
        "--rollout-num-gpus", "1", "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1",
        "--num-rollout", str(rollouts), "--save-hf", str(out / "hf"), "--save-interval", str(rollouts),
        "--output-dir", str(out), "--no-progress", *extra])
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    stages = {key: statistics.fmean(m.get(key, 0.0) for m in lines[1:])
              for key in ("time/rollout_s", "time/train_s", "time/weight_sync_s", "time/save_s")}
    histogram: collections.Counter[str] = collections.Counter()
    for m in lines:
        histogram.update({k.rsplit("/", 1)[1]: int(v) for k, v in m.items() if k.startswith("async/staleness/")})
    side = {key: statistics.fmean(m[key] for m in lines if key in m)
            for key in ("train/is_ratio_mean", "train/is_clipped_fraction", "train/logprob_drift",
                        "async/trainer_wait_s") if any(key in m for m in lines)}
    return {"wall_s": lines[-1]["elapsed_s"] - lines[0]["elapsed_s"], "stages": stages,
            "histogram": dict(histogram), "side": side, "export": out / "hf" / f"rollout_{rollouts:05d}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--rollouts", type=int, default=20, help="train steps per arm")
    parser.add_argument("--sft-rollouts", type=int, default=300, help="warm start: SFT steps of 32")
    parser.add_argument("--warm-start", type=Path, default=None,
                        help="a Hugging Face export to start both arms from (skips the SFT)")
    parser.add_argument("--eval-tasks", type=int, default=200)
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--out", default="runs/async")
    parser.add_argument("--quick", action="store_true", help="a few minutes: checks the pipeline only")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.rollouts, args.sft_rollouts = args.seeds[:1], 4, 20
        args.eval_tasks, args.eval_samples = 20, 2
    out = Path(args.out)
    results = []
    for seed in args.seeds:
        run = out / f"seed{seed}"
        shutil.rmtree(run, ignore_errors=True)
        warm = args.warm_start
        if warm is None:
            common = ["--env", "calc", *[f"--env-kwarg={k}={json.dumps(v)}" for k, v in learning.ENV_KWARGS.items()],
                      "--max-turns", "3", "--rollout-max-response-len", "64", "--micro-batch-size", "8",
                      "--rollout-seed", str(seed), "--seed", str(seed), "--no-use-ray"]
            learning.run_train([*common, "--loss-type", "sft_loss", "--num-rollout", str(args.sft_rollouts),
                                "--rollout-batch-size", "32", "--n-samples-per-prompt", "1", "--lr", "1e-3",
                                "--rollout-shuffle", "--save-hf", str(run / "sft-hf"),
                                "--save-interval", str(args.sft_rollouts), "--output-dir", str(run / "sft")])
            warm = run / "sft-hf" / f"rollout_{args.sft_rollouts:05d}"
        sync = arm("sync", seed, warm, run, args.rollouts, [])
        asyn = arm("async", seed, warm, run, args.rollouts, ["--async-training", "--max-staleness", "1"])
        for name, result in (("sync", sync), ("async", asyn)):
            result["success"] = learning.held_out_success(result["export"], args.eval_tasks, args.eval_samples)
            stages = ", ".join(f"{k.split('/')[1]} {v:.2f}" for k, v in result["stages"].items())
            print(f"seed {seed} {name:>5}: {result['wall_s']:.1f} s for {args.rollouts - 1} rollouts "
                  f"(per rollout: {stages}); held-out success {result['success']:.3f}; "
                  f"staleness {result['histogram'] or '-'}; {result['side']}", flush=True)
        results.append({"seed": seed, "speedup": sync["wall_s"] / asyn["wall_s"],
                        "gap": abs(sync["success"] - asyn["success"]), "histogram": asyn["histogram"]})
        (run / "result.json").write_text(json.dumps(results[-1]) + "\n")
    histogram: collections.Counter[str] = collections.Counter()
    for r in results:
        histogram.update(r["histogram"])
    print(json.dumps({"name": "async_speedup", "value": round(statistics.fmean(r["speedup"] for r in results), 3),
                      "per_seed": [round(r["speedup"], 3) for r in results], "target": ">= 1.6"}))
    print(json.dumps({"name": "async_learning_gap", "value": round(statistics.fmean(r["gap"] for r in results), 3),
                      "per_seed": [round(r["gap"], 3) for r in results], "target": "<= 0.05"}))
    print(json.dumps({"name": "staleness_histogram", "value": dict(sorted(histogram.items()))}))


if __name__ == "__main__":
    main()
