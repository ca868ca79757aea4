"""AST-located, text-level mutations of a Python source file (the injected bugs).

Sites are found on the AST; each mutation replaces one small span of the *text*, so the
mutant differs from the original only there (comments and formatting are kept) and the fix is
an exact inverse edit. Kinds:

* ``arith_op``: a binary or augmented-assignment operator swapped (``+`` <-> ``-``, ...).
* ``compare_op``: a comparison changed (``<`` <-> ``<=``, ``==`` <-> ``!=``, ``in`` <->
  ``not in``, ...).
* ``bool_op``: ``and`` <-> ``or``; ``negation``: a ``not`` removed.
* ``off_by_one``: an integer constant +-1, or a slice bound shifted by one.
* ``constant``: ``True`` <-> ``False``, a float or a short string changed.
* ``swap_args``: two adjacent positional call arguments swapped.
* ``delete_stmt``: a statement deleted (``pass`` when it was alone in its block).
* ``delete_branch``: an ``if`` without ``else`` deleted, or an ``else`` / ``elif`` branch
  removed.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import re
from collections.abc import Iterator

KINDS = (
    "arith_op", "compare_op", "bool_op", "negation", "off_by_one", "constant", "swap_args",
    "delete_stmt", "delete_branch",
)

_ARITH = {
    ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"), ast.Div: ("/", "*"),
    ast.FloorDiv: ("//", "/"), ast.Mod: ("%", "//"), ast.Pow: ("**", "*"),
    ast.LShift: ("<<", ">>"), ast.RShift: (">>", "<<"), ast.BitOr: ("|", "&"),
    ast.BitAnd: ("&", "|"), ast.BitXor: ("^", "|"),
}
_COMPARE = {
    ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"), ast.In: ("in", "not in"), ast.NotIn: ("not in", "in"),
}
_BOOL = {ast.And: ("and", "or"), ast.Or: ("or", "and")}
_DELETABLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Raise,
              ast.Break, ast.Continue, ast.Assert, ast.Delete)


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One edit of the original text: ``source[start:end]`` becomes ``replacement``.

    Attributes:
        kind: One of :data:`KINDS`.
        line: 1-based line of the edit in the original (the line coverage is checked on).
        start: Character offset where the replaced span starts.
        end: Character offset where it ends.
        replacement: The new text of the span.
        note: What changed, e.g. ``"'<' -> '<='"`` (metadata; never shown to the agent).
    """

    kind: str
    line: int
    start: int
    end: int
    replacement: str
    note: str

    @property
    def key(self) -> str:
        """A short stable id of the mutation."""
        raw = f"{self.kind}|{self.start}|{self.end}|{self.replacement}"
        return hashlib.blake2b(raw.encode(), digest_size=4).hexdigest()

    def apply(self, source: str) -> str:
        """The mutated source."""
        return source[: self.start] + self.replacement + source[self.end :]


class _Text:
    """Maps AST (line, UTF-8 byte column) positions to character offsets."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode()[:col].decode(errors="replace"))

    def start(self, node: ast.AST) -> int:
        return self.offset(node.lineno, node.col_offset)

    def end(self, node: ast.AST) -> int:
        return self.offset(node.end_lineno, node.end_col_offset)

    def text(self, node: ast.AST) -> str:
        return self.source[self.start(node) : self.end(node)]

    def line_start(self, lineno: int) -> int:
        return self.starts[lineno - 1]

    def line_end(self, lineno: int) -> int:
        return self.starts[lineno]

    def owns_lines(self, node: ast.stmt) -> bool:
        """The statement alone fills its lines (no other code before or after it)."""
        before = self.source[self.line_start(node.lineno) : self.start(node)]
        after = self.source[self.end(node) : self.line_end(node.end_lineno)]
        return not before.strip() and (not after.strip() or after.strip().startswith("#"))


def _operator_span(text: _Text, left: ast.AST, right: ast.AST, symbol: str) -> tuple[int, int] | None:
    """Where ``symbol`` is written between two operands (only parentheses, spaces and line
    continuations may surround it)."""
    lo, hi = text.end(left), text.start(right)
    segment = text.source[lo:hi]
    if "#" in segment:
        return None
    core = re.sub(r"[()\\\s]+", " ", segment).strip()
    if core != symbol:
        return None
    pattern = r"\s+".join(re.escape(part) for part in symbol.split())
    match = re.search(pattern, segment)
    return (lo + match.start(), lo + match.end()) if match else None


def _parent_map(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _excluded_nodes(tree: ast.Module) -> set[int]:
    """ids of nodes never mutated: docstrings, annotations, ``__main__`` blocks, ``__all__``."""
    skip: set[int] = set()

    def mark(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                mark(body[0])
        if isinstance(node, ast.arg):
            mark(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            mark(node.returns)
        elif isinstance(node, ast.AnnAssign):
            mark(node.annotation)
        elif isinstance(node, ast.JoinedStr):
            mark(node)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            mark(node)
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            mark(node)
    return skip


def enumerate_mutations(source: str) -> list[Mutation]:
    """Every mutation of :data:`KINDS` this source offers, in source order (unique edits).

    Mutants are not compiled here (that is the caller's job, for the few it tries)."""
    tree = ast.parse(source)
    text = _Text(source)
    skip = _excluded_nodes(tree)
    parents = _parent_map(tree)
    found: dict[tuple[int, int, str], Mutation] = {}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        for mutation in _mutations_of(node, text, parents):
            found.setdefault((mutation.start, mutation.end, mutation.replacement), mutation)
    return sorted(found.values(), key=lambda m: (m.start, m.end, m.kind, m.replacement))


def _mutations_of(node: ast.AST, text: _Text, parents: dict[ast.AST, ast.AST]) -> Iterator[Mutation]:
    if isinstance(node, ast.BinOp | ast.AugAssign):
        left = node.left if isinstance(node, ast.BinOp) else node.target
        right = node.right if isinstance(node, ast.BinOp) else node.value
        old, new = _ARITH.get(type(node.op), (None, None))
        if isinstance(node, ast.AugAssign) and old:
            old, new = old + "=", new + "="
        skip_format = isinstance(node.op, ast.Mod) and isinstance(left, ast.Constant)
        if old and not skip_format and (span := _operator_span(text, left, right, old)):
            yield Mutation("arith_op", node.lineno, *span, new, f"{old!r} -> {new!r}")
    elif isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            old, new = _COMPARE[type(op)]
            if span := _operator_span(text, operands[i], operands[i + 1], old):
                yield Mutation("compare_op", node.lineno, *span, new, f"{old!r} -> {new!r}")
    elif isinstance(node, ast.BoolOp):
        old, new = _BOOL[type(node.op)]
        for a, b in zip(node.values, node.values[1:], strict=False):
            if span := _operator_span(text, a, b, old):
                yield Mutation("bool_op", node.lineno, *span, new, f"{old!r} -> {new!r}")
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        lo, hi = text.start(node), text.start(node.operand)
        match = re.match(r"not\s*", text.source[lo:hi])
        if match:
            yield Mutation("negation", node.lineno, lo, lo + match.end(), "", "'not' removed")
    elif isinstance(node, ast.Constant):
        yield from _constant_mutations(node, text, parents)
    elif isinstance(node, ast.Slice):
        for bound in (node.lower, node.upper):
            if bound is None or isinstance(bound, ast.Constant):
                continue
            atom = isinstance(bound, ast.Name | ast.Attribute | ast.Call | ast.Subscript)
            body = text.text(bound) if atom else f"({text.text(bound)})"
            for sign in ("+", "-"):
                yield Mutation("off_by_one", bound.lineno, text.start(bound), text.end(bound),
                               f"{body} {sign} 1", f"slice bound {sign}1")
    elif isinstance(node, ast.Call):
        args = node.args
        for a, b in zip(args, args[1:], strict=False):
            if isinstance(a, ast.Starred) or isinstance(b, ast.Starred):
                continue
            ta, tb = text.text(a), text.text(b)
            if ta != tb:
                between = text.source[text.end(a) : text.start(b)]
                yield Mutation("swap_args", node.lineno, text.start(a), text.end(b),
                               tb + between + ta, "arguments swapped")
    if isinstance(node, ast.stmt):
        yield from _statement_mutations(node, text, parents)


def _constant_mutations(node: ast.Constant, text: _Text, parents: dict[ast.AST, ast.AST]) -> Iterator[Mutation]:
    display = parents.get(node)
    if isinstance(display, ast.Dict | ast.List | ast.Tuple | ast.Set):
        size = len(display.keys) if isinstance(display, ast.Dict) else len(display.elts)
        if size > 8:
            return  # a data table, not logic
    value, raw = node.value, text.text(node)
    lo, hi = text.start(node), text.end(node)
    if isinstance(value, bool):
        yield Mutation("constant", node.lineno, lo, hi, str(not value), f"{value} -> {not value}")
    elif isinstance(value, int):
        for delta in (1, -1):
            new = value + delta
            if new < 0:
                continue
            rendered = hex(new) if raw.lower().startswith("0x") else str(new)
            yield Mutation("off_by_one", node.lineno, lo, hi, rendered, f"{value} -> {new}")
    elif isinstance(value, float):
        new = value * 2 if value else 1.0
        yield Mutation("constant", node.lineno, lo, hi, repr(new), f"{value!r} -> {new!r}")
    elif isinstance(value, str) and len(value) <= 2 and raw[:1] in "'\"" and "\n" not in raw:
        if isinstance(parents.get(node), ast.Dict | ast.keyword):
            return
        new_value = " " if value == "" else value[:-1]
        rendered = repr(new_value)
        if raw[0] == '"' and '"' not in new_value:
            rendered = '"' + rendered[1:-1] + '"'
        yield Mutation("constant", node.lineno, lo, hi, rendered, f"{value!r} -> {new_value!r}")


def _block_of(node: ast.stmt, parents: dict[ast.AST, ast.AST]) -> list[ast.stmt] | None:
    parent = parents.get(node)
    for field in ("body", "orelse", "finalbody"):
        block = getattr(parent, field, None)
        if isinstance(block, list) and any(s is node for s in block):
            return block
    return None


def _delete(node: ast.stmt, text: _Text, block: list[ast.stmt], kind: str, note: str) -> Mutation:
    lo, hi = text.line_start(node.lineno), text.line_end(node.end_lineno)
    line = text.lines[node.lineno - 1]
    indent = line[: len(line) - len(line.lstrip())]
    replacement = f"{indent}pass\n" if len(block) == 1 else ""
    return Mutation(kind, node.lineno, lo, hi, replacement, note)


def _statement_mutations(node: ast.stmt, text: _Text, parents: dict[ast.AST, ast.AST]) -> Iterator[Mutation]:
    parent = parents.get(node)
    if isinstance(parent, ast.Module | ast.ClassDef) or not text.owns_lines(node):
        return
    block = _block_of(node, parents)
    if block is None:
        return
    if isinstance(node, _DELETABLE):
        yield _delete(node, text, block, "delete_stmt", f"{type(node).__name__} deleted")
    if not isinstance(node, ast.If):
        return
    is_elif = text.source[text.start(node) : text.start(node) + 4] == "elif"
    if not node.orelse and not is_elif:
        yield _delete(node, text, block, "delete_branch", "if statement deleted")
    elif node.orelse:
        first = node.orelse[0]
        if text.source[text.start(first) : text.start(first) + 4] == "elif" and not first.orelse:
            lo, hi = text.line_start(first.lineno), text.line_end(first.end_lineno)
            yield Mutation("delete_branch", first.lineno, lo, hi, "", "elif branch deleted")
        elif text.source[text.start(first) : text.start(first) + 4] != "elif":
            body_end = node.body[-1].end_lineno
            for lineno in range(body_end + 1, first.lineno):
                if re.match(r"\s*else\s*:", text.lines[lineno - 1]):
                    lo, hi = text.line_start(lineno), text.line_end(node.orelse[-1].end_lineno)
                    yield Mutation("delete_branch", first.lineno, lo, hi, "", "else branch deleted")
                    break


def inverse_fix(path: str, original: str, mutant: str, mutation: Mutation) -> dict[str, str]:
    """The exact edit that turns ``mutant`` back into ``original``: whole lines around the
    mutated span, widened until the old text occurs once in the mutant.

    Returns:
        ``{"path", "old", "new"}`` with ``mutant.replace(old, new, 1) == original``.

    Raises:
        ValueError: No unique context exists (never seen for real files).
    """
    m_text = _Text(mutant)
    span_end = mutation.start + len(mutation.replacement)
    first = mutant.count("\n", 0, mutation.start) + 1
    last = mutant.count("\n", 0, max(span_end - 1, mutation.start)) + 1
    if not mutation.replacement:
        last = first - 1  # a deletion of whole lines leaves no line of its own
    delta = (mutation.end - mutation.start) - len(mutation.replacement)
    grow_up = True
    while True:
        lo = m_text.line_start(max(first, 1))
        hi = m_text.line_end(last) if last >= first else lo
        old = mutant[lo:hi]
        if old.strip() and mutant.count(old) == 1:
            new = original[lo : hi + delta]
            if mutant[:lo] + new + mutant[hi:] == original:
                return {"path": path, "old": old, "new": new}
        if first <= 1 and last >= len(m_text.lines):
            raise ValueError("no unique context for the fix")
        if (grow_up and first > 1) or last >= len(m_text.lines):
            first -= 1
        else:
            last += 1
        grow_up = not grow_up
