"""Helpers shared by the built-in sandbox tools: bounded output, workspace paths, timeouts.

Every built-in tool returns text a model can act on: outputs are cut to :data:`MAX_OUTPUT_CHARS`
with a visible marker, and model mistakes (a bad path, a bad range) come back as ``Error: ...``
strings instead of exceptions.
"""

from __future__ import annotations

import posixpath

from agentrl.sandbox import WORKSPACE

MAX_OUTPUT_CHARS = 16_000
"""Upper bound on the characters of one tool result (the cut marker included)."""

MAX_TIMEOUT_S = 600
"""Largest per-command timeout a model may ask for, in seconds."""

TOOL_TIMEOUT_S = MAX_TIMEOUT_S + 60
"""The ``@tool`` timeout of command-running tools: above any command timeout, so the sandbox's
own timeout (which kills the processes and reports it) always fires first."""

CUT_MARKER = "[... {n} more characters cut ...]"


def clip(text: str, limit: int = MAX_OUTPUT_CHARS, *, keep_tail: bool = False) -> str:
    """Bounds ``text`` to ``limit`` characters, marking what was cut.

    Args:
        text: The full text.
        limit: Most characters of the result, marker included.
        keep_tail: Keep the start *and* the end (command output, where errors come last);
            otherwise keep the start only.

    Returns:
        ``text`` unchanged when short enough, else a cut version with
        ``[... N more characters cut ...]`` where the missing part was.
    """
    if len(text) <= limit:
        return text
    # The marker's digits depend on N; reserve room for the widest N first.
    room = max(limit - len(CUT_MARKER.format(n=len(text))) - 2, 0)
    if keep_tail:
        head = text[: room // 2]
        tail = text[len(text) - (room - room // 2) :]
        return f"{head}\n{CUT_MARKER.format(n=len(text) - len(head) - len(tail))}\n{tail}"
    head = text[:room]
    return f"{head}\n{CUT_MARKER.format(n=len(text) - len(head))}"


def workspace_path(path: str) -> str:
    """The absolute, normalised sandbox path of a workspace path.

    Args:
        path: Relative to ``/workspace``, or absolute under it.

    Raises:
        ValueError: ``path`` is empty, contains a NUL byte, or leaves the workspace; the message
            is written for the model.
    """
    if not path or "\x00" in path:
        raise ValueError(f"invalid path {path!r}")
    full = posixpath.normpath(path if path.startswith("/") else posixpath.join(WORKSPACE, path))
    if full != WORKSPACE and not full.startswith(WORKSPACE + "/"):
        raise ValueError(
            f"path {path!r} is outside {WORKSPACE}; only workspace files can be used here "
            f"(give a path relative to {WORKSPACE} or starting with {WORKSPACE}/)"
        )
    return full


def check_timeout(timeout: int) -> str | None:
    """An error message when ``timeout`` is not within 1..MAX_TIMEOUT_S seconds, else None."""
    if timeout < 1 or timeout > MAX_TIMEOUT_S:
        return f"Error: timeout must be between 1 and {MAX_TIMEOUT_S} seconds, got {timeout}"
    return None
