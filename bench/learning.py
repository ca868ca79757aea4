"""Does the agent learn? Held-out success before and after GRPO through ``train.py``'s own loop,
in two parts (``--part``).

``demo``: the main job, ``python train.py --env swe-tools --max-turns 5`` on the embedded default
(the shipped swe-tools warm start, at its ``level=located`` and compact prompt; see
agentrl/models/defaults.py), per seed (``--seed``/``--rollout-seed``), with the demo's own
defaults except its held-out evaluation, widened to ``--demo-tasks`` swe-tools test tasks x
``--eval-samples`` samples at the demo's temperature (0.7), before the first rollout (the shipped
model) and after the last; with the training tasks' success in the first and last rollouts (3
each), as the run prints them. Ends with
``{"name": "demo_train_gain", ...}`` (the change on the training tasks, target > 0) and
``{"name": "demo_heldout_gain", ...}`` (reported; no target: the warm start memorised its train
tasks, see docs/getting-started.md).

``calc``: the tiny model, SFT-warmed on ``calc`` oracle episodes, then trained with GRPO. Per seed:
1. warm start: ``train.py --loss-type sft_loss`` on oracle demonstrations (``--sft-rollouts``
   steps of 32), exported as a Hugging Face directory. The default, 300, is the shortest warm
   start (in steps of 100) whose held-out sampled success reaches 0.2, the calibration run's GRPO
   starting point: seed 0 measured 0.001 / 0.005 / 0.465 / 0.749 after 100 / 200 / 300 / 400
   steps. A longer warm start leaves GRPO little room (700 steps: 0.78-0.83 already);
2. held-out success of the warm start: ``--eval-tasks`` test tasks x ``--eval-samples`` samples
   at the rollout temperature (1.0), through the rollout's episode runner;
3. GRPO from the warm start: ``train.py --hf-checkpoint <warm start>`` for ``--grpo-rollouts``
   rollouts of 8 prompts x 8 samples (lr 3e-4, as the calibration run found safe);
4. the same evaluation of the result.

Episodes use calc's compact prompt (``--env-kwarg compact=true``: the system prompt shows one
example call instead of the chat template's tool-schema listing, and the oracle's turns are
terse): about 170 tokens per demonstration instead of about 410, which is what makes the warm
start and GRPO fit on 2 CPU cores. Tasks and rewards are calc's own.

Prints a before/after table per seed, the mean and spread, saves the reward curve
(``learning_curve.png``) and ends with ``{"name": "learning_gain", ...}`` (mean held-out success
after GRPO minus after the warm start; target >= 0.2 within 15 minutes of GRPO on 2 cores).

    python bench/learning.py [--part demo|calc|both] [--seeds 0 1 2] [--quick]
    python bench/learning.py --seeds 1 --out runs/learning &   # seeds in parallel processes,
    python bench/learning.py --seeds 2 --out runs/learning &   # then:
    python bench/learning.py --seeds 0 1 2 --out runs/learning --report-only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402 - train.py's own loop
from agentrl.models.defaults import EMBEDDED_DEFAULTS  # noqa: E402
from agentrl.rollout.config import RolloutConfig  # noqa: E402
from agentrl.run.evaluate import EvalConfig, evaluate  # noqa: E402
from agentrl.run.run_log import run_change  # noqa: E402

DEMO = EMBEDDED_DEFAULTS["swe-tools"]


def run_train(flags: list[str]) -> float:
    started = time.perf_counter()
    asyncio.run(train.main(flags))
    return time.perf_counter() - started


ENV_KWARGS = {"compact": True}
"""calc's constructor arguments for training and evaluation alike."""


def held_out_success(checkpoint: Path, tasks: int, samples: int) -> float:
    config = RolloutConfig(env="calc", env_kwarg=[f"{k}={json.dumps(v)}" for k, v in ENV_KWARGS.items()],
                           hf_checkpoint=str(checkpoint), eval_max_prompts=tasks,
                           n_samples_per_eval_prompt=samples, rollout_temperature=1.0,
                           rollout_max_response_len=64, rollout_concurrency=64)
    summary, _ = asyncio.run(evaluate(config, EvalConfig(policy="model", split="test")))
    return summary["sets"]["calc"]["success_rate"]


def one_seed(seed: int, args: argparse.Namespace, out: Path) -> dict[str, float]:
    run = out / f"seed{seed}"
    shutil.rmtree(run, ignore_errors=True)  # a rerun replaces this seed's earlier results
    env_flags = [f"--env-kwarg={key}={json.dumps(value)}" for key, value in ENV_KWARGS.items()]
    common = ["--env", "calc", *env_flags, "--max-turns", "3", "--rollout-max-response-len", "64", "--micro-batch-size", "8",
              "--rollout-seed", str(seed), "--seed", str(seed),
              "--no-use-ray"]  # one CPU rank: in this process (no Ray cluster to start or lose)
    sft_s = run_train([*common, "--loss-type", "sft_loss", "--num-rollout", str(args.sft_rollouts),
                       "--rollout-batch-size", "32", "--n-samples-per-prompt", "1", "--lr", "1e-3", "--rollout-shuffle",
                       "--save-hf", str(run / "sft-hf"), "--save-interval", str(args.sft_rollouts),
                       "--output-dir", str(run / "sft")])
    warm = run / "sft-hf" / f"rollout_{args.sft_rollouts:05d}"
    before = held_out_success(warm, args.eval_tasks, args.eval_samples)
    print(f"seed {seed}: warm start held-out success {before:.3f} ({args.sft_rollouts} SFT steps, "
          f"{sft_s:.0f} s)", flush=True)
    def grpo(name: str, *flags: str) -> tuple[float, float]:
        """GRPO from the warm start into ``run/name``: (wall seconds, held-out success after)."""
        seconds = run_train([*common, "--hf-checkpoint", str(warm), "--num-rollout", str(args.grpo_rollouts),
                             "--rollout-batch-size", "8", "--n-samples-per-prompt", "8", "--lr", "3e-4", *flags,
                             "--rollout-shuffle", "--save-hf", str(run / f"{name}-hf"),
                             "--save-interval", str(args.grpo_rollouts), "--output-dir", str(run / name)])
        export = run / f"{name}-hf" / f"rollout_{args.grpo_rollouts:05d}"
        if "--lora-rank" in flags:  # a LoRA export: the model is merged/, beside the adapters
            export = export / "merged"
        return seconds, held_out_success(export, args.eval_tasks, args.eval_samples)

    grpo_s, after = grpo("grpo")
    print(f"seed {seed}: warm start {before:.3f} -> GRPO {after:.3f} (SFT {sft_s:.0f} s, "
          f"GRPO {grpo_s:.0f} s)", flush=True)
    result = {"seed": seed, "before": before, "after": after, "sft_s": sft_s, "grpo_s": grpo_s}
    if args.lora_rank:  # the same GRPO from the same warm start, training LoRA adapters only
        lora_s, lora_after = grpo("lora", "--lora-rank", str(args.lora_rank), "--lora-lr", str(args.lora_lr))
        print(f"seed {seed}: warm start {before:.3f} -> GRPO with LoRA r={args.lora_rank} {lora_after:.3f} "
              f"({lora_s:.0f} s; full fine-tuning {after:.3f} in {grpo_s:.0f} s)", flush=True)
        result.update(lora_after=lora_after, lora_s=lora_s)
    (run / "result.json").write_text(json.dumps(result) + "\n")
    return result


def demo_seed(seed: int, args: argparse.Namespace, out: Path) -> dict[str, float]:
    """The main job as a user runs it (``train.py`` in a subprocess, on the embedded default),
    seeded, with its own before/after evaluation widened to ``--demo-tasks`` held-out tasks x
    ``--eval-samples``: the evaluation before rollout 0 is the shipped warm start's."""
    run = out / f"demo-seed{seed}"
    shutil.rmtree(run, ignore_errors=True)
    started = time.perf_counter()
    flags = ["--env", "swe-tools", "--max-turns", str(DEMO.flags["max_turns"]), "--seed", str(seed),
             "--rollout-seed", str(seed), "--eval-max-prompts", str(args.demo_tasks),
             "--n-samples-per-eval-prompt", str(args.eval_samples), "--no-progress", "--output-dir", str(run)]
    if args.demo_rollouts:
        flags += ["--num-rollout", str(args.demo_rollouts), "--eval-interval", str(args.demo_rollouts)]
    subprocess.run([sys.executable, str(ROOT / "train.py"), *flags], check=True)
    wall = time.perf_counter() - started
    change = run_change(run / "metrics.jsonl", eval_path=run / "eval.jsonl")  # the lines train.py ends with
    assert change is not None and change.heldout_steps is not None, f"{run}: no before/after recorded"
    result = {"seed": seed, "before": change.heldout_before, "after": change.heldout_after, "wall_s": wall,
              "train_first": change.success_before, "train_last": change.success_after}
    print(f"demo seed {seed}: training tasks {result['train_first']:.3f} -> {result['train_last']:.3f}; "
          f"held-out {result['before']:.3f} -> {result['after']:.3f} ({wall:.0f} s)", flush=True)
    (run / "result.json").write_text(json.dumps(result) + "\n")
    return result


def demo_report(results: list[dict[str, float]]) -> None:
    print("\nseed  train first  train last  held-out before  held-out after")
    for r in results:
        print(f"{r['seed']:>4}  {r['train_first']:11.3f}  {r['train_last']:10.3f}  {r['before']:15.3f}  "
              f"{r['after']:14.3f}")
    gains = [r["after"] - r["before"] for r in results]
    train_gains = [r["train_last"] - r["train_first"] for r in results]
    print(f"demo: training-task success change {statistics.fmean(train_gains):+.3f}, held-out change "
          f"{statistics.fmean(gains):+.3f}; wall {statistics.fmean(r['wall_s'] for r in results):.0f} s per seed")
    print(json.dumps({"name": "demo_train_gain", "value": round(statistics.fmean(train_gains), 3),
                      "target": "> 0"}))
    print(json.dumps({"name": "demo_heldout_gain", "value": round(statistics.fmean(gains), 3),
                      "target": "report"}))


def plot(out: Path, seeds: list[int]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no curve saved")
        return
    for seed in seeds:
        lines = (out / f"seed{seed}" / "grpo" / "metrics.jsonl").read_text().splitlines()
        rewards = [json.loads(line)["rollout/reward_mean"] for line in lines]
        plt.plot(range(len(rewards)), rewards, label=f"seed {seed}")
    plt.xlabel("rollout")
    plt.ylabel("mean reward (sampled, T=1)")
    plt.title("calc: GRPO from the SFT warm start")
    plt.legend()
    plt.savefig(out / "learning_curve.png", dpi=120)
    print(f"reward curve: {out / 'learning_curve.png'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("demo", "calc", "both"), default="both")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--demo-tasks", type=int, default=32, help="swe-tools test tasks evaluated")
    parser.add_argument("--demo-rollouts", type=int, default=None,
                        help="rollouts of the demo run (default: the embedded default's own)")
    parser.add_argument("--sft-rollouts", type=int, default=300,
                        help="SFT steps of 32 (300: the shortest warm start, in steps of 100, that already "
                             "solves >= 0.2 of held-out tasks at T=1; see the module docstring)")
    parser.add_argument("--grpo-rollouts", type=int, default=150,
                        help="GRPO rollouts of 8x8 (150: about 15 minutes on 2 cores)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="calc: also run the GRPO phase with LoRA adapters of this rank from the same "
                        "warm start, and report both held-out gains and wall times")
    parser.add_argument("--lora-lr", type=float, default=1e-3, help="the adapters' learning rate")
    parser.add_argument("--eval-tasks", type=int, default=200)
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--out", default="runs/learning")
    parser.add_argument("--quick", action="store_true", help="a few minutes: checks the pipeline only")
    parser.add_argument("--report-only", action="store_true",
                        help="print the table of seeds already run into --out (their result.json)")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.sft_rollouts, args.grpo_rollouts = args.seeds[:1], 20, 4
        args.eval_tasks, args.eval_samples = 20, 2
        args.demo_tasks, args.demo_rollouts = 4, 2
    out = Path(args.out)
    if args.part in ("demo", "both"):
        if args.report_only:
            demo = [json.loads((out / f"demo-seed{seed}" / "result.json").read_text()) for seed in args.seeds]
        else:
            demo = [demo_seed(seed, args, out) for seed in args.seeds]
        demo_report(demo)
    if args.part == "demo":
        return
    if args.report_only:  # seeds run apart (e.g. in parallel processes) into the same --out
        results = [json.loads((out / f"seed{seed}" / "result.json").read_text()) for seed in args.seeds]
    else:
        results = [one_seed(seed, args, out) for seed in args.seeds]
    print("\nseed  warm start  after GRPO  gain")
    for r in results:
        print(f"{r['seed']:>4}  {r['before']:10.3f}  {r['after']:10.3f}  {r['after'] - r['before']:+.3f}")
    gains = [r["after"] - r["before"] for r in results]
    spread = statistics.pstdev(gains) if len(gains) > 1 else 0.0
    print(f"mean gain {statistics.fmean(gains):+.3f} (spread {spread:.3f}); "
          f"GRPO wall {statistics.fmean(r['grpo_s'] for r in results):.0f} s per seed")
    plot(out, args.seeds)
    print(json.dumps({"name": "learning_gain", "value": round(statistics.fmean(gains), 3),
                      "target": ">= 0.2"}))
    with_lora = [r for r in results if "lora_after" in r]
    if with_lora:
        print(json.dumps({"name": "lora_vs_full_heldout_gain", "value": {
            "full": round(statistics.fmean(r["after"] - r["before"] for r in with_lora), 3),
            "lora": round(statistics.fmean(r["lora_after"] - r["before"] for r in with_lora), 3),
            "full_grpo_s": round(statistics.fmean(r["grpo_s"] for r in with_lora)),
            "lora_grpo_s": round(statistics.fmean(r["lora_s"] for r in with_lora))}, "target": "report"}))


if __name__ == "__main__":
    main()
