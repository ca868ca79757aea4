"""Public and private task fields: the public view every policy-side path gets, and the
leakage check (``check_env``'s "leakage") failing on each way an env can leak, naming the
field and the place."""

from __future__ import annotations

import pytest

from agentrl import EpisodeState, TaskFields, ToolEnv, check_env, tool
from agentrl.env import check_split
from agentrl.env.leakage import canary_row, find_leaks, value_needles
from agentrl.errors import EnvCheckError

FIELDS = TaskFields({"question": "the question", "answer": "the answer", "steps": "the working"},
                    public=("id", "question"), private=("answer",))


@tool(inline=True)
def double(x: int) -> int:
    """Doubles a number.

    Args:
        x: The number.
    """
    return 2 * x


@tool(inline=True)
def peek(state: EpisodeState) -> str:
    """Shows a hint."""
    return f"hint: it is {state.task['answer']}"


class QuizEnv(ToolEnv):
    """Say the answer; the question is public, the answer and the working private."""

    tools = (double,)
    default_max_turns = 3
    task_fields = FIELDS

    def task_set(self, split="test", limit=None):
        check_split(self, split, ("test",))
        return [{"id": f"q{i}", "question": f"What is 2 * {20 + i}?", "answer": 40 + 2 * i,
                 "steps": f"double {20 + i}"} for i in range(3)][:limit]

    def sample_task(self):
        return self.task_set()[int(self.np_random.integers(3))]

    def make_prompt(self, task):
        return [{"role": "user", "content": task["question"]}]

    def compute_reward(self, task, final, state):
        return final["content"] == f"Answer: {task['answer']}"

    def oracle_action(self, task, history):
        if history[-1]["role"] == "user":
            return {"role": "assistant", "content": "",
                    "tool_calls": [{"name": "double", "arguments": {"x": task["answer"] // 2}}]}
        return f"Answer: {task['answer']}"


def test_the_public_view_holds_the_public_fields_only():
    row = {"id": "q0", "question": "What is 2 * 20?", "answer": 40, "steps": "double 20", "extra": "x"}
    assert FIELDS.public_view(row) == {"id": "q0", "question": "What is 2 * 20?"}
    # declared private, declared but unclassified, and undeclared: all private
    assert set(FIELDS.private_fields(row)) == {"answer", "steps", "extra"}
    view = FIELDS.public_view(row)
    view["question"] += "!"
    assert row["question"] == "What is 2 * 20?"  # a copy


def test_a_field_both_public_and_private_is_refused():
    with pytest.raises(ValueError, match=r"\['answer'\] are both public and private"):
        TaskFields({"answer": "a"}, public=("answer",), private=("answer",))
    with pytest.raises(ValueError, match="tuple of field names"):
        TaskFields({"answer": "a"}, public="answer")


def test_reset_info_carries_the_public_view_and_the_grader_the_row():
    env = QuizEnv()
    row = {**env.task_set(limit=1)[0], "unclassified": "kept for the grader"}
    _, info = env.reset(options={"task": row})
    assert info["task"] == {"id": "q0", "question": "What is 2 * 20?"}
    assert env.state.task["answer"] == 40 and env.state.task["unclassified"] == "kept for the grader"
    env.close()


def test_an_env_without_task_fields_shows_no_field():
    class Undeclared(QuizEnv):
        task_fields = None

    env = Undeclared()
    _, info = env.reset(seed=0)
    assert info["task"] == {}
    env.close()


def test_canaries_keep_the_rows_shape_and_replace_only_private_values():
    row = {"id": "q0", "question": "Q?", "answer": 40, "steps": {"a": ["x", 1.5, True, None]}}
    played, needles = canary_row(FIELDS, row)
    assert played["id"] == "q0" and played["question"] == "Q?"
    assert isinstance(played["answer"], int) and str(played["answer"]) in needles
    a = played["steps"]["a"]
    assert a[0].startswith("agentrl-canary-") and isinstance(a[1], float) and a[2:] == [True, None]
    assert sorted(needles.values()) == ["answer", "steps['a'][0]", "steps['a'][1]"]


def test_values_are_looked_for_only_when_long_enough():
    row = {"id": "q0", "question": "Q?", "answer": 40, "steps": "double twenty, then add"}
    assert value_needles(FIELDS, row) == {"double twenty, then add": "steps"}
    leaks = find_leaks({"double twenty": "steps"}, [{"content": "I will double twenty"}], "obs")
    assert [str(leak) for leak in leaks] == ["steps in obs[0]['content']"]


def test_a_clean_env_passes_every_check():
    assert check_env(QuizEnv()) == []


def _fails(env: ToolEnv, *where: str) -> str:
    with pytest.raises(EnvCheckError) as excinfo:
        check_env(env)
    message = str(excinfo.value)
    assert "'leakage' failed" in message
    for text in where:
        assert text in message, message
    return message


def test_an_answer_in_the_prompt_fails_naming_the_field_and_the_message():
    class InPrompt(QuizEnv):
        def make_prompt(self, task):
            return [{"role": "user", "content": f"{task['question']} (it is {task['answer']})"}]

    _fails(InPrompt(), "task q0", "answer in the first observation[0]['content']")


def test_a_private_field_in_the_system_prompt_is_found_even_when_short():
    class InSystem(QuizEnv):
        def make_prompt(self, task):
            return [{"role": "system", "content": f"Working: {task['steps']}"},
                    {"role": "user", "content": task["question"]}]

    _fails(InSystem(), "steps in the first observation[0]['content']")


def test_a_private_field_declared_public_is_not_a_leak():
    class Shown(QuizEnv):
        task_fields = TaskFields(FIELDS.fields, public=("id", "question", "steps"))

        def make_prompt(self, task):
            return [{"role": "user", "content": f"{task['question']} Hint: {task['steps']}"}]

    assert check_env(Shown()) == []


def test_a_tool_that_tells_the_answer_fails():
    class Peeking(QuizEnv):
        tools = (double, peek)

    _fails(Peeking(), "answer in the answer to peek() with plain arguments (turn 2)")


def test_an_info_that_carries_the_row_fails():
    class RowInInfo(QuizEnv):
        async def areset(self, *, seed=None, options=None):
            observation, info = await super().areset(seed=seed, options=options)
            return observation, {**info, "row": dict(self.state.task)}

    _fails(RowInInfo(), "reset's info['row']['answer']")


def test_a_public_view_that_adds_private_fields_fails():
    class OpenView(QuizEnv):
        def public_task(self, task):
            return dict(task)

    _fails(OpenView(), "the task's public view['answer']")


def test_a_tool_that_serves_a_private_value_to_a_proper_request_is_the_task():
    # lookup-style: the oracle's double(answer / 2) gets the answer back, as a lookup tool
    # answers the right word with its definition; only plain calls are looked at
    assert check_env(QuizEnv()) == []


def test_a_run_tests_style_tool_that_prints_the_hidden_text_fails():
    @tool(inline=True)
    def check(x: int, state: EpisodeState) -> str:
        """Checks a guess.

        Args:
            x: The guess.
        """
        return f"{x} is wrong; the working: {state.task['steps']}"

    class Telling(QuizEnv):
        tools = (double, check)

    _fails(Telling(), "steps in the answer to check() with plain arguments")
