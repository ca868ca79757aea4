"""The ``calc`` environment and its scripted oracle."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl import EpisodeState, ToolEnv
from agentrl.env import TaskFields, check_split
from agentrl.tools import ToolCall
from agentrl_envs.calc.tasks import SPLITS, load_tasks, sample_task
from agentrl_tools.calculator import calculator

SYSTEM_PROMPT = (
    "Solve the arithmetic problem. Use the calculator tool for the arithmetic. "
    "When you know the result, reply with 'Answer: <integer>' and no tool call."
)
COMPACT_SYSTEM_PROMPT = "Call the calculator tool like this:\n{example}\nthen reply 'Answer: <integer>'."
"""The ``compact=True`` system prompt; ``{example}`` is one call written in the env's tool-call
format."""
_EXAMPLE_CALL = ToolCall("calculator", {"expression": "2*3+4"})
_ANSWER_RE = re.compile(r"Answer:[ \t]*\**[ \t]*(-?\d+)")


def parse_answer(text: str) -> int | None:
    """The integer of the last ``Answer: N`` in ``text``, or ``None``.

    The rest of its line may hold words or punctuation (``Answer: 42 pencils.``,
    ``Answer: **42**``) but no other digit: ``Answer: 42.5``, ``Answer: 42, 43``,
    ``Answer: 4e2`` or ``Answer: 42/3`` give no answer rather than 42 or 4, so several
    candidates at once, or a number cut short, never count as their first integer. A number
    too long for ``int()`` (over 4,300 digits) is no answer either.

    Examples:
        >>> parse_answer("The result is 42.\\nAnswer: 42")
        42
        >>> parse_answer("Answer: 42 or 43") is None
        True
    """
    matches = list(_ANSWER_RE.finditer(text))
    if not matches:
        return None
    last = matches[-1]
    rest = text[last.end():].split("\n", 1)[0]
    if any(c.isdigit() for c in rest):
        return None
    try:
        return int(last.group(1))
    except ValueError:  # more digits than int() converts (4300): not an answer, not a crash
        return None


class CalcEnv(ToolEnv):
    """Arithmetic word problems with a calculator tool; reward 1 for the right answer.

    Compact prompts (``compact=True``), for small models with short contexts: by default the
    chat template lists the calculator's JSON schema and its calling instructions in the system
    turn (about 290 of a demonstration's ~410 tokens with the built-in tiny tokenizer). With
    ``compact=True`` the system prompt instead shows one example call, written in the env's
    tool-call format, and ``reset`` returns no schemas in ``info["tools"]`` (so the template adds
    no tool block); the calculator still runs and is parsed exactly as before, and tasks and
    rewards are unchanged. The oracle then writes terse turns: the bare call, then
    ``Answer: N``. A demonstration is about 170 tokens.

    Args:
        split: Task split that ``reset()`` without a task draws from (``train`` or ``test``;
            another raises :class:`~agentrl.errors.UnknownSplitError`).
        compact: Short system prompt with an example call instead of the template's tool schema
            listing; terse oracle turns (see above). Default ``False``.
        max_turns: Assistant turns before truncation (default 4: one call, one answer, slack).
        **kwargs: Passed to :class:`agentrl.ToolEnv`.
    """

    tools = (calculator,)
    default_max_turns = 4
    task_fields = TaskFields(
        {"question": "the arithmetic question, as the user asks it",
         "answer": "the integer answer"},
        prompt="question", label="answer",
        example={"question": "What is 12 * 7?", "answer": 84, "expression": "12 * 7"},
        public=("id", "split", "question"),
        private=("answer", "expression"))

    def __init__(self, *, split: str = "train", compact: bool = False, **kwargs: Any) -> None:
        check_split(type(self), split, SPLITS)
        if not isinstance(compact, bool):
            raise ValueError(f"compact must be true or false, got {compact!r}")
        super().__init__(**kwargs)
        self.split = split
        self.compact = compact
        self.show_tool_schemas = not compact  # the compact prompt shows the call itself
        self.system_prompt = (
            COMPACT_SYSTEM_PROMPT.format(example=self.format.render("", [_EXAMPLE_CALL]))
            if compact else SYSTEM_PROMPT
        )

    def sample_task(self) -> dict[str, Any]:
        return sample_task(self.np_random, self.split)

    def make_prompt(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": str(task["question"])},
        ]


    def compute_reward(self, task: Mapping[str, Any], final: Mapping[str, Any], state: EpisodeState) -> float:
        given = parse_answer(final.get("content") or "")
        state.grade = {"answer": given, "expected": int(task["answer"])}
        return 1.0 if given == int(task["answer"]) else 0.0

    def task_set(self, split: str = "test", limit: int | None = None) -> list[dict[str, Any]]:
        """The first ``limit`` (default 1000) tasks of ``split``.

        Raises:
            UnknownSplitError: ``split`` is not ``train`` or ``test``.
        """
        check_split(self, split, SPLITS)
        return load_tasks(split, 1000 if limit is None else limit)

    def oracle_action(self, task: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> str:
        return calc_oracle(self, task, history)


def calc_oracle(env: ToolEnv, task: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> str:
    """The scripted expert: call the calculator on the task's expression, then answer.

    Returns raw assistant text in the env's tool-call format, exactly as a model would write it;
    terse (no words around the call and the answer) for an env made with ``compact=True``.
    """
    compact = getattr(env, "compact", False)
    last = history[-1] if history else None
    if last is not None and last.get("role") == "tool" and not last["content"].startswith("Error"):
        result = last["content"]
        return f"Answer: {result}" if compact else f"The result is {result}.\nAnswer: {result}"
    call = ToolCall("calculator", {"expression": str(task["expression"])})
    return env.format.render("" if compact else "Let me compute this.", [call])
