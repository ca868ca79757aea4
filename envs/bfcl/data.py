"""BFCL tasks from the ``bfcl-eval`` package and their function schemas as JSON Schema.

``bfcl-eval`` (installed with ``--no-deps``) ships the data as JSON-lines files
``bfcl_eval/data/BFCL_v4_<category>.json`` and the answers as
``bfcl_eval/data/possible_answer/BFCL_v4_<category>.json``; they are read through
:mod:`importlib.resources`, importing nothing of ``bfcl_eval`` but its empty ``__init__``.

A task row is ``{"id", "category", "messages", "functions", "ground_truth"}``: ``functions``
are BFCL's own function documents (used for grading), ``ground_truth`` is BFCL's list of
``{function_name: {param: [possible values]}}`` (``""`` among the values marks an optional
parameter that may be omitted).
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from collections.abc import Mapping
from typing import Any

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")
"""The supported categories: single-turn Python function calling (AST-graded)."""

DATA_VERSION = "BFCL_v4"

_TYPE_MAP = {
    "dict": "object",
    "float": "number",
    "tuple": "array",
    "integer": "integer",
    "string": "string",
    "boolean": "boolean",
    "array": "array",
    "object": "object",
    "number": "number",
    "null": "null",
}
"""BFCL type name -> JSON Schema type; ``any`` (and anything unknown) becomes no type."""

_NOT_JSON_SCHEMA = frozenset({"optional"})
"""BFCL keys that are not JSON Schema keywords (dropped from the mapped schema)."""


def _read_jsonl(*parts: str) -> list[dict[str, Any]]:
    resource = importlib.resources.files("bfcl_eval").joinpath("data", *parts)
    try:
        text = resource.read_text(encoding="utf-8")
    except (FileNotFoundError, ModuleNotFoundError) as exc:
        raise FileNotFoundError(
            f"BFCL data file {'/'.join(parts)} not found in the bfcl-eval package: install it "
            'with `pip install --no-deps "bfcl-eval==2026.3.23"`'
        ) from exc
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@functools.cache
def _category_rows(category: str) -> tuple[dict[str, Any], ...]:
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; supported: {CATEGORIES}")
    questions = _read_jsonl(f"{DATA_VERSION}_{category}.json")
    answers = {row["id"]: row["ground_truth"]
               for row in _read_jsonl("possible_answer", f"{DATA_VERSION}_{category}.json")}
    rows = []
    for row in questions:
        if row["id"] not in answers:
            raise ValueError(f"BFCL task {row['id']} has no possible answer")
        rows.append({
            "id": row["id"],
            "category": category,
            "messages": [dict(m) for m in row["question"][0]],
            "functions": row["function"],
            "ground_truth": answers[row["id"]],
        })
    rows.sort(key=lambda r: int(r["id"].rsplit("_", 1)[1]))
    return tuple(rows)


def task_rows(categories: tuple[str, ...] | list[str] = CATEGORIES) -> tuple[dict[str, Any], ...]:
    """The cached task rows of ``categories`` (shared: copy a row before changing it)."""
    rows: list[dict[str, Any]] = []
    for category in categories:
        rows += _category_rows(category)
    return tuple(rows)


def copy_task(row: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of a task row."""
    return json.loads(json.dumps(row))


def load_tasks(
    categories: tuple[str, ...] | list[str] = CATEGORIES, limit: int | None = None
) -> list[dict[str, Any]]:
    """BFCL tasks, category by category (in the order given), by task number within.

    Args:
        categories: Categories among :data:`CATEGORIES`.
        limit: Keep the first ``limit`` tasks.

    Returns:
        Fresh task rows (deep copies: safe to modify).

    Raises:
        ValueError: An unknown category.
    """
    tasks: list[dict[str, Any]] = []
    for category in categories:
        if limit is not None and len(tasks) >= limit:
            break
        tasks += [copy_task(row) for row in _category_rows(category)]
    return tasks if limit is None else tasks[: max(limit, 0)]


def to_json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A BFCL parameter schema as JSON Schema (draft 2020-12), recursively.

    Types are mapped (``dict`` -> ``object``, ``float`` -> ``number``, ``tuple`` -> ``array``,
    ``any`` -> no ``type`` constraint); ``properties``, ``items`` and ``additionalProperties``
    are mapped in turn; BFCL-only keys (``optional``) are dropped; everything else (``enum``,
    ``default``, ``description``, ``required``, ...) is kept.
    """
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _NOT_JSON_SCHEMA:
            continue
        if key == "type":
            mapped = _TYPE_MAP.get(value) if isinstance(value, str) else None
            if mapped is not None:
                out["type"] = mapped
        elif key == "properties" and isinstance(value, Mapping):
            out["properties"] = {
                name: to_json_schema(sub) if isinstance(sub, Mapping) else sub
                for name, sub in value.items()
            }
        elif key in ("items", "additionalProperties") and isinstance(value, Mapping):
            out[key] = to_json_schema(value)
        else:
            out[key] = value
    return out


def tool_schema(function: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI-style tool schema of a BFCL function document."""
    parameters = to_json_schema(function.get("parameters") or {})
    parameters["type"] = "object"
    parameters.setdefault("properties", {})
    return {
        "type": "function",
        "function": {
            "name": function["name"],
            "description": function.get("description") or function["name"],
            "parameters": parameters,
        },
    }
