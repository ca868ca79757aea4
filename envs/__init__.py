"""agentrl's built-in environments (installed as the ``agentrl_envs`` package).

Importing this package registers every built-in env with lazy entry points; nothing heavy is
imported until an env is made. The repository folder is ``envs/``; the distinct import name
``agentrl_envs`` keeps it from colliding with other packages called ``envs``.
"""

from agentrl.env.registry import register_env

register_env(
    "calc-v0",
    entry_point="agentrl_envs.calc:CalcEnv",
    description="Arithmetic word problems with a calculator tool; reward 1 for the right answer.",
)
