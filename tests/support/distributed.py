"""Running a function in several spawned processes (tensor-parallel tests over gloo)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import torch.multiprocessing as mp


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for MASTER_PORT)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn(fn: Callable[..., None], args: tuple, nprocs: int = 2, timeout_s: float = 240) -> None:
    """Runs ``fn(rank, *args)`` in ``nprocs`` spawned processes; kills them on timeout."""
    context = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"spawned workers did not finish within {timeout_s}s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join()
