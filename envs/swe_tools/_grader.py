"""Grading helper, run inside an episode's sandbox by ``python3 -s -c`` (through
:data:`.grading.BOOTSTRAP`, which first takes the working directory off ``sys.path``).

Standard library (and pytest, for ``project`` mode) only; Python 3.8 or later (it also runs in
SWE-bench images). It reads one JSON request on stdin and prints one line, ``__agentrl_grade__
<nonce> <JSON>`` (``nonce``: the request's, drawn afresh for each grading), then ends with
``os._exit(0)`` so that no exit handler or finalizer can print after it. The host takes only
the last line of a run that exited 0, and only with the right nonce. Every mode first stops what
the episode left running in the sandbox (every process except this command, its ancestors, the
namespace's init and the sandbox's own ``sleep infinity`` holder), so that nothing the agent
started can touch the files while they are graded.

Modes:

* ``stop``: only that; answers ``{"stopped": N}``.
* ``project``: copies the project's source files (``sources``, read from ``root`` without
  following symlinks; missing or non-regular files are left out) into a fresh directory and
  screens those listed in ``originals`` (:func:`screen_source`: against the given and the
  fixed text of each, a source may not add imports nor uses of the interpreter's
  introspection and process hooks, which code under test could use to rewrite the test run
  from inside). It then writes the original test files (``files``) beside them, runs pytest
  there in this process with only our own ini file (no ``conftest.py``, no cache, no plugins
  autoloaded, no user site), checks that the test files are still as written, and answers
  ``{"outcomes": {node id: passed|failed|skipped}, "exit": code}``, or ``{"error": ...}`` when
  a source was refused or a test file changed.
* ``swebench``: puts every test or pytest-configuration file of the repository at ``root``
  (and every path in ``touched``) back as it is in the untouched copy at ``pristine``
  (deleting the ones the copy lacks, and symlinks to directories the copy does not have, which
  would hide files from that walk), deletes new top-level modules the copy lacks that shadow
  an installed or standard one (a ``pytest.py`` or ``inspect.py`` in the working directory is
  what ``python -m pytest`` would import), then applies the unified diff ``patch`` (``git
  apply`` when git is there, else our own exact-match applier). Answers ``{"applied": true}``
  or ``{"applied": false, "error": ...}``.

The module can be imported (``main`` runs only as ``__main__``) for :func:`patch_files`.
"""

import ast
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


_RISKY_NAMES = frozenset({
    "__import__", "eval", "exec", "compile", "globals", "locals", "vars", "getattr", "setattr",
    "delattr", "open", "breakpoint", "input",
})
"""Builtins that reach objects or files by name, or run code from text."""
_RISKY_ATTRIBUTES = frozenset({
    "modules", "meta_path", "path_hooks", "path_importer_cache", "settrace", "setprofile",
    "addaudithook", "excepthook", "unraisablehook", "displayhook", "breakpointhook",
    "_getframe", "_current_frames", "_exit", "f_back", "f_globals", "f_locals", "f_builtins",
    "f_code", "f_trace", "tb_frame", "tb_next", "gi_frame", "cr_frame", "ag_frame",
    "get_objects", "get_referrers", "get_referents", "currentframe", "stack", "attrgetter",
    "methodcaller", "kill", "killpg", "abort", "system", "popen", "fork", "forkpty", "execv",
    "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnv", "spawnve",
    "posix_spawn", "posix_spawnp", "dup2", "chmod", "unlink", "rename", "rmdir", "symlink",
    "write_text", "write_bytes",
})
"""Attributes of the interpreter's introspection (frames, the module table, the garbage
collector), its hooks, and process or file-system control."""
_PLAIN_DUNDERS = frozenset(
    f"__{name}__" for name in (
        "init new del repr str bytes format hash bool len iter next reversed contains getitem "
        "setitem delitem missing call enter exit eq ne lt le gt ge add sub mul matmul truediv "
        "floordiv mod divmod pow lshift rshift and xor or neg pos abs invert complex int float "
        "index round trunc floor ceil radd rsub rmul rmatmul rtruediv rfloordiv rmod rdivmod "
        "rpow rlshift rrshift rand rxor ror iadd isub imul imatmul itruediv ifloordiv imod ipow "
        "ilshift irshift iand ixor ior name qualname doc module all slots version "
        "class_getitem init_subclass set_name copy deepcopy reduce reduce_ex getstate setstate "
        "getnewargs getnewargs_ex sizeof fspath length_hint"
    ).split()
)
"""Special-method and descriptive names: any other ``__x__`` (``__globals__``,
``__subclasses__``, ``__builtins__``, ``__stdout__``...) counts as risky."""


def _risky_uses(tree):
    """{identifier: uses} of the risky names, attributes and dunders in ``tree``, and the set
    of modules it imports."""
    uses, imports = {}, set()

    def note(name, risky):
        if risky or (name.startswith("__") and name.endswith("__") and name not in _PLAIN_DUNDERS):
            uses[name] = uses.get(name, 0) + 1

    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            note(node.id, node.id in _RISKY_NAMES)
        elif isinstance(node, ast.Attribute):
            note(node.attr, node.attr in _RISKY_ATTRIBUTES)
        elif isinstance(node, ast.Import):
            imports.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            imports.add(module)
            for alias in node.names:
                note(alias.name, alias.name in _RISKY_ATTRIBUTES)
    return uses, imports


def screen_source(source, originals):
    """Why ``source`` (bytes) is refused, or ``None``.

    A graded source may not import a module that none of ``originals`` (the task's texts of
    that file) imports, nor use a risky builtin, attribute or dunder (see ``_RISKY_NAMES``,
    ``_RISKY_ATTRIBUTES``, ``_PLAIN_DUNDERS``) more often than the original that uses it most.
    Code under test runs in the test process: with those it could rewrite the run's reports.
    A source that does not parse is not refused here (it fails its tests).
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    allowed_uses, allowed_imports = {}, set()
    for text in originals:
        try:
            uses, imports = _risky_uses(ast.parse(text))
        except (SyntaxError, ValueError):
            continue
        allowed_imports |= imports
        for name, count in uses.items():
            allowed_uses[name] = max(allowed_uses.get(name, 0), count)
    uses, imports = _risky_uses(tree)
    new_imports = sorted(imports - allowed_imports)
    if new_imports:
        return "imports " + ", ".join(new_imports) + ", which the original does not"
    extra = sorted(name for name, count in uses.items() if count > allowed_uses.get(name, 0))
    if extra:
        return "uses " + ", ".join(extra) + " more often than the original"
    return None


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
    originals = req.get("originals") or {}
    for rel in req["sources"]:
        data = _read_source(req["root"], rel)
        if data is not None:
            texts = originals.get(rel)
            reason = None if texts is None else screen_source(data, texts)
            if reason is not None:
                shutil.rmtree(workdir, ignore_errors=True)
                return {"error": f"{rel} was refused: it {reason} (code under test may not "
                                 "reach into the test run)"}
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
    changed = sorted(rel for rel, content in req["files"].items()
                     if _read_source(workdir, rel) != content.encode("utf-8"))
    os.chdir("/")
    shutil.rmtree(workdir, ignore_errors=True)
    if changed:
        return {"error": "test files changed while the tests ran: " + ", ".join(changed),
                "log_tail": sink.text[-4000:]}
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
    r"|(^|/)(\.?pytest\.ini|\.?pytest\.toml|tox\.ini|setup\.cfg|pyproject\.toml)$"
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


def _shadows(name):
    """Whether a top-level module ``name`` exists outside the working directory (so a file of
    that name in it would be imported instead, by ``python -m pytest`` for one)."""
    import importlib.util

    if name in sys.builtin_module_names:
        return False
    kept = sys.path[:]
    sys.path[:] = [p for p in kept if p not in ("", ".", os.getcwd())]
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
    finally:
        sys.path[:] = kept


_MODULE_FILE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\.[^/]*)?\.(py|pyc|so|pyd)$")


def _unhide(root, pristine, original):
    """Removes what the untouched copy lacks and would hide files from the restore walk or
    shadow installed modules: symlinks to directories, and top-level modules or regular
    packages named like an installed or standard module. Returns how many."""
    removed = 0
    links = {rel for rel in original if os.path.islink(os.path.join(pristine, rel))}
    for rel in sorted(_tree(root)):
        here = os.path.join(root, rel)
        if rel not in links and os.path.islink(here) and os.path.isdir(here):
            _remove(here)
            removed += 1
    for name in sorted(os.listdir(root)):
        here = os.path.join(root, name)
        if os.path.lexists(os.path.join(pristine, name)):
            continue
        match = _MODULE_FILE.match(name)
        module = match.group(1) if match and not os.path.isdir(here) else None
        if (os.path.isdir(here) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name)
                and any(f.startswith("__init__.") for f in os.listdir(here))):
            module = name  # a regular package (a plain folder does not shadow one)
        if module is not None and _shadows(module):
            _remove(here)
            removed += 1
    return removed


def swebench(req):
    """``swebench`` mode (see the module docstring)."""
    root, pristine = req["root"], req["pristine"]
    original = _tree(pristine)
    touched = set(req["touched"])
    restored = _unhide(root, pristine, original)
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
    sys.__stdout__.write(MARKER + str(req.get("nonce", "")) + " " + json.dumps(answer) + "\n")
    sys.__stdout__.flush()
    os._exit(0)  # no exit handler or finalizer left by the graded code may print after this


if __name__ == "__main__":
    main()
