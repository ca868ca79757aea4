"""Eval rollouts: named prompt sets (``--eval-prompt-data NAME PATH``) and env test splits
(``--eval-env ID``), ``--n-samples-per-eval-prompt`` samples each, scored with pass@1 and the
unbiased pass@k.

A sample counts as a success when its reward is 1 (binary-reward tasks); ``mean_reward`` is
reported as well for graded rewards.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import statistics
import time
from pathlib import Path
from typing import Any

from agentrl.env import make_env
from agentrl.eval.metrics import SUCCESS_REWARD, pass_at_k
from agentrl.rollout.build import eval_context
from agentrl.rollout.data import RolloutDataSource
from agentrl.rollout.episode import RolloutContext
from agentrl.rollout.runner import RolloutRunner
from agentrl.rollout.sample import Sample

__all__ = ["EvalSet", "eval_sets_from_args", "run_evaluation", "summarize", "write_eval_results"]

DEFAULT_SEED_PROMPTS = 100
"""Prompts of an eval env that has no test split (it is evaluated on seeds 0..N-1)."""


@dataclasses.dataclass
class EvalSet:
    """One named eval set: where its prompts come from and which env plays them."""

    name: str
    prompt_data: str | None
    env: str | None


def eval_sets_from_args(args: Any) -> list[EvalSet]:
    """``--eval-prompt-data`` sets (played in ``--env``) then ``--eval-env`` test splits."""
    sets = [EvalSet(name, path, args.env) for name, path in args.eval_prompt_data]
    sets += [EvalSet(env_id, None, env_id) for env_id in args.eval_env]
    return sets


def _source(args: Any, eval_set: EvalSet) -> RolloutDataSource:
    values = dataclasses.asdict(args) if dataclasses.is_dataclass(args) else dict(vars(args))
    namespace = argparse.Namespace(**values)
    namespace.prompt_data = eval_set.prompt_data
    namespace.env = eval_set.env
    namespace.env_split = "test"
    namespace.rollout_shuffle = False
    namespace.streaming_data = False
    namespace.n_samples_per_prompt = args.n_samples_per_eval_prompt
    return RolloutDataSource(namespace)


async def run_evaluation(ctx: RolloutContext, step: int, runner_kwargs: dict[str, Any] | None = None
                         ) -> dict[str, Any]:  # fmt: skip
    """Plays every eval set once and returns ``{"step", "sets": {name: metrics}}``."""
    args = ctx.args
    results: dict[str, Any] = {}
    for eval_set in eval_sets_from_args(args):
        source = _source(args, eval_set)
        try:
            n_prompts = len(source)
        except TypeError:
            n_prompts = DEFAULT_SEED_PROMPTS
        if args.eval_max_prompts is not None:
            n_prompts = min(n_prompts, args.eval_max_prompts)
        ectx = eval_context(ctx)
        if eval_set.env != args.env:
            kwargs = {"tool_call_format": args.tool_call_format}
            ectx = dataclasses.replace(ectx, env_factory=functools.partial(make_env, eval_set.env, **kwargs))
        runner = RolloutRunner(ectx, source, evaluation=True, **(runner_kwargs or {}))
        started = time.perf_counter()
        batch = await runner.generate(f"eval{step}-{eval_set.name}", num_groups=n_prompts,
                                      submit_size=n_prompts)  # fmt: skip
        await runner.close()
        metrics = summarize(batch.groups)
        metrics["wall_s"] = time.perf_counter() - started
        metrics["skipped_rows"] = source.num_skipped_rows
        results[eval_set.name] = metrics
    return {"step": step, "sets": results}


def summarize(groups: list[list[Sample]]) -> dict[str, Any]:
    """pass@1, unbiased pass@k (k = 1, 2, 4, ... up to the samples per prompt), mean reward."""
    samples = [s for g in groups for s in g]
    n = min((len(g) for g in groups), default=0)
    out: dict[str, Any] = {
        "n_prompts": len(groups),
        "n_samples": len(samples),
        "mean_reward": statistics.fmean(s.reward or 0.0 for s in samples) if samples else 0.0,
        "statuses": dict(collections.Counter(s.status.value for s in samples)),
        "mean_response_len": statistics.fmean(s.response_length for s in samples) if samples else 0.0,
    }
    ks = sorted({k for k in (1, 2, 4, 8, 16, 32, 64, 128, n) if 1 <= k <= n})
    for k in ks:
        scores = []
        for group in groups:
            successes = sum(1 for s in group if (s.reward or 0.0) >= SUCCESS_REWARD)
            scores.append(pass_at_k(len(group), successes, k))
        out[f"pass@{k}"] = statistics.fmean(scores) if scores else 0.0
    return out


def write_eval_results(path: str | Path, result: dict[str, Any]) -> None:
    """Appends one step's results as a JSON line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(result) + "\n")
