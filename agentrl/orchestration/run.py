"""Run-level flags and the files a run writes (metrics, trajectories, eval results, checkpoints)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from agentrl.config import add_arguments, flag, from_namespace, option
from agentrl.errors import ConfigError
from agentrl.orchestration.cluster import ClusterConfig
from agentrl.orchestration.progress import RunProgress
from agentrl.orchestration.sinks import (
    WANDB_MODES,
    MetricsSink,
    TensorBoardSink,
    WandbSink,
    require_wandb,
    scalars,
)
from agentrl.rollout.config import RolloutConfig, collect_sglang_args
from agentrl.rollout.sample import Sample
from agentrl.trainer.config import TrainerConfig, steps_per_rollout

__all__ = ["RunConfig", "RunLog", "checkpoint_folder", "latest_checkpoint", "mark_latest",
           "parse_args"]


@dataclasses.dataclass
class RunConfig:
    """The loop's own flags."""

    num_rollout: int = option(3, "rollout -> train iterations")
    update_weights_interval: int = option(1, "push trainer weights to the engine every N rollouts")
    weight_sync: str = option("auto", "how weights reach the engines: tensor (in memory; Ray's "
                              "shared-memory object store for engine actors), disk (a Hugging "
                              "Face directory under <output-dir>/weights), auto (tensor for "
                              "embedded engines, disk for SGLang servers), broadcast (SGLang "
                              "servers: NCCL from the trainer's rank 0; gloo on CPU)",
                              choices=("auto", "tensor", "disk", "broadcast"))
    eval_interval: int | None = option(None, "evaluate every N rollouts (and before the first)")
    output_dir: str = option("runs/latest", "where metrics, trajectories and checkpoints go")
    save_trajectories: bool = option(True, "write each rollout's samples as JSONL")
    dead_run_rollouts: int = option(3, "warn when every group had zero reward variance for this "
                                    "many rollouts in a row (nothing is being learned)")
    use_tensorboard: bool = option(True, "write TensorBoard event files under <output-dir>/"
                                   "tensorboard (one scalar per metric, step = rollout id)")
    use_wandb: bool = option(False, "also log metrics to Weights & Biases "
                             "(needs: pip install wandb)")
    wandb_project: str = option("agentrl", "the wandb project (with --use-wandb)")
    wandb_mode: str = option("offline", "online, or offline: files under <output-dir>/wandb "
                             "to upload later with `wandb sync` (with --use-wandb)",
                             choices=WANDB_MODES)
    wandb_run_name: str | None = option(None, "the wandb run's name (default: one wandb picks)")
    progress: bool = option(True, "progress bars on a terminal (episodes, train steps, stage)")

    def validate(self) -> None:
        for name in ("num_rollout", "update_weights_interval", "eval_interval", "dead_run_rollouts"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{flag(name)} must be >= 1, got {value}")
        if self.wandb_mode not in WANDB_MODES:
            raise ConfigError(f"--wandb-mode must be one of {', '.join(WANDB_MODES)}, "
                              f"got {self.wandb_mode!r}")  # fmt: skip
        if self.use_wandb:
            # Fail at flag parsing, not after the model has loaded.
            require_wandb()


@dataclasses.dataclass
class Args:
    """Every subsystem's config, and the flat namespace plug-ins receive as ``args``."""

    rollout: RolloutConfig
    trainer: TrainerConfig
    run: RunConfig
    cluster: ClusterConfig
    namespace: argparse.Namespace


def parse_args(argv: Sequence[str] | None = None) -> Args:
    """Parses and validates the flags, the batch equation included (errors name the flag and
    exit with status 2), and fills in ``--global-batch-size`` / ``--num-steps-per-rollout``."""
    parser = argparse.ArgumentParser(prog="train.py", description="agentrl: RL for tool-using agents")
    for cls, title in ((RolloutConfig, "rollout"), (TrainerConfig, "trainer"), (RunConfig, "run"),
                       (ClusterConfig, "cluster")):
        add_arguments(parser, cls, title)
    namespace, unknown = parser.parse_known_args(argv)
    namespace.sglang_args, unknown = collect_sglang_args(unknown)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        rollout = from_namespace(RolloutConfig, namespace)
        trainer = from_namespace(TrainerConfig, namespace)
        run = from_namespace(RunConfig, namespace)
        cluster = from_namespace(ClusterConfig, namespace)
        cluster.validate(trainer.tensor_model_parallel_size)
        check_backend_placement(rollout, cluster)
        if (cluster.use_fault_tolerance and rollout.rollout_backend != "embedded"
                and run.weight_sync not in ("auto", "disk")):
            raise ConfigError(f"--use-fault-tolerance with --rollout-backend {rollout.rollout_backend} "
                              "restarts a server from the latest weights on disk: use --weight-sync "
                              f"disk (or auto), not {run.weight_sync}")
        if run.weight_sync == "broadcast" and rollout.rollout_backend == "embedded":
            raise ConfigError("--weight-sync broadcast is for SGLang servers: use it with "
                              "--rollout-backend sglang (or sglang-compat)")
        steps_per_rollout(trainer, rollout.rollout_batch_size, rollout.n_samples_per_prompt)
        if trainer.load:
            latest_checkpoint(trainer.load)
    except ConfigError as exc:
        parser.error(str(exc))
    return Args(rollout, trainer, run, cluster, namespace)


def check_backend_placement(rollout: RolloutConfig, cluster: ClusterConfig) -> None:
    """Flags that only make sense together.

    Raises:
        ConfigError: Naming the flags.
    """
    if rollout.rollout_backend == "embedded" and cluster.rollout_num_gpus_per_engine != 1:
        raise ConfigError(
            f"--rollout-num-gpus-per-engine {cluster.rollout_num_gpus_per_engine}: the embedded "
            "engine serves one device per engine; tensor-parallel engines need --rollout-backend "
            "sglang")
    if rollout.rollout_backend != "embedded":
        if not (cluster.engine_actors or rollout.rollout_engine_urls):
            raise ConfigError(f"--rollout-backend {rollout.rollout_backend} launches servers as Ray "
                              "actors: add --rollout-num-gpus N (or --colocate), or name running "
                              "servers with --rollout-engine-urls")  # fmt: skip
        if not cluster.use_ray and not rollout.rollout_engine_urls:
            raise ConfigError(f"--rollout-backend {rollout.rollout_backend} places servers with "
                              "Ray: drop --no-use-ray")  # fmt: skip
        if cluster.use_fault_tolerance and rollout.rollout_engine_urls:
            raise ConfigError("--use-fault-tolerance restarts servers this run started; "
                              "--rollout-engine-urls servers are someone else's: drop one of them")
        if rollout.rollout_backend == "sglang-compat" and cluster.rollout_num_gpus_per_engine != 1:
            raise ConfigError("--rollout-backend sglang-compat serves one device per engine: "
                              "--rollout-num-gpus-per-engine must be 1")


class RunLog:
    """Everything a run writes about itself under ``output_dir``.

    * ``metrics.jsonl``: one line per rollout (always), plus a one-line console summary.
    * ``eval.jsonl``: one line per evaluation (:meth:`eval`).
    * ``trajectories/rollout_<id>.jsonl``: each rollout's samples (:meth:`samples`).
    * ``tensorboard/``: event files, one scalar per numeric metric at step = rollout id
      (``use_tensorboard``).
    * ``wandb/``: a Weights & Biases run (``use_wandb``).

    :meth:`stage` times the loop's stages (``time/<stage>_s`` in the next metrics line) and
    moves the progress display along (``progress``, see :class:`RunProgress`). It also warns on
    stderr when ``dead_run_rollouts`` rollouts in a row had zero reward variance
    in every group (nothing is being learned). Call :meth:`close` at the end (or use it as a
    context manager); after that, only the JSONL files are written.

    Args:
        output_dir: The run's folder (created if missing).
        dead_run_rollouts: Flat rollouts in a row before the dead-run warning.
        use_tensorboard: Write TensorBoard event files.
        use_wandb: Log to wandb (imported only then).
        wandb_project: The wandb project.
        wandb_mode: ``"offline"`` or ``"online"``.
        wandb_run_name: The wandb run's name; wandb picks one when ``None``.
        wandb_config: Hyperparameters recorded with the wandb run (e.g. every flag).
        progress: The terminal progress display, or ``None``.

    Raises:
        ConfigError: A requested backend is not installed; the message names the flag.
    """

    def __init__(self, output_dir: str | Path, dead_run_rollouts: int = 3, *,
                 use_tensorboard: bool = True, use_wandb: bool = False,
                 wandb_project: str = "agentrl", wandb_mode: str = "offline",
                 wandb_run_name: str | None = None,
                 wandb_config: dict[str, Any] | None = None,
                 progress: RunProgress | None = None) -> None:  # fmt: skip
        self.dead_run_rollouts = dead_run_rollouts
        self.progress = progress
        self.stage_seconds: dict[str, float] = {}
        self.flat_rollouts = 0
        self.root = Path(output_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.root / "metrics.jsonl"
        self.eval_path = self.root / "eval.jsonl"
        self.trajectories = self.root / "trajectories"
        self.tensorboard_dir = self.root / "tensorboard"
        self.started = time.perf_counter()
        self.sinks: list[MetricsSink] = []
        try:
            if use_tensorboard:
                self.sinks.append(TensorBoardSink(self.tensorboard_dir))
            if use_wandb:
                wandb_sink = WandbSink(self.root, project=wandb_project, mode=wandb_mode,
                                  run_name=wandb_run_name, config=wandb_config)
                self.sinks.append(wandb_sink)
        except BaseException:
            # A later sink failed: release the ones already open so no writer thread leaks.
            self.close()
            raise

    @classmethod
    def from_config(cls, args: Args) -> RunLog:
        """The log the flags ask for, with a progress display sized from them; every flag is
        recorded with a wandb run."""
        run, rollout, trainer = args.run, args.rollout, args.trainer
        progress = RunProgress(run.num_rollout, rollout.rollout_batch_size * rollout.n_samples_per_prompt,
                               trainer.num_steps_per_rollout, enabled=run.progress)  # fmt: skip
        return cls(run.output_dir, dead_run_rollouts=run.dead_run_rollouts,
                   use_tensorboard=run.use_tensorboard, use_wandb=run.use_wandb,
                   wandb_project=run.wandb_project, wandb_mode=run.wandb_mode,
                   wandb_run_name=run.wandb_run_name, wandb_config=vars(args.namespace),
                   progress=progress)  # fmt: skip

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Times one stage of the loop (summed if it runs twice before the next metrics line)."""
        if self.progress is not None:
            self.progress.stage(name)
        started = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            self.stage_seconds[name] = self.stage_seconds.get(name, 0.0) + elapsed

    def metrics(self, rollout_id: int, values: dict[str, Any]) -> None:
        """Records one rollout's metrics: JSONL line, sinks (flushed), console summary, and the
        dead-run check."""
        values = {**values, **{f"time/{k}_s": v for k, v in self.stage_seconds.items()}}
        self.stage_seconds = {}
        if self.progress is not None:
            self.progress.trained(rollout_id)
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
        elapsed = round(time.perf_counter() - self.started, 3)
        record = {"rollout_id": rollout_id, "elapsed_s": elapsed, **values}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        self._log_scalars(rollout_id, {**scalars(values), "run/elapsed_s": elapsed})
        shown = {k: v for k, v in record.items() if k in SHOWN}
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()),
              flush=True)  # fmt: skip

    def eval(self, step: int, result: dict[str, Any]) -> None:
        """Records one evaluation: a line of ``eval.jsonl`` and scalars ``eval/<set>/<metric>``.

        Args:
            step: The rollout id the evaluation ran before (``num_rollout`` for the final one).
            result: What :func:`agentrl.rollout.evaluation.run_evaluation` returns,
                ``{"step", "sets": {name: metrics}}``, or just the ``{name: metrics}`` part.

        Raises:
            ValueError: ``result`` carries a ``step`` other than ``step``.
        """
        sets = result.get("sets")
        # A set's metrics are numbers, so a "sets" mapping of mappings is run_evaluation's form
        # even if someone named an eval set "sets".
        if isinstance(sets, dict) and all(isinstance(v, dict) for v in sets.values()):
            if result.get("step", step) != step:
                raise ValueError(f"eval result is for step {result['step']}, logged at step {step}")
            record = result if "step" in result else {"step": step, **result}
        else:
            record = {"step": step, "sets": result}
        # The same line agentrl.rollout.evaluation.write_eval_results writes, so readers of
        # eval.jsonl need not care which one produced it.
        with self.eval_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        self._log_scalars(step, scalars(record["sets"], prefix="eval/"))
        for name, metrics in record["sets"].items():
            shown = {k: metrics[k] for k in EVAL_SHOWN if k in metrics}
            print(f"eval step={step} {name}: "
                  + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in shown.items()), flush=True)  # fmt: skip

    def samples(self, rollout_id: int, samples: Sequence[Sample]) -> None:
        """Writes one rollout's samples as ``trajectories/rollout_<id>.jsonl``."""
        self.trajectories.mkdir(exist_ok=True)
        with (self.trajectories / f"rollout_{rollout_id:05d}.jsonl").open("w") as f:
            for sample in samples:
                f.write(sample.to_json() + "\n")

    def close(self) -> None:
        """Flushes and closes the TensorBoard / wandb writers; calling it again does nothing."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close()
        if self.progress is not None:
            self.progress.close()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _log_scalars(self, step: int, values: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.log(step, values)


SHOWN = ("rollout_id", "elapsed_s", "rollout/reward_mean", "rollout/success_rate", "rollout/completed", "rollout/truncated",
         "rollout/failed", "rollout/turns_mean", "rollout/zero_std_groups", "train/loss", "train/sft_loss",
         "train/kl_loss", "train/entropy", "train/grad_norm", "train/train_tokens_per_s")  # fmt: skip
EVAL_SHOWN = ("n_prompts", "n_samples", "pass@1", "mean_reward")


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
