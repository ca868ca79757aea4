"""``search``: find text in files (``grep -rnE``) or files by name, inside the sandbox."""

from __future__ import annotations

import shlex

from agentrl import tool
from agentrl.sandbox import Sandbox, SandboxError
from agentrl_tools._common import clip

SEARCH_TIMEOUT_S = 60
MAX_RESULTS_LIMIT = 1000
LINE_CHARS = 300
"""Matched lines longer than this are cut (minified files would flood the result)."""
MAX_SHOWN_BYTES = 12_000
"""Results stop being printed past this size (the rest are still counted), so that the
result, notes included, stays within the output bound."""

_TOTAL = "__agentrl_total__"
_SKIP_DIRS = (".git", "__pycache__")


def _script(pattern: str, path: str, glob: str | None, files_only: bool, max_results: int) -> str:
    """The shell pipeline: the search, sorted (file, then line) so results do not depend on
    directory order, then awk keeping the first results and counting all."""
    q = shlex.quote
    cap = (
        f"awk -v n={max_results} -v w={LINE_CHARS} -v b={MAX_SHOWN_BYTES} "
        "'NR <= n && size < b { line = substr($0, 1, w); size += length(line) + 1; print line } "
        f"END {{ print \"{_TOTAL} \" NR }}'"
    )
    if files_only:
        prune = " -o ".join(f"-name {q(d)}" for d in _SKIP_DIRS)
        name = f" -name {q(glob)}" if glob else ""
        return (
            f"find {q(path)} \\( {prune} \\) -prune -o -type f{name} -print "
            f"| sed 's|^\\./||' | grep -E -e {q(pattern)} | LC_ALL=C sort | {cap}"
        )
    skip = " ".join(f"--exclude-dir={q(d)}" for d in _SKIP_DIRS)
    include = f" --include={q(glob)}" if glob else ""
    return (
        f"grep -rHnIE {skip}{include} -e {q(pattern)} -- {q(path)} | sed 's|^\\./||' "
        f"| LC_ALL=C sort -t: -k1,1 -k2,2n | {cap}"
    )


@tool(timeout=SEARCH_TIMEOUT_S + 30)
async def search(
    pattern: str,
    path: str = ".",
    glob: str | None = None,
    files_only: bool = False,
    max_results: int = 50,
    *,
    sandbox: Sandbox,
) -> str:
    """Searches file contents with a regular expression (like `grep -rnE`), or file names.

    Content results are `file:line:text`. Directories named .git and __pycache__ and binary
    files are skipped. The pattern is a POSIX extended regex: use [0-9] rather than \\d, and
    escape ( ) { } | + ? . * to match them literally.

    Args:
        pattern: Extended regular expression, e.g. "def (add|sub)\\(" or "TODO".
        path: File or directory to search, relative to /workspace (default: all of it).
        glob: Only files whose name matches this glob, e.g. "*.py".
        files_only: Match the pattern against file paths instead of contents and list the files.
        max_results: Most results to show (1-1000); the rest are counted.
    """
    if not pattern:
        return "Error: the pattern is empty"
    if not 1 <= max_results <= MAX_RESULTS_LIMIT:
        return f"Error: max_results must be between 1 and {MAX_RESULTS_LIMIT}, got {max_results}"
    if not path or "\x00" in path:
        return f"Error: invalid path {path!r}"
    if path.startswith("-"):
        path = "./" + path
    try:
        result = await sandbox.exec(
            _script(pattern, path, glob, files_only, max_results), timeout=SEARCH_TIMEOUT_S
        )
    except SandboxError as exc:
        return f"Error: the sandbox could not run the search: {exc}"
    if result.timed_out:
        return (
            f"Error: the search took longer than {SEARCH_TIMEOUT_S} s; search a smaller path "
            "or add a glob"
        )
    lines = result.stdout.rstrip("\n").split("\n")
    total = None
    if lines and lines[-1].startswith(_TOTAL):
        total = int(lines.pop().split()[1])
    lines = [line for line in lines if line]
    errors = clip(result.stderr.strip(), 1500)
    unit = ("file", "files") if files_only else ("match", "matches")
    where = f" in {path}" + (f" (files {glob})" if glob else "")
    if not lines:
        if errors:
            return f"Error: {errors}"
        return f"No {unit[1]} for `{pattern}`{where}."
    total = len(lines) if total is None else total
    found = f"{total} {unit[total != 1]} for `{pattern}`{where}"
    out = [f"{found}:" if total <= len(lines) else f"{found}; the first {len(lines)}:", *lines]
    if total > len(lines):
        out.append(
            f"[... {total - len(lines)} more {unit[1]} not shown: narrow the pattern, path or "
            "glob, or raise max_results]"
        )
    if errors:
        out.append(f"[errors: {errors}]")
    return clip("\n".join(out))
