"""Fork-server that runs a module's unittest suite against many versions of the module.

Run by the task generator with the sandboxes' interpreter (``/usr/bin/python3``), so that
mutants are judged by the Python that grades them later. Standard library only: it must not
import agentrl.

Protocol: one JSON object per line on stdin, one JSON answer per line on stdout.

* ``{"op": "setup", "module": NAME, "module_path": P, "source": MODULE_SOURCE, "tests": SOURCE,
  "tests_path": P}`` stores the test source and imports what both files import (so each forked
  child starts warm).
* ``{"op": "run", "source": MODULE_SOURCE, "timeout": S, "cpu_limit": S, "trace": BOOL}``
  forks a child (wall-clock ``timeout``, optional CPU-time limit, 1 GiB of memory) that
  imports the source as ``NAME``, runs every ``TestCase`` of the test source and reports
  ``{"ok": true, "tests": {id: [outcome, defining_class, detail]}, "lines": [...],
  "duration_s": ..., "cpu_s": ...}``; ``{"ok": false, "error": ...}`` when the child crashed or timed out.
  ``detail`` is ``null`` unless the test failed: then ``{"type", "message", "frames",
  "raised_in_module"}`` where frames are the (line, function) pairs of the traceback inside the
  test file and ``raised_in_module`` tells whether the module itself raised the exception
  (rather than a failed check of the test).
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import resource
import select
import signal
import sys
import time
import types
import unittest

MEMORY_LIMIT_BYTES = 1 << 30
RESULT_LIMIT_BYTES = 8 << 20


class _Recorder(unittest.TestResult):
    """Records one outcome per test (the first failure of a test wins)."""

    def __init__(self, tests_path: str, module_path: str) -> None:
        super().__init__()
        self.tests_path = tests_path
        self.module_path = module_path
        self.outcomes: dict[str, list] = {}

    def _key(self, test: unittest.TestCase) -> list:
        cls = type(test)
        name = test._testMethodName
        owner = next((k.__name__ for k in cls.__mro__ if name in vars(k)), cls.__name__)
        return [f"{cls.__name__}.{name}", owner]

    def _set(self, test: unittest.TestCase, outcome: str, err: tuple | None = None) -> None:
        test_id, owner = self._key(test)
        previous = self.outcomes.get(test_id)
        if previous is not None and previous[0] in ("fail", "error"):
            return
        detail = None
        if err is not None:
            exc_type, exc, tb = err
            frames = []
            in_module = False
            while tb is not None:
                code = tb.tb_frame.f_code
                in_module = code.co_filename == self.module_path
                if code.co_filename == self.tests_path:
                    frames.append([tb.tb_lineno, code.co_name])
                tb = tb.tb_next
            try:
                message = str(exc)
            except Exception as inner:  # noqa: BLE001 - a broken __str__ is still a failure
                message = f"<unprintable {type(exc).__name__}: {inner!r}>"
            detail = {"type": exc_type.__name__, "message": message[:4000], "frames": frames,
                      "raised_in_module": in_module}
        self.outcomes[test_id] = [outcome, owner, detail]

    def addSuccess(self, test):
        self._set(test, "pass")

    def addFailure(self, test, err):
        self._set(test, "fail", err)

    def addError(self, test, err):
        if isinstance(test, unittest.TestCase):
            self._set(test, "error", err)

    def addSkip(self, test, reason):
        if isinstance(test, unittest.TestCase):
            self._set(test, "skip")

    def addExpectedFailure(self, test, err):
        self._set(test, "xfail")

    def addUnexpectedSuccess(self, test):
        self._set(test, "fail")

    def addSubTest(self, test, subtest, err):
        if err is not None:
            kind = "fail" if issubclass(err[0], test.failureException) else "error"
            self._set(test, kind, err)


def _imported_names(source: str) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


def _child(setup: dict, request: dict, write_fd: int) -> None:
    os.setpgid(0, 0)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    if request.get("cpu_limit"):
        cpu = float(request["cpu_limit"])
        signal.setitimer(signal.ITIMER_PROF, cpu)  # SIGPROF ends the child
        hard = int(cpu) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    started = time.perf_counter()
    cpu_started = time.process_time()
    lines: set[int] = set()
    module_path = setup["module_path"]
    if request.get("trace"):
        def local(frame, event, arg):
            if event == "line":
                lines.add(frame.f_lineno)
            return local

        def tracer(frame, event, arg):
            return local if frame.f_code.co_filename == module_path else None

        sys.settrace(tracer)
    try:
        module = types.ModuleType(setup["module"])
        module.__file__ = module_path
        sys.modules[setup["module"]] = module
        exec(compile(request["source"], module_path, "exec"), module.__dict__)
        tests = types.ModuleType("test_module")
        tests.__file__ = setup["tests_path"]
        sys.modules["test_module"] = tests
        exec(compile(setup["tests"], setup["tests_path"], "exec"), tests.__dict__)
        suite = unittest.defaultTestLoader.loadTestsFromModule(tests)
        recorder = _Recorder(setup["tests_path"], module_path)
        suite.run(recorder)
        sys.settrace(None)
        answer = {"ok": True, "tests": recorder.outcomes, "lines": sorted(lines),
                  "duration_s": time.perf_counter() - started,
                  "cpu_s": time.process_time() - cpu_started}
    except BaseException as exc:  # noqa: BLE001 - an import-time failure is a result
        sys.settrace(None)
        answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    data = json.dumps(answer).encode()[:RESULT_LIMIT_BYTES]
    with os.fdopen(write_fd, "wb") as pipe:
        pipe.write(data)
    os._exit(0)


def _run(setup: dict, request: dict) -> dict:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            _child(setup, request, write_fd)
        finally:
            os._exit(1)
    os.close(write_fd)
    deadline = time.monotonic() + float(request.get("timeout", 10))
    chunks = []
    timed_out = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([read_fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(read_fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_fd)
    if timed_out:
        for target in (-pid, pid):
            try:
                os.kill(target, signal.SIGKILL)
            except ProcessLookupError:
                pass
    os.waitpid(pid, 0)
    if timed_out:
        return {"ok": False, "error": "timeout"}
    try:
        return json.loads(b"".join(chunks) or b"null") or {"ok": False, "error": "no result"}
    except ValueError:
        return {"ok": False, "error": "unreadable result"}


def main() -> None:
    """Serves setup and run requests until stdin closes."""
    setup: dict = {}
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "setup":
            setup = request
            setup["code"] = compile(request["tests"], request["tests_path"], "exec")
            for name in _imported_names(request["tests"]) + _imported_names(request.get("source", "")):
                if name.split(".")[0] != request["module"]:
                    try:
                        importlib.import_module(name)
                    except Exception:  # noqa: BLE001 - the child reports import errors
                        pass
            answer = {"ok": True, "python": sys.version}
        else:
            answer = _run(setup, request)
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
