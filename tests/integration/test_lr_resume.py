"""A run continued with ``--load`` keeps an honest learning-rate schedule: a larger
``--num-rollout`` stretches the decay over the new total from the checkpoint's step (no second
warm-up), the same one resumes it exactly, and a schedule that would train every step left at lr
0 is refused. Tiny CPU actors on hand-made samples: each test takes seconds."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from agentrl.models import build_tiny_model
from agentrl.records.sample import Sample, Status
from agentrl.trainer.actor import MegatronActor
from agentrl.trainer.config import TrainerConfig

LR = 1e-3
STEPS_PER_ROLLOUT = 2
SCHEDULE = {"lr": LR, "min_lr": 0.0, "lr_decay_style": "cosine", "lr_warmup_iters": 1,
            "num_steps_per_rollout": STEPS_PER_ROLLOUT, "global_batch_size": 2}


def samples() -> list[Sample]:
    """One rollout: 2 groups of 2 short samples, rewards spread inside each group."""
    return [Sample(group_id=g, index=i, tokens=[5, 6, 7, 8, 9, 10], response_length=3,
                   loss_mask=[1, 1, 1], rollout_log_probs=[-1.0] * 3, reward=float(i),
                   status=Status.COMPLETED)
            for g in range(2) for i in range(2)]


def actor(num_rollout: int, **flags: object) -> MegatronActor:
    """The actor ``train.py --num-rollout num_rollout`` builds (``total_steps`` as serving.py)."""
    return MegatronActor(TrainerConfig(**{**SCHEDULE, **flags}), hf_checkpoint=build_tiny_model(),
                         total_steps=num_rollout * STEPS_PER_ROLLOUT)


def next_lr(scheduler: object) -> float:
    """The learning rate the scheduler set for the next optimizer step."""
    return float(scheduler.optimizer.param_groups[0]["lr"])  # type: ignore[attr-defined]


def cosine(step: int, decay_steps: int, warmup: int = 1, lr: float = LR) -> float:
    """Megatron's cosine decay after the linear warm-up (min lr 0)."""
    return lr * 0.5 * (math.cos(math.pi * (step - warmup) / (decay_steps - warmup)) + 1.0)


def finished_run(tmp_path: Path, num_rollout: int, **flags: object) -> Path:
    """Trains ``num_rollout`` rollouts and checkpoints the end, as train.py does."""
    first = actor(num_rollout, **flags)
    for _ in range(num_rollout):
        first.train(samples())
    first.save_checkpoint(tmp_path / "ckpt", extra={"next_rollout": num_rollout})
    return tmp_path / "ckpt"


def test_resume_with_larger_num_rollout_extends_cosine_schedule(tmp_path, capsys):
    ckpt = finished_run(tmp_path, num_rollout=1)  # 2 steps: the decay ended there, lr 0
    resumed = actor(num_rollout=2)
    assert resumed.load_checkpoint(ckpt) == {"next_rollout": 1}
    assert resumed.step == resumed.scheduler.num_steps == 2  # position kept: no second warm-up
    assert resumed.scheduler.lr_decay_steps == 4
    # step 2 of a cosine over 4 steps after 1 warm-up step: 0.5 * (cos(pi / 3) + 1) = 0.75
    assert next_lr(resumed.scheduler) == pytest.approx(0.75 * LR, rel=1e-9)
    assert next_lr(resumed.scheduler) == pytest.approx(cosine(2, 4), rel=1e-9)
    assert "policy lr schedule extended to this run: decay over 2 -> 4" in capsys.readouterr().out
    resumed.train(samples())  # steps 3 and 4 follow the extended cosine to its end
    assert resumed.scheduler.num_steps == 4 and next_lr(resumed.scheduler) == pytest.approx(0.0)


def test_resume_with_larger_num_rollout_extends_the_critic_schedule_too(tmp_path):
    ckpt = finished_run(tmp_path, num_rollout=1, advantage_estimator="ppo", critic_lr=2 * LR)
    resumed = actor(num_rollout=2, advantage_estimator="ppo", critic_lr=2 * LR)
    resumed.load_checkpoint(ckpt)
    assert resumed.critic_scheduler.lr_decay_steps == 4
    assert next_lr(resumed.critic_scheduler) == pytest.approx(cosine(2, 4, lr=2 * LR), rel=1e-9)


def test_resume_with_same_num_rollout_keeps_schedule(tmp_path, capsys):
    first = actor(num_rollout=2)
    first.train(samples())
    first.save_checkpoint(tmp_path / "ckpt", extra={"next_rollout": 1})
    resumed = actor(num_rollout=2)
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.scheduler.state_dict() == first.scheduler.state_dict()
    assert next_lr(resumed.scheduler) == next_lr(first.scheduler) == pytest.approx(cosine(2, 4))
    printed = capsys.readouterr()
    assert "lr schedule" not in printed.out + printed.err
    resumed.train(samples())
    first.train(samples())
    assert resumed.scheduler.state_dict() == first.scheduler.state_dict()


def test_resume_past_an_explicit_lr_decay_iters_with_min_lr_0_is_refused(tmp_path):
    ckpt = finished_run(tmp_path, num_rollout=1, lr_decay_iters=2)
    with pytest.raises(ConfigError, match=r"--lr-decay-iters 2.*at step 2: all 2 optimizer "
                                          r"steps left would train at lr 0.*Raise --lr-decay-iters"):
        actor(num_rollout=2, lr_decay_iters=2).load_checkpoint(ckpt)
    # an explicit span past the checkpoint's step is kept as given
    resumed = actor(num_rollout=2, lr_decay_iters=3)
    resumed.load_checkpoint(ckpt)
    assert resumed.scheduler.lr_decay_steps == 3
    assert next_lr(resumed.scheduler) == pytest.approx(cosine(2, 3), rel=1e-9)


def test_resume_with_a_changed_lr_warns_that_the_checkpoint_schedule_is_kept(tmp_path, capsys):
    ckpt = finished_run(tmp_path, num_rollout=1)
    resumed = actor(num_rollout=2, lr=2 * LR)
    resumed.load_checkpoint(ckpt)
    assert resumed.scheduler.max_lr == LR
    assert f"--lr {2 * LR} (checkpoint: {LR})" in capsys.readouterr().err
