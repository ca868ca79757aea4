"""StopOnSignals in one process: a first SIGINT stops the run's own code where it runs, also
when it lands in a finalizer, where Python would drop the exception it raises (the end-to-end
behaviour, with train.py, is in tests/e2e/test_interrupts.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest

from agentrl.errors import RunInterrupted
from agentrl.run.interrupts import StopOnSignals

pytestmark = pytest.mark.unit


def _busy(seconds: float) -> float:
    """Holds the event loop (no await), like reading a large prompt file; returns how long."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        time.sleep(0.01)
    return time.monotonic() - started


def test_a_signal_during_the_runs_own_code_stops_it_there():
    async def run() -> None:
        with StopOnSignals(describe=lambda: "start-up", announce=lambda line: None):
            os.kill(os.getpid(), signal.SIGINT)
            _busy(10)

    started = time.monotonic()
    with pytest.raises(RunInterrupted) as info:
        asyncio.run(run())
    assert time.monotonic() - started < 5
    assert info.value.exit_code == 130 and "during start-up" in str(info.value)


def test_a_signal_that_lands_in_a_finalizer_is_sent_again_and_stops_the_run():
    """Python prints and drops what a finalizer (or importlib's module-lock callback, which the
    garbage collector runs in the middle of any code) raises: the stop would be lost and the
    run would go on. The handler sends the signal again instead, and the second delivery stops
    the run's own code."""
    delivered = []

    async def run() -> None:
        with StopOnSignals(describe=lambda: "start-up", announce=delivered.append) as stop:
            class Finalized:
                def __del__(self) -> None:  # as if the signal arrived while this ran
                    stop._on_signal(signal.SIGINT, sys._getframe())

            Finalized()  # dropped at once: its finalizer runs here
            _busy(10)

    started = time.monotonic()
    with pytest.raises(RunInterrupted) as info:
        asyncio.run(run())
    assert time.monotonic() - started < 5  # stopped by the second delivery, not after 10 s
    assert info.value.exit_code == 130
    assert len(delivered) == 1  # announced once: the resent signal is not a "second" one
