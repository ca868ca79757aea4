"""Environments: the ``ToolEnv`` contract, the registry, the checker, and the ``EnvFactory`` a
run builds all its envs with.

Imports neither Ray, Megatron nor SGLang.
"""

from agentrl.env.checker import CHECKS, check_env
from agentrl.env.core import (
    Action,
    EpisodeState,
    StepTimings,
    ToolEnv,
    check_split,
    splits_of,
    task_set_of,
)
from agentrl.env.factory import EnvFactory, EnvInfo
from agentrl.env.messages import AssistantTurn, Message, MessageList, message_problem
from agentrl.env.registry import (
    EnvSpec,
    env_spec,
    import_env_module,
    list_envs,
    load_builtin_envs,
    make_env,
    register_env,
)
from agentrl.env.rewards import as_reward
from agentrl.env.sandboxed import SandboxedToolEnv, register_episode_resource
from agentrl.env.tasks import TaskFields

__all__ = [
    "CHECKS",
    "Action",
    "AssistantTurn",
    "EnvFactory",
    "EnvInfo",
    "EnvSpec",
    "EpisodeState",
    "Message",
    "MessageList",
    "SandboxedToolEnv",
    "StepTimings",
    "TaskFields",
    "ToolEnv",
    "as_reward",
    "check_env",
    "check_split",
    "splits_of",
    "task_set_of",
    "env_spec",
    "import_env_module",
    "list_envs",
    "load_builtin_envs",
    "make_env",
    "message_problem",
    "register_env",
    "register_episode_resource",
]
