"""The ``bfcl`` environment: single-turn function calling, graded under BFCL's AST rules."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl import EpisodeState, ToolEnv
from agentrl.env import TaskFields, check_split
from agentrl.errors import AgentRLError, SchemaViolationError
from agentrl.tools import Tool, ToolCall
from agentrl.tools.toolbox import Toolbox, ToolOutcome, error_text
from agentrl_envs.bfcl.data import CATEGORIES, copy_task, load_tasks, task_rows, tool_schema
from agentrl_envs.bfcl.grading import grade_calls, oracle_calls

SYSTEM_PROMPT = (
    "You are an expert in composing function calls. Answer the user's request by calling the "
    "provided functions, with every call it needs in this one turn (several calls when the "
    "request asks for several). Use only the given functions and parameter names."
)
RECORDED = "Call recorded; it is graded with the turn's other calls."


def _answer_slot(**arguments: Any) -> None:
    """Never called: the calls of an answer turn are recorded and graded, not executed."""


@functools.lru_cache(maxsize=4096)
def _answer_tool(function_json: str) -> Tool:
    """The (stateless) answer-slot tool of one BFCL function document, built once: building
    checks the schema and compiles its validator, which costs milliseconds."""
    schema = tool_schema(json.loads(function_json))["function"]
    return Tool(
        _answer_slot, name=schema["name"], description=schema["description"],
        parameters=schema["parameters"], timeout=None, inline=True,
    )


class AnswerToolbox(Toolbox):
    """The functions of one BFCL task as tools whose calls are *answers*, not executions.

    A well-formed call to one of the functions (known name, arguments a JSON object) is recorded:
    it ends the episode (:meth:`EpisodeState.finish`), and its arguments are validated against
    the function's JSON Schema only to report problems to the model (``schema_violation``); the
    grade is BFCL's, whatever the schema says. Unknown names and arguments that are not an object
    are tool errors as in any env, and do not end the episode.

    Args:
        functions: The task's BFCL function documents.
    """

    def __init__(self, functions: Sequence[Mapping[str, Any]]) -> None:
        super().__init__(_answer_tool(json.dumps(f, sort_keys=True)) for f in functions)

    async def run(self, call: ToolCall, context: Mapping[type, Any]) -> ToolOutcome:
        start = time.perf_counter()
        slot = self.get(call.name)
        arguments = call.arguments
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = None
        if slot is None or not isinstance(arguments, dict):
            return await super().run(call, context)
        state = context.get(EpisodeState)
        if state is None:
            raise AgentRLError("AnswerToolbox needs the episode's EpisodeState in the context")
        state.finish()
        try:
            slot.validate(arguments)
        except SchemaViolationError as exc:
            content = f"{error_text(exc)}. The call is graded as written."
            return ToolOutcome(call, content, exc.kind, time.perf_counter() - start)
        return ToolOutcome(call, RECORDED, None, time.perf_counter() - start)


class BfclEnv(ToolEnv):
    """BFCL function calling: answer with the right calls; graded by BFCL's AST rules.

    Tasks are the Python categories of the Berkeley Function Calling Leaderboard shipped in the
    ``bfcl-eval`` package: ``simple_python`` (400), ``multiple`` (200), ``parallel`` (200) and
    ``parallel_multiple`` (200). Each task's functions are that episode's tools: ``reset``
    returns their JSON Schemas (BFCL's types mapped: ``dict`` -> ``object``, ``float`` ->
    ``number``, ``tuple`` -> ``array``, ``any`` -> unconstrained) in ``info["tools"]``, and
    ``self.toolbox`` is rebuilt for each episode (it keeps the last episode's functions after
    the episode ends). The class-level ``tools`` is empty.

    **The answer is a turn with tool calls.** The first turn that makes a well-formed call to
    one of the task's functions terminates the episode, and *all* calls of that turn are graded
    together (:func:`agentrl_envs.bfcl.grading.grade_calls`): reward 1.0 when they match the
    task's possible answers under BFCL's rules, else 0.0. The calls are not executed: each gets
    a ``role: tool`` message saying it was recorded, or, when its arguments break the
    function's schema, a ``schema_violation`` error counted in ``info["tool_errors"]`` (the
    grade is still BFCL's, which accepts some values a strict schema refuses). A turn without
    tool calls terminates with reward 0.0 (no call is a wrong answer here).

    A turn whose calls cannot be parsed, name no function of the task, or have non-object
    arguments gets error messages and does not terminate, like in any env; with the default
    ``max_turns=1`` (BFCL is single-shot) such an episode is truncated: reward 0.0, not scored.
    A larger ``max_turns`` lets a model correct such malformed turns.

    Splits: only ``test`` (BFCL is an evaluation set); ``task_set("train")`` is refused.

    Args:
        categories: BFCL categories to use, among
            :data:`agentrl_envs.bfcl.data.CATEGORIES`.
        max_turns: Assistant turns before truncation (default 1).
        **kwargs: Passed to :class:`agentrl.ToolEnv` (``tool_call_format``, ...).

    Raises:
        ValueError: An unknown category, or none.
    """

    tools = ()
    default_max_turns = 1
    task_fields = TaskFields(
        {"messages": "the conversation: chat messages (a JSON list, or its text)",
         "functions": "the function schemas the model may call",
         "ground_truth": "the expected calls, each argument with its accepted values",
         "category": "the BFCL category, e.g. simple_python, multiple, parallel"},
        prompt="messages", label="ground_truth",
        example={"category": "simple_python",
                 "messages": [{"role": "user", "content": "Area of a triangle, base 10, height 5?"}],
                 "functions": [{"name": "triangle_area", "description": "Area of a triangle.",
                                "parameters": {"type": "dict", "properties": {
                                    "base": {"type": "integer"}, "height": {"type": "integer"}},
                                    "required": ["base", "height"]}}],
                 "ground_truth": [{"triangle_area": {"base": [10], "height": [5]}}]},
        public=("id", "split", "category", "messages", "functions"),
        private=("ground_truth",))

    def __init__(self, *, categories: Sequence[str] = CATEGORIES, **kwargs: Any) -> None:
        categories = tuple(categories)
        unknown = [c for c in categories if c not in CATEGORIES]
        if not categories or unknown:
            raise ValueError(f"categories must be among {CATEGORIES}, got {categories!r}")
        super().__init__(**kwargs)
        self.categories = categories

    def sample_task(self) -> dict[str, Any]:
        rows = task_rows(self.categories)
        return copy_task(rows[int(self.np_random.integers(len(rows)))])

    def task_set(self, split: str = "test", limit: int | None = None) -> list[dict[str, Any]]:
        """The tasks of the env's categories, category by category (``limit``: the first).

        Raises:
            UnknownSplitError: ``split`` is not ``"test"``.
        """
        check_split(self, split, ("test",),
                    reason="BFCL has only the split 'test' (it is an evaluation set)")
        return load_tasks(self.categories, limit)

    async def setup_episode(self, task: Mapping[str, Any]) -> None:
        self.toolbox = AnswerToolbox(task["functions"])

    def make_prompt(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        messages = [dict(m) for m in task["messages"]]
        if not messages or messages[0].get("role") != "system":
            messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
        return messages

    def compute_reward(
        self, task: Mapping[str, Any], final: Mapping[str, Any], state: EpisodeState
    ) -> float:
        verdict = grade_calls(
            task["functions"], final.get("tool_calls") or [], task["ground_truth"],
            task["category"],
        )
        state.grade = {"valid": verdict.valid, "error": verdict.error}
        return 1.0 if verdict.valid else 0.0

    def oracle_action(self, task: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> str:
        """The first possible answer of each expected call, written in the env's call format."""
        calls = [ToolCall(c["name"], c["arguments"])
                 for c in oracle_calls(task["functions"], task["ground_truth"])]
        return self.format.render("", calls)
