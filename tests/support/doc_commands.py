"""The shell commands the docs show: every line of every ``bash`` block of README.md and
docs/**/*.md (tests/unit/test_doc_commands.py checks them all; integration tests run some as
written)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,})(?P<info>\w*)\s*$")


def bash_commands() -> list[tuple[str, str]]:
    """``(where, command line)`` for each command of each bash block: continuation lines
    joined, comments dropped."""
    found = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        lines = page.read_text().split("\n")
        i = 0
        while i < len(lines):
            opening = FENCE.match(lines[i])
            if opening is None:
                i += 1
                continue
            j = i + 1
            while not lines[j].strip().startswith(opening["fence"]):
                j += 1
            if opening["info"] in ("bash", "sh", "shell"):
                found += _commands(lines[i + 1:j], page, i + 2)
            i = j + 1
    return found


def _commands(body: list[str], page: Path, first_line: int) -> list[tuple[str, str]]:
    out, pending, start = [], "", 0
    for n, line in enumerate(body):
        text = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        if not pending:
            start = n
        pending += text.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        if pending.strip():
            out.append((f"{page.relative_to(REPO)}:{first_line + start}", pending.strip()))
        pending = ""
    return out
