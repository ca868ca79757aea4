"""Sandbox throughput and pool latency.

1. 64 concurrent short python commands (``/usr/bin/python3 -c 'print(1)'``), spread over 8
   sandboxes: bwrap throughput divided by plain-subprocess throughput (the same 64 commands as
   bare asyncio subprocesses). Rounds alternate between the two in one process.
2. The same 64 commands as ``docker exec`` in 8 pooled, warm containers: commands per second.
3. Median time to acquire a pre-warmed sandbox from a :class:`SandboxPool`.

    python bench/sandbox.py [--rounds 5]

Ends with one JSON line per headline figure: bwrap_vs_plain_throughput (target >= 0.85),
docker_exec_per_s (target >= 20), pool_acquire_ms_p50 (target < 5). A backend missing on this
machine is reported with the reason and a null value.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from agentrl.sandbox import Limits, SandboxPool, create_sandbox

COMMAND = ["/usr/bin/python3", "-c", "print(1)"]
CONCURRENT = 64
SANDBOXES = 8


async def plain_round() -> float:
    """Commands per second for 64 bare subprocesses at once."""

    async def one() -> None:
        proc = await asyncio.create_subprocess_exec(
            *COMMAND, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},  # the sandboxes' minimal env
        )
        out, _ = await proc.communicate()
        assert out.strip() == b"1"

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(CONCURRENT)))
    return CONCURRENT / (time.perf_counter() - start)


async def sandbox_round(sandboxes) -> float:
    """Commands per second for 64 commands over ``sandboxes`` at once."""
    start = time.perf_counter()
    results = await asyncio.gather(
        *(sandboxes[i % len(sandboxes)].exec(COMMAND) for i in range(CONCURRENT))
    )
    elapsed = time.perf_counter() - start
    bad = [r for r in results if r.stdout.strip() != "1"]
    assert not bad, bad[0]
    return CONCURRENT / elapsed


async def started(backend: str, n: int):
    sandboxes = [create_sandbox(backend, Limits()) for _ in range(n)]
    await asyncio.gather(*(s.start() for s in sandboxes))
    return sandboxes


async def bench_bwrap(rounds: int) -> tuple[float, float, float]:
    sandboxes = await started("bwrap", SANDBOXES)
    try:
        await sandbox_round(sandboxes)  # warm-up
        await plain_round()
        pairs = [(await sandbox_round(sandboxes), await plain_round()) for _ in range(rounds)]
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes))
    bwrap = statistics.median(b for b, _ in pairs)
    plain = statistics.median(p for _, p in pairs)
    return bwrap, plain, statistics.median(b / p for b, p in pairs)


async def bench_docker(rounds: int) -> float:
    sandboxes = await started("docker", SANDBOXES)
    try:
        await sandbox_round(sandboxes)
        return statistics.median([await sandbox_round(sandboxes) for _ in range(rounds)])
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes))


async def bench_pool_acquire(samples: int = 40) -> float:
    """Median milliseconds to acquire a warm bwrap sandbox (release is not timed)."""
    pool = SandboxPool(lambda: create_sandbox("bwrap", Limits()), max_concurrent=4, prewarm=4)
    times = []
    async with pool:
        for _ in range(samples):
            deadline = time.perf_counter() + 10
            while pool.stats["warm"] < pool.prewarm:  # measure the warm path, as in steady state
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"the pool did not refill (refill errors: {pool.refill_errors})")
                await asyncio.sleep(0.005)
            start = time.perf_counter()
            sandbox = await pool.acquire()
            times.append(time.perf_counter() - start)
            await pool.release(sandbox)
    return statistics.median(times) * 1000


def docker_reason() -> str | None:
    try:
        from agentrl.sandbox.docker import docker_unavailable_reason
    except ImportError as exc:
        return f"docker SDK not importable: {exc}"
    return docker_unavailable_reason()


async def main(rounds: int) -> None:
    bwrap, plain, ratio = await bench_bwrap(rounds)
    print(f"64 concurrent python commands: plain {plain:.1f}/s, bwrap {bwrap:.1f}/s, ratio {ratio:.2f}")
    reason = docker_reason()
    docker = None
    if reason is None:
        docker = await bench_docker(rounds)
        print(f"docker exec in {SANDBOXES} warm containers: {docker:.1f} commands/s")
    else:
        print(f"docker: not measured ({reason})")
    acquire = await bench_pool_acquire()
    print(f"pool acquire (warm): p50 {acquire:.2f} ms")
    for name, value, target in (
        ("bwrap_vs_plain_throughput", round(ratio, 3), ">= 0.85"),
        ("docker_exec_per_s", None if docker is None else round(docker, 1), ">= 20"),
        ("pool_acquire_ms_p50", round(acquire, 3), "< 5"),
    ):
        print(json.dumps({"name": name, "value": value, "target": target}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="sandbox benchmarks")
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args().rounds))
