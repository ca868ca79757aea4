"""``calc-slow``: calc whose tool calls take 100 ms more, like a quick real tool (a test run, a
file read), for bench/async.py. Registered on import: ``--env _slow_calc:calc-slow``."""

from __future__ import annotations

import asyncio
from typing import Any

from agentrl import register_env
from agentrl_envs.calc.env import CalcEnv

TOOL_LATENCY_S = 0.1


class SlowCalcEnv(CalcEnv):
    """:class:`CalcEnv`, with :data:`TOOL_LATENCY_S` added to every turn that called a tool."""

    async def astep(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        result = await super().astep(action)
        if result[4]["tool_calls"]:
            await asyncio.sleep(TOOL_LATENCY_S)
        return result


register_env("calc-slow", SlowCalcEnv, description="calc with 100 ms of tool latency (bench)")
