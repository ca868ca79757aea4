"""Peak memory of a piece of work, for the benchmarks that report one: the process's highest
RSS while ``work`` runs, over its RSS just before (sampled every 2 ms by a thread; run each
measured side in a child process of its own, since RSS never shrinks within a process)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import psutil


def peak_rss_mib(work: Callable[[], object]) -> float:
    """Runs ``work`` and returns its peak RSS over the RSS before it, in MiB."""
    process = psutil.Process()
    base = peak = process.memory_info().rss
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.002):
            peak = max(peak, process.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        work()
    finally:
        done.set()
        sampler.join()
    return (max(peak, process.memory_info().rss) - base) / 2**20
