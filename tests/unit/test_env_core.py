"""The ToolEnv contract: observations, terminated vs truncated, tool errors, info, async use."""

from __future__ import annotations

import asyncio
import dataclasses

import gymnasium
import numpy as np
import pytest
from gymnasium.error import ResetNeeded
from gymnasium.utils.env_checker import data_equivalence

from agentrl import EpisodeState, TaskFields, ToolEnv, tool
from agentrl.env import StepTimings, as_reward
from agentrl.errors import RewardError
from agentrl.tools import ToolCall


@tool(inline=True)
def add(a: int, b: int) -> int:
    """Adds two integers.

    Args:
        a: First.
        b: Second.
    """
    return a + b


@tool
def submit(answer: str, state: EpisodeState) -> str:
    """Submits the final answer and ends the episode.

    Args:
        answer: The answer.
    """
    state.finish(answer)
    return "submitted"


class EchoEnv(ToolEnv):
    """Answer with the task's number."""

    tools = (add, submit)
    default_max_turns = 3

    def sample_task(self):
        return {"target": int(self.np_random.integers(0, 1000))}

    def make_prompt(self, task):
        return [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"Say {task['target']}"}]

    def compute_reward(self, task, final, state):
        answer = state.answer if state.finished else final["content"]
        return 1.0 if str(task["target"]) in str(answer) else 0.0


def call(name, **arguments):
    return {"role": "assistant", "content": "", "tool_calls": [{"name": name, "arguments": arguments}]}


def test_reset_returns_task_messages_and_schemas():
    env = EchoEnv()
    obs, info = env.reset(seed=3)
    assert [m["role"] for m in obs] == ["system", "user"]
    assert info["tools"] == [add.schema, submit.schema]
    assert info["max_turns"] == 3 and info["turn"] == 0
    assert obs[1]["content"] == f"Say {env.state.task['target']}"
    assert info["task"] == {}  # EchoEnv declares no task fields: all of a row is private
    assert env.observation_space.contains(obs)


def test_task_from_options():
    env = EchoEnv()
    obs, info = env.reset(options={"task": {"target": 7}})
    assert obs[1]["content"] == "Say 7" and env.state.task == {"target": 7}


def test_tool_call_returns_tool_message_and_continues():
    env = EchoEnv()
    env.reset(options={"task": {"target": 5}})
    obs, reward, terminated, truncated, info = env.step(call("add", a=2, b=3))
    assert obs == [{"role": "tool", "name": "add", "content": "5"}]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["tool_calls"] == ["add"] and info["tool_errors"] == {}
    assert info["tool_results"] == [{"name": "add", "error": None}]


def test_step_timings_are_on_the_env_not_in_info():
    env = EchoEnv()
    env.reset(options={"task": {"target": 5}})
    assert env.last_step_timings is None
    _, _, _, _, info = env.step(call("add", a=2, b=3))
    timings = env.last_step_timings
    assert isinstance(timings, StepTimings) and len(timings.tool_calls_s) == 1
    assert min(timings.parse_s, timings.tools_s, timings.reward_s, *timings.tool_calls_s) >= 0
    assert not any("_s" in key for key in info)
    assert not any("duration_s" in result for result in info["tool_results"])
    env.step("It is 5.")
    assert env.last_step_timings is not timings and env.last_step_timings.tool_calls_s == ()


def test_identical_seeded_steps_return_equal_data():
    env = EchoEnv()
    runs = []
    for _ in range(2):
        env.reset(seed=4)
        runs.append(env.step(call("add", a=2, b=3)))
    assert data_equivalence(runs[0], runs[1], exact=True)


def test_returned_data_is_never_shared_with_the_env():
    class Public(EchoEnv):
        task_fields = TaskFields({"target": "the number"}, public=("target", "meta"))

    env = Public()
    task = {"target": 5, "meta": {"source": "hand"}}
    obs_1, info_1 = env.reset(options={"task": task})
    obs_2, info_2 = env.reset(options={"task": task})
    assert info_1["task"] == info_2["task"] == task
    assert info_1["task"] is not info_2["task"] and info_1["task"]["meta"] is not task["meta"]
    assert info_1["tools"][0] is not info_2["tools"][0]
    obs_2[1]["content"] = "changed by the caller"
    info_2["tools"][0]["function"]["name"] = "changed"
    step_obs, *_ = env.step(call("add", a=1, b=1))
    step_obs[0]["content"] = "changed by the caller"
    assert env.messages[1]["content"] == "Say 5" and env.messages[-1]["content"] == "2"
    assert env.toolbox.schemas[0]["function"]["name"] == "add"


def test_turn_without_tool_calls_terminates_and_is_scored():
    env = EchoEnv()
    env.reset(options={"task": {"target": 5}})
    obs, reward, terminated, truncated, _ = env.step("It is 5.")
    assert (obs, reward, terminated, truncated) == ([], 1.0, True, False)
    env.reset(options={"task": {"target": 5}})
    _, reward, terminated, _, _ = env.step({"role": "assistant", "content": "It is 6."})
    assert (reward, terminated) == (0.0, True)


def test_tool_can_finish_the_episode():
    env = EchoEnv()
    env.reset(options={"task": {"target": 9}})
    obs, reward, terminated, truncated, _ = env.step(call("submit", answer="9"))
    assert obs[0]["content"] == "submitted"
    assert (reward, terminated, truncated) == (1.0, True, False)


def test_max_turns_truncates_without_scoring():
    env = EchoEnv(max_turns=2)
    env.reset(options={"task": {"target": 1}})
    assert env.step(call("add", a=1, b=0))[2:4] == (False, False)
    _, reward, terminated, truncated, _ = env.step(call("add", a=1, b=0))
    assert (reward, terminated, truncated) == (0.0, False, True)
    with pytest.raises(ResetNeeded):
        env.step("more")


def test_step_before_reset_raises():
    with pytest.raises(ResetNeeded):
        EchoEnv().step("hi")


def test_raw_text_is_parsed_with_the_env_format():
    env = EchoEnv(tool_call_format="hermes")
    env.reset(options={"task": {"target": 4}})
    text = env.format.render("Adding.", [ToolCall("add", {"a": 1, "b": 3})])
    obs, _, terminated, _, _ = env.step(text)
    assert obs[0]["content"] == "4" and not terminated
    assert env.messages[2] == {
        "role": "assistant", "content": "Adding.",
        "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 3}}],
    }


def test_malformed_call_becomes_parse_error_and_runs_nothing():
    env = EchoEnv()
    env.reset(options={"task": {"target": 4}})
    obs, _, terminated, truncated, info = env.step('<tool_call>\n{"name": "add", "argu')
    assert not terminated and not truncated
    assert obs[0]["role"] == "tool" and obs[0]["content"].startswith("Error (parse_error):")
    assert info["tool_errors"] == {"parse_error": 1}


def test_errors_are_counted_per_step_and_per_episode():
    env = EchoEnv()
    env.reset(options={"task": {"target": 4}})
    action = {"role": "assistant", "content": "", "tool_calls": [
        {"name": "nope", "arguments": {}},
        {"name": "add", "arguments": {"a": "x", "b": 1}},
        {"name": "add", "arguments": "[1]"},
        {"type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}},
        {"oops": True},
    ]}
    obs, _, _, _, info = env.step(action)
    assert [m["content"].split(":")[0] for m in obs] == [
        "Error (unknown_tool)", "Error (schema_violation)", "Error (malformed_arguments)", "3",
        "Error (malformed_arguments)",
    ]
    assert info["tool_errors"] == {"unknown_tool": 1, "schema_violation": 1, "malformed_arguments": 2}
    _, _, _, _, info = env.step(call("nope"))
    assert info["tool_errors"] == {"unknown_tool": 1}
    assert info["episode_tool_errors"] == {"unknown_tool": 2, "schema_violation": 1, "malformed_arguments": 2}


def test_seeded_reset_is_deterministic():
    env = EchoEnv()
    assert env.reset(seed=11)[0] == env.reset(seed=11)[0]


def test_render_ansi_and_close_idempotent():
    env = EchoEnv(render_mode="ansi")
    env.reset(options={"task": {"target": 2}})
    env.step(call("add", a=1, b=1))
    text = env.render()
    assert "[user] Say 2" in text and "-> add(" in text and "[tool:add] 2" in text
    env.close()
    env.close()


def test_sync_api_inside_event_loop_explains_async_api():
    env = EchoEnv()

    async def main():
        with pytest.raises(RuntimeError, match="await env.areset"):
            env.reset()

    asyncio.run(main())


def test_many_episodes_concurrently_through_async_api():
    async def play(seed):
        env = EchoEnv()
        obs, info = await env.areset(seed=seed)
        await env.astep(call("add", a=1, b=1))
        _, reward, terminated, _, _ = await env.astep(str(env.state.task["target"]))
        await env.aclose()
        return reward, terminated

    async def main():
        return await asyncio.gather(*(play(s) for s in range(20)))

    assert asyncio.run(main()) == [(1.0, True)] * 20


class ResourceEnv(EchoEnv):
    """Counts set-up and tear-down."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.events = []

    async def setup_episode(self, task):
        self.events.append("setup")

    async def teardown_episode(self):
        self.events.append("teardown")


def test_episode_resources_are_released_once():
    env = ResourceEnv()
    env.reset(seed=0)
    env.reset(seed=1)  # the first episode is abandoned: torn down
    env.step("done")  # terminated: torn down
    env.close()  # nothing open: no extra teardown
    env.reset(seed=2)
    env.close()
    assert env.events == ["setup", "teardown", "setup", "teardown", "setup", "teardown"]


def test_abstract_hooks_are_required():
    class Incomplete(ToolEnv):
        def make_prompt(self, task):
            return []

    with pytest.raises(TypeError, match="compute_reward"):
        Incomplete()


def test_invalid_constructor_arguments():
    with pytest.raises(ValueError, match="max_turns"):
        EchoEnv(max_turns=0)
    with pytest.raises(ValueError, match="Unknown|unknown|known"):
        EchoEnv(tool_call_format="nope")


def test_is_a_gymnasium_env():
    assert isinstance(EchoEnv(), gymnasium.Env)


class BoolRewardEnv(EchoEnv):
    def compute_reward(self, task, final, state):
        return str(task["target"]) in final["content"]


class TextRewardEnv(EchoEnv):
    def compute_reward(self, task, final, state):
        return "1.0"


def test_bool_reward_counts_as_one_or_zero():
    env = BoolRewardEnv()
    env.reset(options={"task": {"target": 5}})
    right = env.step("It is 5.")[1]
    env.reset(options={"task": {"target": 5}})
    wrong = env.step("It is 6.")[1]
    assert (right, wrong) == (1.0, 0.0) and type(right) is float


def test_non_number_reward_raises_naming_the_env():
    env = TextRewardEnv()
    env.reset(options={"task": {"target": 5}})
    with pytest.raises(RewardError, match=r"TextRewardEnv\.compute_reward returned str '1\.0', not a number"):
        env.step("It is 5.")


class _Scalar:
    """Stands for a 0-d tensor: a number only through .item()."""

    def item(self):
        return 0.25


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, 1.0), (False, 0.0), (3, 3.0), (0.5, 0.5), (np.float32(0.5), 0.5), (np.bool_(True), 1.0),
     (np.array(2.0), 2.0), (_Scalar(), 0.25)],
)
def test_as_reward_accepts_numbers(value, expected):
    assert as_reward(value, "src") == expected


@pytest.mark.parametrize(
    ("value", "detail"),
    [("1", "not a number"), (None, "not a number"), ([1.0], "not a number"),
     (np.array([1.0, 2.0]), "not a number"), (float("nan"), "not a finite number"),
     (float("inf"), "not a finite number")],
)
def test_as_reward_rejects_non_numbers_naming_the_source(value, detail):
    with pytest.raises(RewardError, match=f"^my_rm returned .*{detail}"):
        as_reward(value, "my_rm")


def test_step_timings_are_frozen():
    timings = StepTimings(0.1, 0.2, 0.3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        timings.parse_s = 1.0  # type: ignore[misc]


class TwoStageEnv(EchoEnv):
    """Say the target, then say it doubled: ``next_stage`` opens the second stage."""

    default_max_turns = 4

    def next_stage(self, final):
        stages = self.state.data.setdefault("answers", [])
        stages.append(self.state.answer)
        if len(stages) == 1:
            return [{"role": "user", "content": f"Now say {2 * self.state.task['target']}"}]
        return None

    def compute_reward(self, task, final, state):
        return float(state.data["answers"] == [str(task["target"]), str(2 * task["target"])])


def test_next_stage_goes_on_in_the_same_episode():
    env = TwoStageEnv()
    env.reset(options={"task": {"target": 4}})
    obs, reward, terminated, truncated, _ = env.step(call("submit", answer="4"))
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert obs == [{"role": "tool", "name": "submit", "content": "submitted"},
                   {"role": "user", "content": "Now say 8"}]
    assert env.messages[-1] == obs[-1] and not env.state.finished and env.state.answer is None
    obs[-1]["content"] = "changed"  # the caller's copy, not the transcript
    assert env.messages[-1]["content"] == "Now say 8"
    obs, reward, terminated, truncated, _ = env.step(call("submit", answer="8"))
    assert (obs, reward, terminated, truncated) == ([{"role": "tool", "name": "submit", "content": "submitted"}],
                                                    1.0, True, False)


def test_the_turn_limit_counts_every_stage():
    env = TwoStageEnv(max_turns=2)
    env.reset(options={"task": {"target": 4}})
    env.step(call("submit", answer="4"))
    _, reward, terminated, truncated, _ = env.step(call("add", a=1, b=2))
    assert (reward, terminated, truncated) == (0.0, False, True)
