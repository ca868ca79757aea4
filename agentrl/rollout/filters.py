"""Dynamic-sampling filters: ``filter(args, group) -> bool`` keeps a group (``True``) or drops it.

Pass one with ``--dynamic-sampling-filter-path`` (``file.py:name`` or ``module:name``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from agentrl.records.sample import Sample

__all__ = ["reward_std_positive"]


def reward_std_positive(args: Any, group: Sequence[Sample]) -> bool:
    """Keeps groups whose rewards differ (population std > 0): with GRPO, a group whose samples
    all score the same has zero advantage everywhere and teaches nothing."""
    rewards = [s.reward if s.reward is not None else 0.0 for s in group]
    return len(rewards) > 1 and statistics.pstdev(rewards) > 0.0
