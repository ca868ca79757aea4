"""Reading what a run or an evaluation wrote, safely and while it is still being written.

:class:`JsonlIndex` keeps the byte offsets of a JSON-lines file's complete lines, so one line
is read with one seek however long the file; :meth:`JsonlIndex.refresh` reads only what was
appended since the last call (a line still being written is not indexed until its newline
arrives), and starts over when the file was replaced (a resumed run rewrites
``metrics.jsonl``). :func:`inside` is the one gate between a request and the file system: a
path is served only when it resolves, symlinks followed, under the viewed folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["JsonlIndex", "Line", "inside"]

_CHUNK = 1 << 20


def inside(root: Path, relative: str) -> Path | None:
    """``root / relative`` when it exists and resolves (symlinks followed) under ``root``;
    ``None`` otherwise (``..``, an absolute path, a symlink pointing out, a missing file)."""
    if not relative or "\0" in relative or os.path.isabs(relative):
        return None
    base = root.resolve()
    try:
        path = (base / relative).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    return path if path == base or path.is_relative_to(base) else None


class Line:
    """One line of a JSON-lines file: its 1-based number and its parsed value or the reason
    it cannot be parsed."""

    __slots__ = ("error", "number", "value")

    def __init__(self, number: int, value: Any = None, error: str | None = None) -> None:
        self.number = number
        self.value = value
        self.error = error


class JsonlIndex:
    """The complete lines of a JSON-lines file, by byte offset.

    Args:
        path: The file (it may not exist yet: it then has no lines).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.spans: list[tuple[int, int]] = []  # [start, end) of each complete line's bytes
        self._scanned = 0
        self._identity: tuple[int, int] | None = None

    def refresh(self) -> int:
        """Indexes the lines appended since the last call; returns the number of lines."""
        try:
            stat = self.path.stat()
        except OSError:
            self.spans, self._scanned, self._identity = [], 0, None
            return 0
        identity = (stat.st_dev, stat.st_ino)
        if identity != self._identity or stat.st_size < self._scanned:  # replaced or rewritten
            self.spans, self._scanned, self._identity = [], 0, identity
        if stat.st_size == self._scanned:
            return len(self.spans)
        with self.path.open("rb") as f:
            f.seek(self._scanned)
            start = self._scanned
            pending = b""
            while True:
                chunk = f.read(_CHUNK)
                if not chunk:
                    break
                pending += chunk
                cut = 0
                while (newline := pending.find(b"\n", cut)) != -1:
                    if newline > cut:  # blank lines are not records
                        self.spans.append((start + cut, start + newline))
                    cut = newline + 1
                start += cut
                pending = pending[cut:]
            self._scanned = start  # a line without its newline yet is read again next time
        return len(self.spans)

    def __len__(self) -> int:
        return len(self.spans)

    def raw(self, index: int) -> bytes:
        """The bytes of line ``index`` (0-based), without its newline."""
        start, end = self.spans[index]
        with self.path.open("rb") as f:
            f.seek(start)
            return f.read(end - start)

    def line(self, index: int) -> Line:
        """Line ``index`` (0-based) parsed; a malformed one carries its error."""
        return parse_line(index + 1, self.raw(index))

    def lines(self) -> list[Line]:
        """Every complete line, parsed (for small files such as ``metrics.jsonl``)."""
        if not self.spans:
            return []
        first, last = self.spans[0][0], self.spans[-1][1]
        with self.path.open("rb") as f:
            f.seek(first)
            data = f.read(last - first)
        return [parse_line(i + 1, data[s - first : e - first]) for i, (s, e) in enumerate(self.spans)]


def parse_line(number: int, raw: bytes) -> Line:
    """A line's JSON object, or the error that says why it is not one."""
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return Line(number, error=f"not JSON ({exc.__class__.__name__}: {exc})")
    if not isinstance(value, dict):
        return Line(number, error=f"a JSON {type(value).__name__}, not an object")
    return Line(number, value)
