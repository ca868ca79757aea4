"""Per-turn framework overhead of a ToolEnv step, against the bare parse + validate cost.

One "turn" = what the env does for an assistant message with one tool call: parse the raw text
(hermes format), validate the arguments with the tool's cached JSON-Schema validator, dispatch
to the tool, and build the ``role: tool`` message and ``info``. The tool itself is an async
function that returns at once, so only framework work is timed.

Baseline, in the same process and interleaved with it round by round: ``json.loads`` of the call's JSON plus the same cached
``Draft202012Validator`` on the arguments: the least any framework must do per call.

    python bench/env_overhead.py [--turns 20000]

Prints a table, then one JSON line per headline figure (env_overhead_ratio, env_overhead_us).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from jsonschema import Draft202012Validator

from agentrl import ToolEnv, tool
from agentrl.tools import ToolCall, get_format


@tool
async def search_code(query: str, path: str = ".", max_results: int = 10, regex: bool = False) -> str:
    """Searches files under a path for a pattern.

    Args:
        query: Text or regular expression to look for.
        path: Directory to search, relative to the workspace.
        max_results: Most matching lines to return.
        regex: Treat query as a regular expression.
    """
    return "src/app.py:12: def handler(request):"


class BenchEnv(ToolEnv):
    """An env with one typical tool."""

    tools = (search_code,)

    def make_prompt(self, task):
        return [{"role": "user", "content": "find the handler"}]

    def compute_reward(self, task, final, state):
        return 0.0


ARGUMENTS = {"query": "def handler", "path": "src", "max_results": 5, "regex": False}


def make_framework_turns(turns: int):
    """A function timing ``turns`` env turns (astep with one tool call) in a running loop."""
    env = BenchEnv(max_turns=10**9)
    text = get_format("hermes").render("Searching.", [ToolCall("search_code", ARGUMENTS)])
    loop = asyncio.new_event_loop()
    loop.run_until_complete(env.areset(seed=0, options={"task": {}}))

    async def run() -> float:
        env.messages.clear()
        start = time.perf_counter()
        for _ in range(turns):
            obs, *_ = await env.astep(text)
        elapsed = time.perf_counter() - start
        assert obs[0]["content"].startswith("src/app.py"), obs
        return elapsed / turns

    return lambda: loop.run_until_complete(run())


def make_baseline_turns(turns: int):
    """A function timing ``turns`` bare json.loads + cached-validator checks of the same call."""
    payload = json.dumps({"name": "search_code", "arguments": ARGUMENTS})
    validator = Draft202012Validator(search_code.parameters)

    def run() -> float:
        start = time.perf_counter()
        for _ in range(turns):
            call = json.loads(payload)
            assert next(validator.iter_errors(call["arguments"]), None) is None
        return (time.perf_counter() - start) / turns

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description="ToolEnv per-turn overhead")
    parser.add_argument("--turns", type=int, default=2000, help="turns per round")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()

    framework_run, baseline_run = make_framework_turns(args.turns), make_baseline_turns(args.turns)
    framework_run(), baseline_run()  # warm-up
    # Interleaved rounds: machine noise hits both sides alike; medians of each side.
    rounds = [(framework_run(), baseline_run()) for _ in range(args.rounds)]
    framework = statistics.median(f for f, _ in rounds)
    baseline = statistics.median(b for _, b in rounds)
    ratio = framework / baseline
    print(f"{'measure':<44}{'us/turn':>10}")
    print(f"{'baseline: json.loads + cached validator':<44}{baseline * 1e6:>10.1f}")
    print(f"{'agentrl: parse+validate+dispatch+message':<44}{framework * 1e6:>10.1f}")
    print(f"{'ratio':<44}{ratio:>10.2f}")
    print(json.dumps({"name": "env_overhead_ratio", "value": round(ratio, 3), "target": "<= 3"}))
    print(json.dumps({"name": "env_overhead_us", "value": round(framework * 1e6, 1), "target": "< 200"}))


if __name__ == "__main__":
    main()
