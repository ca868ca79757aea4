"""Where swe-tools tasks come from: standard-library modules and their CPython unit tests.

Each source module is a pure-Python file of the running interpreter's standard library
(``sysconfig.get_paths()["stdlib"]``) with a test file in its ``test`` package. A task's project
holds the module under a new name (``textwrap`` -> ``textwrap_mod.py``), so it never collides
with the standard library, and its tests rewritten to import it: ``import textwrap`` becomes
``import textwrap_mod as textwrap``, so the test bodies, names and messages stay as CPython wrote
them. Imports from CPython's private ``test`` package are removed: the few helpers used are
replaced by small definitions of our own (:attr:`SourceModule.prelude`), and test methods that
need anything else are dropped.

Text edits here work on whole lines located through the AST, so everything not edited keeps
its original formatting.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import sysconfig
import textwrap
from collections.abc import Iterable
from pathlib import Path

_IEEE_PRELUDE = '''
requires_IEEE_754 = unittest.skipUnless(
    float.__getformat__("double").startswith("IEEE"), "requires IEEE 754 doubles"
)
'''

_EXTREMES_PRELUDE = '''
class _Extreme:
    """Compares above (sign 1) or below (sign -1) every other object."""

    def __init__(self, sign):
        self.sign = sign

    def __eq__(self, other):
        return self is other

    def __hash__(self):
        return id(self)

    def __lt__(self, other):
        return self is not other and self.sign < 0

    def __gt__(self, other):
        return self is not other and self.sign > 0

    def __le__(self, other):
        return self is other or self.sign < 0

    def __ge__(self, other):
        return self is other or self.sign > 0


LARGEST = _Extreme(1)
SMALLEST = _Extreme(-1)
'''


@dataclasses.dataclass(frozen=True)
class SourceModule:
    """One standard-library module used as a task source.

    Attributes:
        name: Its standard-library name (``textwrap``; ``html`` is a package's ``__init__``).
        prelude: Our own definitions replacing helpers that its tests import from CPython's
            private ``test`` package (inserted after the imports).
    """

    name: str
    prelude: str = ""

    @property
    def project_name(self) -> str:
        """The module's import name inside a task's project."""
        return f"{self.name}_mod"

    @property
    def project_path(self) -> str:
        """The module's file inside a task's project."""
        return f"{self.project_name}.py"

    def source_file(self) -> Path:
        """The module's file in this interpreter's standard library."""
        root = stdlib_dir()
        single = root / f"{self.name}.py"
        return single if single.is_file() else root / self.name / "__init__.py"

    def test_file(self) -> Path:
        """Its CPython test file."""
        return stdlib_dir() / "test" / f"test_{self.name}.py"


MODULES: tuple[SourceModule, ...] = (
    SourceModule("textwrap"),
    SourceModule("colorsys"),
    SourceModule("fnmatch"),
    SourceModule("shlex"),
    SourceModule("string"),
    SourceModule("graphlib"),
    SourceModule("html"),
    SourceModule("fractions", prelude=_IEEE_PRELUDE),
    SourceModule("ipaddress", prelude=_EXTREMES_PRELUDE),
)
"""The default source modules (all pure Python, none imported at interpreter start-up)."""


@functools.cache
def stdlib_dir() -> Path:
    """The running interpreter's standard-library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def module_by_name(name: str) -> SourceModule:
    """The :data:`MODULES` entry called ``name`` (a plain entry for other names)."""
    return next((m for m in MODULES if m.name == name), SourceModule(name))


@functools.lru_cache(maxsize=16)
def parse(source: str) -> ast.Module:
    """``ast.parse`` with a small cache (callers must not modify the tree)."""
    return ast.parse(source)


# -- line-based editing ----------------------------------------------------------------------


def _span(node: ast.stmt) -> tuple[int, int]:
    """1-based first and last line of a statement, decorators included."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return first, node.end_lineno or node.lineno


def _apply_line_edits(source: str, edits: Iterable[tuple[int, int, str]]) -> str:
    """Replaces 1-based inclusive line ranges by text, bottom-up (ranges are disjoint);
    ``(n + 1, n, text)`` inserts ``text`` after line ``n``."""
    lines = source.splitlines(keepends=True)
    for first, last, text in sorted(edits, reverse=True):
        lines[first - 1 : last] = [text] if text else []
    return "".join(lines)


def _names_used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    names = _names_used(node.test)
    consts = {c.value for c in ast.walk(node.test) if isinstance(c, ast.Constant)}
    return "__name__" in names and "__main__" in consts


def main_guard_lines(source: str) -> set[int]:
    """Lines inside top-level ``if __name__ == "__main__":`` blocks."""
    lines: set[int] = set()
    for node in ast.parse(source).body:
        if _is_main_guard(node):
            first, last = _span(node)
            lines.update(range(first, last + 1))
    return lines


def _import_text(node: ast.stmt, module: SourceModule) -> str | None:
    """The rewritten import statement when ``node`` imports the module, else ``None``."""
    names = ", ".join(
        f"{a.name} as {a.asname}" if a.asname else a.name for a in getattr(node, "names", [])
    )
    if isinstance(node, ast.ImportFrom) and node.module == module.name and not node.level:
        return f"from {module.project_name} import {names}"
    if isinstance(node, ast.Import) and any(a.name == module.name for a in node.names):
        if len(node.names) != 1:
            raise ValueError(f"test import of {module.name} shares a line: {ast.unparse(node)}")
        alias = node.names[0].asname or module.name
        return f"import {module.project_name} as {alias}"
    return None


def _from_test_package(node: ast.stmt) -> list[str] | None:
    """Names bound by an import from CPython's ``test`` package, else ``None``."""
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        if node.module == "test" or node.module.startswith("test."):
            return [a.asname or a.name for a in node.names]
    if isinstance(node, ast.Import) and any(
        a.name == "test" or a.name.startswith("test.") for a in node.names
    ):
        return [a.asname or a.name.split(".")[0] for a in node.names]
    return None


def rewrite_tests(module: SourceModule, source: str) -> str:
    """CPython's test file for ``module`` rewritten for the task project (see module doc).

    Raises:
        ValueError: A top-level statement other than a def needs a removed helper.
    """
    tree = ast.parse(source)
    edits: list[tuple[int, int, str]] = []
    removed: set[str] = set()
    last_import = 0
    for node in tree.body:
        first, last = _span(node)
        if isinstance(node, ast.Import | ast.ImportFrom):
            last_import = last
            new = _import_text(node, module)
            if new is not None:
                indent = source.splitlines()[first - 1][: node.col_offset]
                edits.append((first, last, f"{indent}{new}\n"))
            elif (bound := _from_test_package(node)) is not None:
                removed.update(bound)
                edits.append((first, last, ""))
    prelude_names = {
        t.id
        for stmt in ast.parse(module.prelude).body
        for t in ast.walk(stmt)
        if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)
    } | {s.name for s in ast.parse(module.prelude).body if isinstance(s, ast.ClassDef)}
    missing = removed - prelude_names
    for node in tree.body:
        first, last = _span(node)
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if _is_main_guard(node) or (isinstance(node, ast.FunctionDef) and node.name == "load_tests"):
            edits.append((first, last, ""))
        elif isinstance(node, ast.ClassDef):
            edits += _drop_members_using(node, missing)
        elif _names_used(node) & missing:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                raise ValueError(f"test_{module.name}: line {first} needs {_names_used(node) & missing}")
            edits.append((first, last, ""))
    if module.prelude:
        edits.append((last_import + 1, last_import, "\n" + module.prelude.strip("\n") + "\n\n"))
    return _apply_line_edits(source, edits)


def _drop_members_using(node: ast.ClassDef, missing: set[str]) -> list[tuple[int, int, str]]:
    """Edits that remove a class's members needing removed helpers (the class when its own
    header or a non-function member needs them)."""
    header = [*node.bases, *node.keywords, *node.decorator_list]
    if any(_names_used(h) & missing for h in header):
        first, last = _span(node)
        return [(first, last, "")]
    drops = []
    for member in node.body:
        if _names_used(member) & missing:
            if not isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                first, last = _span(node)
                return [(first, last, "")]
            drops.append(member)
    return _removal_edits(node, drops)


def _removal_edits(node: ast.ClassDef, drops: list[ast.stmt]) -> list[tuple[int, int, str]]:
    """Line edits removing ``drops`` from a class body, leaving ``pass`` if it empties."""
    if not drops:
        return []
    edits = [(*_span(m), "") for m in drops]
    if len(drops) == len(node.body):
        first, last = _span(drops[0])
        edits[0] = (first, last, " " * drops[0].col_offset + "pass\n")
    return edits


def test_methods(source: str) -> list[tuple[str, str]]:
    """(class, method) of every ``test*`` method defined directly in a top-level class."""
    return [
        (node.name, member.name)
        for node in parse(source).body
        if isinstance(node, ast.ClassDef)
        for member in node.body
        if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef)
        and member.name.startswith("test")
    ]


def drop_test_methods(source: str, drop: set[tuple[str, str]]) -> str:
    """``source`` without the given (class, method) test methods."""
    edits: list[tuple[int, int, str]] = []
    for node in parse(source).body:
        if isinstance(node, ast.ClassDef):
            members = [
                m for m in node.body
                if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and (node.name, m.name) in drop
            ]
            edits += _removal_edits(node, members)
    return _apply_line_edits(source, edits)


def statement_at(source: str, lineno: int, max_lines: int = 12) -> str:
    """The smallest statement of ``source`` covering ``lineno``, dedented and cut to
    ``max_lines`` lines (an empty string when none covers it)."""
    best: ast.stmt | None = None
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.stmt) and node.lineno <= lineno <= (node.end_lineno or 0):
            if best is None or (node.end_lineno - node.lineno) < (best.end_lineno - best.lineno):
                best = node
    if best is None:
        return ""
    if isinstance(best, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return ""
    lines = source.splitlines()[best.lineno - 1 : best.end_lineno]
    text = textwrap.dedent("\n".join(lines))
    cut = text.splitlines()
    if len(cut) > max_lines:
        text = "\n".join(cut[:max_lines] + ["..."])
    return text


def docstring_of(source: str, cls: str, method: str) -> str:
    """The first line of a test method's docstring ('' when it has none)."""
    for node in parse(source).body:
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                if isinstance(member, ast.FunctionDef) and (node.name, member.name) == (cls, method):
                    doc = ast.get_docstring(member) or ""
                    return doc.strip().splitlines()[0] if doc.strip() else ""
    return ""
