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
register_env(
    "humaneval-v0",
    entry_point="agentrl_envs.humaneval:HumanEvalEnv",
    description="HumanEval (164 problems) with a sandboxed python tool; reward 1 when the "
    "hidden tests pass.",
)
register_env(
    "bfcl-v0",
    entry_point="agentrl_envs.bfcl:BfclEnv",
    description="BFCL function calling (simple, multiple, parallel, parallel_multiple); the "
    "first turn's calls are graded under BFCL's AST rules.",
)
register_env(
    "math-python-v0",
    entry_point="agentrl_envs.math_python:MathPythonEnv",
    description="reasoning-gym math word problems with a sandboxed python tool; reward from "
    "the generator's own scorer.",
)
register_env(
    "swe-tools-v0",
    entry_point="agentrl_envs.swe_tools:SweToolsEnv",
    description="Fix an injected bug in a small real Python project (stdlib module + CPython "
    "tests) with bash/editor/search/run_tests/submit; reward 1 when the hidden tests pass.",
)
register_env(
    "swe-bench-v0",
    entry_point="agentrl_envs.swe_tools:SweBenchEnv",
    description="SWE-bench-format instances in their Docker images; graded like the official "
    "harness (test_patch applied, FAIL_TO_PASS and PASS_TO_PASS must pass).",
)
register_env(
    "harbor-v0",
    entry_point="agentrl_envs.harbor:HarborEnv",
    description="Harbor task directories (task.toml, instruction.md, environment/Dockerfile, "
    "tests/test.sh) in their Docker images, graded by the task's verifier; --env-kwarg path=DIR "
    "(default: the 14 shipped tasks).",
)
register_env(
    "openenv-v0",
    entry_point="agentrl_envs.openenv:OpenEnvEnv",
    description="An environment served over OpenEnv's protocol (an openenv server, or agentrl "
    "serve-env): its MCP tools, reward and task API; --env-kwarg url=http://HOST:PORT.",
)
