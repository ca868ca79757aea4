"""``harbor-v0``: Harbor task directories (``task.toml``, ``instruction.md``, ``environment/``,
``tests/``, ``solution/``) as an environment. ``tasks/`` holds the tasks shipped with agentrl
(``--env harbor`` without ``path=`` plays them)."""

from agentrl_envs.harbor.env import HarborEnv
from agentrl_envs.harbor.task import (
    SHIPPED_TASKS,
    HarborTask,
    HarborTaskError,
    load_task,
    load_tasks,
)

__all__ = ["SHIPPED_TASKS", "HarborEnv", "HarborTask", "HarborTaskError", "load_task", "load_tasks"]
