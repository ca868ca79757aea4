"""``agentrl eval``: evaluate a policy on an env's tasks (or any eval set) from the command line.

Its flags are ``train.py``'s rollout flags (the same :class:`~agentrl.rollout.RolloutConfig`,
the same names), plus :class:`EvalConfig`; a few have short aliases (``--limit`` for
``--eval-max-prompts``, ``--n-samples`` for ``--n-samples-per-eval-prompt``, ...). What it
runs is :func:`agentrl.eval.runner.evaluate_sets`, the evaluation ``train.py`` runs.

    agentrl eval --env calc --policy oracle --limit 20
    agentrl eval --env calc --policy model --hf-checkpoint DIR --n-samples 4 --output out.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

from agentrl.config import add_arguments, from_namespace, option
from agentrl.errors import ConfigError
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.sample import Sample

__all__ = ["EvalConfig", "add_eval_arguments", "evaluate", "format_table", "parse_eval_config", "run_eval"]

POLICIES = ("oracle", "null", "model")

ALIASES = {
    "eval_max_prompts": ["--limit"],
    "n_samples_per_eval_prompt": ["--n-samples"],
    "eval_temperature": ["--temperature"],
    "rollout_max_response_len": ["--max-response-len"],
    "rollout_max_context_len": ["--max-context-len"],
    "rollout_concurrency": ["--concurrency"],
}
"""``agentrl eval``'s short flags, each another name of a ``train.py`` flag."""


@dataclasses.dataclass
class EvalConfig:
    """The flags only ``agentrl eval`` has."""

    policy: str = option("oracle", "who plays: the env's scripted expert (oracle), a policy "
                         "that does no work (null), or a language model served by the embedded "
                         "engine (model: --hf-checkpoint, default the built-in tiny model)",
                         choices=POLICIES)
    split: str = option("test", "the task split of --env evaluated when no --eval-prompt-data "
                        "or --eval-env set is given")
    output: str | None = option(None, "summary JSON path; the episodes go beside it as "
                                "<stem>.episodes.jsonl")

    def validate(self) -> None:
        """Raises ConfigError naming the flag: an unknown policy, an unwritable output."""
        if self.policy not in POLICIES:
            raise ConfigError(f"--policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.output is not None:
            path = Path(self.output)
            try:  # fail now, not after the episodes have run
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            except OSError as exc:
                raise ConfigError(f"--output {self.output!r} cannot be written ({exc.strerror}): "
                                  "choose a writable path") from exc


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """``agentrl eval``'s flags: :class:`RolloutConfig`'s (with :data:`ALIASES`) and
    :class:`EvalConfig`'s."""
    add_arguments(parser, EvalConfig, "eval")
    add_arguments(parser, RolloutConfig, "rollout (the same flags as train.py's)", aliases=ALIASES)


def parse_eval_config(namespace: argparse.Namespace) -> tuple[RolloutConfig, EvalConfig]:
    """The validated configs of a parsed ``agentrl eval`` command line.

    Raises:
        ConfigError: A flag value is invalid (the message names it).
    """
    evaluation = from_namespace(EvalConfig, namespace)
    if vars(namespace).get("env") is None:
        raise ConfigError("--env is required: the env whose tasks are evaluated")
    rollout = from_namespace(RolloutConfig, namespace)
    return rollout, evaluation


async def evaluate(rollout: RolloutConfig, evaluation: EvalConfig
                   ) -> tuple[dict[str, Any], dict[str, list[list[Sample]]]]:
    """Evaluates ``evaluation.policy`` on the eval sets of ``rollout`` (default: ``--env``'s
    ``--split``).

    Returns:
        ``(summary, groups)``: the summary ``{"env", "policy", "split", "sets": {name:
        metrics}}`` (what ``--output`` holds) and each set's played groups of samples.
    """
    from agentrl.eval.runner import EvalSet, eval_sets
    from agentrl.orchestration.interrupts import StopOnSignals
    from agentrl.rollout.build import env_factory

    envs = env_factory(rollout)
    assert envs is not None
    sets = eval_sets(rollout) or [EvalSet(str(rollout.env), None, rollout.env, evaluation.split)]
    stop = StopOnSignals(describe=lambda: f"the evaluation of {evaluation.policy}",
                         advice=lambda: "nothing was written (results are written when every set "
                         "is done); run the command again")
    with stop:  # Ctrl-C / SIGTERM: episodes, sandboxes and the engine are closed, then one line
        results = await _play_sets(rollout, evaluation, envs, sets)
    summary = {"env": rollout.env, "policy": results[1], "split": evaluation.split,
               "sets": {name: metrics for name, (metrics, _) in results[0].items()}}
    return summary, {name: groups for name, (_, groups) in results[0].items()}


async def _play_sets(rollout: RolloutConfig, evaluation: EvalConfig, envs: Any, sets: list[Any]
                     ) -> tuple[dict[str, tuple[dict[str, Any], list[list[Sample]]]], str]:
    """Plays ``sets`` with the policy; returns each set's (metrics, groups) and the policy's
    label. Closes the engine and the envs' sandboxes however it ends."""
    from agentrl.eval.runner import evaluate_sets
    from agentrl.rollout.build import load_policy_engine, make_rollout_context, scripted_context
    from agentrl.rollout.episode import SCRIPTED_POLICIES, ScriptedTurns

    engine = None
    try:
        if evaluation.policy == "model":
            engine = load_policy_engine(rollout)
            ctx = make_rollout_context(rollout, engine, envs)
            label = f"model:{rollout.hf_checkpoint or 'tiny'}"
        else:
            turns = ScriptedTurns(SCRIPTED_POLICIES[evaluation.policy], evaluation.policy)
            ctx = scripted_context(rollout, turns, envs)
            label = evaluation.policy
        return await evaluate_sets(ctx, sets, "eval"), label
    finally:
        if engine is not None:
            await engine.close()
        await envs.aclose()


def run_eval(namespace: argparse.Namespace) -> int:
    """Runs ``agentrl eval``; prints one table per set and writes ``--output``.

    Returns:
        0, or 1 when every episode of some set failed (the reasons are printed).

    Raises:
        AgentRLError: A bad flag, env, split or plug-in (printed by the CLI as one line).
    """
    from agentrl.eval.runner import write_episodes

    rollout, evaluation = parse_eval_config(namespace)
    summary, groups = asyncio.run(evaluate(rollout, evaluation))
    for name, metrics in summary["sets"].items():
        print(format_table(name, summary["policy"], metrics))
    if evaluation.output is not None:
        path = Path(evaluation.output)
        path.write_text(json.dumps(summary, indent=2) + "\n")
        episodes = path.with_name(path.stem + ".episodes.jsonl")
        write_episodes(episodes, [g for set_groups in groups.values() for g in set_groups])
        print(f"wrote {path} and {episodes}")
    broken = [name for name, m in summary["sets"].items() if m["n_samples"] and m["failed"] == m["n_samples"]]
    if broken:
        print(f"agentrl: every episode of {', '.join(broken)} failed; the reasons are listed above")
        return 1
    return 0


def format_table(name: str, policy: str, metrics: dict[str, Any]) -> str:
    """The human-readable summary of one eval set."""
    t = metrics["time_per_episode_s"]
    n_prompts = metrics["n_prompts"]
    per_prompt = metrics["n_samples"] // n_prompts if n_prompts else 0
    rows = [
        ("set / policy", f"{name} / {policy}"),
        ("episodes", f"{metrics['n_samples']} ({n_prompts} tasks x {per_prompt} samples)"),
        ("success rate", f"{metrics['success_rate']:.3f}"),
        ("mean reward", f"{metrics['mean_reward']:.3f}"),
        *((key, f"{value:.3f}") for key, value in metrics.items() if key.startswith("pass@")),
        ("statuses", ", ".join(f"{k}={v}" for k, v in metrics["statuses"].items()) or "none"),
        ("mean turns", f"{metrics['mean_turns']:.2f}"),
        ("tool calls", str(metrics["tool_calls"])),
        ("tool errors", ", ".join(f"{k}={v}" for k, v in metrics["tool_errors"].items()) or "none"),
        ("failed episodes", str(metrics["failed"])),
        *((f"  {count} x", reason) for reason, count in metrics["errors"].items()),
        ("time/episode (s)", f"policy {t['policy']:.3f}  tools {t['tools']:.3f}  "
                             f"grading {t['grading']:.3f}  total {t['total']:.3f}"),
        ("wall time (s)", f"{metrics['wall_s']:.1f}"),
    ]
    if metrics["skipped_rows"]:
        rows.append(("skipped rows", str(metrics["skipped_rows"])))
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key.ljust(width)}  {value}" for key, value in rows)
