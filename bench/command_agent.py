"""What sandboxing a command agent costs per episode: ``--agent-command`` in its bubblewrap
sandbox (the default) against the same agent on the host (``--agent-on-host``).

The agent is ``examples/cli_agent.py`` (the real ``openai`` SDK, two model calls), on calc's
test tasks, one episode at a time, through the gateway. The model is scripted (it answers at
once), so what is timed is the agent's episode: starting its process (and, sandboxed, the
sandbox), the SDK's start-up and calls, the env's grading. Rounds alternate between the two
modes to spread the machine's noise.

* ``command_agent_sandbox_cost_ratio``: median episode wall time sandboxed / on the host;
* ``command_agent_sandbox_extra_s``: the difference of the medians, in seconds.

    PYTHONPATH=. python bench/command_agent.py [--rounds 3] [--episodes 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from agentrl.eval.runner import EvalSet, evaluate_sets
from agentrl.records.sample import Status
from agentrl.rollout.build import env_factory
from agentrl.rollout.config import RolloutConfig
from agentrl.run.context import make_rollout_context
from tests.support.engines import ScriptedEngine
from tests.support.tokenizers import tiny_tokenizer

AGENT = Path(__file__).resolve().parents[1] / "examples" / "cli_agent.py"


def answering_engine(envs) -> ScriptedEngine:
    """A model that answers each calc task right away."""
    env = envs()
    tasks = env.task_set("test", 64)

    def policy(text: str, rid: str) -> str:
        task = next(t for t in tasks if t["question"] in text)
        return f"Answer: {task['answer']}"

    engine = ScriptedEngine(tiny_tokenizer(), policy)
    engine.max_context_len = 4096
    return engine


async def episodes(on_host: bool, count: int) -> list[float]:
    """Plays ``count`` calc episodes one at a time; returns each one's wall seconds."""
    config = RolloutConfig(env="calc", agent_command=f"{sys.executable} {AGENT}", eval_max_prompts=1,
                           rollout_max_context_len=4096, agent_on_host=on_host)
    envs = env_factory(config)
    ctx = make_rollout_context(config, answering_engine(envs), envs)
    times = []
    try:
        for i in range(count):
            started = time.perf_counter()
            # the first test task each time: the same work in both modes
            result = await evaluate_sets(ctx, [EvalSet(f"calc-{i}", None, "calc", "test")], f"b{i}")
            times.append(time.perf_counter() - started)
            [(_, groups)] = result.values()
            sample = groups[0][0]
            assert sample.status is Status.COMPLETED and sample.reward == 1.0, sample.metadata.get("error")
    finally:
        await ctx.aclose()
        await envs.aclose()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=4, help="episodes per mode and round")
    args = parser.parse_args()
    asyncio.run(episodes(True, 1))  # warm the interpreter's caches for both
    times: dict[str, list[float]] = {"host": [], "sandbox": []}
    for _ in range(args.rounds):
        for mode in ("host", "sandbox"):
            times[mode] += asyncio.run(episodes(mode == "host", args.episodes))
    host, sandbox = statistics.median(times["host"]), statistics.median(times["sandbox"])
    for mode, values in times.items():
        print(f"{mode}: {len(values)} episodes, median {statistics.median(values):.3f} s "
              f"(min {min(values):.3f}, max {max(values):.3f})")
    print(json.dumps({"name": "command_agent_sandbox_cost_ratio", "value": round(sandbox / host, 3),
                      "target": "none set (issue 46 asks for the figure)"}))
    print(json.dumps({"name": "command_agent_sandbox_extra_s", "value": round(sandbox - host, 3),
                      "target": "none set (issue 46 asks for the figure)"}))


if __name__ == "__main__":
    main()
