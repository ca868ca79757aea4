"""``run_tests``: run pytest in the sandbox and return a compact summary.

pytest runs under a small driver inside the sandbox that keeps the start and the end of the
output (the failure sections come first, the counts line last) and stops the run itself shortly
before the sandbox's timeout would, so even a hung or flooding test suite yields a summary.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from agentrl import EpisodeState, tool
from agentrl.sandbox import Sandbox, SandboxError
from agentrl_tools._common import TOOL_TIMEOUT_S, check_timeout, clip

MAX_FAILURES = 10
"""Failures (and errors) described one by one; the rest are counted."""
FAILURE_LINES = 15
"""Last lines of each failure's traceback that are shown."""
CAPTURED_LINES = 5
"""Last lines of each failure's captured output that are shown."""
LINE_CHARS = 300
DRIVER_KEEP_BYTES = 24_000
"""Bytes of pytest output the driver keeps from the start, and again from the end."""

PYTEST_ARGS = ("-q", "--tb=short", "-p", "no:cacheprovider")
_EXIT = "__agentrl_exit__"

# Runs `python3 -m pytest ARGS` with its output in a pipe, keeping the first and last
# DRIVER_KEEP_BYTES; after LIMIT seconds kills the run's process group. Prints the kept output,
# then "__agentrl_exit__ CODE" (CODE: pytest's exit status, or "timeout").
_DRIVER = r"""
import os, signal, subprocess, sys, threading
limit, keep, args = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
proc = subprocess.Popen([sys.executable, "-m", "pytest", *args], stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
head, tail, seen = bytearray(), bytearray(), [0]
def pump():
    while True:
        chunk = proc.stdout.read1(65536)
        if not chunk:
            return
        seen[0] += len(chunk)
        room = keep - len(head)
        if room > 0:
            head.extend(chunk[:room])
            chunk = chunk[room:]
        tail.extend(chunk)
        del tail[:-keep]
reader = threading.Thread(target=pump, daemon=True)
reader.start()
try:
    code = str(proc.wait(timeout=limit))
except subprocess.TimeoutExpired:
    code = "timeout"
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()
reader.join(2.0)
out = sys.stdout.buffer
out.write(bytes(head))
cut = seen[0] - len(head) - len(tail)
if cut > 0:
    out.write(b"\n[... %d bytes of pytest output cut ...]\n" % cut)
out.write(bytes(tail))
out.write(b"\n__agentrl_exit__ " + code.encode() + b"\n")
"""

_SECTION_BLOCK = re.compile(r"^={3,} (.+?) ={3,}$")
_SECTION = re.compile(r"^_{3,} (.+?) _{3,}$")
_CAPTURED = re.compile(r"^-{3,} .+ -{3,}$")
_COUNT_WORDS = re.compile(
    r"\b\d+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?)\b|no tests ran"
)
_DURATION = re.compile(r"\bin \d+(\.\d+)?s\b( \(\d+:\d\d:\d\d\))?")  # "in 75.32s (0:01:15)" too


@tool(timeout=TOOL_TIMEOUT_S + 30)
async def run_tests(
    path: str | None = None, timeout: int = 300, *, sandbox: Sandbox, state: EpisodeState
) -> str:
    """Runs the task's tests with pytest in the sandbox and summarises the result.

    Returns the counts line (e.g. "1 failed, 4 passed"), then for each failing test
    (at most 10) its id and the end of its traceback. For full output, run pytest with bash.

    Args:
        path: Test file, directory or test id (e.g. "tests/test_app.py::test_add"), relative to
            /workspace; several may be given separated by spaces. Default: the task's tests.
        timeout: Seconds before the test run is stopped (1-600).
    """
    if error := check_timeout(timeout):
        return error
    targets = _targets(path, state)
    if isinstance(targets, str):
        return targets
    argv = ["python3", "-c", _DRIVER, str(timeout), str(DRIVER_KEEP_BYTES), *PYTEST_ARGS,
            *targets]
    try:
        result = await sandbox.exec(
            argv, timeout=timeout + 20, env={"PYTHONDONTWRITEBYTECODE": "1"}
        )
    except SandboxError as exc:
        return f"Error: the sandbox could not run pytest: {exc}"
    return clip(summarize(result.stdout, result.stderr, " ".join(targets), timeout, result.timed_out))


def _targets(path: str | None, state: EpisodeState) -> list[str] | str:
    """The pytest targets, or an error message."""
    default = state.task.get("visible_tests", "tests")
    if path is None or not path.strip():
        if isinstance(default, str):
            path = default
        elif isinstance(default, Sequence):
            return [str(p) for p in default]
        else:
            path = "tests"
    try:
        targets = shlex.split(path)
    except ValueError as exc:
        return f"Error: cannot split path {path!r} into test paths: {exc}"
    if any(t.startswith("-") for t in targets):
        return (
            "Error: path takes test paths or ids only, not pytest options; to pass options, run "
            "`python3 -m pytest ...` with the bash tool"
        )
    return targets or ["tests"]


def summarize(stdout: str, stderr: str, where: str, timeout: int, killed: bool) -> str:
    """The model-facing summary of a driver run.

    Args:
        stdout: The driver's output (kept pytest output, then the exit line).
        stderr: The driver's error output.
        where: The targets, for messages.
        timeout: The run's time limit in seconds.
        killed: The sandbox killed the driver itself (it did not report an exit status).
    """
    text, code = stdout, ""
    if f"\n{_EXIT} " in stdout:
        text, _, code_part = stdout.rpartition(f"\n{_EXIT} ")
        code = code_part.strip()
    lines = text.splitlines()
    counts = _counts_line(lines)
    if "No module named pytest" in text or "No module named pytest" in stderr:
        return "Error: pytest is not installed in this sandbox; run the tests another way with bash"
    if killed or not code:
        return (
            f"Error: the test run of {where} did not finish within {timeout} s and was killed."
            + _tail_note(text + stderr)
        )
    if code == "timeout":
        head = f"Timed out: the tests of {where} did not finish within {timeout} s; the run was stopped."
        details = _failures(lines)
        return "\n\n".join(p for p in (head, details, _tail_note(text).strip()) if p)
    if code == "0":
        return counts or "All tests passed."
    if code == "5":
        return f"No tests were collected from {where} ({counts or 'no tests ran'})."
    if code == "4":
        return f"Error: pytest could not run {where}:" + _tail_note(text + stderr)
    if code not in ("1", "2"):
        return f"Error: pytest stopped with exit status {code}:" + _tail_note(text + stderr)
    details = _failures(lines)
    status = counts or "Some tests failed (no counts line in the output)."
    if code == "2" and "Interrupted" in text:
        status += " (the run was interrupted: fix the errors below first)"
    return status + ("\n\n" + details if details else _tail_note(text))


def _counts_line(lines: list[str]) -> str:
    """pytest's summary line without its wall time: the same run always reads the same, so an
    episode's observations (and a demonstration written from them) do not vary with load."""
    for line in reversed(lines):
        if _DURATION.search(line) and _COUNT_WORDS.search(line):
            return " ".join(_DURATION.sub("", line).strip("= ").split())
    return ""


def _tail_note(text: str, count: int = 25) -> str:
    kept = [line for line in text.splitlines() if line.strip()]
    tail = [line[:LINE_CHARS] for line in kept[-count:]]
    return ("\n" + "\n".join(tail)) if tail else ""


def _failures(lines: list[str]) -> str:
    """Id and traceback end of each failure/error section, ids from the short summary."""
    sections: list[tuple[str, str, list[str]]] = []  # (kind, header name, body lines)
    ids: dict[str, list[str]] = {"FAILED": [], "ERROR": []}
    block = ""
    for line in lines:
        match = _SECTION_BLOCK.match(line)
        if match:
            block = match.group(1).strip()
            continue
        if block in ("FAILURES", "ERRORS"):
            match = _SECTION.match(line)
            if match:
                sections.append(("FAILED" if block == "FAILURES" else "ERROR", match.group(1), []))
            elif sections:
                sections[-1][2].append(line)
        elif block == "short test summary info":
            kind, _, rest = line.partition(" ")
            if kind in ids:
                ids[kind].append(rest.partition(" - ")[0].strip())
    if not sections:
        return ""
    seen = {"FAILED": 0, "ERROR": 0}
    parts = []
    for kind, name, body in sections[:MAX_FAILURES]:
        index = seen[kind]
        seen[kind] += 1
        known = ids[kind]
        test_id = known[index] if len(known) == sum(1 for s in sections if s[0] == kind) else name
        parts.append(f"{kind} {test_id}\n" + _section_text(body))
    if len(sections) > MAX_FAILURES:
        parts.append(f"[... {len(sections) - MAX_FAILURES} more failures/errors not shown]")
    return "\n\n".join(parts)


def _section_text(body: list[str]) -> str:
    """The end of the traceback, then the end of each captured-output block."""
    chunks: list[tuple[str, list[str]]] = [("", [])]
    for line in body:
        if _CAPTURED.match(line):
            chunks.append((line.strip("- "), []))
        else:
            chunks[-1][1].append(line)
    trace = [line for line in chunks[0][1] if line.strip()]
    out = [f"    {line[:LINE_CHARS]}" for line in trace[-FAILURE_LINES:]]
    if len(trace) > FAILURE_LINES:
        out.insert(0, f"    [... {len(trace) - FAILURE_LINES} earlier traceback lines cut ...]")
    for title, captured in chunks[1:]:
        kept = [line for line in captured if line.strip()][-CAPTURED_LINES:]
        if kept:
            out.append(f"    {title} (last lines):")
            out += [f"      {line[:LINE_CHARS]}" for line in kept]
    return "\n".join(out)
