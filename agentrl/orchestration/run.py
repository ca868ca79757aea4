"""Run-level flags and the files a run writes (metrics, trajectories, eval results, checkpoints)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.config import add_arguments, flag, from_namespace, option
from agentrl.errors import ConfigError
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.sample import Sample
from agentrl.trainer.config import TrainerConfig, steps_per_rollout

__all__ = ["RunConfig", "RunLog", "checkpoint_folder", "latest_checkpoint", "mark_latest",
           "parse_args"]


@dataclasses.dataclass
class RunConfig:
    """The loop's own flags."""

    num_rollout: int = option(3, "rollout -> train iterations")
    update_weights_interval: int = option(1, "push trainer weights to the engine every N rollouts")
    eval_interval: int | None = option(None, "evaluate every N rollouts (and before the first)")
    output_dir: str = option("runs/latest", "where metrics, trajectories and checkpoints go")
    save_trajectories: bool = option(True, "write each rollout's samples as JSONL")
    dead_run_rollouts: int = option(3, "warn when every group had zero reward variance for this "
                                    "many rollouts in a row (nothing is being learned)")

    def validate(self) -> None:
        for name in ("num_rollout", "update_weights_interval", "eval_interval", "dead_run_rollouts"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{flag(name)} must be >= 1, got {value}")


@dataclasses.dataclass
class Args:
    """Every subsystem's config, and the flat namespace plug-ins receive as ``args``."""

    rollout: RolloutConfig
    trainer: TrainerConfig
    run: RunConfig
    namespace: argparse.Namespace


def parse_args(argv: Sequence[str] | None = None) -> Args:
    """Parses and validates the flags, the batch equation included (errors name the flag and
    exit with status 2), and fills in ``--global-batch-size`` / ``--num-steps-per-rollout``."""
    parser = argparse.ArgumentParser(prog="train.py", description="agentrl: RL for tool-using agents")
    for cls, title in ((RolloutConfig, "rollout"), (TrainerConfig, "trainer"), (RunConfig, "run")):
        add_arguments(parser, cls, title)
    namespace = parser.parse_args(argv)
    try:
        rollout = from_namespace(RolloutConfig, namespace)
        trainer = from_namespace(TrainerConfig, namespace)
        run = from_namespace(RunConfig, namespace)
        steps_per_rollout(trainer, rollout.rollout_batch_size, rollout.n_samples_per_prompt)
        if trainer.load:
            latest_checkpoint(trainer.load)
    except ConfigError as exc:
        parser.error(str(exc))
    return Args(rollout, trainer, run, namespace)


class RunLog:
    """Appends metrics, eval results and trajectories as JSONL under ``output_dir``."""

    def __init__(self, output_dir: str | Path, dead_run_rollouts: int = 3) -> None:
        self.dead_run_rollouts = dead_run_rollouts
        self.flat_rollouts = 0
        self.root = Path(output_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.root / "metrics.jsonl"
        self.eval_path = self.root / "eval.jsonl"
        self.trajectories = self.root / "trajectories"
        self.started = time.perf_counter()

    def metrics(self, rollout_id: int, values: dict[str, Any]) -> None:
        groups = values.get("rollout/groups", 0)
        flat = groups > 0 and values.get("rollout/zero_std_groups", 0) == groups
        self.flat_rollouts = self.flat_rollouts + 1 if flat else 0
        values = {**values, "run/flat_rollouts_in_a_row": self.flat_rollouts}
        if self.flat_rollouts >= self.dead_run_rollouts:
            print(f"WARNING: dead run: in the last {self.flat_rollouts} rollouts every group's "
                  "samples got the same reward, so every advantage is 0 and nothing is learned. "
                  "Warm-start the model (it never succeeds or always does), raise "
                  "--n-samples-per-prompt or --rollout-temperature, or use a dynamic-sampling "
                  "filter (--dynamic-sampling-filter-path agentrl.rollout.filters:reward_std_positive).",
                  file=sys.stderr, flush=True)  # fmt: skip
        record = {"rollout_id": rollout_id, "elapsed_s": round(time.perf_counter() - self.started, 3),
                  **values}  # fmt: skip
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        shown = {k: v for k, v in record.items() if k in SHOWN}
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()),
              flush=True)  # fmt: skip

    def samples(self, rollout_id: int, samples: Sequence[Sample]) -> None:
        self.trajectories.mkdir(exist_ok=True)
        with (self.trajectories / f"rollout_{rollout_id:05d}.jsonl").open("w") as f:
            for sample in samples:
                f.write(sample.to_json() + "\n")


SHOWN = ("rollout_id", "elapsed_s", "rollout/reward_mean", "rollout/completed", "rollout/truncated",
         "rollout/failed", "rollout/turns_mean", "rollout/zero_std_groups", "train/loss", "train/sft_loss",
         "train/kl_loss", "train/entropy", "train/grad_norm", "train/train_tokens_per_s")  # fmt: skip


def checkpoint_folder(root: str | Path, next_rollout: int) -> Path:
    """``<root>/rollout_<n>``: the checkpoint taken before rollout ``n``."""
    return Path(root) / f"rollout_{next_rollout:05d}"


def mark_latest(root: str | Path, folder: Path) -> None:
    """Records ``folder`` as the newest complete checkpoint (written last, atomically)."""
    marker = Path(root) / "latest"
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(folder.name + "\n")
    tmp.replace(marker)


def latest_checkpoint(root: str | Path) -> Path:
    """The checkpoint ``--load`` names: ``root`` itself if it is one, else the newest complete
    one under it.

    Raises:
        ConfigError: Neither; the message names ``--load`` and the folder.
    """
    root = Path(root)
    if (root / "data.json").is_file():
        return root
    marker = root / "latest"
    if marker.is_file():
        return root / marker.read_text().strip()
    raise ConfigError(f"--load {str(root)!r}: no checkpoint there (no 'latest' marker and no "
                      "data.json); pass the --save folder of an earlier run")
