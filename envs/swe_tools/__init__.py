"""``swe-tools``: repair an injected bug in a small real Python project with shell, editor and
test tools.

Tasks are generated deterministically from standard-library modules and their CPython tests
(:mod:`agentrl_envs.swe_tools.generate`) and cached; ``swe-bench-v0``
(:class:`SweBenchEnv`) plays SWE-bench-format instances in Docker images. The classes are
imported lazily, so ``python -m agentrl_envs.swe_tools.generate`` loads only the generator.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SweToolsEnv": "agentrl_envs.swe_tools.env",
    "grade_task": "agentrl_envs.swe_tools.env",
    "SweBenchEnv": "agentrl_envs.swe_tools.swebench",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
