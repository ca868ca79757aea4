"""The calc env: safe evaluator, deterministic disjoint splits, oracle and null policies."""

from __future__ import annotations

import asyncio

import pytest

import agentrl
from agentrl_envs.calc import calc_oracle, load_tasks, split_of
from agentrl_tools.calculator import CalculatorError, calculator, safe_eval


@pytest.mark.parametrize(
    ("expression", "value"),
    [("37*12+5", 449), ("(3 + 4.5) / 2", 3.75), ("-2**3", -8), ("7 // 2 % 3", 0), ("10/4", 2.5),
     ("8/4", 2), (" 1 + 1 ", 2)],
)
def test_safe_eval_values(expression, value):
    assert safe_eval(expression) == value


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("__import__('os').system('true')", "is not allowed"),
        ("open('/etc/passwd').read()", "is not allowed"),
        ("(1).__class__", "is not allowed"),
        ("x + 1", "is not allowed"),
        ("[1, 2]", "is not allowed"),
        ("'a' * 3", "is not allowed"),
        ("9**9**9", "exponent"),
        ("10**30 * 10**30", "beyond"),
        ("1/0", "division by zero"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 +", "not an arithmetic expression"),
        ("1" * 300, "longer than"),
        ("True + 1", "is not allowed"),
    ],
)
def test_safe_eval_rejects(expression, reason):
    with pytest.raises(CalculatorError, match=reason):
        safe_eval(expression)


def test_calculator_tool_schema():
    assert calculator.parameters["required"] == ["expression"]
    assert calculator("2*3") == "6"


def test_tasks_are_deterministic_and_splits_disjoint():
    train = load_tasks("train", 300, seed=0)
    test = load_tasks("test", 100, seed=0)
    assert train == load_tasks("train", 300, seed=0)
    assert all(split_of(t["question"]) == "train" for t in train)
    assert all(split_of(t["question"]) == "test" for t in test)
    assert not {t["question"] for t in train} & {t["question"] for t in test}
    assert len({t["id"] for t in train}) == 300
    assert all(safe_eval(t["expression"]) == t["answer"] for t in train)
    assert load_tasks("train", 5, seed=1) != load_tasks("train", 5, seed=0)


def _play(env, task, policy):
    obs, info = env.reset(options={"task": task})
    while True:
        obs, reward, terminated, truncated, info = env.step(policy(env, task, env.messages))
        if terminated or truncated:
            return reward


def test_oracle_solves_every_task():
    env = agentrl.make_env("calc")
    tasks = load_tasks("test", 100)
    assert sum(_play(env, t, calc_oracle) for t in tasks) == len(tasks)


def test_null_policy_scores_zero():
    env = agentrl.make_env("calc")
    tasks = load_tasks("test", 50)
    assert sum(_play(env, t, lambda *_: "I don't know.") for t in tasks) == 0


def test_answer_must_be_exact():
    env = agentrl.make_env("calc")
    task = {"question": "What is 2 + 2?", "expression": "2+2", "answer": 4}
    assert _play(env, task, lambda *_: "Answer: 4") == 1.0
    assert _play(env, task, lambda *_: "Answer: 44") == 0.0
    assert _play(env, task, lambda *_: "4") == 0.0
    assert _play(env, task, lambda *_: "Answer: 5 ... no wait, Answer: 4") == 1.0


def test_reset_without_task_draws_from_split():
    env = agentrl.make_env("calc", split="test")
    for seed in range(20):
        _, info = env.reset(seed=seed)
        assert split_of(info["task"]["question"]) == "test"


def test_compact_prompt_shows_the_call_and_lists_no_schema():
    env = agentrl.make_env("calc", compact=True)
    obs, info = env.reset(seed=0)
    assert info["tools"] == [] and env.toolbox.names == ["calculator"]  # the tool still runs
    system = obs[0]["content"]
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3+4"}}\n</tool_call>' in system
    assert "Answer: <integer>" in system
    # the example call is written in the env's own tool-call format, which parses it back
    for fmt in ("hermes", "llama3", "pythonic"):
        env = agentrl.make_env("calc", compact=True, tool_call_format=fmt)
        example = env.system_prompt.split("\n", 1)[1].rsplit("\n", 1)[0]
        assert [c.name for c in env.format.parse(example).tool_calls] == ["calculator"]
    with pytest.raises(ValueError, match="compact"):
        agentrl.make_env("calc", compact="yes")


def test_compact_oracle_is_terse_and_solves_every_task():
    env = agentrl.make_env("calc", compact=True)
    tasks = load_tasks("test", 50)
    assert sum(_play(env, t, calc_oracle) for t in tasks) == len(tasks)
    call, answer = [m for m in env.messages if m["role"] == "assistant"]
    assert call["content"] == "" and [c["name"] for c in call["tool_calls"]] == ["calculator"]
    assert answer["content"] == f"Answer: {tasks[-1]['answer']}"


def test_default_prompt_is_unchanged():
    from agentrl_envs.calc.env import SYSTEM_PROMPT

    obs, info = agentrl.make_env("calc").reset(seed=0)
    assert obs[0]["content"] == SYSTEM_PROMPT and [s["function"]["name"] for s in info["tools"]] == ["calculator"]


def test_env_kwarg_flag_reaches_the_env_and_shortens_samples():
    from agentrl.errors import ConfigError
    from agentrl.records.sample import Sample
    from agentrl.rollout.build import env_factory
    from agentrl.rollout.config import RolloutConfig
    from agentrl.rollout.demonstrations import oracle_sample
    from agentrl.run.context import make_rollout_context
    from tests.unit.test_rollout_episode import make_ctx

    with pytest.raises(ConfigError, match="--env-kwarg expects KEY=VALUE"):
        RolloutConfig(env="calc", env_kwarg=["compact"]).validate()
    config = RolloutConfig(env="calc", env_kwarg=["compact=true", "split=test"], rollout_max_context_len=1024)
    config.validate()
    assert config.env_kwargs == {"compact": True, "split": "test"}
    base = make_ctx()
    lengths = []
    for flags in ([], ["compact=true"]):
        config = RolloutConfig(env="calc", env_kwarg=flags, rollout_max_context_len=1024)
        ctx = make_rollout_context(config, base.engine, env_factory(config))
        assert ctx.envs().compact is bool(flags)
        sample = asyncio.run(oracle_sample(ctx, Sample(group_id=0, metadata={"seed": 3})))
        assert sample.reward == 1.0
        lengths.append(len(sample.tokens))
    assert lengths[1] < lengths[0] / 2
