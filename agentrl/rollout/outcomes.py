"""What a set of played samples achieved, computed one way for every reader: the rollout's
``rollout/...`` metrics, the evaluation's summary (``agentrl eval``, ``train.py --eval-*``),
the progress bar and the benchmarks all count success and reward with these functions."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from agentrl.env.rewards import SUCCESS_REWARD
from agentrl.records.sample import Sample, Status

__all__ = ["GATEWAY_FIGURES", "outcome_metrics", "succeeded"]

GATEWAY_FIGURES = ("segments", "rewrites", "dropped_replies")
"""What a black-box agent's session reports: segments started, of them by a rewritten history,
and replies the engine generated that are in no trained sample."""


def succeeded(sample: Sample) -> bool:
    """Whether ``sample`` solved its task: it did not fail and its reward reaches
    :data:`~agentrl.env.rewards.SUCCESS_REWARD`."""
    return sample.status is not Status.FAILED and (sample.reward or 0.0) >= SUCCESS_REWARD


def outcome_metrics(samples: Sequence[Sample]) -> dict[str, Any]:
    """The outcome of ``samples``, every figure over all of them (a sample without a reward,
    e.g. a failed one, counts as reward 0 and no success).

    Returns:
        ``n_samples``; ``success_rate`` (:func:`succeeded`); ``mean_reward``; ``statuses``
        (status -> count); ``mean_turns``; ``mean_response_len`` (tokens); ``tool_calls``
        (calls the assistant turns made); ``tool_errors`` (kind -> count). Means of no samples
        are 0. When some samples are black-box agents' episodes, also ``gateway``: their
        sessions' ``segments``, ``rewrites`` and ``dropped_replies`` summed (see
        :meth:`agentrl.gateway.Session.stats`).
    """
    count = len(samples) or 1
    tool_errors: collections.Counter[str] = collections.Counter()
    for sample in samples:
        tool_errors.update(sample.metadata.get("tool_errors", {}))
    sessions = [s.metadata["gateway"] for s in samples if "gateway" in s.metadata]
    gateway = ({key: sum(stats[key] for stats in sessions) for key in GATEWAY_FIGURES}
               if sessions else None)
    return {
        **({"gateway": gateway} if gateway is not None else {}),
        "n_samples": len(samples),
        "success_rate": sum(succeeded(s) for s in samples) / count,
        "mean_reward": sum(s.reward or 0.0 for s in samples) / count,
        "statuses": dict(sorted(collections.Counter(s.status.value for s in samples).items())),
        "mean_turns": sum(s.metadata.get("turns", 0) for s in samples) / count,
        "mean_response_len": sum(s.response_length for s in samples) / count,
        "tool_calls": sum(len(t.tool_names) for s in samples for t in s.turns if t.role == "assistant"),
        "tool_errors": dict(sorted(tool_errors.items())),
    }
