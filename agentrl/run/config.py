"""The run's typed configs: the loop's own flags (``RunConfig``) and ``Args``, every
subsystem's config of one run, which :func:`agentrl.run.flags.parse_args` builds."""

from __future__ import annotations

import argparse
import dataclasses

from agentrl.config import flag, option
from agentrl.errors import ConfigError
from agentrl.models.defaults import EmbeddedDefault
from agentrl.placement.cluster import ClusterConfig
from agentrl.rollout.config import RolloutConfig
from agentrl.run.sinks import WANDB_MODES, require_wandb
from agentrl.trainer.config import TrainerConfig

__all__ = ["Args", "RunConfig"]


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The loop's own flags."""

    num_rollout: int = option(3, "rollout -> train iterations (with --load: the new total; the "
                              "lr decay is stretched to it)")
    update_weights_interval: int = option(1, "push trainer weights to the engine every N rollouts")
    async_training: bool = option(False, "overlap rollouts and training: episodes go on running "
                                  "on the engines while the trainer trains on finished groups, "
                                  "and weights are pushed to them in flight (see "
                                  "docs/guides/async-training.md)")
    max_staleness: int = option(1, "with --async-training: no trained group's oldest token is "
                                "more than this many weight versions behind the trainer (1: "
                                "one-step-off; 0: on-policy); new groups wait to start, none is "
                                "dropped for being late")
    weight_sync: str = option("auto", "how weights reach the engines: tensor (in memory; Ray's "
                              "shared-memory object store for engine actors), disk (a Hugging "
                              "Face directory under <output-dir>/weights), auto (tensor for "
                              "embedded engines, disk for SGLang servers), broadcast (SGLang "
                              "servers: NCCL from the trainer's rank 0; gloo on CPU), adapter "
                              "(vLLM servers with --lora-rank: only the LoRA adapters, which the "
                              "servers load onto the base model)",
                              choices=("auto", "tensor", "disk", "broadcast", "adapter"))
    eval_interval: int | None = option(None, "evaluate every N rollouts (and before the first)")
    output_dir: str | None = option(None, "where metrics, trajectories and checkpoints go; "
                                    "default: a new folder runs/<date>-<time> (runs/latest "
                                    "points at the newest), or with --load of a run's folder, "
                                    "that folder; a folder an earlier run wrote metrics to is "
                                    "refused unless --load continues that run")
    save_trajectories: bool = option(True, "write each rollout's samples as JSONL")
    save_atif: bool = option(False, "also write each rollout's episodes as ATIF trajectories "
                             "(Harbor's trajectory format): one JSON file an episode under "
                             "trajectories/atif/rollout_<id>/")
    max_failed_fraction: float | None = option(
        None, "stop the run when more than this share of a rollout's samples failed (an env, a "
        "tool plumbing or a plug-in crashed); default: only when every sample failed")
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
    debug: bool = option(False, "errors of the trainer's and engines' Ray actors carry their "
                         "remote traceback (default: one line naming what failed and why)")

    def validate(self) -> None:
        """Raises ConfigError naming the first invalid flag and what to change."""
        if self.save_atif and not self.save_trajectories:
            raise ConfigError("--save-atif writes the episodes beside the trajectories: drop "
                              "--no-save-trajectories")
        for name in ("num_rollout", "update_weights_interval", "eval_interval",
                     "dead_run_rollouts"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{flag(name)} must be >= 1, got {value}")
        if self.max_staleness < 0:
            raise ConfigError(f"--max-staleness must be >= 0, got {self.max_staleness}")
        if self.async_training and self.max_staleness < self.update_weights_interval - 1:
            raise ConfigError(
                f"--max-staleness {self.max_staleness} with --update-weights-interval "
                f"{self.update_weights_interval}: the engines keep each version for "
                f"{self.update_weights_interval} iterations, so groups started on it are up to "
                f"{self.update_weights_interval - 1} versions old when trained; raise "
                f"--max-staleness to {self.update_weights_interval - 1} or lower the interval")
        if self.max_failed_fraction is not None and not 0 <= self.max_failed_fraction < 1:
            raise ConfigError(f"--max-failed-fraction must be in [0, 1), got {self.max_failed_fraction}")
        if self.wandb_mode not in WANDB_MODES:
            raise ConfigError(f"--wandb-mode must be one of {', '.join(WANDB_MODES)}, "
                              f"got {self.wandb_mode!r}")
        if self.use_wandb:
            # Fail at flag parsing, not after the model has loaded.
            require_wandb()


@dataclasses.dataclass(frozen=True)
class Args:
    """Every subsystem's config, and the flat namespace plug-ins receive as ``args``."""

    rollout: RolloutConfig
    trainer: TrainerConfig
    run: RunConfig
    cluster: ClusterConfig
    namespace: argparse.Namespace
    embedded: EmbeddedDefault | None = None
    """The embedded default the run plays (no ``--hf-checkpoint``; see
    :mod:`agentrl.models.defaults`), or ``None``."""
    fresh_output_dir: bool = False
    """The run's folder is a new dated one under ``runs/`` (no ``--output-dir``): ``runs/latest``
    is pointed at it when the run starts (:mod:`agentrl.run.run_folder`)."""
