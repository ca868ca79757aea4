"""Errors raised inside Ray actors (a trainer rank, an engine), as the user should read them.

Ray hands the driver a ``RayTaskError`` whose text is the remote traceback with terminal colour
codes, or a ``RayActorError`` when the actor's process died. :func:`readable` turns either into
one of our own errors: the original :class:`~agentrl.errors.AgentRLError` when the actor raised
one (its message is written for the user already), else a :class:`RemoteError` naming what
failed and the exception's first line. The remote traceback is added only with ``--debug``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import TypeVar

from agentrl.errors import AgentRLError

__all__ = ["RemoteError", "readable", "remote_call"]

T = TypeVar("T")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class RemoteError(AgentRLError):
    """A Ray actor of the run (a trainer rank, an engine) failed or died; the message says which
    and why, in one line (the remote traceback follows with ``--debug``)."""


def _first_line(text: str) -> str:
    lines = [line.strip() for line in _ANSI.sub("", text).splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


def readable(exc: BaseException, what: str, *, debug: bool = False) -> BaseException:
    """The error to show for ``exc``, raised by Ray while ``what`` ran (e.g. "the trainer's
    set-up"); ``exc`` itself when it is not a Ray error.

    Args:
        exc: What a Ray call raised.
        what: What was being done, for the message.
        debug: Append the remote traceback (without colour codes) to the message.
    """
    from ray.exceptions import RayActorError, RayError, RayTaskError

    if not isinstance(exc, RayError):
        return exc
    remote = _ANSI.sub("", str(exc))
    cause = exc.cause if isinstance(exc, RayTaskError) else None
    if isinstance(cause, AgentRLError):
        if debug:
            print(f"{what} failed; the remote traceback:\n{remote}", file=sys.stderr)
        return cause
    if cause is not None:
        message = f"{what} failed: {type(cause).__name__}: {_first_line(str(cause))}"
    elif isinstance(exc, RayActorError):
        message = f"{what} failed: its Ray actor died ({_first_line(remote)})"
    else:
        message = f"{what} failed: {type(exc).__name__}: {_first_line(remote)}"
    if debug:
        return RemoteError(f"{message}\n{remote}")
    return RemoteError(f"{message} (--debug shows the remote traceback)")


def remote_call(call: Callable[[], T], what: str, *, debug: bool = False) -> T:
    """``call()``, with a Ray error it raises made :func:`readable`."""
    from ray.exceptions import RayError

    try:
        return call()
    except RayError as exc:
        raise readable(exc, what, debug=debug) from None
