"""Deterministic, cached generator of swe-tools repair tasks.

Usage::

    python -m agentrl_envs.swe_tools.generate --out DIR [--seed 0] [--modules textwrap,shlex]
        [--per-module 36] [--workers 2]

writes ``DIR/tasks-seed<seed>-<fingerprint>.jsonl`` (one task per line) and prints counts per
module, split and mutation kind, and the time taken. Without ``--out`` it fills the cache that
:class:`~agentrl_envs.swe_tools.SweToolsEnv` reads: ``$AGENTRL_CACHE/swe-tools-v1/`` or, when
``AGENTRL_CACHE`` is unset, ``~/.cache/agentrl/swe-tools-v1/``. The env generates that file on
first use (and logs that it does); the fingerprint in the name covers the generator version,
the parameters, the source files and the test interpreter, so a change regenerates.

How a task is made (see :mod:`~agentrl_envs.swe_tools.sources` and
:mod:`~agentrl_envs.swe_tools.mutate`):

1. A standard-library module and its CPython tests become a tiny project (``<name>_mod.py``,
   ``tests/``, ``pytest.ini``). Tests failing or flaky on the untouched module are dropped.
2. The tests run once with line tracing; mutations are enumerated on executed lines only,
   shuffled by ``seed`` and interleaved by kind.
3. Each mutant runs the whole suite in a forked child of :mod:`._runner` (the sandboxes'
   ``/usr/bin/python3`` when present; ``PYTHONHASHSEED=0``; CPU and memory limits). A mutant is
   kept when it imports, fails at least one test, fails at most half of them, and its line has
   no kept mutant yet.
4. Tests are split per module by a seeded hash into visible (about 30%) and hidden methods;
   methods that the mutant breaks always go to the hidden file, so the visible tests pass on
   the buggy code and at least one hidden test fails.
5. The issue text comes from the first failing test: its name, the failing statement of the
   test and the assertion message; never from the diff.

Train/test split: a fixed hash of ``(seed, task id)`` (20% test).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import fcntl
import hashlib
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentrl_envs.swe_tools import sources
from agentrl_envs.swe_tools.issue import problem_statement
from agentrl_envs.swe_tools.mutate import KINDS, Mutation, enumerate_mutations, inverse_fix
from agentrl_envs.swe_tools.sources import SourceModule

GENERATOR_VERSION = 1
DEFAULT_PER_MODULE = 36
TEST_PER_MILLE = 200
VISIBLE_PER_MILLE = 300
MAX_FAILING_SHARE = 0.5
VISIBLE_PATH = "tests/test_visible.py"
HIDDEN_PATH = "tests/test_hidden.py"
PYTEST_INI = "[pytest]\npythonpath = .\n"
_RUNNER = Path(__file__).with_name("_runner.py")
_log = logging.getLogger("agentrl_envs.swe_tools")


def cache_dir() -> Path:
    """``$AGENTRL_CACHE/swe-tools-v1`` or ``~/.cache/agentrl/swe-tools-v1``."""
    root = os.environ.get("AGENTRL_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "agentrl"
    return base / "swe-tools-v1"


def test_python() -> str:
    """The interpreter that judges mutants: the sandboxes' ``/usr/bin/python3`` if present."""
    return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


_PYTHON_VERSIONS: dict[str, str] = {}


def _python_version(python: str) -> str:
    if python not in _PYTHON_VERSIONS:
        _PYTHON_VERSIONS[python] = subprocess.run(
            [python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True,
            check=True, timeout=60,
        ).stdout.strip()
    return _PYTHON_VERSIONS[python]


def split_of(task_id: str, seed: int = 0) -> str:
    """``test`` for about 20% of task ids (a fixed hash of seed and id), else ``train``."""
    digest = hashlib.blake2b(f"{seed}:{task_id}".encode(), digest_size=8).digest()
    return "test" if int.from_bytes(digest, "big") % 1000 < TEST_PER_MILLE else "train"


def fingerprint(seed: int, modules: Sequence[SourceModule], per_module: int) -> str:
    """Digest of everything the generated rows depend on."""
    h = hashlib.blake2b(digest_size=6)
    h.update(f"v{GENERATOR_VERSION}|{seed}|{per_module}|{_python_version(test_python())}".encode())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if path.name in ("generate.py", "mutate.py", "sources.py", "issue.py", "_runner.py"):
            h.update(path.read_bytes())
    for module in modules:
        h.update(f"|{module.name}|{module.prelude}".encode())
        h.update(module.source_file().read_bytes() + module.test_file().read_bytes())
    return h.hexdigest()


class _Runner:
    """One fork-server process (see :mod:`._runner`); used by one thread at a time."""

    def __init__(self, python: str) -> None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONHASHSEED": "0",
               "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        self.proc = subprocess.Popen(
            [python, "-s", str(_RUNNER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=env, cwd=tempfile.gettempdir(),
        )
        self.module: str | None = None
        self.tests: str | None = None

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the swe-tools test runner exited unexpectedly")
        return json.loads(line)

    def setup(self, module: SourceModule, source: str, tests: str) -> None:
        if (self.module, self.tests) != (module.name, tests):
            self.ask({"op": "setup", "module": module.project_name,
                      "module_path": f"/project/{module.project_path}", "source": source,
                      "tests": tests, "tests_path": "/project/tests/test_all.py"})
            self.module, self.tests = module.name, tests

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class _Baseline:
    """A module's project before mutation: cleaned tests, expected tests, covered lines."""

    def __init__(self, module: SourceModule, runner: _Runner) -> None:
        self.module = module
        self.source = module.source_file().read_text(encoding="utf-8")
        tests = sources.rewrite_tests(module, module.test_file().read_text(encoding="utf-8"))
        for _ in range(3):
            runner.setup(module, self.source, tests)
            first = runner.ask({"op": "run", "source": self.source, "timeout": 120, "trace": True})
            second = runner.ask({"op": "run", "source": self.source, "timeout": 120})
            if not (first.get("ok") and second.get("ok")):
                raise RuntimeError(f"{module.name}: its tests do not run: {first} {second}")
            bad = {
                (owner, test_id.split(".")[1])
                for test_id, (outcome, owner, _) in {**first["tests"], **second["tests"]}.items()
                if outcome in ("fail", "error")
                or first["tests"].get(test_id, [None])[0] != second["tests"].get(test_id, [None])[0]
            }
            if not bad:
                break
            tests = sources.drop_test_methods(tests, bad)
        else:
            raise RuntimeError(f"{module.name}: tests keep failing on the original module")
        self.tests = tests
        self.expected = {t: owner for t, (outcome, owner, _) in first["tests"].items() if outcome == "pass"}
        self.covered = set(first["lines"])
        self.cpu_limit = round(max(0.3, second["cpu_s"] * 10), 2)

    def runs(self, test_id: str) -> tuple[str, str]:
        """(owner class, method) of a test id ``Class.method``."""
        return self.expected[test_id], test_id.split(".", 1)[1]


def _order(mutations: list[Mutation], rng: random.Random) -> list[Mutation]:
    """Seeded shuffle, interleaved by kind so every kind gets its turn."""
    by_kind: dict[str, list[Mutation]] = collections.defaultdict(list)
    for m in mutations:
        by_kind[m.kind].append(m)
    kinds = [k for k in KINDS if k in by_kind]
    rng.shuffle(kinds)
    for k in kinds:
        rng.shuffle(by_kind[k])
    ordered = []
    while any(by_kind[k] for k in kinds):
        ordered += [by_kind[k].pop() for k in kinds if by_kind[k]]
    return ordered


def _visible_methods(base: _Baseline, seed: int) -> set[tuple[str, str]]:
    methods = sorted({base.runs(t) for t in base.expected})
    visible = {
        m for m in methods
        if int(hashlib.blake2b(f"{seed}:{m}".encode(), digest_size=4).hexdigest(), 16) % 1000
        < VISIBLE_PER_MILLE
    }
    return visible or set(methods[:1])


def _task(base: _Baseline, mutation: Mutation, result: dict[str, Any], visible_base: set,
          failing: list[str], seed: int) -> dict[str, Any] | None:
    module = base.module
    visible = visible_base - {base.runs(t) for t in failing}
    all_methods = set(sources.test_methods(base.tests))
    if not any(base.runs(t) in visible for t in base.expected):
        return None
    buggy = mutation.apply(base.source)
    visible_src = sources.drop_test_methods(base.tests, all_methods - visible)
    hidden_src = sources.drop_test_methods(base.tests, visible)

    def node_id(test_id: str) -> str:
        path = VISIBLE_PATH if base.runs(test_id) in visible else HIDDEN_PATH
        return f"{path}::{test_id.replace('.', '::')}"

    task_id = f"swe-{module.name}-{mutation.key}"
    return {
        "id": task_id,
        "module": module.name,
        "split": split_of(task_id, seed),
        "files": {module.project_path: buggy, VISIBLE_PATH: visible_src, "pytest.ini": PYTEST_INI},
        "visible_tests": VISIBLE_PATH,
        "hidden_tests": {HIDDEN_PATH: hidden_src},
        "test_ids": sorted(node_id(t) for t in base.expected),
        "problem_statement": problem_statement(module, base.tests, failing, result["tests"]),
        "fix": inverse_fix(module.project_path, base.source, buggy, mutation),
        "failing_tests": sorted(node_id(t) for t in failing),
        "difficulty": {
            "file_lines": buggy.count("\n") + 1,
            "n_failing_tests": len(failing),
            "n_tests": len(base.expected),
            "mutation_kind": mutation.kind,
        },
        "mutation": {"kind": mutation.kind, "line": mutation.line, "note": mutation.note},
    }


def _module_tasks(module: SourceModule, per_module: int, seed: int, pool: _Pool) -> list[dict[str, Any]]:
    base = pool.call(lambda runner: _Baseline(module, runner))
    visible_base = _visible_methods(base, seed)
    candidates = [m for m in enumerate_mutations(base.source) if m.line in base.covered]
    candidates = _order(candidates, random.Random(f"{seed}:{module.name}"))
    candidates = candidates[: per_module * 10]
    tasks: list[dict[str, Any]] = []
    used_lines: set[int] = set()
    chunk = 4 * pool.size
    for start in range(0, len(candidates), chunk):
        batch = [m for m in candidates[start : start + chunk] if m.line not in used_lines]
        results = pool.map(lambda runner, m: _judge(runner, base, m), batch)
        for mutation, result in zip(batch, results, strict=True):
            if result is None or mutation.line in used_lines:
                continue
            failing = sorted(t for t in base.expected if result["tests"].get(t, ["missing"])[0] != "pass")
            task = _task(base, mutation, result, visible_base, failing, seed)
            if task is not None:
                tasks.append(task)
                used_lines.add(mutation.line)
            if len(tasks) >= per_module:
                return tasks
    return tasks


def _judge(runner: _Runner, base: _Baseline, mutation: Mutation) -> dict[str, Any] | None:
    """The mutant's test results when it is a usable bug, else ``None``."""
    mutant = mutation.apply(base.source)
    try:
        compile(mutant, base.module.project_path, "exec")
    except (SyntaxError, ValueError):
        return None
    runner.setup(base.module, base.source, base.tests)
    result = runner.ask({"op": "run", "source": mutant, "cpu_limit": base.cpu_limit,
                         "timeout": 10 * base.cpu_limit + 10})
    if not result.get("ok"):
        return None
    failing = [t for t in base.expected if result["tests"].get(t, ["missing"])[0] != "pass"]
    if not failing or len(failing) > MAX_FAILING_SHARE * len(base.expected):
        return None
    return result


class _Pool:
    """Threads, each with its own runner process (one per CPU core by default)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.python = test_python()
        self._local = threading.local()
        self._runners: list[_Runner] = []
        self._lock = threading.Lock()
        self._executor = concurrent.futures.ThreadPoolExecutor(size, thread_name_prefix="swe-gen")

    def _runner(self) -> _Runner:
        runner = getattr(self._local, "runner", None)
        if runner is None:
            runner = self._local.runner = _Runner(self.python)
            with self._lock:
                self._runners.append(runner)
        return runner

    def call(self, fn: Callable[[_Runner], Any]) -> Any:
        return self._executor.submit(lambda: fn(self._runner())).result()

    def map(self, fn: Callable[[_Runner, Any], Any], items: Sequence[Any]) -> list[Any]:
        futures = [self._executor.submit(lambda item=item: fn(self._runner(), item)) for item in items]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._executor.shutdown()
        for runner in self._runners:
            runner.close()


def generate(*, seed: int = 0, modules: Sequence[str] | None = None,
             per_module: int = DEFAULT_PER_MODULE, workers: int | None = None) -> list[dict[str, Any]]:
    """Generates the task rows (deterministic for the same arguments and machine).

    Args:
        seed: Drives the mutant order, the visible/hidden test split and the train/test split.
        modules: Standard-library module names (default: :data:`sources.MODULES`).
        per_module: Most tasks per module.
        workers: Test-runner processes (default: the CPU count, at most 4).
    """
    chosen = [sources.module_by_name(n) for n in modules] if modules else list(sources.MODULES)
    pool = _Pool(workers or min(4, os.cpu_count() or 1))
    try:
        rows: list[dict[str, Any]] = []
        for module in chosen:
            started = time.monotonic()
            rows += (found := _module_tasks(module, per_module, seed, pool))
            _log.info("swe-tools: %s: %d tasks in %.1f s", module.name, len(found),
                      time.monotonic() - started)
    finally:
        pool.close()
    return rows


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def tasks_path(directory: Path | None = None, *, seed: int = 0, modules: Sequence[str] | None = None,
               per_module: int = DEFAULT_PER_MODULE) -> Path:
    """Where the rows for these arguments live (``directory`` defaults to :func:`cache_dir`)."""
    chosen = [sources.module_by_name(n) for n in modules] if modules else list(sources.MODULES)
    name = f"tasks-seed{seed}-{fingerprint(seed, chosen, per_module)}.jsonl"
    return (directory or cache_dir()) / name


def load_or_generate(directory: Path | None = None, *, seed: int = 0,
                     modules: Sequence[str] | None = None,
                     per_module: int = DEFAULT_PER_MODULE) -> list[dict[str, Any]]:
    """The cached rows, generated (under a file lock, written atomically) when missing."""
    path = tasks_path(directory, seed=seed, modules=modules, per_module=per_module)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.parent / f".{path.name}.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                _log.warning("swe-tools: no task cache at %s; generating the tasks now (first "
                             "use; about a minute on 2 cores)", path)
                started = time.monotonic()
                rows = generate(seed=seed, modules=modules, per_module=per_module)
                _write_jsonl(path, rows)
                _log.warning("swe-tools: generated %d tasks in %.0f s", len(rows),
                             time.monotonic() - started)
            fcntl.flock(lock, fcntl.LOCK_UN)
    return read_jsonl(path)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The task rows of a JSONL file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def summary(rows: list[dict[str, Any]]) -> str:
    """Counts per module and split, and per mutation kind."""
    per = collections.Counter((r["module"], r["split"]) for r in rows)
    kinds = collections.Counter(r["difficulty"]["mutation_kind"] for r in rows)
    lines = [f"{len(rows)} tasks"]
    for module in sorted({r["module"] for r in rows}):
        lines.append(f"  {module:10s} train {per[(module, 'train')]:3d}  test {per[(module, 'test')]:3d}")
    lines.append("  kinds: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: generate, write the JSONL, print the summary and the time taken."""
    parser = argparse.ArgumentParser(prog="python -m agentrl_envs.swe_tools.generate",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="directory (default: the cache)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modules", default=None, help="comma-separated stdlib module names")
    parser.add_argument("--per-module", type=int, default=DEFAULT_PER_MODULE)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args(argv)
    modules = args.modules.split(",") if args.modules else None
    started = time.monotonic()
    rows = generate(seed=args.seed, modules=modules, per_module=args.per_module, workers=args.workers)
    path = tasks_path(args.out, seed=args.seed, modules=modules, per_module=args.per_module)
    _write_jsonl(path, rows)
    print(summary(rows))
    print(f"wrote {path} in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
