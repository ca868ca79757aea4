"""Environments: the ``ToolEnv`` contract, the registry and the checker.

Imports neither Ray, Megatron nor SGLang.
"""

from agentrl.env.checker import CHECKS, check_env
from agentrl.env.core import Action, EpisodeState, ToolEnv
from agentrl.env.messages import AssistantTurn, Message, MessageList, message_problem
from agentrl.env.registry import (
    EnvSpec,
    env_spec,
    list_envs,
    load_builtin_envs,
    make_env,
    register_env,
)
from agentrl.env.sandboxed import SandboxedToolEnv, register_episode_resource, shared_pool

__all__ = [
    "CHECKS",
    "Action",
    "AssistantTurn",
    "EnvSpec",
    "EpisodeState",
    "Message",
    "MessageList",
    "SandboxedToolEnv",
    "ToolEnv",
    "check_env",
    "env_spec",
    "list_envs",
    "load_builtin_envs",
    "make_env",
    "message_problem",
    "register_env",
    "register_episode_resource",
    "shared_pool",
]
