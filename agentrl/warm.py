"""A supervised warm start on an env's oracle demonstrations: of the built-in tiny model, or of
``--hf-checkpoint`` (a folder, a named model such as ``smollm2-135m-instruct``, a GGUF file).

    python -m agentrl.warm --env swe-tools --env-kwarg level=located \\
        --env-kwarg compact=true --max-turns 5 --steps 400 --out runs/warm

1. **Demonstrations, once**: the env's oracle plays every task of its ``train`` split (the
   episode loop of ``agentrl eval --policy oracle``, in the env's sandboxes), and each solved
   episode is written as a conversation to ``OUT/demonstrations.jsonl`` (one row: the messages
   and the tool schemas the env shows the model). Played once, not at every step.
2. **Training**: ``train.py --loss-type sft_loss`` on that file, from the built-in tiny model
   (or ``--hf-checkpoint``, with ``--chat-template`` when its own renders no tool calls):
   ``--steps`` steps of ``--batch-size`` conversations in shuffled epochs (``--seed``), loss
   on the assistant's tokens only, learning rate ``--lr``; the result is exported as a Hugging
   Face folder, ``OUT/model`` (``--hf-checkpoint OUT/model`` for ``train.py`` and
   ``agentrl eval``).
3. ``OUT/warm.json`` records the recipe, the demonstrations' SHA-256 and the loss per step.

``--demonstrations FILE`` skips step 1 and trains on ``FILE`` (copied to
``OUT/demonstrations.jsonl``), e.g. the demonstrations a shipped checkpoint was made from.

The same recipe on the same machine reproduces the same loss curve (the oracle, the data order
and the trainer are all seeded); ``tests/e2e/test_warm_start.py`` checks it on a short schedule.
The command needs a checkout of agentrl (it runs the repository's ``train.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.config import FlagParser, parse_pairs, run_command
from agentrl.env import make_env, task_set_of
from agentrl.errors import AgentRLError, ConfigError
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.outcomes import succeeded
from agentrl.run.evaluate import EvalConfig, evaluate

__all__ = ["main", "write_demonstrations"]

TRAIN_PY = Path(__file__).resolve().parents[1] / "train.py"


def build_parser() -> argparse.ArgumentParser:
    parser = FlagParser(prog="python -m agentrl.warm", allow_abbrev=False,
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True, help="the env whose oracle demonstrates (its train split)")
    parser.add_argument("--env-kwarg", action="append", default=[], metavar="KEY=VALUE",
                        help="env constructor argument (VALUE parsed as JSON when possible); repeatable")
    parser.add_argument("--max-turns", type=int, default=None, help="turns per demonstration episode")
    parser.add_argument("--steps", type=int, default=400, help="training steps")
    parser.add_argument("--batch-size", type=int, default=16, help="conversations per step")
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data order and the trainer")
    parser.add_argument("--limit", type=int, default=None, help="demonstrate only the first LIMIT train tasks")
    parser.add_argument("--demonstrations", default=None, metavar="FILE",
                        help="train on this demonstrations.jsonl (an earlier warm start's, e.g. the "
                             "shipped checkpoint's) instead of playing the oracle")
    parser.add_argument("--hf-checkpoint", default=None, metavar="MODEL",
                        help="the model to warm-start: a Hugging Face folder, a named model "
                             "(agentrl models list) or a .gguf file (default: the built-in tiny model)")
    parser.add_argument("--chat-template", default=None, metavar="NAME|FILE",
                        help="train.py's --chat-template (for a model whose own renders no tool calls)")
    parser.add_argument("--out", required=True, help="output folder (demonstrations, model/, warm.json)")
    return parser


async def _play(env: str, env_kwarg: Sequence[str], max_turns: int | None, limit: int | None
                ) -> tuple[list[dict[str, Any]], int]:
    config = RolloutConfig(env=env, env_kwarg=list(env_kwarg), max_turns=max_turns,
                           eval_max_prompts=limit, n_samples_per_eval_prompt=1)
    _, groups = await evaluate(config, EvalConfig(policy="oracle", split="train"))
    played = [s for set_groups in groups.values() for group in set_groups for s in group]
    solved = [s for s in played if succeeded(s) and s.metadata.get("messages")]
    return [s.metadata["messages"] for s in solved], len(played)


def _tool_schemas(env: str, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """The schemas the env shows the model at reset (none for a compact prompt)."""
    made = make_env(env, **kwargs)
    try:
        task = task_set_of(made, "train", 1)[0]
        _, info = made.reset(options={"task": task})
        return list(info["tools"])
    finally:
        made.close()


def write_demonstrations(env: str, env_kwarg: Sequence[str], max_turns: int | None, path: Path,
                         limit: int | None = None) -> tuple[int, int]:
    """Plays the oracle on ``env``'s train tasks and writes the solved episodes to ``path``, one
    ``{"prompt": messages, "tools": schemas}`` per line. Returns (written, played).

    Raises:
        AgentRLError: The oracle solved no task (the env has no oracle, or it is broken).
    """
    conversations, played = asyncio.run(_play(env, env_kwarg, max_turns, limit))
    if not conversations:
        raise AgentRLError(f"--env {env}: the oracle solved none of the {played} train tasks it "
                           "played; a warm start needs demonstrations")
    tools = _tool_schemas(env, parse_pairs(list(env_kwarg), "--env-kwarg"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for messages in conversations:
            f.write(json.dumps({"prompt": messages, "tools": tools}, ensure_ascii=False) + "\n")
    return len(conversations), played


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("steps", "batch_size"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
    if not TRAIN_PY.is_file():
        raise ConfigError(f"the warm start runs the repository's train.py, which is not at {TRAIN_PY}: "
                          "run it from a checkout of agentrl")
    out = Path(args.out)
    demos = out / "demonstrations.jsonl"
    started = time.monotonic()
    if args.demonstrations is not None:
        given = Path(args.demonstrations)
        if args.limit is not None:
            raise ConfigError("--limit chooses the tasks the oracle plays; with --demonstrations "
                              "nothing is played: drop one of them")
        if not given.is_file():
            raise ConfigError(f"--demonstrations {given}: no such file")
        out.mkdir(parents=True, exist_ok=True)
        if given.resolve() != demos.resolve():
            shutil.copyfile(given, demos)
        written, played = sum(1 for line in demos.read_text(encoding="utf-8").splitlines() if line.strip()), None
        print(f"warm start: {written} demonstrations from {given}", flush=True)
    else:
        written, played = write_demonstrations(args.env, args.env_kwarg, args.max_turns, demos, args.limit)
        print(f"warm start: {written} demonstrations from {played} {args.env} train tasks in {demos}", flush=True)
    run = out / "sft"
    flags = ["--prompt-data", str(demos), "--tool-key", "tools", "--loss-type", "sft_loss",
             "--num-rollout", str(args.steps), "--rollout-batch-size", str(args.batch_size),
             "--n-samples-per-prompt", "1", "--rollout-shuffle", "--lr", str(args.lr),
             "--seed", str(args.seed), "--rollout-seed", str(args.seed),
             "--save-hf", str(out / "hf"), "--save-interval", str(args.steps),
             "--no-use-ray", "--no-progress", "--output-dir", str(run)]
    for flag, value in (("--hf-checkpoint", args.hf_checkpoint), ("--chat-template", args.chat_template)):
        if value is not None:
            flags += [flag, value]
    played_s, started = time.monotonic() - started, time.monotonic()
    done = subprocess.run([sys.executable, str(TRAIN_PY), *flags])
    trained_s = time.monotonic() - started
    if done.returncode != 0:
        raise AgentRLError(f"the warm start's train.py run failed (exit {done.returncode}); its "
                           f"output is above, its files in {run}")
    model = out / "model"
    exported = out / "hf" / f"rollout_{args.steps:05d}"
    if model.exists():
        shutil.rmtree(model)
    exported.rename(model)
    losses = [json.loads(line)["train/sft_loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    recipe = {"env": args.env, "env_kwarg": args.env_kwarg, "max_turns": args.max_turns,
              "hf_checkpoint": args.hf_checkpoint, "chat_template": args.chat_template,
              "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed,
              "limit": args.limit, "demonstrations": written, "tasks_played": played,
              "demonstrations_from": args.demonstrations,  # None: played by the oracle here
              "demonstrations_sha256": hashlib.sha256(demos.read_bytes()).hexdigest(),
              "train_flags": flags, "sft_loss": losses,
              "minutes": {"demonstrations": round(played_s / 60, 1), "training": round(trained_s / 60, 1)},
              # what a shipped copy of model/ is checked against (tests/e2e/test_warm_start.py)
              "model_sha256": {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                               for p in sorted(model.iterdir()) if p.is_file()}}
    (out / "warm.json").write_text(json.dumps(recipe, indent=1) + "\n")
    print(f"warm start: sft_loss {losses[0]:.4f} -> {losses[-1]:.4f} over {args.steps} steps; "
          f"model in {model} (--hf-checkpoint {model})")
    return 0


if __name__ == "__main__":
    run_command(main, "agentrl.warm")
