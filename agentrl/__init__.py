"""agentrl: train LLM agents with reinforcement learning on multi-turn, tool-using tasks.

The public surface users write code against:

* :class:`ToolEnv`, :class:`EpisodeState` - the environment contract; :class:`TaskFields` -
  what a task row holds and which of it the policy may see.
* :func:`tool`, :class:`Tool` - typed Python functions as tools.
* :func:`register_env`, :func:`make_env`, :func:`check_env`, :func:`list_envs` - the registry
  (importing agentrl registers the built-in envs, also with Gymnasium as ``agentrl/<id>``).
* :class:`Sample`, :class:`Status` - the trajectory record every stage exchanges.
"""

from agentrl import errors
from agentrl._version import __version__
from agentrl.env import (
    EpisodeState,
    SandboxedToolEnv,
    TaskFields,
    ToolEnv,
    check_env,
    env_spec,
    list_envs,
    make_env,
    register_env,
)
from agentrl.env.registry import load_builtin_envs
from agentrl.rollout import Sample, Status
from agentrl.tools import Injected, Tool, ToolCall, tool

# The built-in ids become known to make_env and to gymnasium.make("agentrl/calc-v0") now:
# agentrl_envs only records lazy entry points, so no env module is imported here.
load_builtin_envs()

__all__ = [
    "EpisodeState",
    "Injected",
    "Sample",
    "SandboxedToolEnv",
    "Status",
    "TaskFields",
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
