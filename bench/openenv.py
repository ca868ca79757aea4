"""OpenEnv serving: what a step costs over loopback, and how many swe-tools sessions one server
holds at once.

* ``openenv_step_overhead_ms``: one calc ``calculator`` step played through ``agentrl serve-env``
  by the ``openenv`` env (agentrl's protocol client, a WebSocket session on 127.0.0.1) minus
  the same step on the env in this process; p50 and p99 over ``--steps`` steps, each step
  timed alone (target: p50 <= 5 ms).
* ``openenv_swe_tools_sessions``: ``--sessions`` clients each open a swe-tools session (a
  bubblewrap sandbox with the project's files) at once; how many the server held together,
  and the p50 / max time of a reset (report).

The server runs in .venv-openenv (scripts/setup-openenv.sh), started and stopped here.

    python bench/openenv.py [--steps 300] [--sessions 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OPENENV_PYTHON = REPO / ".venv-openenv" / "bin" / "python"
CALL = {"role": "assistant", "content": "", "tool_calls": [{"name": "calculator", "arguments": {"expression": "12*7"}}]}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """``agentrl serve-env`` in .venv-openenv on a free port, until stopped."""

    def __init__(self, env_id: str, *flags: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([str(OPENENV_PYTHON), "-m", "agentrl", "serve-env", env_id,
                                      "--port", str(self.port), *flags],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"serve-env {env_id} did not start") from None
                time.sleep(0.2)

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=60)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def step_times(env, steps: int) -> list[float]:
    """Seconds per calculator step, each on an episode of its own turn budget."""
    times = []
    task = env.task_set("test", limit=1)[0]
    await env.areset(options={"task": task})
    for _ in range(steps):
        if env._turn >= env.max_turns - 1:  # keep the episode open: a fresh one before the limit
            await env.areset(options={"task": task})
        start = time.perf_counter()
        await env.astep(CALL)
        times.append(time.perf_counter() - start)
    await env.aclose()
    return times


def step_overhead(steps: int) -> dict[str, float]:
    from agentrl.env import make_env

    direct = asyncio.run(step_times(make_env("calc", max_turns=1000), steps))
    server = Server("calc", "--env-kwarg", "max_turns=1000")
    try:
        remote_env = make_env("openenv", url=server.url, max_turns=1000)
        remote = asyncio.run(step_times(remote_env, steps))
    finally:
        server.stop()
    result = {f"{name}_{q}": round(1000 * percentile(times, p), 3)
              for name, times in (("direct", direct), ("remote", remote)) for q, p in (("p50", 0.5), ("p99", 0.99))}
    print(f"calc step: in process p50 {result['direct_p50']} ms p99 {result['direct_p99']} ms; "
          f"over loopback p50 {result['remote_p50']} ms p99 {result['remote_p99']} ms")
    return {"p50": round(result["remote_p50"] - result["direct_p50"], 3),
            "p99": round(result["remote_p99"] - result["direct_p99"], 3)}


def sessions_held(count: int) -> dict[str, float]:
    from agentrl.env import make_env

    server = Server("swe-tools", "--max-sessions", str(count))
    try:
        envs = [make_env("openenv", url=server.url, admission_timeout=1.0) for _ in range(count)]
        tasks = envs[0].task_set("test", limit=count)

        async def hold() -> tuple[int, list[float]]:
            async def one(env, task) -> float | None:
                start = time.perf_counter()
                try:
                    await env.areset(options={"task": task})
                except Exception as exc:  # noqa: BLE001 - reported, not fatal: the count is the figure
                    print(f"  a session failed: {exc}", file=sys.stderr)
                    return None
                return time.perf_counter() - start

            times = await asyncio.gather(*(one(e, tasks[i % len(tasks)]) for i, e in enumerate(envs)))
            held = [t for t in times if t is not None]
            for env in envs:
                await env.aclose()
            return len(held), held

        held, times = asyncio.run(hold())
    finally:
        server.stop()
    print(f"swe-tools: {held} of {count} sessions held at once; reset p50 {statistics.median(times):.2f} s, "
          f"max {max(times):.2f} s")
    return {"held": held, "asked": count, "reset_p50_s": round(statistics.median(times), 3),
            "reset_max_s": round(max(times), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--sessions", type=int, default=16)
    args = parser.parse_args()
    if not OPENENV_PYTHON.exists():
        raise SystemExit("bench/openenv.py needs .venv-openenv: run scripts/setup-openenv.sh")
    overhead = step_overhead(args.steps)
    sessions = sessions_held(args.sessions)
    print(json.dumps({"name": "openenv_step_overhead_ms", "value": overhead, "target": "p50 <= 5"}))
    print(json.dumps({"name": "openenv_swe_tools_sessions", "value": sessions, "target": "report"}))


if __name__ == "__main__":
    main()
