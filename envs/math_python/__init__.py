"""``math-python``: reasoning-gym word problems solved with a sandboxed ``python`` tool.

Tasks come from reasoning-gym's procedural generators (offline, deterministic train/test
splits); the model answers ``Answer: X`` and the reward is the generator's own
``score_answer``, without the partial credit it gives an answer that merely contains the
expected one.
"""

from agentrl_envs.math_python.env import MathPythonEnv, extract_answer, hedge_checked
from agentrl_envs.math_python.tasks import DEFAULT_GENERATORS, load_tasks, score_answer

__all__ = [
    "DEFAULT_GENERATORS", "MathPythonEnv", "extract_answer", "hedge_checked", "load_tasks",
    "score_answer",
]
