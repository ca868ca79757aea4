"""Stopping the servers tests start in process groups of their own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def stop_process_group(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """SIGTERM to ``proc``'s process group, SIGKILL after ``timeout`` seconds, then SIGKILL to
    whatever of the group outlived it (a server's worker processes). Safe on an exited one."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
