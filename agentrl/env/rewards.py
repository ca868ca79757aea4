"""``as_reward``: the one coercion of a reward value (an env's score, a reward plug-in's) to a
float; ``SUCCESS_REWARD``: the one threshold of success."""

from __future__ import annotations

import math
import numbers
from typing import Any

from agentrl.errors import RewardError

SUCCESS_REWARD = 1.0 - 1e-9
"""A sample or episode succeeded when its reward reaches this (1.0 on binary-reward tasks, with
room for float noise): what success rates, pass@k and the env checker count everywhere."""


def as_reward(value: Any, source: str) -> float:
    """``value`` as a finite float.

    Bools count as 0.0 / 1.0 (a pass/fail grader may return one); numpy scalars and 0-d tensors
    are read through their ``.item()``.

    Args:
        value: What the reward function returned.
        source: Who returned it, for the message (e.g. ``"CalcEnv.compute_reward"``).

    Returns:
        The reward.

    Raises:
        RewardError: ``value`` is not a real number (e.g. a str, ``None``, an array of several
            values), or is NaN or infinite; the message names ``source``.
    """
    if not isinstance(value, numbers.Real) and callable(getattr(value, "item", None)):
        try:
            value = value.item()
        except (TypeError, ValueError) as exc:  # e.g. an array of more than one value
            raise RewardError(
                f"{source} returned {type(value).__name__} {value!r:.60}, not a number: {exc}"
            ) from exc
    if not isinstance(value, numbers.Real):
        raise RewardError(
            f"{source} returned {type(value).__name__} {value!r:.60}, not a number: return a "
            "float (an int, a bool, a numpy scalar or a 0-d tensor is fine too)"
        )
    result = float(value)
    if not math.isfinite(result):
        raise RewardError(f"{source} returned {result}, not a finite number")
    return result
