"""check_env passes conforming envs and names the problem in broken ones."""

from __future__ import annotations

import random

import pytest

import agentrl
from agentrl import ToolEnv, check_env, tool
from agentrl.errors import EnvCheckError, ToolDefinitionError


@tool(inline=True)
def echo(text: str) -> str:
    """Echoes text.

    Args:
        text: What to echo.
    """
    return text


class GoodEnv(ToolEnv):
    """A conforming env."""

    tools = (echo,)
    default_max_turns = 3

    def sample_task(self):
        return {"n": int(self.np_random.integers(100))}

    def make_prompt(self, task):
        return [{"role": "user", "content": f"n={task['n']}"}]

    def compute_reward(self, task, final, state):
        return 0.0


def test_good_env_passes_and_says_which_checks_it_skipped():
    # GoodEnv has no scripted oracle and declares no task fields: those checks did not run,
    # and check_env says so
    split, oracle, leakage = check_env(GoodEnv())
    assert split.startswith("unknown split: the env has no task set")
    assert oracle.startswith("oracle: the env has no scripted oracle")
    assert leakage.startswith("leakage: the env declares no task_fields")
    assert check_env(GoodEnv(), oracle_episodes=0)[1] == "oracle: not asked for (oracle_episodes=0)"


NEEDS_USER_DATA = {
    "swe-bench-v0": "swe-bench-v0 needs the user's instances and their Docker images; "
    "tests/integration/test_swe_tools.py runs check_env on a hand-made instance",
    "harbor-v0": "harbor-v0 plays each task in a Docker container (not a unit test); "
    "tests/integration/test_harbor.py runs check_env on a Harbor task",
    "openenv-v0": "openenv-v0 plays an OpenEnv server (none runs in unit tests); "
    "tests/integration/test_openenv.py runs check_env on a served env",
}


@pytest.mark.parametrize("env_id", [spec.id for spec in agentrl.list_envs()])
def test_every_registered_env_passes(env_id):
    if env_id in NEEDS_USER_DATA:
        pytest.skip(NEEDS_USER_DATA[env_id])
    assert check_env(agentrl.make_env(env_id)) == []  # built-in envs have oracles: every check runs


class FourTupleEnv(GoodEnv):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated or truncated, info


class NondeterministicEnv(GoodEnv):
    def sample_task(self):
        return {"n": random.random()}


class UnseededTaskEnv(GoodEnv):
    """Draws its task from global random; the prompt does not show it."""

    def sample_task(self):
        return {"n": random.random()}

    def make_prompt(self, task):
        return [{"role": "user", "content": "Say the hidden number."}]


class AnswerEnv(GoodEnv):
    """Reward 1 for saying the task's number; the oracle says it."""

    played: list

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.played = []

    def compute_reward(self, task, final, state):
        return 1.0 if final["content"] == f"n={task['n']}" else 0.0

    def task_set(self, split="test", limit=None):
        return {"test": [{"id": f"t{i}", "n": 100 + i} for i in range(limit or 10)]}[split]

    def oracle_action(self, task, history):
        self.played.append(task.get("id"))
        return f"n={task['n']}"


class WrongOracleEnv(AnswerEnv):
    def oracle_action(self, task, history):
        return "n=-1"


class BadRewardEnv(GoodEnv):
    def compute_reward(self, task, final, state):
        return "1"


class BadPromptEnv(GoodEnv):
    def make_prompt(self, task):
        return [{"role": "narrator", "content": "hi"}]


class EmptyPromptEnv(GoodEnv):
    def make_prompt(self, task):
        return []


class NeverTruncatesEnv(GoodEnv):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, False, info


class CloseTwiceFailsEnv(GoodEnv):
    closed = False

    def close(self):
        if self.closed:
            raise RuntimeError("already closed")
        self.closed = True
        super().close()


class NoDescriptionToolEnv(GoodEnv):
    tools = (tool(lambda_text := (lambda text: text), name="nodesc", inline=True),)


class TupleResetEnv(GoodEnv):
    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return obs


class AnySplitEnv(AnswerEnv):
    def task_set(self, split="test", limit=None):
        return [{"id": f"t{i}", "n": 100 + i} for i in range(limit or 10)]


class BrokenSplitEnv(AnswerEnv):
    def task_set(self, split="test", limit=None):
        return [[]][["test"].index(split) if split == "test" else 1]


@pytest.mark.parametrize(
    ("env_cls", "check", "detail"),
    [
        (FourTupleEnv, "final answer", "got a tuple of 4"),
        (NondeterministicEnv, "determinism", "np_random"),
        (BadRewardEnv, "final answer", "BadRewardEnv.compute_reward returned str '1', not a number"),
        (UnseededTaskEnv, "determinism", "reset(seed=0) gave different tasks"),
        (WrongOracleEnv, "oracle", "the scripted oracle solved 0 of 5 episodes"),
        (BadPromptEnv, "reset", "role must be one of"),
        (EmptyPromptEnv, "reset", "non-empty list"),
        (NeverTruncatesEnv, "truncation", "max_turns"),
        (CloseTwiceFailsEnv, "close", "not idempotent"),
        (NoDescriptionToolEnv, "tool schemas", "no description"),
        (TupleResetEnv, "reset", "must return (observation, info)"),
        (AnySplitEnv, "unknown split", "returned 1 task(s) instead of refusing the split"),
        (BrokenSplitEnv, "unknown split", "raised IndexError"),
    ],
)
def test_broken_env_fails_naming_the_problem(env_cls, check, detail):
    with pytest.raises(EnvCheckError) as excinfo:
        check_env(env_cls())
    message = str(excinfo.value)
    assert f"'{check}' failed" in message
    assert detail in message


def test_oracle_plays_the_first_test_tasks():
    env = AnswerEnv()
    check_env(env)
    assert env.played == ["t0", "t1", "t2", "t3", "t4"]


def test_oracle_failure_names_the_failed_tasks():
    with pytest.raises(EnvCheckError, match=r"t0: reward 0\.0 \(terminated after 1 turns"):
        check_env(WrongOracleEnv())


def test_not_a_tool_env():
    with pytest.raises(EnvCheckError, match="'type' failed"):
        check_env(object())


def test_invalid_schema_is_caught_before_the_env_exists():
    with pytest.raises(ToolDefinitionError, match="invalid JSON schema"):
        tool(lambda x: x, name="broken", parameters={"type": "object", "required": "x"})


def test_a_dict_lookup_of_the_split_is_an_unknown_split_error_listing_the_splits():
    from agentrl.env import splits_of, task_set_of
    from agentrl.errors import UnknownSplitError

    env = AnswerEnv()
    assert splits_of(env) == ("test",)
    with pytest.raises(UnknownSplitError, match="AnswerEnv has no task split 'dev'; available splits: 'test'"):
        task_set_of(env, "dev")
