"""``calc``: arithmetic word problems solved with a calculator tool.

Tasks are generated from a seed (2-3 operations of ``+ - *`` on 1..50, as plain expressions or
short word problems). The train/test split is a fixed function of the question text, so the two
never overlap whatever the seed. Reward is 1.0 when the final assistant message's last
``Answer: N`` line gives the right integer and no other number, else 0.0. ``compact=True``
(``--env-kwarg compact=true``) shows the tool call in a short system prompt instead of the
template's schema listing, for small models (see :class:`CalcEnv`).
"""

from agentrl_envs.calc.env import CalcEnv, calc_oracle, parse_answer
from agentrl_envs.calc.tasks import generate_task, load_tasks, split_of

__all__ = ["CalcEnv", "calc_oracle", "generate_task", "load_tasks", "parse_answer", "split_of"]
