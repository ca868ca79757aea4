"""agentrl: train LLM agents with reinforcement learning on multi-turn, tool-using tasks.

The public surface users write code against:

* :class:`ToolEnv`, :class:`EpisodeState` - the environment contract.
* :func:`tool`, :class:`Tool` - typed Python functions as tools.
* :func:`register_env`, :func:`make_env`, :func:`check_env`, :func:`list_envs` - the registry.
* :class:`Sample`, :class:`Status` - the trajectory record every stage exchanges.
"""

from agentrl import errors
from agentrl.env import (
    EpisodeState,
    SandboxedToolEnv,
    ToolEnv,
    check_env,
    env_spec,
    list_envs,
    make_env,
    register_env,
)
from agentrl.rollout import Sample, Status
from agentrl.tools import Injected, Tool, ToolCall, tool

__version__ = "0.1.0"

__all__ = [
    "EpisodeState",
    "Injected",
    "Sample",
    "SandboxedToolEnv",
    "Status",
    "Tool",
    "ToolCall",
    "ToolEnv",
    "__version__",
    "check_env",
    "env_spec",
    "errors",
    "list_envs",
    "make_env",
    "register_env",
    "tool",
]
