"""Deterministic task sets from reasoning-gym generators.

Row ``i`` of a reasoning-gym dataset made with seed ``s`` is generated from ``s + i``, so two
seeds closer than the dataset size share rows. Each split therefore reads its own range of
seeds: ``test`` from ``seed * 2**24``, ``train`` from ``seed * 2**24 + 2**23``. Rows are also
made disjoint by question text: ``test`` keeps the first ``test_size`` distinct questions,
``train`` the first ``train_size`` distinct questions that are not in ``test`` (same ``seed``
and ``test_size``). Rows whose generation raises (reasoning-gym's ``basic_arithmetic`` can divide
by zero on a few seeds) are skipped. Everything is a pure function of the arguments.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

SPLITS = ("train", "test")
DEFAULT_GENERATORS = ("gsm_symbolic", "basic_arithmetic", "leg_counting", "decimal_arithmetic")
"""Generators whose ``score_answer`` gives 1.0 to their own answer and 0.0 to no answer."""

DEFAULT_SIZES = {"train": 500, "test": 200}
"""Rows per generator and split by default."""

_SPLIT_BASE = {"test": 0, "train": 1 << 23}
_SEED_STRIDE = 1 << 24
MAX_ROWS_SCANNED = 1 << 16
"""Rows of a generator read at most per split (distinct questions are picked among them)."""


def _reasoning_gym() -> Any:
    import reasoning_gym  # imported on first use: it loads all of its ~100 generators (~2 s)

    return reasoning_gym


def split_seed(split: str, seed: int = 0) -> int:
    """The reasoning-gym seed the rows of ``split`` are generated from.

    Raises:
        ValueError: Unknown split, or ``seed`` outside 0..63.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not 0 <= seed < 64:
        raise ValueError(f"seed must be in 0..63, got {seed!r}")
    return _SPLIT_BASE[split] + seed * _SEED_STRIDE


@functools.cache
def dataset(generator: str, split: str, seed: int = 0) -> Any:
    """The reasoning-gym dataset object of (generator, split, seed); rows are made lazily.

    Row ``i`` of the split's range is ``dataset(...)[i]``; its ``score_answer`` scores answers.
    """
    return _reasoning_gym().create_dataset(
        generator, size=MAX_ROWS_SCANNED, seed=split_seed(split, seed)
    )


def _json_safe(value: Any) -> Any:
    """``value`` as plain JSON data (metadata may hold e.g. ``Fraction``: those become text)."""
    return json.loads(json.dumps(value, default=str))


def _distinct_rows(
    generator: str, split: str, seed: int, size: int, exclude: frozenset[str]
) -> tuple[dict[str, Any], ...]:
    if size < 0:
        raise ValueError(f"the {split} size must be >= 0, got {size}")
    data = dataset(generator, split, seed)
    rows: list[dict[str, Any]] = []
    seen = set(exclude)
    index = 0
    while len(rows) < size and index < MAX_ROWS_SCANNED:
        try:
            entry = data[index]
        except Exception:  # noqa: BLE001 - a generator bug on this seed: skip the row
            entry = None
        if entry is not None and entry["question"] not in seen:
            seen.add(entry["question"])
            rows.append({
                "id": f"{generator}-{split}-{seed}-{len(rows)}",
                "split": split,
                "seed": seed,
                "generator": generator,
                "source_index": index,
                "question": entry["question"],
                "answer": str(entry["answer"]),
                "metadata": _json_safe(entry.get("metadata", {})),
            })
        index += 1
    if len(rows) < size:
        raise ValueError(
            f"reasoning-gym generator {generator!r} gave only {len(rows)} distinct questions "
            f"for split {split!r} in {index} rows; ask for fewer"
        )
    return tuple(rows)


@functools.cache
def _test_rows(generator: str, seed: int, test_size: int) -> tuple[dict[str, Any], ...]:
    return _distinct_rows(generator, "test", seed, test_size, frozenset())


@functools.cache
def _train_rows(
    generator: str, seed: int, train_size: int, test_size: int
) -> tuple[dict[str, Any], ...]:
    held_out = frozenset(row["question"] for row in _test_rows(generator, seed, test_size))
    return _distinct_rows(generator, "train", seed, train_size, held_out)


def generator_rows(
    generator: str, split: str, *, train_size: int, test_size: int, seed: int = 0
) -> tuple[dict[str, Any], ...]:
    """The rows of one generator in one split (cached; do not modify them)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "test":
        return _test_rows(generator, seed, test_size)
    return _train_rows(generator, seed, train_size, test_size)


def load_tasks(
    split: str = "test",
    *,
    generators: tuple[str, ...] = DEFAULT_GENERATORS,
    train_size: int = DEFAULT_SIZES["train"],
    test_size: int = DEFAULT_SIZES["test"],
    seed: int = 0,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """The tasks of ``split``: generator by generator, in generator order, row order within.

    Args:
        split: ``train`` or ``test``.
        generators: reasoning-gym dataset names.
        train_size: Rows per generator in ``train``.
        test_size: Rows per generator in ``test``.
        seed: Selects another (disjoint) family of splits, 0..63.
        limit: Keep the first ``limit`` tasks.

    Returns:
        Fresh task rows ``{"id", "split", "generator", "source_index", "question", "answer",
        "metadata"}``.
    """
    tasks: list[dict[str, Any]] = []
    for generator in generators:
        if limit is not None and len(tasks) >= limit:
            break
        rows = generator_rows(
            generator, split, train_size=train_size, test_size=test_size, seed=seed
        )
        tasks += [dict(row) for row in rows]
    return tasks if limit is None else tasks[: max(limit, 0)]


def score_answer(task: Mapping[str, Any], answer: str | None) -> float:
    """The generator's own ``score_answer(answer, entry)`` for a task row.

    ``entry`` is the generator's original row, made again from the task's (split, seed,
    source_index) when those match its question; otherwise it is rebuilt from the task's
    question, answer and metadata (e.g. for hand-written tasks).
    """
    generator, split, seed = task["generator"], task.get("split", "test"), task.get("seed", 0)
    data = dataset(generator, split if split in SPLITS else "test", seed)
    entry: Mapping[str, Any] | None = None
    index = task.get("source_index")
    if split in SPLITS and isinstance(index, int) and 0 <= index < MAX_ROWS_SCANNED:
        try:
            candidate = data[index]
        except Exception:  # noqa: BLE001 - not a generated row after all
            candidate = None
        if candidate is not None and candidate["question"] == task["question"]:
            entry = candidate
    if entry is None:
        entry = {
            "question": task["question"],
            "answer": task["answer"],
            "metadata": dict(task.get("metadata") or {}),
        }
    return float(data.score_answer(answer, dict(entry)))
