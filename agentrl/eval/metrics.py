"""Evaluation metrics: pass@k and the one summary of an evaluated set (:func:`summarize`)."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from typing import Any

from agentrl.records.sample import Sample, Status
from agentrl.rollout.outcomes import outcome_metrics, succeeded

USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")
"""The keys of a sample's ``metadata["usage"]`` and of the summary's ``usage``."""



def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate for one task: ``1 - C(n-c, k) / C(n, k)``.

    ``n`` samples were drawn for the task and ``c`` of them were correct; the result is the
    probability that at least one of ``k`` samples drawn without replacement from those ``n``
    is correct. Computed as the product ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``, which never
    forms the (huge) binomial coefficients and stays accurate for large ``n``.

    Args:
        n: Samples drawn for the task (>= 1).
        c: Correct samples among them (0 <= c <= n).
        k: Samples the metric is about (1 <= k <= n).

    Returns:
        A probability in [0, 1]: 0.0 when ``c == 0``, 1.0 when every draw of ``k`` samples
        must contain a correct one (``n - c < k``).

    Raises:
        ValueError: The counts are inconsistent (negative, ``c > n``, ``k`` outside 1..n).
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"pass_at_k: {name} must be an int, got {value!r}")
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    failure = 1.0
    for i in range(n - c + 1, n + 1):
        failure *= 1.0 - k / i
    return 1.0 - failure


PASS_K = (1, 2, 4, 5, 8, 10, 16, 32, 64, 100, 128)
"""The ``k`` of pass@k reported below the samples per prompt (``n`` itself is always added)."""


def pass_k_values(n: int) -> list[int]:
    """The ``k`` reported for ``n`` samples per prompt: :data:`PASS_K` up to ``n``, and ``n``."""
    return sorted({k for k in PASS_K if k <= n} | ({n} if n >= 1 else set()))


def summarize(groups: Sequence[Sequence[Sample]]) -> dict[str, Any]:
    """The metrics of one evaluated set, the same for ``train.py``'s evaluation and
    ``agentrl eval``.

    Args:
        groups: One list per prompt (task): its samples, sharing a group id.

    Returns:
        ``n_prompts``, ``n_samples``, ``success_rate`` (:func:`agentrl.rollout.outcomes.succeeded`),
        ``mean_reward``, ``pass@k`` for each ``k`` of :func:`pass_k_values` (``n`` = the fewest
        samples any prompt has; the unbiased estimate, averaged over prompts), ``statuses``
        (status -> count), ``truncated_by`` (what cut the truncated ones -> count: ``max_turns``,
        ``length`` for a reply at ``--rollout-max-response-len``, ``context``, ``agent_timeout``),
        ``failed`` (samples whose env, tool plumbing or policy crashed),
        ``errors`` (the first line of each failure's reason -> count), ``mean_turns``,
        ``mean_response_len`` (tokens), ``tool_calls``, ``tool_errors`` (kind -> count),
        ``time_per_episode_s`` (``policy``, ``tools``, ``grading`` and ``total`` seconds per
        episode; ``total`` from reset to the end, the rest inside it); and ``usage``, only
        when some sample has ``metadata["usage"]`` (episodes a policy server played, see
        :mod:`agentrl.eval.openai_policy`): ``prompt_tokens``, ``completion_tokens`` and
        ``total_tokens`` summed over those samples; ``gateway``, only when some samples are
        black-box agents' episodes: their sessions' ``segments``, ``rewrites`` and
        ``dropped_replies`` summed.
    """
    samples = [s for g in groups for s in g]
    count = len(samples) or 1

    def mean(values: Iterable[float]) -> float:
        return sum(values) / count

    errors: collections.Counter[str] = collections.Counter()
    for sample in samples:
        if sample.status is Status.FAILED:
            errors[str(sample.metadata.get("error", "unknown error")).splitlines()[0][:200]] += 1
    assistant = [t for s in samples for t in s.turns if t.role == "assistant"]
    outcome = outcome_metrics(samples)
    out: dict[str, Any] = {
        "n_prompts": len(groups),
        "n_samples": outcome["n_samples"],
        "success_rate": outcome["success_rate"],
        "mean_reward": outcome["mean_reward"],
    }
    n = min((len(g) for g in groups), default=0)
    for k in pass_k_values(n):
        scores = [pass_at_k(len(g), sum(succeeded(s) for s in g), k) for g in groups]
        out[f"pass@{k}"] = sum(scores) / len(scores)
    out.update({
        "statuses": outcome["statuses"],
        "truncated_by": dict(collections.Counter(str(s.metadata.get("finish")) for s in samples
                                                 if s.status is Status.TRUNCATED).most_common()),
        "failed": sum(s.status is Status.FAILED for s in samples),
        "errors": dict(errors.most_common(5)),
        "mean_turns": outcome["mean_turns"],
        "mean_response_len": outcome["mean_response_len"],
        "tool_calls": outcome["tool_calls"],
        "tool_errors": outcome["tool_errors"],
        **({"gateway": outcome["gateway"]} if "gateway" in outcome else {}),  # agents' sessions
        "time_per_episode_s": {
            "policy": mean(t.generate_s for t in assistant),
            "tools": mean(t.tools_s for t in assistant),
            "grading": mean(t.reward_s for t in assistant),
            "total": mean(s.metadata.get("episode_s", 0.0) for s in samples),
        },
    })
    usages = [s.metadata["usage"] for s in samples if "usage" in s.metadata]
    if usages:
        totals = {key: sum(int(u.get(key, 0)) for u in usages) for key in USAGE_KEYS[:2]}
        out["usage"] = {**totals, "total_tokens": sum(totals.values())}
    return out
