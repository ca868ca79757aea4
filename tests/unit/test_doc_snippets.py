"""Every code block of README.md and docs/**/*.md marked runnable runs, and exits 0.

The convention (docs/contributing.md, "Runnable snippets"): an HTML comment on the line right
before a block's opening fence,

    <!-- runnable -->                    run the block alone
    <!-- runnable file=my_envs.py -->    also save it as my_envs.py for later blocks of the page
    <!-- runnable needs=my_envs.py -->   copy those saved blocks into its directory first
    <!-- runnable timeout=30 -->         its time limit in seconds (default 60)

``python`` blocks run with the virtualenv's interpreter, ``bash`` / ``sh`` blocks with bash
(``set -euo pipefail``), the virtualenv's ``bin/`` first on ``PATH``. Each block runs in a fresh
temporary directory that is on ``PYTHONPATH`` and holds links to the checkout's ``train.py`` and
``examples/``, so commands written for a checkout work as written.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT_S = 60
LANGUAGES = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
LINKED = ("train.py", "examples")
"""What a block's directory links from the checkout (paths the docs use relative to it)."""

MARKER = re.compile(r"^<!--\s*runnable\b(?P<options>[^>]*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
OPTIONS = {"file", "needs", "timeout"}


@dataclasses.dataclass(frozen=True)
class Snippet:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str  # "python" or "bash"
    code: str
    file: str | None
    needs: tuple[str, ...]
    timeout_s: float

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def parse(page: Path) -> list[Snippet]:
    """The runnable blocks of one page; a malformed marker raises ValueError naming its line."""
    lines = page.read_text().split("\n")
    snippets: list[Snippet] = []
    saved: set[str] = set()
    fence: str | None = None  # the open fence's characters, while inside a block
    i = 0
    while i < len(lines):
        line = lines[i]
        opening = FENCE.match(line)
        if fence is not None:
            if opening and opening["fence"][0] == fence[0] and len(opening["fence"]) >= len(fence) \
                    and not opening["info"].strip():
                fence = None
            i += 1
            continue
        if opening:
            fence = opening["fence"]
            i += 1
            continue
        marker = MARKER.match(line)
        if marker is None:
            if line.lstrip().startswith("<!--") and re.search(r"\brunnable\b", line):
                raise ValueError(f"{page}:{i + 1}: malformed runnable marker {line!r}")
            i += 1
            continue
        where = f"{page.relative_to(REPO)}:{i + 1}"
        options = dict(_option(word, where) for word in marker["options"].split())
        unknown = set(options) - OPTIONS
        if unknown:
            raise ValueError(f"{where}: unknown runnable option(s) {sorted(unknown)}; known: {sorted(OPTIONS)}")
        block = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if block is None:
            raise ValueError(f"{where}: a runnable marker must be followed directly by a code fence")
        language = LANGUAGES.get(block["info"].strip().split(" ")[0] if block["info"].strip() else "")
        if language is None:
            raise ValueError(f"{where}: only {sorted(LANGUAGES)} blocks can be runnable, "
                             f"not {block['info'].strip()!r}")
        body, j = [], i + 2
        while j < len(lines) and not (lines[j].strip().startswith(block["fence"])
                                      and not lines[j].strip().strip(block["fence"][0])):
            body.append(lines[j])
            j += 1
        if j == len(lines):
            raise ValueError(f"{where}: the runnable block is never closed")
        needs = tuple(n for n in options.get("needs", "").split(",") if n)
        missing = [n for n in needs if n not in saved]
        if missing:
            raise ValueError(f"{where}: needs {missing}, which no earlier block of the page saves "
                             "(file=NAME)")
        if "file" in options:
            saved.add(options["file"])
        snippets.append(Snippet(page=page, line=i + 2, language=language, code="\n".join(body) + "\n",
                                file=options.get("file"), needs=needs,
                                timeout_s=float(options.get("timeout", DEFAULT_TIMEOUT_S))))
        i = j + 1
    return snippets


def _option(word: str, where: str) -> tuple[str, str]:
    key, sep, value = word.partition("=")
    if not sep or not value:
        raise ValueError(f"{where}: runnable options are key=value words, got {word!r}")
    return key, value


def all_snippets() -> list[Snippet]:
    return [snippet for page in pages() for snippet in parse(page)]


def venv_bin() -> Path:
    """The checkout's virtualenv (.venv), else the one running the tests."""
    local = REPO / ".venv" / "bin"
    return local if (local / "python").exists() else Path(sys.executable).parent


SNIPPETS = all_snippets()


def test_markers_are_well_formed_and_some_blocks_are_marked():
    # parse() already ran at import; this keeps a marker error a test failure with its message
    assert all_snippets() == SNIPPETS
    assert any(s.page.name == "README.md" for s in SNIPPETS), "README.md has no runnable block"


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_runnable_snippet(snippet: Snippet, tmp_path: Path) -> None:
    for name in LINKED:
        (tmp_path / name).symlink_to(REPO / name)
    earlier = [s for s in SNIPPETS if s.page == snippet.page and s.file in snippet.needs]
    for saved in earlier:
        (tmp_path / saved.file).write_text(saved.code)
    bin_dir = venv_bin()
    if snippet.language == "python":
        script = tmp_path / (snippet.file or "snippet.py")
        script.write_text(snippet.code)
        argv = [str(bin_dir / "python"), script.name]
    else:
        script = tmp_path / "snippet.sh"
        script.write_text("set -euo pipefail\n" + snippet.code)
        argv = [shutil.which("bash") or "/bin/bash", script.name]
    env = {**os.environ,
           "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(tmp_path),
           "VIRTUAL_ENV": str(bin_dir.parent),
           "NO_COLOR": "1"}
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=snippet.timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the block's whole process group, servers included
        stdout, stderr = proc.communicate()
        pytest.fail(f"{snippet.id}: still running after {snippet.timeout_s:.0f} s (mark only fast "
                    f"blocks, or raise timeout=)\n--- stdout\n{stdout[-3000:]}--- stderr\n{stderr[-3000:]}")
    assert proc.returncode == 0, (
        f"{snippet.id}: the {snippet.language} block exited {proc.returncode}\n--- block\n"
        f"{snippet.code}--- stdout\n{stdout[-3000:]}--- stderr\n{stderr[-3000:]}")
