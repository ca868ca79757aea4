"""Deterministic generation of ``calc`` tasks."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from agentrl_tools.calculator import safe_eval

SPLITS = ("train", "test")
TEST_FRACTION_PER_MILLE = 100
_SPLIT_CODES = {"train": 1, "test": 2}

# Each word template fixes the expression's shape: (text, expression), with {a}..{d} numbers.
_WORD_TEMPLATES: tuple[tuple[str, str], ...] = (
    ("A shop has {a} boxes with {b} pencils in each. It receives {c} more pencils. "
     "How many pencils does it have now?", "{a}*{b}+{c}"),
    ("Mia had {a} stickers. She gave {b} away and then bought {c} packs of {d} stickers. "
     "How many stickers does she have?", "{a}-{b}+{c}*{d}"),
    ("A train carries {a} passengers. At the first stop {b} get off and {c} get on. "
     "How many passengers are on the train?", "{a}-{b}+{c}"),
    ("A farmer plants {a} rows of {b} trees and later removes {c} trees. "
     "How many trees are left?", "{a}*{b}-{c}"),
    ("Each of {a} teams has {b} players, and each player scores {c} points. "
     "How many points are scored in total?", "{a}*{b}*{c}"),
)
_OPS = ("+", "-", "*")


def split_of(question: str) -> str:
    """The split a question belongs to: a fixed hash of its text (about 10% test)."""
    digest = hashlib.blake2b(question.encode(), digest_size=8).digest()
    return "test" if int.from_bytes(digest, "big") % 1000 < TEST_FRACTION_PER_MILLE else "train"


def generate_task(rng: np.random.Generator) -> dict[str, Any]:
    """Draws one task (question, expression, integer answer) from ``rng``."""
    numbers = {k: int(rng.integers(1, 51)) for k in "abcd"}
    if rng.random() < 0.5:
        text, shape = _WORD_TEMPLATES[int(rng.integers(len(_WORD_TEMPLATES)))]
        question, expression = text.format(**numbers), shape.format(**numbers)
    else:
        n_ops = int(rng.integers(2, 4))
        parts = [str(numbers["a"])]
        for key in "bcd"[:n_ops]:
            parts += [_OPS[int(rng.integers(len(_OPS)))], str(numbers[key])]
        expression = "".join(parts)
        question = f"What is {' '.join(parts)}?"
    return {"question": question, "expression": expression, "answer": safe_eval(expression)}


def task_at(split: str, index: int, seed: int = 0) -> dict[str, Any]:
    """Task number ``index`` of ``split``: the same row for the same (split, index, seed)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = np.random.default_rng([seed, _SPLIT_CODES[split], index])
    while True:
        task = generate_task(rng)
        if split_of(task["question"]) == split:
            return {"id": f"calc-{split}-{seed}-{index}", "split": split, **task}


def load_tasks(split: str = "train", size: int = 1000, seed: int = 0) -> list[dict[str, Any]]:
    """The first ``size`` tasks of ``split`` for ``seed`` (deterministic, no duplicates across
    splits)."""
    return [task_at(split, i, seed) for i in range(size)]


def sample_task(rng: np.random.Generator, split: str = "train") -> dict[str, Any]:
    """A task of ``split`` drawn from ``rng`` (rejection sampling on the split hash)."""
    while True:
        task = generate_task(rng)
        if split_of(task["question"]) == split:
            digest = hashlib.blake2b(task["question"].encode(), digest_size=6).hexdigest()
            return {"id": f"calc-{split}-{digest}", "split": split, **task}
