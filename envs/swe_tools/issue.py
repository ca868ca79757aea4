"""Issue text for a task, written from what a user would observe: the failing test's name, the
statement of the test that failed and the assertion message (never from the diff)."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl_envs.swe_tools import sources
from agentrl_envs.swe_tools.sources import SourceModule

MAX_MESSAGE_CHARS = 1200
MAX_MESSAGE_LINES = 20
MAX_OTHERS = 5


def _clean(message: str) -> str:
    """Removes run-specific noise (addresses) and bounds the length."""
    message = re.sub(r"0x[0-9a-fA-F]{6,}", "0x...", message.strip())
    lines = message.splitlines()
    if len(lines) > MAX_MESSAGE_LINES:
        lines = lines[:MAX_MESSAGE_LINES] + ["..."]
    message = "\n".join(lines)
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + " ..."
    return message


def _phrase(method: str, doc: str) -> str:
    """What a test checks, in words: its docstring, else its name split into words."""
    if doc:
        doc = re.sub(r"^(tests?|check)\s+(that\s+)?", "", doc.rstrip("."), flags=re.IGNORECASE)
        return doc[:1].lower() + doc[1:] if doc[1:2].islower() else doc
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", method.removeprefix("test"))
    words = words.replace("_", " ").strip().lower()
    return words or method


def _api_names(snippet: str, alias: str) -> list[str]:
    """``alias.name`` attributes a statement uses (the module's API it exercises)."""
    try:
        tree = ast.parse(snippet)
    except SyntaxError:
        return []
    names = [
        node.attr for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == alias
    ]
    return list(dict.fromkeys(names))


def _alias(tests: str, module: SourceModule) -> str | None:
    for node in sources.parse(tests).body:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == module.project_name:
                    return a.asname or a.name
    return None


def problem_statement(module: SourceModule, tests: str, failing: Sequence[str],
                      results: Mapping[str, Any]) -> str:
    """The issue for a mutant, from its first failing test.

    Args:
        module: The source module.
        tests: The test source the results refer to (frames are lines of it).
        failing: Failing test ids (``Class.method``), sorted.
        results: The runner's per-test results (``[outcome, owner, detail]``).
    """
    with_detail = [t for t in failing if results.get(t, [None, None, None])[2]]
    test_id = (with_detail or list(failing))[0]
    cls, method = test_id.split(".", 1)
    outcome, owner, detail = results.get(test_id, ["missing", cls, None])
    doc = sources.docstring_of(tests, owner or cls, method)
    phrase = _phrase(method, doc)
    project = module.project_name
    alias = _alias(tests, module)
    parts: list[str] = []
    if detail is None:
        parts.append(f"## `{project}`: {phrase} is broken")
        parts.append(f"The check `{cls}.{method}` no longer passes (it did not finish).")
    else:
        frames = detail.get("frames") or []
        kind = detail.get("type", "Exception")
        if kind == "AssertionError" and not detail.get("raised_in_module"):
            parts.append(f"## `{project}`: wrong result in {phrase}")
        else:
            parts.append(f"## `{project}`: {phrase} raises `{kind}`")
        snippets = []
        for lineno, _ in ([frames[0], frames[-1]] if len(frames) > 1 else frames):
            snippet = sources.statement_at(tests, lineno)
            if snippet and snippet not in snippets:
                snippets.append(snippet)
        if snippets:
            where = f"in the check `{cls}.{method}`"
            parts.append(f"This code, {where}, does not behave as expected:")
            parts.append("```python\n" + "\n".join(snippets) + "\n```")
        else:
            parts.append(f"The check `{cls}.{method}` fails.")
        message = _clean(detail.get("message", ""))
        parts.append(f"It fails with:\n```\n{kind}: {message}\n```" if message else
                     f"It fails with a bare `{kind}` (no message).")
        api = _api_names("\n".join(snippets), alias) if alias else []
        if alias and snippets and alias in "\n".join(snippets):
            note = f"(`{alias}` is `{project}`: the tests do `import {project} as {alias}`.)"
            if api:
                note = f"The API involved: {', '.join(f'`{project}.{a}`' for a in api)}. " + note
            parts.append(note)
    others = [t for t in failing if t != test_id]
    if others:
        listed = ", ".join(f"`{t}`" for t in others[:MAX_OTHERS])
        more = f" and {len(others) - MAX_OTHERS} more" if len(others) > MAX_OTHERS else ""
        parts.append(f"The same problem also breaks {listed}{more}.")
    parts.append("Expected: these checks pass, as they did before this regression.")
    return "\n\n".join(parts)
