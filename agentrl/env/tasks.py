"""What an env needs of a task row, checked once, where rows are read.

An env declares :class:`TaskFields` (``ToolEnv.task_fields``): the fields its
``make_prompt`` and ``compute_reward`` read, which of them a prompt file's ``--input-key``
column and ``--label-key`` column fill, and an example row. The data loader turns every row
into a task with :meth:`TaskFields.task_from` before the run starts, so a row the env cannot
use is skipped with its line and the reason (the fields it lacks, the ones it has), and a file
with no usable row is refused at start-up instead of failing every episode.

The same declaration says which fields the policy side may see (:attr:`TaskFields.public`):
every path that hands a task to the side being graded (``reset``'s ``info["task"]``,
``agentrl serve-env``'s observations and task API, black-box agents' ``task``, exported
trajectories) hands out :meth:`TaskFields.public_view`, never the row. Every other field
(answers, reference fixes, hidden tests, solutions, and any column nobody classified) is
private: only the grader (``compute_reward``, through ``EpisodeState.task``) reads it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["TaskFields", "public_view"]


@dataclasses.dataclass(frozen=True)
class TaskFields:
    """The fields of an env's task rows.

    Attributes:
        fields: Each field the env reads (name -> what it holds, in a few words); a row without
            one of them, or with it null, is not a task of this env.
        prompt: The field a prompt file's ``--input-key`` column fills when the row lacks it
            (``question`` for calc: ``--input-key text`` reads the question from ``text``).
        label: The field the ``--label-key`` column fills when the row lacks it.
        example: A row of this env, for the docs and ``agentrl list-envs --verbose``.
        public: The fields the policy side may see (the question, the problem statement, the
            visible files, ids, the split): what :meth:`public_view` keeps. Any other field of
            a row, declared in :attr:`fields` or not, is private.
        private: The fields only the grader reads (answers, fixes, hidden tests), named for the
            docs, ``agentrl list-envs --verbose`` and the leakage check; a field in neither list
            is private too.

    Raises:
        ValueError: A field is both public and private.
    """

    fields: Mapping[str, str]
    prompt: str | None = None
    label: str | None = None
    example: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    public: tuple[str, ...] = ()
    private: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("public", "private"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"TaskFields.{name} must be a tuple of field names, got {value!r}")
            object.__setattr__(self, name, tuple(value))
        both = sorted(set(self.public) & set(self.private))
        if both:
            raise ValueError(f"TaskFields: {both} are both public and private; a field is one or the other")

    def public_view(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """What the policy side may see of ``row``: its :attr:`public` fields (copies)."""
        return {name: copy.deepcopy(row[name]) for name in self.public if name in row}

    def private_fields(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The fields of ``row`` the policy side must never see: all but :attr:`public`."""
        return {name: value for name, value in row.items() if name not in self.public}

    def task_from(self, row: Mapping[str, Any], input_key: str, label_key: str) -> dict[str, Any] | str:
        """``row`` as a task of this env, or why it cannot be one.

        Args:
            row: A row of a prompt file.
            input_key: ``--input-key``: its column fills :attr:`prompt` when the row lacks it.
            label_key: ``--label-key``: its column fills :attr:`label` when the row lacks it.

        Returns:
            The task (a new dict: the row, with the mapped fields added), or the reason as a
            sentence that names the fields missing, the ones the row has and how to map one.
        """
        task = dict(row)
        for field, key in ((self.prompt, input_key), (self.label, label_key)):
            if field is not None and task.get(field) is None and task.get(key) is not None:
                task[field] = task[key]
        missing = [name for name in self.fields if task.get(name) is None]
        if not missing:
            return task
        needs = ", ".join(f"{name!r} ({self.fields[name]})" for name in missing)
        hints = [f"{flag} NAME reads {field!r} from the column NAME"
                 for field, flag in ((self.prompt, "--input-key"), (self.label, "--label-key"))
                 if field in missing]
        hint = f"; {' and '.join(hints)}" if hints else ""
        return f"no {needs}; the row has {sorted(row)[:10]}{hint}"

    def describe(self) -> list[str]:
        """Lines that say what a row needs: each field, the flags that map onto fields, an
        example."""
        lines = [f"  {name}: {what}" + (" (--input-key maps a column onto it)" if name == self.prompt
                                        else " (--label-key maps a column onto it)" if name == self.label
                                        else "")
                 for name, what in self.fields.items()]
        lines.append("  public (the policy may see): " + (", ".join(self.public) or "(none)"))
        unlisted = [name for name in self.fields if name not in self.public and name not in self.private]
        private = [*self.private, *unlisted]
        lines.append("  private (the grader only): " + (", ".join(private) or "(none)")
                     + "; and any other column of a row")
        if self.example:
            lines.append(f"  example row: {json.dumps(dict(self.example), ensure_ascii=False)}")
        return lines


def public_view(fields: TaskFields | None, row: Mapping[str, Any]) -> dict[str, Any]:
    """What the policy side may see of ``row`` for an env declaring ``fields``: nothing for an
    env that declares none (every field is private until an env says otherwise)."""
    return fields.public_view(row) if fields is not None else {}
