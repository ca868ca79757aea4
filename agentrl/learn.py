"""Does a real model learn here? One recipe, end to end, on tasks it was not shown:

    python -m agentrl.learn --env calc --env-kwarg compact=true --out runs/learn

1. **Zero-shot**: ``agentrl eval --policy model`` of ``--hf-checkpoint`` (SmolLM2-135M-Instruct
   by default) on ``--eval-limit`` held-out tasks (the env's ``test`` split), greedy, one
   sample each.
2. **Warm start**: ``python -m agentrl.warm`` on the oracle's demonstrations of ``train`` tasks
   (``--warm-steps`` x ``--warm-batch-size`` conversations, lr ``--warm-lr``), then the same
   evaluation of its model.
3. **RL**: ``train.py`` with GRPO from the warm start (``--rl-rollouts`` rollouts of
   ``--rollout-batch-size`` train tasks x ``--n-samples-per-prompt``; ``--lora-rank`` for
   adapters), exported, then the same evaluation.

Every phase is the command a user would type, run as a child process (its output shows as it
goes). The recipe prints held-out pass@1 with its standard error after each phase and the
wall time of each, and writes them to ``OUT/learn.json``; ``agentrl view OUT`` shows the
three evaluations and the RL run. ``learn.json`` records each phase once it has finished: the
same command again skips those and starts the first unfinished phase afresh (what a stopped
run of it left is removed); another recipe in the same ``--out`` is refused.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.config import FlagParser, run_command
from agentrl.errors import AgentRLError, ConfigError
from agentrl.run.checkpoints import write_atomically

__all__ = ["build_parser", "heldout_figure", "main"]

TRAIN_PY = Path(__file__).resolve().parents[1] / "train.py"


def build_parser() -> argparse.ArgumentParser:
    parser = FlagParser(prog="python -m agentrl.learn", allow_abbrev=False,
                        description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True,
                        help="the env: its train split teaches, its test split measures")
    parser.add_argument("--env-kwarg", action="append", default=[], metavar="KEY=VALUE",
                        help="env constructor argument, for every phase; repeatable")
    parser.add_argument("--max-turns", type=int, default=None,
                        help="turns per episode (default: the env's)")
    parser.add_argument("--hf-checkpoint", default="smollm2-135m-instruct", metavar="MODEL",
                        help="the model: a named model, a Hugging Face folder or a .gguf file")
    parser.add_argument("--chat-template", default=None, metavar="NAME|FILE",
                        help="train.py's --chat-template")
    parser.add_argument("--eval-limit", type=int, default=200,
                        help="held-out (test) tasks each evaluation plays")
    parser.add_argument("--warm-steps", type=int, default=3,
                        help="warm-start steps (3: enough to call the tool, leaving RL room on "
                             "calc; 60 saturate it)")
    parser.add_argument("--warm-batch-size", type=int, default=8,
                        help="demonstrations per warm-start step")
    parser.add_argument("--warm-lr", type=float, default=1e-4, help="warm-start learning rate")
    parser.add_argument("--rl-rollouts", type=int, default=24,
                        help="GRPO rollouts (one optimizer step each)")
    parser.add_argument("--rollout-batch-size", type=int, default=8, help="train tasks per rollout")
    parser.add_argument("--n-samples-per-prompt", type=int, default=4,
                        help="samples per task (GRPO's group)")
    parser.add_argument("--lr", type=float, default=2e-5,
                        help="RL learning rate (2e-5 learned most per minute of 5e-6 and 2e-5 on "
                             "SmolLM2; with --lora-rank, the adapters' rate)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="RL with LoRA adapters of this rank (0: every weight)")
    parser.add_argument("--rollout-max-response-len", type=int, default=None,
                        help="tokens per turn (default: train.py's)")
    parser.add_argument("--no-zero-shot", dest="zero_shot", action="store_false",
                        help="skip the zero-shot evaluation (the model's zero-shot figure is "
                             "already known)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every phase")
    parser.add_argument("--out", required=True, help="the recipe's folder")
    return parser


def heldout_figure(eval_json: Path) -> dict[str, Any]:
    """Pass@1 of one evaluation file (one sample per task) with its standard error,
    ``sqrt(p (1 - p) / n)``, and the tool calls made."""
    summary = json.loads(eval_json.read_text(encoding="utf-8"))
    [metrics] = summary["sets"].values()
    n, p = metrics["n_samples"], metrics["success_rate"]
    return {"pass@1": p, "stderr": math.sqrt(p * (1 - p) / n) if n else 0.0, "tasks": n,
            "tool_calls": metrics["tool_calls"], "tool_errors": metrics["tool_errors"],
            "wall_s": metrics["wall_s"]}


def _record_for(path: Path, recipe: dict[str, Any]) -> dict[str, Any]:
    """``learn.json`` to go on with: the earlier one if it was made by the same recipe, a new
    one if there is none.

    Raises:
        ConfigError: The folder holds another recipe's phases; names the flags that differ.
    """
    fresh = {"recipe": recipe, "done": [], "minutes": {}, "heldout": {}}
    if not path.is_file():
        return fresh
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
        before = dict(earlier["recipe"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--out: {path} cannot be read ({exc}); give another --out") from None
    changed = sorted(k for k in {*before, *recipe} if before.get(k) != recipe.get(k))
    if changed:
        flags = ", ".join(f"--{k.replace('_', '-')} {before.get(k)!r} -> {recipe.get(k)!r}" for k in changed)
        raise ConfigError(f"--out {path.parent} holds a recipe with other flags ({flags}): its phases "
                          "would not be this recipe's; give another --out, or the same flags to go on")
    return {**fresh, **earlier}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("eval_limit", "warm_steps", "warm_batch_size", "rl_rollouts", "rollout_batch_size"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
    if args.n_samples_per_prompt < 2:
        raise ConfigError("--n-samples-per-prompt must be >= 2: GRPO compares samples of one task")
    if not TRAIN_PY.is_file():
        raise ConfigError(f"the recipe runs the repository's train.py, which is not at {TRAIN_PY}: "
                          "run it from a checkout of agentrl")
    out = Path(args.out)
    recipe = {k: v for k, v in vars(args).items() if k != "out"}
    record_path = out / "learn.json"
    record = _record_for(record_path, recipe)
    out.mkdir(parents=True, exist_ok=True)
    env = ["--env", args.env, *(w for kv in args.env_kwarg for w in ("--env-kwarg", kv))]
    env += ["--max-turns", str(args.max_turns)] if args.max_turns is not None else []
    template = ["--chat-template", args.chat_template] if args.chat_template else []
    length = (["--rollout-max-response-len", str(args.rollout_max_response_len)]
              if args.rollout_max_response_len else [])

    def phase(name: str, outputs: Path, command: list[str]) -> None:
        """Runs one phase unless learn.json records it done; what an unfinished run of it left
        (``outputs``) is removed first, so it starts clean."""
        if name in record["done"]:
            print(f"learn: {name}: done before", flush=True)
            return
        if outputs.is_dir():
            shutil.rmtree(outputs)
        elif outputs.exists():
            outputs.unlink()
        print(f"learn: {name}: {shlex.join(command)}", flush=True)
        started = time.monotonic()
        if subprocess.run(command).returncode != 0:
            raise AgentRLError(f"the {name} phase failed; its output is above, its files in {outputs}")
        record["minutes"][name] = round((time.monotonic() - started) / 60, 1)
        record["done"].append(name)
        write_atomically(record_path, json.dumps(record, indent=1) + "\n")

    def evaluate(name: str, model: str) -> None:
        path = out / f"eval-{name}.json"
        phase(f"eval {name}", path, [
            sys.executable, "-m", "agentrl", "eval", *env, "--policy", "model", "--hf-checkpoint", model,
            *template, *length, "--split", "test", "--limit", str(args.eval_limit), "--n-samples", "1",
            "--temperature", "0", "--rollout-seed", str(args.seed), "--output", str(path)])
        if name not in record["heldout"]:
            record["heldout"][name] = heldout_figure(path)
            write_atomically(record_path, json.dumps(record, indent=1) + "\n")

    if args.zero_shot:
        evaluate("zero-shot", args.hf_checkpoint)
    warm = out / "warm"
    phase("warm start", warm, [
        sys.executable, "-m", "agentrl.warm", *env, "--hf-checkpoint", args.hf_checkpoint, *template,
        "--steps", str(args.warm_steps), "--batch-size", str(args.warm_batch_size),
        "--lr", str(args.warm_lr), "--seed", str(args.seed),
        "--limit", str(args.warm_steps * args.warm_batch_size), "--out", str(warm)])
    evaluate("warm", str(warm / "model"))
    rl = out / "rl"
    exported = rl / "hf" / f"rollout_{args.rl_rollouts:05d}"
    phase("RL", rl, [
        sys.executable, str(TRAIN_PY), *env, "--hf-checkpoint", str(warm / "model"), *template, *length,
        "--num-rollout", str(args.rl_rollouts), "--rollout-batch-size", str(args.rollout_batch_size),
        "--n-samples-per-prompt", str(args.n_samples_per_prompt), "--lr", str(args.lr),
        "--lora-rank", str(args.lora_rank), "--seed", str(args.seed), "--rollout-seed", str(args.seed),
        "--rollout-shuffle", "--save-hf", str(rl / "hf"), "--no-use-ray", "--no-progress",
        "--output-dir", str(rl)])
    evaluate("RL", str(exported / "merged" if args.lora_rank else exported))

    heldout = record["heldout"]
    print(f"\nheld-out pass@1 on {args.env} ({args.eval_limit} test tasks, greedy):")
    for name in ("zero-shot", "warm", "RL"):
        if name not in heldout:
            continue
        figure = heldout[name]
        print(f"  {name:<10} {figure['pass@1']:.3f} +- {figure['stderr']:.3f}"
              f"   ({figure['tool_calls']} tool calls)")
    gain = heldout["RL"]["pass@1"] - heldout["warm"]["pass@1"]
    print(f"  RL over the warm start: {gain:+.3f}")
    print("minutes: " + ", ".join(f"{k} {v}" for k, v in record.get("minutes", {}).items()))
    print(f"all of it: {record_path}; look at it: agentrl view {out}")
    return 0


if __name__ == "__main__":
    run_command(main, "agentrl.learn",
                on_interrupt="stopped; the same command goes on from the first unfinished phase")
