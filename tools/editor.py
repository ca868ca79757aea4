"""``editor``: view, create and edit workspace files, with per-episode undo.

Files are read and written through the sandbox's confined file API (``read_file`` /
``write_file``: no ``..`` escapes, no symlinks followed); directory listings and deletions (undo
of a create) run as commands in the sandbox. The edit history lives in the episode state, so
``undo_edit`` reverts the episode's own edits, newest first.
"""

from __future__ import annotations

import difflib
import posixpath
from typing import Literal

from agentrl import EpisodeState, tool
from agentrl.sandbox import WORKSPACE, Sandbox, SandboxError
from agentrl_tools._common import MAX_OUTPUT_CHARS, clip, workspace_path

HISTORY_KEY = "agentrl.editor_history"
"""Key of ``EpisodeState.data``: absolute path -> previous contents (``None``: did not exist)."""

MAX_READ_BYTES = 4 * 1024 * 1024
"""Largest file the editor reads."""
MAX_HISTORY = 50
"""Undo steps kept per file."""
SNIPPET_CONTEXT = 4
"""Lines shown before and after an edited region."""
MAX_LISTING = 400
"""Entries shown by a directory view."""
LINE_CHARS = 2000
"""Viewed lines longer than this are cut."""
NEAR_MISS_MAX_LINES = 20_000
"""Files up to this many lines are scanned for a near miss when old_str is not found."""

Command = Literal["view", "create", "str_replace", "insert", "undo_edit"]


class _EditorError(Exception):
    """A mistake the model can fix; its message becomes the tool's result."""


class _IsDirectoryError(_EditorError):
    """The path is a directory."""


@tool
async def editor(
    command: Command,
    path: str,
    file_text: str | None = None,
    old_str: str | None = None,
    new_str: str | None = None,
    insert_line: int | None = None,
    view_range: list[int] | None = None,
    *,
    sandbox: Sandbox,
    state: EpisodeState,
) -> str:
    """Views, creates and edits files in the workspace (/workspace).

    Commands:
    - view: a file with line numbers (optionally only view_range), or a directory's files two
      levels deep.
    - create: writes file_text to path (an existing file is overwritten; undo_edit restores it).
    - str_replace: replaces old_str, which must occur exactly once in the file (include enough
      surrounding lines to make it unique; whitespace must match), with new_str.
    - insert: inserts new_str after line insert_line (0 inserts at the top).
    - undo_edit: reverts the last edit of path made with this tool.

    Args:
        command: One of view, create, str_replace, insert, undo_edit.
        path: File or directory, relative to /workspace or absolute under it, e.g. "src/app.py".
        file_text: create: the whole content of the file.
        old_str: str_replace: the exact text to replace.
        new_str: str_replace: the replacement (default: empty, i.e. delete old_str). insert:
            the lines to insert.
        insert_line: insert: the line after which new_str goes (0 = top of the file).
        view_range: view: [start, end] line numbers, 1-based and inclusive; end -1 means to the
            end of the file.
    """
    try:
        full = workspace_path(path)
        if command == "view":
            return await _view(sandbox, full, view_range)
        if command == "create":
            return await _create(sandbox, state, full, file_text)
        if command == "str_replace":
            return await _str_replace(sandbox, state, full, old_str, new_str)
        if command == "insert":
            return await _insert(sandbox, state, full, new_str, insert_line)
        return await _undo(sandbox, state, full)
    except (_EditorError, ValueError, SandboxError) as exc:
        return f"Error: {exc}"


# -- commands -------------------------------------------------------------------------------


async def _view(sandbox: Sandbox, full: str, view_range: list[int] | None) -> str:
    try:
        text = await _read(sandbox, full, must_exist=True)
    except _IsDirectoryError:
        if view_range is not None:
            raise _EditorError(
                f"{_show(full)} is a directory; view_range applies to files only"
            ) from None
        return await _listing(sandbox, full)
    assert text is not None
    lines = text.splitlines()
    if not lines:
        return f"{_show(full)} is empty."
    start, end = 1, len(lines)
    if view_range is not None:
        start, end = _check_range(view_range, len(lines))
    body = "\n".join(_numbered(lines[start - 1 : end], start))
    if len(body) > MAX_OUTPUT_CHARS - 200:
        body = clip(body, MAX_OUTPUT_CHARS - 200)
        body += "\n[the file is too long to show at once: use view_range to see a part of it]"
    return body


async def _create(sandbox: Sandbox, state: EpisodeState, full: str, file_text: str | None) -> str:
    if file_text is None:
        raise _EditorError("create needs file_text (the whole content of the new file)")
    previous = await _read(sandbox, full, must_exist=False)
    await sandbox.write_file(full, file_text)
    _remember(state, full, previous)
    count = len(file_text.splitlines())
    if previous is None:
        return f"Created {_show(full)} ({count} lines)."
    return (
        f"Overwrote the existing file {_show(full)} ({count} lines now); undo_edit restores "
        "its previous content."
    )


async def _str_replace(
    sandbox: Sandbox, state: EpisodeState, full: str, old_str: str | None, new_str: str | None
) -> str:
    if not old_str:
        raise _EditorError("str_replace needs old_str: the exact, non-empty text to replace")
    new_str = new_str or ""
    text = await _read(sandbox, full, must_exist=True)
    assert text is not None
    starts = _occurrences(text, old_str)
    if not starts:
        return (
            f"Error: no match for old_str in {_show(full)}; nothing was changed. old_str must "
            "match exactly, including whitespace and indentation (view the file to copy it)."
            + _near_miss(text, old_str)
        )
    if len(starts) > 1:
        lines = sorted({_line_of(text, i) for i in starts})
        return (
            f"Error: old_str occurs {len(starts)} times in {_show(full)} (on lines "
            f"{_list(lines)}); nothing was changed. Include more surrounding lines so it matches "
            "exactly once."
        )
    at = starts[0]
    updated = text[:at] + new_str + text[at + len(old_str) :]
    await sandbox.write_file(full, updated)
    _remember(state, full, text)
    first = _line_of(updated, at)
    last = first + new_str.count("\n")
    return (
        f"Edited {_show(full)}. The edited region now reads:\n"
        f"{_snippet(updated, first, last)}\n"
        "Check that this is what you meant; undo_edit reverts the edit."
    )


async def _insert(
    sandbox: Sandbox, state: EpisodeState, full: str, new_str: str | None, insert_line: int | None
) -> str:
    if new_str is None:
        raise _EditorError("insert needs new_str: the lines to insert")
    if insert_line is None:
        raise _EditorError("insert needs insert_line: the line after which to insert (0 = top)")
    text = await _read(sandbox, full, must_exist=True)
    assert text is not None
    lines = text.splitlines(keepends=True)
    if not 0 <= insert_line <= len(lines):
        raise _EditorError(
            f"insert_line {insert_line} is out of range: {_show(full)} has {len(lines)} lines, "
            f"so use 0 to {len(lines)}"
        )
    if insert_line == len(lines) and lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    block = new_str if new_str.endswith("\n") or not new_str else new_str + "\n"
    updated = "".join(lines[:insert_line]) + block + "".join(lines[insert_line:])
    await sandbox.write_file(full, updated)
    _remember(state, full, text)
    added = len(block.splitlines())
    return (
        f"Inserted {added} line(s) after line {insert_line} of {_show(full)}. The region now "
        f"reads:\n{_snippet(updated, insert_line + 1, insert_line + max(added, 1))}\n"
        "Check the indentation; undo_edit reverts the edit."
    )


async def _undo(sandbox: Sandbox, state: EpisodeState, full: str) -> str:
    history: dict[str, list[str | None]] = state.data.get(HISTORY_KEY, {})
    stack = history.get(full)
    if not stack:
        return f"Error: there is no edit of {_show(full)} to undo in this episode."
    previous = stack[-1]
    if previous is None:
        result = await sandbox.exec(["rm", "-f", "--", full], timeout=30)
        if not result.ok:
            raise _EditorError(f"could not remove {_show(full)}: {result.to_text()}")
        stack.pop()
        return f"Undid the creation of {_show(full)}: the file was removed."
    await sandbox.write_file(full, previous)
    stack.pop()
    return (
        f"Reverted the last edit of {_show(full)} ({len(previous.splitlines())} lines); "
        f"{len(stack)} earlier edit(s) of it can still be undone."
    )


# -- helpers ----------------------------------------------------------------------------------


def _show(full: str) -> str:
    """The path as shown to the model: relative to the workspace."""
    return "/workspace" if full == WORKSPACE else posixpath.relpath(full, WORKSPACE)


async def _is_dir(sandbox: Sandbox, full: str) -> bool:
    result = await sandbox.exec(
        ["sh", "-c", 'test -d "$1" && ! test -L "$1"', "sh", full], timeout=30
    )
    return result.exit_code == 0


async def _read(sandbox: Sandbox, full: str, *, must_exist: bool) -> str | None:
    """The file as text; ``None`` when it does not exist and ``must_exist`` is false.

    Raises:
        _IsDirectoryError: A directory.
        _EditorError: Missing (when it must exist), a symlink, too large, or not UTF-8 text.
    """
    try:
        data = await sandbox.read_file(full, max_bytes=MAX_READ_BYTES)
    except SandboxError as exc:
        check = await sandbox.exec(["sh", "-c", 'test -e "$1" || test -L "$1"', "sh", full], timeout=30)
        if check.exit_code != 0:
            if must_exist:
                raise _EditorError(
                    f"{_show(full)} does not exist; create it with the create command, or "
                    "view a directory to see what is there"
                ) from None
            return None
        if await _is_dir(sandbox, full):
            raise _IsDirectoryError(f"{_show(full)} is a directory") from None
        raise _EditorError(f"cannot read {_show(full)}: {exc}") from None
    if b"\x00" in data[:8192]:
        raise _EditorError(f"{_show(full)} is a binary file ({len(data)} bytes); it cannot be edited here")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _EditorError(f"{_show(full)} is not UTF-8 text; use bash to handle it") from None


def _remember(state: EpisodeState, full: str, previous: str | None) -> None:
    stack = state.data.setdefault(HISTORY_KEY, {}).setdefault(full, [])
    stack.append(previous)
    del stack[:-MAX_HISTORY]


async def _listing(sandbox: Sandbox, full: str) -> str:
    result = await sandbox.exec(
        ["find", full, "-mindepth", "1", "-maxdepth", "2",
         "(", "-name", ".*", "-o", "-name", "__pycache__", ")", "-prune",
         "-o", "-printf", "%P\\t%y\\n"],
        timeout=30,
    )
    if result.exit_code != 0 and not result.stdout:
        raise _EditorError(f"cannot list {_show(full)}: {result.to_text()}")
    entries = []
    for line in result.stdout.splitlines():
        name, _, kind = line.rpartition("\t")
        if name:
            entries.append(name + ("/" if kind == "d" else ""))
    entries.sort()
    shown = entries[:MAX_LISTING]
    head = (
        f"Files and directories in {_show(full)}, two levels deep (hidden entries and "
        "__pycache__ skipped):"
    )
    if not entries:
        return f"{_show(full)} is an empty directory (hidden entries are not listed)."
    body = "\n".join(shown)
    if len(entries) > len(shown):
        body += f"\n[... {len(entries) - len(shown)} more entries not shown: view a subdirectory]"
    return clip(f"{head}\n{body}")


def _check_range(view_range: list[int], count: int) -> tuple[int, int]:
    if len(view_range) != 2:
        raise _EditorError(f"view_range must be [start, end], got {view_range}")
    start, end = view_range
    if end == -1:
        end = count
    if not 1 <= start <= count:
        raise _EditorError(f"view_range start {start} is out of range: the file has lines 1 to {count}")
    if end < start:
        raise _EditorError(f"view_range end {end} is before start {start} (use -1 for the end of the file)")
    return start, min(end, count)


def _numbered(lines: list[str], first: int) -> list[str]:
    out = []
    for number, line in enumerate(lines, first):
        if len(line) > LINE_CHARS:
            line = line[:LINE_CHARS] + f" [... {len(line) - LINE_CHARS} more characters cut ...]"
        out.append(f"{number:6}\t{line}")
    return out


def _snippet(text: str, first: int, last: int) -> str:
    lines = text.splitlines()
    start = max(first - SNIPPET_CONTEXT, 1)
    end = min(last + SNIPPET_CONTEXT, len(lines))
    return clip("\n".join(_numbered(lines[start - 1 : end], start)), MAX_OUTPUT_CHARS // 2)


def _near_miss(text: str, old_str: str) -> str:
    """A hint naming where something close to ``old_str`` is, or ``""``."""
    stripped = old_str.strip()
    if stripped and stripped != old_str and stripped in text:
        lines = sorted({_line_of(text, i) for i in _occurrences(text, stripped)})
        return (
            f" Without its leading/trailing whitespace it occurs on line(s) {_list(lines)}: "
            "check indentation and line breaks."
        )
    first = next((line.strip() for line in old_str.splitlines() if line.strip()), "")
    lines = text.splitlines()
    if not first or len(lines) > NEAR_MISS_MAX_LINES:
        return ""
    best, best_ratio = 0, 0.0
    matcher = difflib.SequenceMatcher(b=first, autojunk=False)
    for number, line in enumerate(lines, 1):
        matcher.set_seq1(line.strip())
        if matcher.real_quick_ratio() > best_ratio and matcher.ratio() > best_ratio:
            best, best_ratio = number, matcher.ratio()
    if best_ratio < 0.6:
        return ""
    return (
        f" The line most like its first line is line {best}: "
        f"{lines[best - 1].strip()[:LINE_CHARS]!r}"
    )


def _occurrences(text: str, needle: str) -> list[int]:
    starts = []
    at = text.find(needle)
    while at >= 0:
        starts.append(at)
        at = text.find(needle, at + len(needle))
    return starts


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _list(numbers: list[int], most: int = 20) -> str:
    shown = ", ".join(str(n) for n in numbers[:most])
    return shown + (f" and {len(numbers) - most} more" if len(numbers) > most else "")
