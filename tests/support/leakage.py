"""Asserting that what a policy-side path handed out holds no private task field."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from agentrl.env import ToolEnv
from agentrl.env.leakage import find_leaks, value_needles


def assert_public_only(env: ToolEnv, row: Mapping[str, Any], seen: Any, where: str) -> None:
    """No private string of ``row`` (8+ characters, and not also in its public fields) occurs
    in ``seen``, and every task dict in
    it (a ``task`` key's value) holds the env's public fields only, so short private values
    (calc's answer) are covered too."""
    assert env.task_fields is not None
    public = json.dumps(env.public_task(row))
    # a private string that the public fields hold too (swe-tools' buggy line, in its file) is
    # no secret; exact values are looked for here, canaries by check_env's leakage check
    needles = {text: field for text, field in value_needles(env.task_fields, row).items()
               if json.dumps(text)[1:-1] not in public}
    leaks = find_leaks(needles, seen, where)
    assert not leaks, f"private values on the policy side: {[str(leak) for leak in leaks]}"
    for path, task in _task_dicts(seen, where):
        assert set(task) <= set(env.task_fields.public), f"{path} holds {sorted(task)}"


def _task_dicts(value: Any, path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key == "task" and isinstance(item, Mapping):
                yield f"{path}[task]", item
            yield from _task_dicts(item, f"{path}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _task_dicts(item, f"{path}[{i}]")
