"""``agentrl eval``: evaluate a policy on an env's tasks (or any eval set) from the command line.

Its flags are ``train.py``'s rollout flags (the same :class:`~agentrl.rollout.RolloutConfig`,
the same names), plus :class:`EvalConfig`; a few have short aliases (``--limit`` for
``--eval-max-prompts``, ``--n-samples`` for ``--n-samples-per-eval-prompt``, ...). What it
runs is :func:`agentrl.eval.runner.evaluate_sets`, the evaluation ``train.py`` runs.

    agentrl eval --env calc --policy oracle --limit 20
    agentrl eval --env calc --policy model --hf-checkpoint DIR --n-samples 4 --output out.json
    agentrl eval --env calc --policy openai --base-url http://127.0.0.1:8000/v1 --model NAME

``--policy openai`` plays any OpenAI-compatible chat server with its native tool calling
(:mod:`agentrl.eval.openai_policy`).

Imported on first use: the ``--policy openai`` client (aiohttp and its session), only when that
policy plays.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from agentrl._version import __version__
from agentrl.config import add_arguments, from_namespace, option
from agentrl.env import ToolEnv
from agentrl.errors import ConfigError
from agentrl.eval.runner import EvalSet, eval_sets, evaluate_sets, write_episodes
from agentrl.models.catalog import resolve_checkpoint
from agentrl.records.atif import write_atif
from agentrl.records.sample import Sample
from agentrl.rollout.build import env_factory, policy_checkpoint, scripted_context
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.episode import SCRIPTED_POLICIES, ScriptedTurns
from agentrl.run.assemble import eval_context
from agentrl.run.interrupts import StopOnSignals

if TYPE_CHECKING:  # aiohttp is imported only when the openai policy runs
    from agentrl.eval.openai_policy import OpenAITurns

__all__ = ["EvalConfig", "add_eval_arguments", "evaluate", "format_table", "openai_turns",
           "parse_eval_config", "run_eval"]

POLICIES = ("oracle", "null", "model", "openai")

ALIASES = {
    "eval_max_prompts": ["--limit"],
    "n_samples_per_eval_prompt": ["--n-samples"],
    "eval_temperature": ["--temperature"],
    "rollout_max_response_len": ["--max-response-len"],
    "rollout_max_context_len": ["--max-context-len"],
    "rollout_concurrency": ["--concurrency"],
    "agent_function_path": ["--agent"],
}
"""``agentrl eval``'s short flags, each another name of a ``train.py`` flag."""


@dataclasses.dataclass
class EvalConfig:
    """The flags only ``agentrl eval`` has."""

    policy: str = option("oracle", "who plays: the env's scripted expert (oracle), a policy "
                         "that does no work (null), or a language model served by the embedded "
                         "engine (model: --hf-checkpoint, default the embedded default, as "
                         "train.py's), or "
                         "an OpenAI-compatible chat server (openai: --base-url, --model)",
                         choices=POLICIES)
    split: str = option("test", "the task split of --env evaluated when no --eval-prompt-data "
                        "or --eval-env set is given")
    output: str | None = option(None, "summary JSON path; the episodes go beside it as "
                                "<stem>.episodes.jsonl")
    save_atif: bool = option(False, "with --output: also write each episode as an ATIF "
                             "trajectory (Harbor's trajectory format) in <stem>.atif/")
    base_url: str | None = option(None, "--policy openai: the server's API root, under which "
                                  "/chat/completions is, e.g. http://127.0.0.1:8000/v1")
    model: str | None = option(None, "--policy openai: the model name the server serves (its "
                               "/models lists them)")
    api_key_env: str = option("OPENAI_API_KEY", "--policy openai: the environment variable "
                              "holding the API key, sent as a bearer token; unset or empty: no "
                              "key is sent (local servers need none)")
    request_timeout: float = option(120.0, "--policy openai: seconds one request may take")
    max_retries: int = option(4, "--policy openai: retries of a request that failed with HTTP "
                              "429, 5xx, a timeout or a connection error (exponential backoff, "
                              "or the server's Retry-After)")

    def validate(self) -> None:
        """Raises ConfigError naming the flag: an unknown policy, an unwritable output,
        ``--policy openai`` without ``--base-url`` or ``--model``, a ``--base-url`` that is not
        http(s), a ``--request-timeout`` that is not positive, a negative ``--max-retries``."""
        if self.policy not in POLICIES:
            raise ConfigError(f"--policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.save_atif and self.output is None:
            raise ConfigError("--save-atif writes beside --output: give --output FILE.json")
        if self.policy == "openai":
            if not self.base_url:
                raise ConfigError("--policy openai needs --base-url: the server's API root, "
                                  "e.g. http://127.0.0.1:8000/v1")
            if not self.model:
                raise ConfigError("--policy openai needs --model: the model name the server "
                                  "serves (GET <base-url>/models lists them)")
        if self.base_url is not None:
            parts = urlsplit(self.base_url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ConfigError(f"--base-url must be an http:// or https:// URL, got "
                                  f"{self.base_url!r}")
        if not self.request_timeout > 0:
            raise ConfigError(f"--request-timeout must be > 0 seconds, got {self.request_timeout}")
        if self.max_retries < 0:
            raise ConfigError(f"--max-retries must be >= 0, got {self.max_retries}")
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
    if rollout.hf_checkpoint is not None:  # a named model or a GGUF file: fetched once
        rollout = dataclasses.replace(rollout, hf_checkpoint=resolve_checkpoint(rollout.hf_checkpoint))
    if rollout.rollout_backend != "embedded":
        if evaluation.policy != "model":
            raise ConfigError(f"--rollout-backend {rollout.rollout_backend} serves --policy model; "
                              f"--policy {evaluation.policy} uses no engine: drop one of them")
        if not rollout.rollout_engine_urls:
            raise ConfigError(f"agentrl eval --rollout-backend {rollout.rollout_backend} plays "
                              "against servers you started: give their --rollout-engine-urls "
                              "(train.py is what launches servers itself)")
    if rollout.has_agent and evaluation.policy == "openai":
        raise ConfigError("--agent / --agent-command play through agentrl's gateway against "
                          "--policy model (the --hf-checkpoint), oracle or null (the env's scripted "
                          "policies answer as the model); --policy openai is a server of its own: "
                          "point your agent at it directly")
    return rollout, evaluation


async def evaluate(rollout: RolloutConfig, evaluation: EvalConfig
                   ) -> tuple[dict[str, Any], dict[str, list[list[Sample]]]]:
    """Evaluates ``evaluation.policy`` on the eval sets of ``rollout`` (default: ``--env``'s
    ``--split``).

    Returns:
        ``(summary, groups)``: the summary ``{"env", "policy", "split", "sets": {name:
        metrics}}`` (what ``--output`` holds) and each set's played groups of samples.
    """
    envs = env_factory(rollout)
    assert envs is not None
    if evaluation.policy == "oracle":
        check_has_oracle(envs)
    sets = eval_sets(rollout) or [EvalSet(str(rollout.env), None, rollout.env, evaluation.split)]
    stop = StopOnSignals(describe=lambda: f"the evaluation of {evaluation.policy}",
                         advice=lambda: "nothing was written (results are written when every set "
                         "is done); run the command again")
    with stop:  # Ctrl-C / SIGTERM: episodes, sandboxes and the engine are closed, then one line
        results = await _play_sets(rollout, evaluation, envs, sets)
    summary = {"env": rollout.env, "policy": results[1], "split": evaluation.split,
               "sets": {name: metrics for name, (metrics, _) in results[0].items()}}
    return summary, {name: groups for name, (_, groups) in results[0].items()}


def check_has_oracle(envs: Any) -> None:
    """Refuses ``--policy oracle`` (the default) for an env without a scripted oracle, whose
    every episode would fail, naming the policies that can play it.

    Raises:
        ConfigError: The env does not override ``ToolEnv.oracle_action``.
    """
    probe = envs()
    try:
        if type(probe).oracle_action is ToolEnv.oracle_action:
            raise ConfigError(f"--policy oracle (the default) plays the env's scripted expert, and "
                              f"{type(probe).__name__} has none: pass --policy model (the embedded "
                              "default, or --hf-checkpoint), --policy openai --base-url URL --model "
                              "NAME (a chat server), or --policy null")
    finally:
        probe.close()


async def _play_sets(rollout: RolloutConfig, evaluation: EvalConfig, envs: Any, sets: list[Any]
                     ) -> tuple[dict[str, tuple[dict[str, Any], list[list[Sample]]]], str]:
    """Plays ``sets`` with the policy; returns each set's (metrics, groups) and the policy's
    label. Closes the engine and the envs' sandboxes however it ends."""
    async with contextlib.AsyncExitStack() as closing:
        closing.push_async_callback(envs.aclose)
        if evaluation.policy == "model" or rollout.has_agent:  # started as train.py starts it
            # (a scripted policy answering an agent still needs the model's tokenizer and template)
            scripted = SCRIPTED_POLICIES.get(evaluation.policy)
            ctx = await eval_context(rollout, envs, closing, agent_model=scripted)
            label = f"model:{rollout.hf_checkpoint or 'tiny'}"
            if rollout.rollout_backend != "embedded":
                label += f" on {rollout.rollout_backend} {','.join(rollout.rollout_engine_urls)}"
            if ctx.agents is not None:
                on = evaluation.policy if scripted is not None else label
                label = f"agent:{ctx.agents.name} on {on}"
        elif evaluation.policy == "openai":
            client = openai_turns(rollout, evaluation)
            closing.push_async_callback(client.close)
            ctx = scripted_context(rollout, client, envs)
            closing.push_async_callback(ctx.aclose)
            label = f"openai:{evaluation.model}"
        else:
            turns = ScriptedTurns(SCRIPTED_POLICIES[evaluation.policy], evaluation.policy)
            ctx = scripted_context(rollout, turns, envs)
            closing.push_async_callback(ctx.aclose)
            label = evaluation.policy
        return await evaluate_sets(ctx, sets, "eval"), label


def openai_turns(rollout: RolloutConfig, evaluation: EvalConfig) -> OpenAITurns:
    """The :class:`~agentrl.eval.openai_policy.OpenAITurns` of ``--policy openai``: the eval
    sampling flags (``--eval-temperature``, else ``--rollout-temperature``; ``--rollout-top-p``;
    ``--rollout-max-response-len`` as ``max_tokens``; ``--rollout-stop``), the key from the
    variable ``--api-key-env`` names (none when it is unset or empty)."""
    from agentrl.eval.openai_policy import OpenAITurns

    assert evaluation.base_url is not None and evaluation.model is not None  # validate() checked
    temperature = (rollout.eval_temperature if rollout.eval_temperature is not None
                   else rollout.rollout_temperature)
    return OpenAITurns(evaluation.base_url, evaluation.model,
                       api_key=os.environ.get(evaluation.api_key_env) or None,
                       temperature=temperature, top_p=rollout.rollout_top_p,
                       max_tokens=rollout.rollout_max_response_len, stop=rollout.rollout_stop,
                       request_timeout=evaluation.request_timeout,
                       max_retries=evaluation.max_retries)


def run_eval(namespace: argparse.Namespace) -> int:
    """Runs ``agentrl eval``; prints one table per set and writes ``--output``.

    Returns:
        0, or 1 when every episode of some set failed (the reasons are printed).

    Raises:
        AgentRLError: A bad flag, env, split or plug-in (printed by the CLI as one line).
    """
    rollout, evaluation = parse_eval_config(namespace)
    summary, groups = asyncio.run(evaluate(rollout, evaluation))
    for name, metrics in summary["sets"].items():
        print(format_table(name, summary["policy"], metrics))
    if evaluation.output is not None:
        if evaluation.policy == "model":  # its tokenizer shows the episodes' tokens in agentrl view
            summary["policy_dir"] = policy_checkpoint(rollout)
        path = Path(evaluation.output)
        path.write_text(json.dumps(summary, indent=2) + "\n")
        episodes = path.with_name(path.stem + ".episodes.jsonl")
        played = [g for set_groups in groups.values() for g in set_groups]
        write_episodes(episodes, played)
        print(f"wrote {path} and {episodes}")
        if evaluation.save_atif:
            atif = path.with_name(path.stem + ".atif")
            write_atif(atif, [s for group in played for s in group], agent_version=__version__,
                       model_name=summary["policy"], session_id=path.stem)
            print(f"wrote the episodes as ATIF trajectories in {atif}/")
        print(f"look at the episodes: agentrl view {path}")
    broken = [name for name, m in summary["sets"].items() if m["n_samples"] and m["failed"] == m["n_samples"]]
    if broken:
        print(f"agentrl: every episode of {', '.join(broken)} failed; the reasons are listed above")
        return 1
    return 0


TRUNCATIONS = {
    "max_turns": "the turn limit (--max-turns)",
    "length": "a reply at --rollout-max-response-len",
    "context": "the context (--rollout-max-context-len)",
    "agent_timeout": "--agent-timeout",
}
"""What each ``finish`` of a truncated episode means, for the eval table."""


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
        *((("  truncated by", ", ".join(f"{TRUNCATIONS.get(k, k)} {v}" for k, v in metrics["truncated_by"].items())),)
          if metrics.get("truncated_by") else ()),
        ("mean turns", f"{metrics['mean_turns']:.2f}"),
        ("tool calls", str(metrics["tool_calls"])),
        ("tool errors", ", ".join(f"{k}={v}" for k, v in metrics["tool_errors"].items()) or "none"),
        *_usage_rows(metrics),
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


def _usage_rows(metrics: dict[str, Any]) -> list[tuple[str, str]]:
    """The token-usage row of a policy server's episodes (none when no tokens were counted)."""
    usage = metrics.get("usage")
    if not usage or not usage["total_tokens"]:
        return []
    return [("tokens", f"prompt {usage['prompt_tokens']}  completion "
                       f"{usage['completion_tokens']}  total {usage['total_tokens']}")]
