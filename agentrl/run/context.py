"""The context every episode of a run shares, composed from the run's config, its engine and
its envs: the chat renderer (checked token-exact), the context length, the sampling parameters
and, when ``--agent-function-path`` / ``--agent-command`` is given, the black-box agent that plays
through a gateway. ``train.py`` and ``agentrl eval`` build theirs here."""

from __future__ import annotations

from agentrl.engine.base import Engine
from agentrl.env.factory import EnvFactory
from agentrl.errors import ConfigError
from agentrl.rollout.agents import AgentPlayer, load_agent
from agentrl.rollout.build import renderer_from_config, resolve, sampling_from_config
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.episode import Policy, RolloutContext

__all__ = ["make_rollout_context"]


def make_rollout_context(config: RolloutConfig, engine: Engine, envs: EnvFactory | None, *,
                         agent_model: Policy | None = None) -> RolloutContext:
    """The shared context of a run's episodes, played by ``engine``; with a black-box agent,
    ``agent_model`` (a scripted policy such as the env's oracle) may answer the agent instead of
    the engine's model (``agentrl eval --agent ... --policy oracle``).

    Checks that the chat template is token-exact with the env's tools
    (``ChatRenderer.self_check``) and that the context length fits the engine (and, with
    ``--overlong-prompts cut``, a response turn).

    Raises:
        ConfigError: The model has no tokenizer, or a flag value does not fit it (context).
        ChatTemplateError: The template is not prefix-stable or the tool-call format cannot read
            what it writes.
    """
    tokenizer = engine.tokenizer
    if tokenizer is None:
        raise ConfigError("--hf-checkpoint: the model directory has no tokenizer files")
    config = resolve(config, envs)
    renderer = renderer_from_config(config, tokenizer)
    renderer.self_check(list(envs.info.tool_schemas) or None if envs is not None else None)
    engine_limit = engine.max_context_len
    limit = config.rollout_max_context_len or engine_limit
    if limit is None:
        raise ConfigError("--rollout-max-context-len is required: the engine reports no limit")
    if engine_limit is not None and limit > engine_limit:
        raise ConfigError(f"--rollout-max-context-len {limit} exceeds the model's context "
                          f"length {engine_limit}: lower it")
    if config.overlong_prompts == "cut" and config.rollout_max_response_len >= limit:
        raise ConfigError(f"--overlong-prompts cut leaves room for one --rollout-max-response-len "
                          f"({config.rollout_max_response_len}) turn, which the context of {limit} "
                          "tokens cannot hold: lower it or pass --rollout-max-context-len")
    agents = None
    if config.has_agent:  # a black-box agent plays every episode, through a gateway
        agent = load_agent(config.agent_function_path, config.agent_command, config.agent_timeout,
                           on_host=config.agent_on_host)
        assert agent is not None
        agents = AgentPlayer(agent, config, engine, renderer, limit, model=agent_model)
    return RolloutContext(config, engine, renderer, sampling_from_config(config, renderer), limit,
                          envs, agents=agents)
