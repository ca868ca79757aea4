"""Grading helper, run inside an episode's sandbox as ``python3 -s -P -c <this file>``.

Standard library (and pytest, for ``project`` mode) only. It reads one JSON request on stdin
and prints one line, ``__agentrl_grade__ <JSON>``. Every mode first stops what the episode left
running in the sandbox (every process except this command, its ancestors, the namespace's init
and the sandbox's own ``sleep infinity`` holder), so that nothing the agent started can touch
the files while they are graded.

Modes:

* ``stop``: only that; answers ``{"stopped": N}``.
* ``project``: copies the project's source files (``sources``, read from ``root`` without
  following symlinks; missing or non-regular files are left out) into a fresh directory, writes
  the original test files (``files``) beside them, runs pytest there in this process with only
  our own ini file (no ``conftest.py``, no cache, no plugins autoloaded, no user site) and
  answers ``{"outcomes": {node id: passed|failed|skipped}, "exit": code}``.
* ``swebench``: puts every test or pytest-configuration file of the repository at ``root``
  (and every path in ``touched``) back as it is in the untouched copy at ``pristine``
  (deleting the ones the copy lacks), then applies the unified diff ``patch`` (``git apply``
  when git is there, else our own exact-match applier). Answers ``{"applied": true}`` or
  ``{"applied": false, "error": ...}``.

The module can be imported (``main`` runs only as ``__main__``) for :func:`patch_files`.
"""

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

MARKER = "__agentrl_grade__ "
MAX_SOURCE_BYTES = 8 << 20


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


def _others():
    keep = {1}
    pid = os.getpid()
    while pid > 1:
        keep.add(pid)
        pid = _ppid(pid)
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in keep and not _is_holder(int(name)):
            found.append(int(name))
    return found


def stop_others():
    """Stops, then kills, every other process of the sandbox (repeated while new ones show)."""
    stopped = 0
    for _ in range(10):
        pids = _others()
        alive = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
                alive.append(pid)
            except OSError:
                pass
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                stopped += 1
            except OSError:
                pass
        time.sleep(0.05)
    return stopped


def _read_source(root, rel):
    path = os.path.join(root, rel)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
        return None if len(data) > MAX_SOURCE_BYTES else data
    finally:
        os.close(fd)


def _write(base, rel, data):
    path = os.path.join(base, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


class _Recorder:
    """pytest plugin: one outcome per test node id."""

    def __init__(self):
        self.outcomes = {}

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.outcomes[report.nodeid] = "failed"
        elif report.skipped and report.when in ("setup", "call"):
            self.outcomes.setdefault(report.nodeid, "skipped")
        elif report.passed and report.when == "call":
            self.outcomes.setdefault(report.nodeid, "passed")


class _Capped:
    """A text sink keeping the last ``limit`` characters (pytest's terminal output)."""

    def __init__(self, limit=20000):
        self.limit, self.text = limit, ""

    def write(self, s):
        self.text = (self.text + s)[-self.limit :]
        return len(s)

    def flush(self):
        pass

    def isatty(self):
        return False


def grade_project(req):
    """``project`` mode (see the module docstring)."""
    workdir = tempfile.mkdtemp(prefix="agentrl-grade-")
    for rel in req["sources"]:
        data = _read_source(req["root"], rel)
        if data is not None:
            _write(workdir, rel, data)
    for rel, content in req["files"].items():
        _write(workdir, rel, content)
    ini = os.path.join(workdir, ".agentrl-grading.ini")
    _write(workdir, ini, "[pytest]\n")
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    os.environ.pop("PYTEST_ADDOPTS", None)
    sys.dont_write_bytecode = True
    sys.path.insert(0, workdir)
    os.chdir(workdir)
    import pytest

    recorder = _Recorder()
    sink = _Capped()
    real_stdout, real_stderr = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = sink
    try:
        code = pytest.main(
            ["-q", "-p", "no:cacheprovider", "--noconftest", "-c", ini, "--rootdir", workdir,
             *req["targets"]],
            plugins=[recorder],
        )
    finally:
        sys.stdout, sys.stderr = real_stdout, real_stderr
    os.chdir("/")
    shutil.rmtree(workdir, ignore_errors=True)
    return {"outcomes": recorder.outcomes, "exit": int(code), "log_tail": sink.text[-4000:]}


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def patch_files(patch):
    """[(old path, new path, [(old start, old lines, new lines)])] of a unified diff."""
    files, lines, i = [], patch.splitlines(keepends=True), 0
    while i < len(lines):
        if not (lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            i += 1
            continue
        old = lines[i][4:].rstrip("\n").split("\t")[0]
        new = lines[i + 1][4:].rstrip("\n").split("\t")[0]
        hunks, i = [], i + 2
        while i < len(lines) and (match := _HUNK.match(lines[i])):
            old_left = int(match.group(2) or 1)
            new_left = int(match.group(4) or 1)
            before, after, i = [], [], i + 1
            while i < len(lines) and (old_left or new_left):
                line = lines[i]
                tag, text = line[:1], line[1:] or "\n"
                if tag in (" ", "\n"):
                    text = "\n" if tag == "\n" else text
                    before.append(text)
                    after.append(text)
                    old_left, new_left = old_left - 1, new_left - 1
                elif tag == "-":
                    before.append(text)
                    old_left -= 1
                elif tag == "+":
                    after.append(text)
                    new_left -= 1
                i += 1
            hunks.append((int(match.group(1)), before, after))
        files.append((old, new, hunks))
    return files


def _strip(path):
    return None if path == "/dev/null" else re.sub(r"^[ab]/", "", path)


_TEST_LIKE = re.compile(
    r"(^|/)(tests?|testing)/|(^|/)test_[^/]*\.py$|_tests?\.py$|(^|/)conftest\.py$"
    r"|(^|/)(pytest\.ini|tox\.ini|setup\.cfg|pyproject\.toml)$"
)


def _remove(path):
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def _git(root, *args, data=None):
    return subprocess.run(["git", "-C", root, *args], input=data, capture_output=True,
                          text=True, timeout=300, check=False)


def _tree(root):
    """Relative paths of the files and symlinks under root (``.git`` skipped)."""
    found = set()
    for here, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git" and not os.path.islink(os.path.join(here, d))]
        rel = os.path.relpath(here, root)
        for name in files + [d for d in os.listdir(here) if os.path.islink(os.path.join(here, d))]:
            found.add(os.path.normpath(os.path.join(rel, name)))
    return found


def _same(a, b):
    if os.path.islink(a) or not os.path.isfile(a):
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def swebench(req):
    """``swebench`` mode (see the module docstring)."""
    root, pristine = req["root"], req["pristine"]
    original = _tree(pristine)
    touched = set(req["touched"])
    restored = 0
    for rel in sorted(_tree(root) | original):
        if not (_TEST_LIKE.search(rel) or rel in touched):
            continue
        here, there = os.path.join(root, rel), os.path.join(pristine, rel)
        if rel in original and not os.path.islink(there):
            if not _same(here, there):
                _remove(here)
                os.makedirs(os.path.dirname(here), exist_ok=True)
                shutil.copyfile(there, here)
                restored += 1
        elif os.path.lexists(here):
            _remove(here)
            restored += 1
    if shutil.which("git") and os.path.isdir(os.path.join(root, ".git")):
        if _git(root, "apply", "-v", "-", data=req["patch"]).returncode == 0:
            return {"applied": True, "restored": restored}
    return {**apply_patch(req), "restored": restored}


def apply_patch(req):
    """Applies every file of the diff, or none (each hunk must match exactly)."""
    results = {}
    for old, new, hunks in patch_files(req["patch"]):
        src, dst = _strip(old), _strip(new)
        text = ""
        if src is not None:
            data = _read_source(req["root"], src)
            if data is None:
                return {"applied": False, "error": f"{src}: missing"}
            text = data.decode("utf-8")
        lines = text.splitlines(keepends=True)
        offset = 0
        for start, before, after in hunks:
            at = max(start - 1 + offset, 0) if before else start + offset
            if lines[at : at + len(before)] != before:
                return {"applied": False, "error": f"{src or dst}: hunk at line {start} does not match"}
            lines[at : at + len(before)] = after
            offset += len(after) - len(before)
        results[(src, dst)] = "".join(lines)
    for (src, dst), content in results.items():
        if dst is None:
            os.unlink(os.path.join(req["root"], src))
        else:
            _write(req["root"], dst, content)
    return {"applied": True}


def main():
    """Reads the request, stops leftovers, runs the mode, prints the answer line."""
    req = json.loads(sys.stdin.read())
    answer = {"stopped": stop_others()}
    if req["mode"] == "project":
        answer.update(grade_project(req))
    elif req["mode"] == "swebench":
        answer.update(swebench(req))
    sys.__stdout__.write(MARKER + json.dumps(answer) + "\n")
    sys.__stdout__.flush()


if __name__ == "__main__":
    main()
