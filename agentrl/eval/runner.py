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

Envs: an eval set's env comes from :class:`EvalEnvs`, one factory per distinct env, made on first
use and reused by every evaluation of the run; all of them share one set of sandbox pools and
one MCP pool: the run's (``--env``'s factory, which the run closes), or, when the run has no
``--env``, those of the first eval env's factory, made and closed by :meth:`EvalEnvs.aclose`. A
run that evaluates more than once makes one :class:`EvalEnvs` and closes it at its end; without
one, each evaluation makes its own and closes it when it ends.
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
from agentrl.records.sample import Sample
from agentrl.rollout.build import env_factory, eval_context
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.data import RolloutDataSource
from agentrl.rollout.episode import RolloutContext
from agentrl.rollout.runner import RolloutRunner

__all__ = ["DEFAULT_SEED_PROMPTS", "EvalEnvs", "EvalSet", "eval_sets", "evaluate_sets",
           "run_evaluation", "write_episodes"]

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


class EvalEnvs:
    """The env factories of a run's eval sets: one per eval env, made on first use and reused
    by every evaluation; they share the sandbox pools and MCP pool of one factory (see the
    module docstring).

    ``async with EvalEnvs(...)`` closes it on the way out, or pass :meth:`aclose` to whatever
    closes the run's other resources (``train.py``'s exit stack).

    Args:
        config: The run's rollout flags (``--max-turns`` and the tool-call format reach every
            eval env; ``--env-kwarg`` only envs of ``--env``'s id).
        envs: The run's env factory (``--env``); ``None`` for single-turn training prompts.
    """

    def __init__(self, config: RolloutConfig, envs: EnvFactory | None) -> None:
        self.config = config
        self.envs = envs
        self._owned: EnvFactory | None = None  # made here: its pools are closed here
        self._factories: dict[str, EnvFactory] = {}

    def factory(self, env_id: str | None) -> EnvFactory | None:
        """The factory of ``env_id`` (the same one at every call), or the run's when ``None``
        (an eval set of single-turn prompts, or of prompts played in ``--env``)."""
        if env_id is None:
            return self.envs
        factory = self._factories.get(env_id)
        if factory is None:
            root = self.envs or self._owned
            if root is not None:
                factory = root.for_env(env_id)  # the run's settings, its pools
            else:
                factory = env_factory(dataclasses.replace(self.config, env=env_id, env_kwarg=[]))
                self._owned = factory
            assert factory is not None
            self._factories[env_id] = factory
        return factory

    async def aclose(self) -> None:
        """Closes the sandbox pools and MCP servers of the factory made here (none when the run
        has ``--env``: its factory's are the run's to close). Idempotent; a later
        :meth:`factory` makes new ones."""
        owned, self._owned = self._owned, None
        self._factories.clear()
        if owned is not None:
            await owned.aclose()

    async def __aenter__(self) -> EvalEnvs:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _source(config: RolloutConfig, eval_set: EvalSet, envs: EnvFactory | None) -> RolloutDataSource:
    source_config = dataclasses.replace(
        config, prompt_data=eval_set.prompt_data, env=eval_set.env, rollout_shuffle=False,
        streaming_data=False, rollout_max_prompts=None,  # eval sets have --eval-max-prompts
        n_samples_per_prompt=config.n_samples_per_eval_prompt, data_source_path=None)
    return RolloutDataSource(source_config, envs=envs, split=eval_set.split)


async def evaluate_sets(ctx: RolloutContext, sets: Sequence[EvalSet], label: str,
                        envs: EvalEnvs | None = None
                        ) -> dict[str, tuple[dict[str, Any], list[list[Sample]]]]:
    """Plays every set once.

    Args:
        ctx: The rollout context (its engine or scripted turns, env factory, config).
        sets: The eval sets.
        label: Prefix of the episodes' request ids (``eval3`` for the evaluation before
            rollout 3).
        envs: The run's eval envs, made from ``ctx``'s config and env factory (left open);
            ``None``: made for this call and closed when it ends.

    Returns:
        ``{set name: (metrics, groups)}``; metrics as :func:`~agentrl.eval.metrics.summarize`
        plus ``wall_s`` and ``skipped_rows``.
    """
    if envs is None:
        async with EvalEnvs(ctx.config, ctx.envs) as own:
            return await evaluate_sets(ctx, sets, label, own)
    config = ctx.config
    results: dict[str, tuple[dict[str, Any], list[list[Sample]]]] = {}
    for eval_set in sets:
        factory = envs.factory(eval_set.env)
        source = _source(config, eval_set, factory)
        try:
            n_prompts = len(source)
        except TypeError:
            n_prompts = DEFAULT_SEED_PROMPTS
        if config.eval_max_prompts is not None:
            n_prompts = min(n_prompts, config.eval_max_prompts)
        ectx = dataclasses.replace(eval_context(ctx), envs=factory)
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


async def run_evaluation(ctx: RolloutContext, step: int, envs: EvalEnvs | None = None
                         ) -> dict[str, Any]:
    """``train.py``'s evaluation before rollout ``step``: every ``--eval-*`` set once.

    Args:
        ctx: The run's rollout context.
        step: The rollout it comes before.
        envs: The run's eval envs (one for all its evaluations, closed at its end); ``None``:
            made for this evaluation and closed when it ends.

    Returns:
        ``{"step": step, "sets": {name: metrics}}`` (what ``RunLog.eval`` records).
    """
    results = await evaluate_sets(ctx, eval_sets(ctx.config), f"eval{step}", envs)
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
                for key in ("agent_metrics", "gateway", "segments"):  # a black-box agent's episode
                    if key in meta:
                        record[key] = meta[key]
                if s.tokens:  # a model played it: the token stream, as a trajectory file has it
                    record["trajectory"] = {
                        "tokens": s.tokens, "response_length": s.response_length,
                        "loss_mask": s.loss_mask, "rollout_log_probs": s.rollout_log_probs,
                        "token_versions": s.token_versions,
                        "turns": [dataclasses.asdict(t) for t in s.turns]}
                f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
