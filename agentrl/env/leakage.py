"""Finding a task's private values on the policy side (the leakage check).

A task row's private fields (see :class:`~agentrl.env.tasks.TaskFields`) are for the grader
only. This module finds them in what the side being graded receives: observations, infos,
tool outputs, served JSON, agent payloads, files in the episode's sandbox.

Two ways to look, both used by :func:`agentrl.env.check_env`:

* **Canaries** (:func:`canary_row`): every private value of a row is replaced by a unique
  marker of the same type (strings by ``agentrl-canary-<n>``, numbers by large distinctive
  numbers; structure and keys kept), the env plays that row, and any marker on the policy side
  is a leak. Nothing is matched by coincidence, so short answers (``84``) are found too.
* **Values** (:func:`value_needles`), for an env that cannot even start an episode on a
  canary row (its setup reads a private field, as Harbor's task folder): the row's own private
  strings of at least :data:`MIN_VALUE_CHARS` characters. Shorter values and numbers are not
  looked for this way: they occur in questions and tool outputs by chance.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from typing import Any

from agentrl.env.tasks import TaskFields

__all__ = ["MIN_VALUE_CHARS", "Leak", "canary_row", "find_leaks", "value_needles"]

MIN_VALUE_CHARS = 8
"""The shortest private string looked for by value (not by canary)."""

_CANARY_INT = 918_273_000
"""Canary numbers count up from here: nine digits that no small task holds by chance."""


@dataclasses.dataclass(frozen=True)
class Leak:
    """A private value found on the policy side.

    Attributes:
        field: The private field, with the path inside it (``fix['new']``, ``test_ids[0]``).
        where: Where it was found (``observation[1]['content']``, ``file /workspace/x.py``).
    """

    field: str
    where: str

    def __str__(self) -> str:
        return f"{self.field} in {self.where}"


def canary_row(fields: TaskFields, row: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``row`` with every private value replaced by a canary of the same type.

    Args:
        fields: The env's task fields (which are public).
        row: A task row.

    Returns:
        The new row (public fields untouched), and each canary's text -> the field path it
        stands for. Booleans and nulls stay (a canary cannot stand for them).
    """
    needles: dict[str, str] = {}

    def replace(value: Any, path: str) -> Any:
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, str):
            canary = f"agentrl-canary-{len(needles)}"
        elif isinstance(value, int):
            canary = str(_CANARY_INT + len(needles))
        elif isinstance(value, float):
            canary = f"{_CANARY_INT + len(needles)}.5"
        elif isinstance(value, Mapping):
            return {key: replace(item, f"{path}[{key!r}]") for key, item in value.items()}
        elif isinstance(value, list | tuple):
            return [replace(item, f"{path}[{i}]") for i, item in enumerate(value)]
        else:
            return value
        needles[canary] = path
        return type(value)(canary) if not isinstance(value, str) else canary

    out = dict(row)
    for name, value in fields.private_fields(row).items():
        out[name] = replace(value, name)
    return out, needles


def value_needles(fields: TaskFields, row: Mapping[str, Any]) -> dict[str, str]:
    """The private strings of ``row`` worth looking for by value (see the module): each text
    of at least :data:`MIN_VALUE_CHARS` characters -> its field path."""
    needles: dict[str, str] = {}
    for name, value in fields.private_fields(row).items():
        for path, leaf in _leaves(value, name):
            text = leaf.strip() if isinstance(leaf, str) else ""
            if len(text) >= MIN_VALUE_CHARS:
                needles.setdefault(text, path)
    return needles


def find_leaks(needles: Mapping[str, str], seen: Any, where: str) -> list[Leak]:
    """Where in ``seen`` (JSON-like data, or text) a needle occurs.

    Args:
        needles: Text -> the field path it stands for (:func:`canary_row`, :func:`value_needles`).
        seen: What the policy side received.
        where: Its name (``observation``, ``served reset``): paths are added to it.

    Returns:
        One :class:`Leak` per needle and place, in the order found.
    """
    found: list[Leak] = []
    for path, leaf in _leaves(seen, where):
        text = leaf if isinstance(leaf, str) else json.dumps(leaf) if isinstance(leaf, int | float) else ""
        for needle, field in needles.items():
            if needle in text:
                found.append(Leak(field, path))
    return found


def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every leaf of JSON-like ``value`` with its path; dict keys count as leaves too (a
    hidden test's file name is a key)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield f"{path}[{key!r}] (the key)", str(key)
            yield from _leaves(item, f"{path}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _leaves(item, f"{path}[{i}]")
    else:
        yield path, value
