"""Learning-rate schedules of the Megatron actor: their decay span, and fitting a schedule
restored from a checkpoint to the resumed run."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch

from agentrl.errors import ConfigError
from agentrl.trainer.config import TrainerConfig

__all__ = ["decay_steps", "global_rank", "load_schedule", "lr_of"]


def decay_steps(config: TrainerConfig, total_steps: int | None) -> int:
    """Optimizer steps this run's flags decay the learning rate over: ``--lr-decay-iters``,
    else the whole run (``total_steps``); always past the warm-up, as Megatron requires."""
    return max(config.lr_decay_iters or max(1, total_steps or 1), config.lr_warmup_iters + 1)


def load_schedule(scheduler: Any, saved: Mapping[str, Any], name: str, lr_flag: str,
                  config: TrainerConfig, total_steps: int | None) -> None:
    """Restores a learning-rate schedule from a checkpoint and fits it to this run.

    The checkpoint gives the position (its step count: no second warm-up) and the shape
    (peak and floor lr, warm-up, decay style: Megatron's
    ``use_checkpoint_opt_param_scheduler``); a flag that differs from it is warned about,
    not silently dropped. The decay span is this run's: ``--lr-decay-iters`` when given,
    else ``total_steps`` (``--num-rollout`` x ``--num-steps-per-rollout``), so continuing
    with a larger ``--num-rollout`` stretches the decay over the new total instead of
    training the added rollouts at the old schedule's floor. With ``total_steps`` unknown
    and no ``--lr-decay-iters`` the checkpoint's span is kept.

    Args:
        scheduler: The ``OptimizerParamScheduler`` built from this run's flags.
        saved: Its state in the checkpoint.
        name: ``"policy"`` or ``"critic"``, for the messages.
        lr_flag: The flag of its peak learning rate (``--lr`` or ``--critic-lr``).
        config: The run's trainer flags.
        total_steps: Optimizer steps of the whole run (``None``: unknown).

    Raises:
        ConfigError: Every optimizer step left in the run would train at lr 0 (the decay
            ends at or before the checkpoint's step and the floor is 0); names the flags.
    """
    c = config
    flags = {lr_flag: scheduler.max_lr, "--min-lr": scheduler.min_lr,
             "--lr-warmup-iters": scheduler.lr_warmup_steps,
             "--lr-decay-style": scheduler.lr_decay_style}
    scheduler.load_state_dict(dict(saved))
    kept = {lr_flag: scheduler.max_lr, "--min-lr": scheduler.min_lr,
            "--lr-warmup-iters": scheduler.lr_warmup_steps,
            "--lr-decay-style": scheduler.lr_decay_style}
    changed = [f"{flag} {flags[flag]} (checkpoint: {kept[flag]})"
               for flag in flags if flags[flag] != kept[flag]]
    rank0 = global_rank() == 0
    if changed and rank0:
        print(f"WARNING: the checkpoint's {name} lr schedule is kept, so these flags have no "
              f"effect on this resumed run: {', '.join(changed)}", file=sys.stderr, flush=True)
    at = scheduler.num_steps
    old = scheduler.lr_decay_steps
    if c.lr_decay_iters is not None or total_steps is not None:
        new = max(decay_steps(config, total_steps), scheduler.lr_warmup_steps + 1)
        if new != old:
            scheduler.lr_decay_steps = new
            scheduler.step(increment=0)  # the param groups' lr at the kept step, new span
            if scheduler.lr_decay_style != "constant" and rank0:
                source = (f"--lr-decay-iters {c.lr_decay_iters}" if c.lr_decay_iters
                          else "--num-rollout x --num-steps-per-rollout")
                print(f"{name} lr schedule {'extended' if new > old else 'shortened'} to "
                      f"this run: decay over {old} -> {new} optimizer steps ({source}); "
                      f"resuming at step {at}, lr {lr_of(scheduler):.4g}", flush=True)
    left = (total_steps or 0) - at
    # Past the warm-up every decay style only goes down, so lr 0 now is lr 0 to the end.
    if (left > 0 and scheduler.lr_decay_style != "constant"
            and at > scheduler.lr_warmup_steps and lr_of(scheduler) <= 0.0):
        raise ConfigError(
            f"the resumed {name} lr schedule decays to 0 at step {scheduler.lr_decay_steps} "
            f"(--lr-decay-iters {c.lr_decay_iters}, --lr-decay-style "
            f"{scheduler.lr_decay_style}, --min-lr {scheduler.min_lr}) but the checkpoint "
            f"is at step {at}: all {left} optimizer steps left would train at lr 0. Raise "
            f"--lr-decay-iters above {at}, or drop it so the decay spans --num-rollout x "
            f"--num-steps-per-rollout ({total_steps})")


def global_rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def lr_of(scheduler: Any) -> float:
    """The learning rate the scheduler set for the next optimizer step (its largest group's)."""
    return max(float(group["lr"]) for group in scheduler.optimizer.param_groups)
