"""Harbor tasks on the private Docker daemon: image builds and oracle episodes.

1. Image build time per task, cold (the task's image removed first) and cached (built again
   right after: a lookup of the environment folder's hash).
2. Oracle episodes (``solution/solve.sh``, then grading) of the shipped tasks with 4 envs in
   flight sharing one sandbox pool, against the same episodes one at a time in the same
   process: episodes per second, and where an episode's time goes: container start (acquiring
   the sandbox and copying the working directory in), agent (the oracle's tool calls) and
   grading (stopping the sandbox's processes, copying the tests in, ``tests/test.sh``).

    python bench/harbor.py [--rounds 2] [--tasks 14]

Needs the Docker daemon (``scripts/dockerd.sh start``). Ends with one JSON line per headline
figure: harbor_oracle_eps_per_s (concurrency 4; reported), harbor_concurrency_speedup
(concurrency 4 over 1; reported), harbor_image_build_cold_s / harbor_image_build_cached_s
(median per task; reported) and the shares of episode time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections import defaultdict
from typing import Any

from agentrl.sandbox import SandboxPools
from agentrl.sandbox.docker import get_client
from agentrl_envs.harbor import SHIPPED_TASKS, HarborEnv, load_tasks
from agentrl_envs.harbor.images import ensure_task_image, image_tag

CONCURRENCY = 4


async def builds(tasks: list[Any]) -> tuple[list[float], list[float]]:
    """(cold, cached) build seconds per task."""
    client = get_client()
    cold, cached = [], []
    for task in tasks:
        tag = image_tag(task)
        if client.images.list(name=tag):
            client.images.remove(tag, force=True)
        first = await ensure_task_image(client, task)
        again = await ensure_task_image(client, task)
        assert first.built and not again.built
        cold.append(first.seconds)
        cached.append(again.seconds)
    return cold, cached


async def episode(env: HarborEnv, row: dict[str, Any], phases: dict[str, list[float]]) -> float:
    start = time.perf_counter()
    await env.areset(options={"task": row})
    phases["container start"].append(time.perf_counter() - start)
    agent = grading = 0.0
    reward = 0.0
    while True:
        _, reward, terminated, truncated, _ = await env.astep(env.oracle_action(row, env.messages))
        timings = env.last_step_timings
        agent += timings.parse_s + timings.tools_s
        grading += timings.reward_s
        if terminated or truncated:
            break
    phases["agent"].append(agent)
    phases["grading"].append(grading)
    return reward


async def episodes(rows: list[dict[str, Any]], concurrency: int) -> tuple[float, dict[str, list[float]]]:
    """Episodes per second for ``rows`` played by ``concurrency`` envs, and per-phase times."""
    pools = SandboxPools()
    envs = [HarborEnv(sandbox_pools=pools, max_concurrent_sandboxes=concurrency) for _ in range(concurrency)]
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for row in rows:
        queue.put_nowait(row)
    phases: dict[str, list[float]] = defaultdict(list)
    rewards: list[float] = []

    async def worker(env: HarborEnv) -> None:
        while not queue.empty():
            rewards.append(await episode(env, queue.get_nowait(), phases))

    for env in envs:  # the images are cached: this measures episodes, not builds
        for row in rows:
            await env.task_image(env.harbor_task(row))
    start = time.perf_counter()
    try:
        await asyncio.gather(*(worker(env) for env in envs))
    finally:
        for env in envs:
            await env.aclose()
        await pools.aclose()
    wall = time.perf_counter() - start
    assert rewards == [1.0] * len(rows), rewards
    return len(rows) / wall, phases


async def main(rounds: int, n_tasks: int) -> None:
    tasks = load_tasks(SHIPPED_TASKS)[:n_tasks]
    cold, cached = await builds(tasks)
    print(f"image builds of {len(tasks)} tasks: median {statistics.median(cold):.2f} s cold, "
          f"{statistics.median(cached) * 1e3:.1f} ms cached")
    rows = HarborEnv().task_set()[:n_tasks]
    rates: dict[int, list[float]] = {1: [], CONCURRENCY: []}
    phases: dict[str, list[float]] = defaultdict(list)
    for _ in range(rounds):  # alternate, so that machine noise hits both alike
        for concurrency in (1, CONCURRENCY):
            rate, times = await episodes(rows, concurrency)
            rates[concurrency].append(rate)
            if concurrency == CONCURRENCY:
                for name, values in times.items():
                    phases[name] += values
    eps = statistics.median(rates[CONCURRENCY])
    speedup = eps / statistics.median(rates[1])
    total = sum(sum(v) for v in phases.values())
    shares = {name: sum(v) / total for name, v in phases.items()}
    print(f"oracle episodes: {eps:.2f}/s with {CONCURRENCY} in flight, "
          f"{statistics.median(rates[1]):.2f}/s one at a time ({len(rows)} episodes x {rounds} rounds)")
    print("episode time: " + ", ".join(
        f"{name} {shares[name]:.0%} (median {statistics.median(phases[name]):.2f} s)" for name in shares))
    cold_share = sum(cold) / (sum(cold) + len(rows) / eps)
    print(f"a cold start (every image built, then one episode each) spends {cold_share:.0%} building")
    for name, value, target in [
        ("harbor_oracle_eps_per_s", eps, "report"),
        ("harbor_concurrency_speedup", speedup, "report"),
        ("harbor_image_build_cold_s", statistics.median(cold), "report"),
        ("harbor_image_build_cached_s", statistics.median(cached), "report"),
        ("harbor_share_container_start", shares["container start"], "report"),
        ("harbor_share_agent", shares["agent"], "report"),
        ("harbor_share_grading", shares["grading"], "report"),
        ("harbor_share_image_build_cold_start", cold_share, "report"),
    ]:
        print(json.dumps({"name": name, "value": round(value, 4), "target": target}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=14)
    options = parser.parse_args()
    asyncio.run(main(options.rounds, options.tasks))
