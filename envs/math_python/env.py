"""The ``math-python`` environment: reasoning-gym word problems with a sandboxed python tool."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl import EpisodeState
from agentrl.env import TaskFields, check_split
from agentrl.env.sandboxed import SandboxedToolEnv
from agentrl_envs.math_python.tasks import (
    DEFAULT_GENERATORS,
    DEFAULT_SIZES,
    SPLITS,
    generator_rows,
    load_tasks,
    score_answer,
)
from agentrl_tools.python_tool import python

SYSTEM_PROMPT = (
    "Solve the problem. You may run Python code with the python tool to compute. When you know "
    "the result, reply without a tool call and end your reply with a line 'Answer: <answer>'."
)
_ANSWER_RE = re.compile(r"Answer:[ \t]*(.*)", re.IGNORECASE)


def extract_answer(text: str) -> str | None:
    """The text after the last ``Answer:`` on its line (``**``, backticks, ``$`` and one
    trailing period stripped), or ``None`` when there is no ``Answer:`` line.

    Examples:
        >>> extract_answer("It is 3 + 4.\\nAnswer: 7.")
        '7'
    """
    found = _ANSWER_RE.findall(text)
    if not found:
        return None
    answer = found[-1].strip().strip("*`$ \t").strip()
    if answer.endswith(".") and not answer.endswith(".."):
        answer = answer[:-1].rstrip()
    return answer


def hedge_checked(task: Mapping[str, Any], answer: str | None, score: float) -> float:
    """``score`` (the generator's), or 0.0 when it is partial credit for an answer that merely
    contains the expected one.

    reasoning-gym's default scorer (``basic_arithmetic``, ``leg_counting``...) gives
    ``len(expected) / len(answer)`` to any answer that contains the expected text: ``5000``
    for ``500`` earns 0.75, and a list of candidates earns more than one wrong number. Only an
    answer the generator scores 1.0 keeps full credit; other partial credit (e.g. 0.01 for a
    wrong single number on ``gsm_symbolic``) is kept when the answer does not contain the
    expected text.

    Examples:
        >>> hedge_checked({"answer": "500"}, "5000", 0.75)
        0.0
        >>> hedge_checked({"answer": "500"}, "500", 1.0)
        1.0
    """
    if score < 1.0 and answer and str(task["answer"]) in answer:
        return 0.0
    return score


class MathPythonEnv(SandboxedToolEnv):
    """Math word problems (reasoning-gym) with a python tool; reward from the generator's scorer.

    Tasks come from reasoning-gym generators (by default ``gsm_symbolic``, ``basic_arithmetic``,
    ``leg_counting`` and ``decimal_arithmetic``), ``train_size`` / ``test_size`` rows per
    generator and split, deterministic and disjoint (see :mod:`agentrl_envs.math_python.tasks`).
    The model may compute with the ``python`` tool in the episode's sandbox and ends with a turn
    without tool calls whose last ``Answer: X`` line gives the answer; the reward is the
    generator's own ``score_answer(X, entry)`` (``None`` when there is no ``Answer:`` line),
    except that partial credit for an answer that merely contains the expected one is 0.0
    (:func:`hedge_checked`: reasoning-gym's default scorer pays ``5000`` for ``500``, or a
    list of candidates, a share of the reward). Scorers may give other partial credit (e.g.
    0.01 for a wrong number on ``gsm_symbolic``); a success is a reward of 1.0.

    Args:
        split: Split that ``reset()`` without a task draws from (``train`` or ``test``).
        generators: reasoning-gym dataset names (each must score its own answer 1.0).
        train_size: Rows per generator in ``train``.
        test_size: Rows per generator in ``test``.
        seed: Another disjoint family of splits (0..63).
        max_turns: Assistant turns before truncation (default 6).
        **kwargs: Passed to :class:`agentrl.env.sandboxed.SandboxedToolEnv`.

    Raises:
        ValueError: Unknown split (:class:`~agentrl.errors.UnknownSplitError`), no generator,
            or a negative size.
    """

    tools = (python,)
    default_max_turns = 6
    task_fields = TaskFields(
        {"question": "the problem, as the user asks it",
         "answer": "the expected final answer (text)",
         "generator": "the reasoning-gym generator whose scorer grades the answer, e.g. basic_arithmetic"},
        prompt="question", label="answer",
        example={"question": "What is 17 + 25?", "answer": "42", "generator": "basic_arithmetic"},
        public=("id", "split", "question", "generator", "seed", "source_index"),
        private=("answer", "metadata"))  # reasoning-gym's metadata holds the answer and its working

    def __init__(
        self,
        *,
        split: str = "train",
        generators: Sequence[str] = DEFAULT_GENERATORS,
        train_size: int = DEFAULT_SIZES["train"],
        test_size: int = DEFAULT_SIZES["test"],
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        check_split(type(self), split, SPLITS)
        generators = tuple(generators)
        if not generators or not all(isinstance(g, str) for g in generators):
            raise ValueError(f"generators must be reasoning-gym dataset names, got {generators!r}")
        sizes = {"train": train_size, "test": test_size}
        for name, size in sizes.items():
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"{name}_size must be an int >= 1, got {size!r}")
        if not isinstance(seed, int) or not 0 <= seed < 64:
            raise ValueError(f"seed must be an int in 0..63, got {seed!r}")
        super().__init__(**kwargs)
        self.split = split
        self.generators = generators
        self.train_size = train_size
        self.test_size = test_size
        self.seed = seed

    def sample_task(self) -> dict[str, Any]:
        generator = self.generators[int(self.np_random.integers(len(self.generators)))]
        rows = generator_rows(
            generator, self.split, train_size=self.train_size, test_size=self.test_size,
            seed=self.seed,
        )
        return dict(rows[int(self.np_random.integers(len(rows)))])

    def task_set(self, split: str = "test", limit: int | None = None) -> list[dict[str, Any]]:
        """The tasks of ``split``, generator by generator (``limit``: the first ones).

        Raises:
            UnknownSplitError: ``split`` is not ``train`` or ``test``.
        """
        check_split(self, split, SPLITS)
        return load_tasks(
            split, generators=self.generators, train_size=self.train_size,
            test_size=self.test_size, seed=self.seed, limit=limit,
        )

    def make_prompt(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": str(task["question"])},
        ]

    def compute_reward(
        self, task: Mapping[str, Any], final: Mapping[str, Any], state: EpisodeState
    ) -> float:
        answer = extract_answer(final.get("content") or "")
        generator_score = score_answer(task, answer)
        score = hedge_checked(task, answer, generator_score)
        state.grade = {"answer": answer, "expected": task["answer"], "score": score,
                       "generator_score": generator_score}
        return score

    def oracle_action(self, task: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> str:
        """Answers the task's ground-truth answer."""
        return f"Answer: {task['answer']}"
