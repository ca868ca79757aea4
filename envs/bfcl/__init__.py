"""``bfcl``: single-turn function calling from the Berkeley Function Calling Leaderboard.

Tasks (Python categories ``simple_python``, ``multiple``, ``parallel``, ``parallel_multiple``)
come from the ``bfcl-eval`` package's data files (offline). Each task's functions are the
episode's tools; the first turn with calls is the answer, graded under BFCL's AST rules.
"""

from agentrl_envs.bfcl.data import CATEGORIES, load_tasks, to_json_schema, tool_schema
from agentrl_envs.bfcl.env import AnswerToolbox, BfclEnv
from agentrl_envs.bfcl.grading import Verdict, check_call, grade_calls, oracle_calls

__all__ = [
    "CATEGORIES",
    "AnswerToolbox",
    "BfclEnv",
    "Verdict",
    "check_call",
    "grade_calls",
    "load_tasks",
    "oracle_calls",
    "to_json_schema",
    "tool_schema",
]
