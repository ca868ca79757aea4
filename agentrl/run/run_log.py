"""``RunLog``: the files a run writes about itself (metrics, trajectories, eval results) and
its TensorBoard / wandb scalars."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl._version import __version__
from agentrl.records.atif import write_atif
from agentrl.records.sample import Sample
from agentrl.run.progress import RunProgress
from agentrl.run.run_folder import LATEST, point_latest
from agentrl.run.sinks import MetricsSink, TensorBoardSink, WandbSink, scalars

if TYPE_CHECKING:
    from agentrl.run.config import Args

__all__ = ["EVAL_SHOWN", "SHOWN", "RunChange", "RunLog", "run_change"]


class RunLog:
    """Everything a run writes about itself under ``output_dir``.

    * ``run.json``: each launch of the run (a first start, then every ``--load``): its command
      line, every flag's value and the policy's Hugging Face folder (:meth:`record_launch`).
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

    The run-level counters (the flat rollouts in a row, the run's elapsed seconds) go into each
    checkpoint (:meth:`counters`) and come back on ``--load`` (:meth:`restore`), so a resumed run
    warns and counts as if it had never stopped.

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
                 progress: RunProgress | None = None, gateway_segments: str = "last",
                 atif_model: str | None = None) -> None:
        self.dead_run_rollouts = dead_run_rollouts
        self.atif_model = atif_model
        """With ``--save-atif``: the policy's name in the ATIF documents (else none are written)."""
        self.gateway_segments = gateway_segments
        self.dropped_replies_explained = False
        self.progress = progress
        self.stage_seconds: dict[str, float] = {}
        self.flat_rollouts = 0
        self.rollouts_logged = 0  # by this launch
        self.elapsed_before = 0.0  # seconds the run ran before this process (restored on --load)
        self.root = Path(output_dir)
        # the folders this run makes (the run's, and parents such as runs/): taken back if it
        # stops before it launched
        self.created = [folder for folder in (self.root, *self.root.parents) if not folder.exists()]
        self.root.mkdir(parents=True, exist_ok=True)
        self.run_path = self.root / "run.json"
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
        samples = rollout.rollout_batch_size * rollout.n_samples_per_prompt
        progress = RunProgress(run.num_rollout, samples, trainer.num_steps_per_rollout or 1,
                               enabled=run.progress)
        assert run.output_dir is not None  # chosen by parse_args
        log = cls(run.output_dir, dead_run_rollouts=run.dead_run_rollouts,
                  use_tensorboard=run.use_tensorboard, use_wandb=run.use_wandb,
                  wandb_project=run.wandb_project, wandb_mode=run.wandb_mode,
                  wandb_run_name=run.wandb_run_name, wandb_config=vars(args.namespace),
                  progress=progress, gateway_segments=rollout.gateway_segments,
                  atif_model=(rollout.hf_checkpoint or "the embedded default") if run.save_atif else None)
        if args.fresh_output_dir:  # a new dated folder: runs/latest names it from now on
            note = point_latest(run.output_dir)
            if note is not None:
                print(f"note: {note}", file=sys.stderr)
        return log

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
        self.flat_rollouts = self._flat_rollouts_after(values)
        values = {**values, "run/flat_rollouts_in_a_row": self.flat_rollouts}
        self.rollouts_logged += 1
        dropped = values.get("rollout/gateway/dropped_replies", 0)
        if dropped and self.gateway_segments == "last" and not self.dropped_replies_explained:
            self.dropped_replies_explained = True  # once a run
            print(f"note: rollout/gateway/dropped_replies={dropped:g}: model replies in no trained "
                  "sample: the segments before an agent rewrote its history (trimmed or summarised "
                  "it), which --gateway-segments last leaves out (--gateway-segments all trains "
                  "every segment), choices it did not continue, or draws a retry replaced "
                  "(docs/guides/agents.md, Sessions and segments)", file=sys.stderr, flush=True)
        if self.flat_rollouts >= self.dead_run_rollouts:
            print(_dead_run(f"in the last {self.flat_rollouts} rollouts"), file=sys.stderr, flush=True)
        elapsed = round(self._elapsed(), 3)
        record = {"rollout_id": rollout_id, "elapsed_s": elapsed, **values}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        self._log_scalars(rollout_id, {**scalars(values), "run/elapsed_s": elapsed})
        shown = {k: v for k, v in record.items() if k in SHOWN}
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in shown.items()), flush=True)

    def record_launch(self, argv: Sequence[str], flags: Mapping[str, Any], policy_dir: str) -> None:
        """Adds this launch to ``run.json`` (rewritten atomically; earlier launches kept).

        Args:
            argv: The command line after the program name.
            flags: Every flag's value (``vars`` of the parsed namespace).
            policy_dir: The policy's Hugging Face folder (its tokenizer decodes the run's
                tokens in ``agentrl view``).
        """
        launches: list[Any] = []
        if self.run_path.is_file():
            with contextlib.suppress(ValueError, OSError):
                launches = list(json.loads(self.run_path.read_text(encoding="utf-8"))["launches"])
        launches.append({"argv": list(argv), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                         "cwd": os.getcwd(),  # what the relative paths among the flags mean
                         "flags": json.loads(json.dumps(dict(flags), default=str)),
                         "policy_dir": policy_dir})
        staging = self.run_path.with_name(self.run_path.name + ".tmp")
        staging.write_text(json.dumps({"launches": launches}, indent=1) + "\n", encoding="utf-8")
        staging.replace(self.run_path)

    def counters(self, pending: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The run-level counters to save with a checkpoint (JSON-able; :meth:`restore` takes
        them back).

        Args:
            pending: The metrics of a rollout that is checkpointed before :meth:`metrics`
                records it (train.py saves first): the counters are given as they will be once
                it is recorded, so the resumed run continues from the rollout after it.
        """
        flat = self.flat_rollouts if pending is None else self._flat_rollouts_after(pending)
        return {"flat_rollouts": flat, "elapsed_s": self._elapsed()}

    def restore(self, counters: Mapping[str, Any], next_rollout: int) -> None:
        """Continues the counters of :meth:`counters` (a ``--load``); missing ones (a checkpoint
        from before they were saved) start at 0.

        The lines the stopped run wrote after its checkpoint (rollouts from ``next_rollout``
        on, and a line a kill cut in half) are played again by the resumed run: they move from
        ``metrics.jsonl`` / ``eval.jsonl`` to ``<file>.superseded``, so each rollout has one
        line and nothing written is thrown away.
        """
        self.flat_rollouts = int(counters.get("flat_rollouts", 0))
        self.elapsed_before = float(counters.get("elapsed_s", 0.0))
        _supersede_after(self.metrics_path, "rollout_id", next_rollout)
        _supersede_after(self.eval_path, "step", next_rollout)

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
                             for k, v in shown.items()), flush=True)

    def change(self, window: int = 3) -> RunChange | None:
        """What the run changed: its first rollouts against its last ones, and its first
        evaluation against its last (:func:`run_change` over ``metrics.jsonl`` and
        ``eval.jsonl``, so a resumed run covers every launch).

        Args:
            window: Rollouts averaged at each end (fewer when the run is short: at most half).
        """
        return run_change(self.metrics_path, window, self.eval_path)

    def samples(self, rollout_id: int, samples: Sequence[Sample]) -> None:
        """Writes one rollout's samples as ``trajectories/rollout_<id>.jsonl``."""
        self.trajectories.mkdir(exist_ok=True)
        with (self.trajectories / f"rollout_{rollout_id:05d}.jsonl").open("w") as f:
            for sample in samples:
                f.write(sample.to_json() + "\n")
        if self.atif_model is not None:
            write_atif(self.trajectories / "atif" / f"rollout_{rollout_id:05d}", samples,
                       agent_version=__version__, model_name=self.atif_model, session_id=self.root.name)

    def close(self) -> None:
        """Flushes and closes the TensorBoard / wandb writers; calling it again does nothing."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close()
        if self.progress is not None:
            self.progress.close()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        self.close()
        if exc_type is not None and self.root in self.created and self._recorded_nothing():
            self._take_back()

    def _recorded_nothing(self) -> bool:
        """Whether the folder holds nothing a run produced: at most its ``run.json`` (the
        launch) and the TensorBoard writer's empty start, no metrics, evaluation, trajectory or
        checkpoint."""
        kept = {self.run_path.name, self.tensorboard_dir.name}
        return self.root.is_dir() and all(entry.name in kept for entry in self.root.iterdir())

    def _take_back(self) -> None:
        """Removes the folder this run made when it stopped before its first rollout was
        recorded (a refused start: an env that cannot be imported, a prompt file with no usable
        row, a signal while reading it; or a failure while starting: a server that never
        answered): nothing in it records a run. ``runs/latest`` then names no folder and goes
        too."""
        shutil.rmtree(self.root, ignore_errors=True)
        latest = self.root.parent / LATEST
        if latest.is_symlink() and os.readlink(latest) == self.root.name:
            latest.unlink(missing_ok=True)
        for folder in self.created[1:]:  # parents it made, innermost first, while empty
            with contextlib.suppress(OSError):
                folder.rmdir()

    def ending(self, save_root: str | Path, exported: Sequence[str], *, lora: bool) -> list[str]:
        """The run's last lines: where its files are, how to go on, what it exported (and, for
        LoRA without ``--save-hf``, where the adapters are and how to get them out)."""
        lines = [f"done: metrics {self.metrics_path}, trajectories {self.trajectories}/, checkpoints "
                 f"{save_root}/ (continue with --load {save_root} and a larger --num-rollout)"]
        if exported:
            lines.append(f"exported (Hugging Face folders, --save-hf): {', '.join(exported)}")
        elif lora:
            lines.append(f"the LoRA adapters are only in the checkpoints under {save_root}/ (no "
                         f"--save-hf): `agentrl export {self.root} --hf DIR` writes the newest as a "
                         "Hugging Face folder with the adapters merged, and the adapters alone in "
                         "PEFT's format (--save-hf DIR does it at every save)")
        lines.append(f"look at the run: agentrl view {self.root}")
        return lines

    def finish(self) -> None:
        """Ends the run's console output: a run too short for the dead-run warning whose every
        rollout was flat gets it now (a 2-rollout run that learned nothing says why)."""
        if 0 < self.flat_rollouts < self.dead_run_rollouts and self.flat_rollouts >= self.rollouts_logged:
            print(_dead_run(f"in all {self.flat_rollouts} rollouts of this run"), file=sys.stderr, flush=True)

    def _flat_rollouts_after(self, values: Mapping[str, Any]) -> int:
        """The flat-rollouts-in-a-row count once the rollout with metrics ``values`` is counted:
        one more if every group had one reward for all its samples, else 0."""
        groups = values.get("rollout/groups", 0)
        flat = groups > 0 and values.get("rollout/zero_std_groups", 0) == groups
        return self.flat_rollouts + 1 if flat else 0

    def _elapsed(self) -> float:
        """Seconds the run has run, over every process that continued it."""
        return self.elapsed_before + time.perf_counter() - self.started

    def _log_scalars(self, step: int, values: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.log(step, values)


def _dead_run(when: str) -> str:
    """The dead-run warning: ``when`` says over which rollouts every reward was flat."""
    return (f"WARNING: dead run: {when} every group's samples got the same reward, so every "
            "advantage is 0 and nothing is learned. Warm-start the model (it never succeeds or "
            "always does), raise --n-samples-per-prompt or --rollout-temperature, or use a "
            "dynamic-sampling filter (--dynamic-sampling-filter-path "
            "agentrl.rollout.filters:reward_std_positive).")


def _supersede_after(path: Path, key: str, first: int) -> None:
    """Moves the lines of ``path`` whose ``key`` is ``first`` or later, and the lines that are
    not a JSON object with an integer ``key``, to ``<path>.superseded``; the rest is rewritten
    atomically (temp + rename)."""
    if not path.is_file():
        return
    kept, moved = [], []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True):
        try:
            value = json.loads(line).get(key)
        except (ValueError, AttributeError):
            value = None
        (kept if isinstance(value, int) and value < first else moved).append(line)
    if not moved:
        return
    with path.with_name(path.name + ".superseded").open("a", encoding="utf-8") as f:
        f.writelines(line if line.endswith("\n") else line + "\n" for line in moved)
    staging = path.with_name(path.name + ".tmp")
    staging.write_text("".join(kept), encoding="utf-8")
    staging.replace(path)


SHOWN = ("rollout_id", "elapsed_s", "rollout/reward_mean", "rollout/success_rate",
         "rollout/completed", "rollout/truncated", "rollout/failed", "rollout/turns_mean",
         "rollout/zero_std_groups", "rollout/gateway/dropped_replies", "train/loss",
         "train/sft_loss", "train/kl_loss", "train/entropy", "train/grad_norm",
         "train/train_tokens_per_s", "async/staleness_mean", "async/staleness_max",
         "async/trainer_wait_s", "async/groups_in_flight")
"""The metrics of the one-line console summary of each rollout (those a run has: the async
figures with ``--async-training``, the gateway's with a black-box agent)."""
EVAL_SHOWN = ("n_prompts", "n_samples", "pass@1", "mean_reward")
"""The metrics printed for each eval set."""


@dataclasses.dataclass(frozen=True)
class RunChange:
    """A run's first rollouts against its last ones, on the training tasks, and its first
    evaluation against its last one, on held-out tasks.

    Attributes:
        first: The rollout ids averaged at the start.
        last: The rollout ids averaged at the end.
        success_before: Mean ``rollout/success_rate`` over ``first``.
        success_after: The same over ``last``.
        reward_before: Mean ``rollout/reward_mean`` over ``first``.
        reward_after: The same over ``last``.
        episodes: Training episodes behind each of the two success figures (the noise a reader
            should expect is about ``sqrt(p * (1 - p) / episodes)``).
        heldout_steps: The steps of the first and last evaluation (``None``: fewer than two).
        heldout_before: Mean ``pass@1`` over the eval sets at the first evaluation.
        heldout_after: The same at the last one.
        heldout_episodes: Episodes behind each held-out figure.
    """

    first: tuple[int, ...]
    last: tuple[int, ...]
    success_before: float
    success_after: float
    reward_before: float
    reward_after: float
    episodes: int = 0
    heldout_steps: tuple[int, int] | None = None
    heldout_before: float = 0.0
    heldout_after: float = 0.0
    heldout_episodes: int = 0

    def __str__(self) -> str:
        def span(ids: tuple[int, ...]) -> str:
            return f"rollout {ids[0]}" if len(ids) == 1 else f"rollouts {ids[0]}-{ids[-1]}"

        text = (f"success on the training tasks: {self.success_before:.3f} in {span(self.first)} -> "
                f"{self.success_after:.3f} in {span(self.last)} "
                f"({_change(self.success_before, self.success_after, self.episodes)}"
                + (f", {self.episodes} episodes each" if self.episodes else "")
                + f"); mean reward {self.reward_before:.3f} -> {self.reward_after:.3f}")
        if self.heldout_steps is not None:
            before, after = self.heldout_steps
            text += (f"\nsuccess on held-out tasks (eval pass@1, {self.heldout_episodes} episodes "
                     f"each): {self.heldout_before:.3f} at step {before} -> {self.heldout_after:.3f} "
                     f"at step {after} ({_change(self.heldout_before, self.heldout_after, self.heldout_episodes)})")
        if self.episodes or self.heldout_episodes:
            text += ("\n(+- is one standard error of the change from the episode counts alone: a "
                     "change within about twice it can be chance)")
        return text


def _change(before: float, after: float, episodes: int) -> str:
    """``after - before`` with one standard error of that difference when ``episodes`` (behind
    each figure) is known: two independent success rates, ``sqrt(p1 q1 / n + p2 q2 / n)``."""
    if episodes <= 0:
        return f"{after - before:+.3f}"
    error = math.sqrt((before * (1 - before) + after * (1 - after)) / episodes)
    return f"{after - before:+.3f} +- {error:.3f}"


def _rows(path: Path, key: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file that have ``key``, in file order; a line a kill cut
    in half is left out."""
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if isinstance(row, dict) and key in row:
                    rows.append(row)
    return rows


def run_change(metrics_path: Path, window: int = 3, eval_path: Path | None = None) -> RunChange | None:
    """Reads a run's ``metrics.jsonl`` and compares its first rollouts with its last ones, and,
    given its ``eval.jsonl``, its first evaluation with its last one.

    Args:
        metrics_path: The run's ``metrics.jsonl``.
        window: Rollouts averaged at each end (fewer when the run is short: at most half).
        eval_path: The run's ``eval.jsonl`` (``None`` or a missing file: no held-out figures).

    Returns:
        The change, or ``None`` when fewer than two rollouts were recorded.
    """
    rows = sorted(_rows(metrics_path, "rollout/success_rate"), key=lambda row: row.get("rollout_id", 0))
    if len(rows) < 2:
        return None
    size = max(1, min(window, len(rows) // 2))
    first, last = rows[:size], rows[-size:]

    def mean(part: list[dict[str, Any]], key: str) -> float:
        return sum(float(row.get(key, 0.0)) for row in part) / len(part)

    def pass1(record: dict[str, Any]) -> float:
        sets = [m for m in record["sets"].values() if isinstance(m, dict) and "pass@1" in m]
        return sum(float(m["pass@1"]) for m in sets) / max(1, len(sets))

    evals = sorted(_rows(eval_path, "sets"), key=lambda row: row.get("step", 0)) if eval_path else []
    held = {}
    if len(evals) >= 2 and evals[0].get("step") != evals[-1].get("step"):
        held = {"heldout_steps": (int(evals[0]["step"]), int(evals[-1]["step"])),
                "heldout_before": pass1(evals[0]), "heldout_after": pass1(evals[-1]),
                "heldout_episodes": int(sum(m.get("n_samples", 0) for m in evals[-1]["sets"].values()
                                            if isinstance(m, dict)))}
    return RunChange(
        first=tuple(int(row.get("rollout_id", 0)) for row in first),
        last=tuple(int(row.get("rollout_id", 0)) for row in last),
        success_before=mean(first, "rollout/success_rate"), success_after=mean(last, "rollout/success_rate"),
        reward_before=mean(first, "rollout/reward_mean"), reward_after=mean(last, "rollout/reward_mean"),
        episodes=int(sum(row.get("rollout/samples", 0) for row in first)), **held)
