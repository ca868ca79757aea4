"""Putting a rollout together from flags: the policy engine, the chat renderer, the context."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.env import make_env
from agentrl.errors import ConfigError
from agentrl.rollout.engine.base import Engine, SamplingParams
from agentrl.rollout.episode import RolloutContext

__all__ = ["load_policy_engine", "make_rollout_context", "sampling_from_args"]


def load_policy_engine(args: Any, **engine_kwargs: Any) -> Any:
    """The embedded engine serving ``--hf-checkpoint`` (default: the built-in tiny model)."""
    from agentrl.rollout.engine.embedded import EmbeddedEngine

    path = getattr(args, "hf_checkpoint", None)
    if path is None:
        from agentrl.models import build_tiny_model

        path = build_tiny_model()
    return EmbeddedEngine.from_pretrained(str(path), seed=getattr(args, "rollout_seed", 0),
                                          **engine_kwargs)  # fmt: skip


def sampling_from_args(args: Any, renderer: ChatRenderer, *, evaluation: bool = False) -> SamplingParams:
    """A turn's sampling parameters; the chat template's end-of-turn token always stops a turn."""
    temperature = args.rollout_temperature
    if evaluation and getattr(args, "eval_temperature", None) is not None:
        temperature = args.eval_temperature
    end_of_turn = renderer.encode(renderer.end_of_turn)
    return SamplingParams(
        max_new_tokens=args.rollout_max_response_len, temperature=temperature,
        top_p=args.rollout_top_p, top_k=args.rollout_top_k, stop=tuple(args.rollout_stop),
        stop_token_ids=tuple(dict.fromkeys([*end_of_turn, *args.rollout_stop_token_ids])),
    )  # fmt: skip


def make_rollout_context(
    args: Any, engine: Engine, tokenizer: Any, env_kwargs: Mapping[str, Any] | None = None
) -> RolloutContext:
    """The shared context of a run's episodes.

    The env is made with ``--env-kwarg`` pairs (``args.env_kwargs``), then ``env_kwargs``.
    Resolves ``--max-turns`` (the env's default when not given) onto ``args``, so plug-ins such
    as the brief's custom generate loop can read ``args.max_turns``; checks the chat template is
    token-exact with the env's tools (``ChatRenderer.self_check``).

    Raises:
        ConfigError: A flag value does not fit the model (context length).
        ChatTemplateError: The template is not prefix-stable or the tool-call format cannot read
            what it writes.
    """
    if tokenizer is None:
        raise ConfigError("--hf-checkpoint: the model directory has no tokenizer files")
    renderer = ChatRenderer(tokenizer, args.tool_call_format)
    factory = None
    tools = None
    if args.env is not None:
        kwargs = {**dict(getattr(args, "env_kwargs", None) or {}), **dict(env_kwargs or {}),
                  "tool_call_format": args.tool_call_format}  # fmt: skip
        if args.max_turns is not None:
            kwargs["max_turns"] = args.max_turns
        factory = functools.partial(make_env, args.env, **kwargs)
        probe = factory()
        tools = probe.toolbox.schemas or None
        if args.max_turns is None:
            args.max_turns = probe.max_turns
        probe.close()
    elif args.max_turns is None:
        args.max_turns = 1
    renderer.self_check(tools)
    engine_limit = getattr(engine, "max_context_len", None)
    limit = args.rollout_max_context_len or engine_limit
    if limit is None:
        raise ConfigError("--rollout-max-context-len is required: the engine reports no limit")
    if engine_limit is not None and limit > engine_limit:
        raise ConfigError(f"--rollout-max-context-len {limit} exceeds the model's context "
                          f"length {engine_limit}: lower it")
    return RolloutContext(args, engine, renderer, sampling_from_args(args, renderer), limit, factory,
                          seed=args.rollout_seed)  # fmt: skip


def eval_context(ctx: RolloutContext) -> RolloutContext:
    """``ctx`` with the eval sampling temperature (it shares the engine and stop flag)."""
    sampling = sampling_from_args(ctx.args, ctx.renderer, evaluation=True)
    return dataclasses.replace(ctx, sampling=sampling)
