"""Stopping on SIGINT / SIGTERM: the first signal stops the run cleanly, a second exits at once.

A run (``train.py``, ``agentrl eval``) enters :class:`StopOnSignals` inside its main coroutine.
The first SIGINT or SIGTERM cancels that coroutine: no new group starts, in-flight engine
requests are abandoned, and as the cancellation unwinds every episode closes its env and
sandbox, the sandbox pools close, the engine and the trainer's Ray actors stop. The context
manager then turns the cancellation into :class:`RunInterrupted`, whose message says what was
interrupted and how to continue; the entry point prints it as one line and exits with the
shell's code for the signal (130, 143).

A second signal exits at once (``os._exit``), after removing this process's sandboxes
(:func:`agentrl.sandbox.reap_own_at_exit`), which takes well under a second: waiting is what
the user refused, leaking mounts and containers is not acceptable either way.

The handler is a plain ``signal.signal`` handler, not ``loop.add_signal_handler``: the loop's
handlers only run when the loop gets control back, and a blocking trainer call (a Ray ``get``)
would delay even the second signal. For the same reason, when the signal interrupts the run's
own code while it holds the loop (a long step with no ``await``, such as reading a large prompt
file at start-up), the handler raises the cancellation right there instead of waiting for the
loop.

Imported on first use: the sandbox reaper, only when a signal stops the run (the sandbox package
pulls the Docker back-end's helpers).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from agentrl.errors import RunInterrupted

__all__ = ["StopOnSignals", "exit_code_for"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_code_for(signum: int) -> int:
    """The shell's exit status of a process ended by ``signum`` (128 + n: 130 for SIGINT)."""
    return 128 + signum


def _drops_exceptions(frame: FrameType) -> bool:
    """Whether an exception raised in ``frame`` would be lost: it runs a finalizer or importlib's
    module-lock weakref callback, whose exceptions Python prints as "Exception ignored" and
    drops."""
    code = frame.f_code
    return code.co_name == "__del__" or (code.co_name == "cb" and "importlib" in code.co_filename)


class StopOnSignals:
    """Stops the current task on the first SIGINT / SIGTERM (see the module docstring).

    Use it in the main thread, in the coroutine to stop::

        with StopOnSignals(describe=lambda: f"rollout {i}") as stop:
            ...

    Args:
        describe: What the run is doing now (``"rollout 3 (train)"``), for the message.
        advice: What to tell the user after the interruption (``"continue with --load X"``);
            called after the clean-up, so it sees the newest checkpoint.
        announce: Where the one line "stopping ..." goes when the first signal arrives.
        prog: The program's name, for the line printed when the run exits at once.
    """

    def __init__(self, describe: Callable[[], str] = lambda: "the run",
                 advice: Callable[[], str] = lambda: "",
                 announce: Callable[[str], Any] | None = None, prog: str = "agentrl") -> None:
        self.prog = prog
        self.describe = describe
        self.advice = advice
        self.announce = announce or (lambda line: print(line, file=sys.stderr, flush=True))
        self.signum: int | None = None
        self.interrupted_during = ""
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._previous: dict[int, Any] = {}
        self._watches: list[tuple[Callable[[], bool], str]] = []
        self._again = False  # the first signal, sent again by us (see _stop_task)

    def watch(self, lost: Callable[[], bool], why: str) -> None:
        """After a signal, checks ``lost()`` twice a second: once it is true the clean stop
        cannot finish (e.g. the signal went to the whole process group and stopped Ray's own
        processes, so every call to Ray hangs), and the run exits at once, as on a second
        signal, with the usual message and ``why``."""
        self._watches.append((lost, why))

    def _watchdog(self) -> None:
        while self._previous:  # until __exit__: the clean stop finished
            for lost, why in self._watches:
                if lost():
                    self._exit_now(f"{why}, so the run could not stop cleanly")
            time.sleep(0.5)

    def _message(self, extra: str = "") -> str:
        assert self.signum is not None
        message = f"interrupted by {signal.Signals(self.signum).name} during {self.interrupted_during}"
        if extra:
            message += f" ({extra})"
        advice = self.advice()
        return f"{message}; {advice}" if advice else message

    def _exit_now(self, why: str) -> None:
        from agentrl.sandbox import reap_own_at_exit

        assert self.signum is not None
        reap_own_at_exit()
        self.announce(f"{self.prog}: {self._message(why)}")
        os._exit(exit_code_for(self.signum))

    def __enter__(self) -> StopOnSignals:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._again:  # the first signal once more, where it can take effect (_stop_task)
            self._again = False
            self._stop_task(signum, frame)
            return
        if self.signum is not None:  # the second signal: no clean-up beyond the sandboxes
            self._exit_now(f"a second {signal.Signals(signum).name} ended the clean-up")
        self.signum = signum
        self.interrupted_during = self.describe()
        name = signal.Signals(signum).name
        self.announce(f"{name}: stopping {self.interrupted_during}: closing episodes, sandboxes "
                      "and engines (send it again to exit at once)")
        if self._watches:
            threading.Thread(target=self._watchdog, name="agentrl-stop-watchdog", daemon=True).start()
        self._stop_task(signum, frame)

    def _stop_task(self, signum: int, frame: FrameType | None) -> None:
        """Cancels the stopped task: right here when its own code holds the loop (reading a
        large file), else at its next await. An exception raised inside a finalizer or a weakref
        callback is printed and dropped by Python, so a signal that lands in one (importlib's
        module-lock callback runs whenever the garbage collector does) is sent again a moment
        later, when the code it interrupted has moved on."""
        assert self._loop is not None and self._task is not None
        if not self._runs_now(frame):
            self._loop.call_soon_threadsafe(self._task.cancel)
            return
        if frame is not None and _drops_exceptions(frame):
            self._again = True
            again = threading.Timer(0.05, os.kill, (os.getpid(), signum))
            again.daemon = True
            again.start()
            return
        raise asyncio.CancelledError  # stop it here, as a cancellation at its next await would

    def _runs_now(self, frame: FrameType | None) -> bool:
        """Whether the signal interrupted the stopped task's own code (its coroutine's frame is
        on the interrupted stack): then the loop would not get control back to cancel it until
        that code is done, which for a start-up step such as reading a large prompt file can
        take minutes."""
        assert self._task is not None
        target = getattr(self._task.get_coro(), "cr_frame", None)
        while frame is not None:
            if frame is target:
                return True
            frame = frame.f_back
        return False

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.signum is None:
            for signum, previous in self._previous.items():
                signal.signal(signum, previous)
            self._previous = {}
            return
        # Interrupted: the handler stays until the process exits, so that a further signal
        # while the run reports and exits still means "exit at once", not a traceback.
        self._previous = {}  # (also ends the watchdog)
        if exc_type is None:  # the run ended on its own right after the signal
            return
        assert self._task is not None
        with contextlib.suppress(AttributeError):
            self._task.uncancel()  # ours: the task goes on to report it, not to die of it
        extra = ""
        if not isinstance(exc, asyncio.CancelledError):  # e.g. a Ray worker that got it first
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            extra = f"while stopping: {type(exc).__name__}: {first}"
        raise RunInterrupted(self._message(extra), signal_name=signal.Signals(self.signum).name,
                             exit_code=exit_code_for(self.signum)) from None
