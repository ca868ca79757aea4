"""The parts of a rollout made from its config alone: the env factory, the policy engine, the
sampling parameters, a scripted policy's context and the eval context (the context of a run's
episodes, which may start a gateway for a black-box agent, is composed above:
:func:`agentrl.run.context.make_rollout_context`).

Imported on first use: the embedded engine (torch) and the tiny model's builder (``tokenizers``),
only when a run plays a model here.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentrl.chat import ChatRenderer
from agentrl.chat.templates import load_chat_template
from agentrl.engine.base import SamplingParams
from agentrl.env.factory import EnvFactory
from agentrl.models.tiny import build_tiny_model
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.episode import EngineTurns, RolloutContext, TurnSource
from agentrl.sandbox import SandboxPools

if TYPE_CHECKING:  # torch: only with the engine itself
    from agentrl.engine.embedded import EmbeddedEngine

__all__ = [
    "env_factory",
    "eval_context",
    "load_policy_engine",
    "policy_checkpoint",
    "resolve",
    "sampling_from_config",
    "scripted_context",
]

def env_factory(config: RolloutConfig, *, make_sandbox_pools: Callable[[], SandboxPools] = SandboxPools,
                sandbox_retries: int = 0) -> EnvFactory | None:
    """The run's env factory (``None`` without ``--env``): built once, used by the data source,
    the episodes and the evaluation.

    Args:
        config: The rollout flags.
        make_sandbox_pools: Makes the envs' sandbox pools (default: local sandboxes;
            ``--sandbox-placement ray`` passes remote ones, see
            :func:`agentrl.placement.sandbox_hosts.placed_env_factory`).
        sandbox_retries: How many times an episode whose sandbox was lost is played again.

    Raises:
        UnknownEnvError: ``--env`` names no registered env.
    """
    if config.env is None:
        return None
    return EnvFactory(config.env, env_kwargs=config.env_kwargs, max_turns=config.max_turns,
                      tool_call_format=config.tool_call_format, make_sandbox_pools=make_sandbox_pools,
                      sandbox_retries=sandbox_retries)


def resolve(config: RolloutConfig, envs: EnvFactory | None) -> RolloutConfig:
    """``config`` with ``max_turns`` resolved: ``--max-turns``, else the env's own turn limit,
    else 1 (single-turn prompts). A new object; ``config`` itself is not changed."""
    if config.max_turns is not None:
        return config
    return dataclasses.replace(config, max_turns=envs.info.max_turns if envs is not None else 1)


def policy_checkpoint(config: RolloutConfig) -> str:
    """The policy's Hugging Face directory: ``--hf-checkpoint``, else the random built-in tiny
    model (built on first use and cached). ``train.py`` and ``agentrl eval`` fill
    ``hf_checkpoint`` in with an env's shipped warm start first, where it has one
    (:mod:`agentrl.models.defaults`)."""
    if config.hf_checkpoint is not None:
        return config.hf_checkpoint

    return str(build_tiny_model())


def load_policy_engine(config: RolloutConfig, **engine_kwargs: Any) -> EmbeddedEngine:
    """The embedded engine serving :func:`policy_checkpoint`."""
    from agentrl.engine.embedded import EmbeddedEngine

    return EmbeddedEngine.from_pretrained(policy_checkpoint(config), seed=config.rollout_seed,
                                          **engine_kwargs)


def renderer_from_config(config: RolloutConfig, tokenizer: Any) -> ChatRenderer:
    """The chat renderer of ``tokenizer`` with ``--tool-call-format`` and ``--chat-template``
    (the model's own template when not given); not yet self-checked."""
    if config.chat_template is None:
        return ChatRenderer(tokenizer, config.tool_call_format)
    label, text = load_chat_template(config.chat_template)
    return ChatRenderer(tokenizer, config.tool_call_format, chat_template=text, template_name=label)


def sampling_from_config(config: RolloutConfig, renderer: ChatRenderer | None, *,
                         evaluation: bool = False) -> SamplingParams:
    """A turn's sampling parameters; the chat template's end-of-turn token always stops a turn
    (``--eval-temperature`` replaces the temperature of eval rollouts when given)."""
    temperature = config.rollout_temperature
    if evaluation and config.eval_temperature is not None:
        temperature = config.eval_temperature
    end_of_turn = renderer.encode(renderer.end_of_turn) if renderer is not None else []
    return SamplingParams(
        max_new_tokens=config.rollout_max_response_len, temperature=temperature,
        top_p=config.rollout_top_p, top_k=config.rollout_top_k, stop=tuple(config.rollout_stop),
        stop_token_ids=tuple(dict.fromkeys([*end_of_turn, *config.rollout_stop_token_ids])),
    )


def scripted_context(config: RolloutConfig, turns: TurnSource, envs: EnvFactory) -> RolloutContext:
    """A context whose turns come from a scripted policy and keep no tokens (no model)."""
    config = resolve(config, envs)
    limit = config.rollout_max_context_len or 1 << 30
    return RolloutContext(config, None, None, sampling_from_config(config, None), limit, envs,
                          turns=turns)


def eval_context(ctx: RolloutContext) -> RolloutContext:
    """``ctx`` for eval rollouts: the eval temperature, the same engine, and a stop flag of
    its own (an eval rollout that has enough groups stops its own episodes, not the training
    episodes an asynchronous run keeps playing meanwhile)."""
    if ctx.engine is None or ctx.renderer is None:
        return ctx
    sampling = sampling_from_config(ctx.config, ctx.renderer, evaluation=True)
    turns = ctx.turns
    if isinstance(turns, EngineTurns):
        turns = EngineTurns(ctx.engine, sampling, ctx.config.rollout_seed)
    return dataclasses.replace(ctx, sampling=sampling, turns=turns, stopping=threading.Event())
