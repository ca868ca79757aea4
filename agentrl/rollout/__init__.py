"""Rollout: the ``Sample`` record (engines, the episode runner, data sources and rewards come
in later issues).

Imports neither Ray, Megatron nor SGLang.
"""

from agentrl.rollout.sample import Sample, Status, Turn

__all__ = ["Sample", "Status", "Turn"]
