"""Evaluation: named eval sets played through the rollout's one episode loop, one summary.

``train.py`` (``--eval-prompt-data NAME PATH``, ``--eval-env ID``, every ``--eval-interval``
rollouts) and ``agentrl eval`` both call :func:`evaluate_sets`. An eval set is a prompt file
played in the run's env, or an env's task split; each prompt is played
``--n-samples-per-eval-prompt`` times (one group) and the groups are summarized by
:func:`agentrl.eval.metrics.summarize`: the same keys, the same pass@k, wherever it runs.

Seeds: an env without a task set is evaluated on seeds drawn for its eval split, which never
equal the seeds its training rollouts use (:func:`agentrl.rollout.data.env_seed`).

The policy is the context's turn source: the engine's sampled turns (training, ``agentrl eval
--policy model``), or a scripted policy (``--policy oracle`` / ``null``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.env.factory import EnvFactory
from agentrl.eval.metrics import summarize
from agentrl.rollout.build import env_factory, eval_context
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.data import RolloutDataSource
from agentrl.rollout.episode import RolloutContext
from agentrl.rollout.runner import RolloutRunner
from agentrl.rollout.sample import Sample

__all__ = ["DEFAULT_SEED_PROMPTS", "EvalSet", "eval_sets", "evaluate_sets", "run_evaluation",
           "write_episodes"]

DEFAULT_SEED_PROMPTS = 100
"""Prompts of an eval env that has no task set (it is evaluated on that many seeds)."""


@dataclasses.dataclass(frozen=True)
class EvalSet:
    """One named eval set.

    Attributes:
        name: Its name in results (``--eval-prompt-data NAME``, or the env id).
        prompt_data: A prompt file, played in ``env``; ``None``: the env's own tasks.
        env: The env that plays it (``None``: single-turn prompts).
        split: The env's task split (and seed salt) when ``prompt_data`` is ``None``.
    """

    name: str
    prompt_data: str | None
    env: str | None
    split: str = "test"


def eval_sets(config: RolloutConfig, split: str = "test") -> list[EvalSet]:
    """``--eval-prompt-data`` sets (played in ``--env``), then ``--eval-env`` task splits."""
    sets = [EvalSet(name, path, config.env) for name, path in config.eval_prompt_data]
    sets += [EvalSet(env_id, None, env_id, split) for env_id in config.eval_env]
    return sets


def _source(config: RolloutConfig, eval_set: EvalSet, envs: EnvFactory | None) -> RolloutDataSource:
    source_config = dataclasses.replace(
        config, prompt_data=eval_set.prompt_data, env=eval_set.env, rollout_shuffle=False,
        streaming_data=False, rollout_max_prompts=None,  # eval sets have --eval-max-prompts
        n_samples_per_prompt=config.n_samples_per_eval_prompt, data_source_path=None)
    return RolloutDataSource(source_config, envs=envs, split=eval_set.split)


async def evaluate_sets(ctx: RolloutContext, sets: Sequence[EvalSet], label: str
                        ) -> dict[str, tuple[dict[str, Any], list[list[Sample]]]]:
    """Plays every set once.

    Args:
        ctx: The rollout context (its engine or scripted turns, env factory, config).
        sets: The eval sets.
        label: Prefix of the episodes' request ids (``eval3`` for the evaluation before
            rollout 3).

    Returns:
        ``{set name: (metrics, groups)}``; metrics as :func:`~agentrl.eval.metrics.summarize`
        plus ``wall_s`` and ``skipped_rows``.
    """
    config = ctx.config
    results: dict[str, tuple[dict[str, Any], list[list[Sample]]]] = {}
    for eval_set in sets:
        envs = ctx.envs
        if eval_set.env is not None and envs is not None:
            envs = envs.for_env(eval_set.env)
        elif eval_set.env is not None:  # single-turn training prompts, an env's eval set
            envs = env_factory(dataclasses.replace(config, env=eval_set.env, env_kwarg=[]))
        source = _source(config, eval_set, envs)
        try:
            n_prompts = len(source)
        except TypeError:
            n_prompts = DEFAULT_SEED_PROMPTS
        if config.eval_max_prompts is not None:
            n_prompts = min(n_prompts, config.eval_max_prompts)
        ectx = dataclasses.replace(eval_context(ctx), envs=envs)
        runner = RolloutRunner.from_context(ectx, source, evaluation=True)
        started = time.perf_counter()
        try:
            batch = await runner.generate(f"{label}-{eval_set.name}", num_groups=n_prompts,
                                          submit_size=n_prompts)
        finally:
            await runner.close()
            source.close()
        metrics = summarize(batch.groups)
        metrics["wall_s"] = time.perf_counter() - started
        metrics["skipped_rows"] = source.num_skipped_rows
        results[eval_set.name] = (metrics, batch.groups)
    return results


async def run_evaluation(ctx: RolloutContext, step: int) -> dict[str, Any]:
    """``train.py``'s evaluation before rollout ``step``: every ``--eval-*`` set once.

    Returns:
        ``{"step": step, "sets": {name: metrics}}`` (what ``RunLog.eval`` records).
    """
    results = await evaluate_sets(ctx, eval_sets(ctx.config), f"eval{step}")
    return {"step": step, "sets": {name: metrics for name, (metrics, _) in results.items()}}


def write_episodes(path: str | Path, groups: Sequence[Sequence[Sample]]) -> None:
    """Writes one JSON object per evaluated sample: task id, group, sample, reward, status,
    finish, turns, tool calls and errors, the error of a failed one, the conversation (and
    which tool outputs the model saw cut), the grader's findings, the sandbox's command log,
    and, when a model played, its token stream (``trajectory``)."""
    with Path(path).open("w", encoding="utf-8") as f:
        for group in groups:
            for s in group:
                meta = s.metadata
                record = {
                    "task_id": meta.get("task_id"), "group_id": s.group_id, "sample": s.index,
                    "reward": s.reward, "status": s.status.value, "finish": meta.get("finish"),
                    "turns": meta.get("turns", 0), "seed": meta.get("seed"),
                    "tool_calls": [name for t in s.turns if t.role == "assistant"
                                   for name in t.tool_names],
                    "tool_errors": meta.get("tool_errors", {}), "error": meta.get("error"),
                    "tool_outputs_cut": meta.get("tool_outputs_cut", 0),
                    "response_length": s.response_length, "usage": meta.get("usage"),
                    "messages": meta.get("messages", []),
                    "cut_messages": meta.get("cut_messages", []),
                    "grade": meta.get("grade"), "commands": meta.get("commands", []),
                }
                if s.tokens:  # a model played it: the token stream, as a trajectory file has it
                    record["trajectory"] = {
                        "tokens": s.tokens, "response_length": s.response_length,
                        "loss_mask": s.loss_mask, "rollout_log_probs": s.rollout_log_probs,
                        "token_versions": s.token_versions,
                        "turns": [dataclasses.asdict(t) for t in s.turns]}
                f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
