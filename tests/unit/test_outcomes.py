"""One way to count success and reward: the rollout's metrics, the evaluation's summary and the
progress bar agree on the same samples (hand-made)."""

from __future__ import annotations

import collections

import pytest

from agentrl.eval.metrics import summarize
from agentrl.records.sample import Sample, Status
from agentrl.rollout.outcomes import outcome_metrics, succeeded
from agentrl.rollout.runner import batch_metrics
from agentrl.run.progress import RunProgress

pytestmark = pytest.mark.unit


def group() -> list[Sample]:
    return [Sample(group_id=0, index=0, reward=1.0, status=Status.COMPLETED),
            Sample(group_id=0, index=1, reward=0.5, status=Status.TRUNCATED),
            Sample(group_id=0, index=2, reward=None, status=Status.FAILED),  # crashed: reward 0
            Sample(group_id=0, index=3, reward=1.0, status=Status.FAILED)]  # a failure never succeeds


def test_success_and_reward_are_counted_over_every_sample():
    samples = group()
    assert [succeeded(s) for s in samples] == [True, False, False, False]
    outcome = outcome_metrics(samples)
    assert outcome["success_rate"] == 0.25 and outcome["mean_reward"] == pytest.approx(2.5 / 4)
    assert outcome["statuses"] == {"completed": 1, "failed": 2, "truncated": 1}


def test_the_rollout_the_evaluation_and_the_progress_bar_agree():
    samples = group()
    rollout = batch_metrics([samples], collections.Counter(), submitted=1, wall_s=1.0)
    evaluation = summarize([samples])
    progress = RunProgress(1, 4, 1, enabled=False)
    progress.group_done(samples)
    assert rollout["rollout/success_rate"] == evaluation["success_rate"] == progress.success_rate == 0.25
    assert rollout["rollout/reward_mean"] == evaluation["mean_reward"] == pytest.approx(0.625)
    assert rollout["rollout/failed"] == evaluation["failed"] == 2
