"""Custom generate (slime's example) and custom reward models, through the rollout runner."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentrl.errors import PluginError
from agentrl.records.sample import Sample, Status
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.custom import load_custom_generate, run_custom_generate
from agentrl.rollout.episode import Episode
from agentrl.rollout.rewards import RewardModels, load_reward_model
from tests.unit.test_rollout_episode import TASK, calc_policy, check_token_exact, make_ctx

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def args(**kw):
    return RolloutConfig(**{"env": "calc", "max_turns": 5, **kw})


def run_brief(ctx, samples):
    fn = load_custom_generate(str(EXAMPLES / "custom_generate.py"))
    return asyncio.run(run_custom_generate(fn, ctx, samples, "r0-g0"))


def test_brief_custom_generate_gives_the_same_tokens_as_the_env_runner():
    ctx = make_ctx()
    ctx.config = args()
    custom = run_brief(ctx, [Sample(group_id=0, prompt=_calc_prompt(), metadata={"task": TASK})])[0]
    assert custom.status is Status.COMPLETED and custom.reward == 1.0
    check_token_exact(ctx, custom, ctx.engine)
    reference = asyncio.run(Episode(make_ctx(), Sample(group_id=0, metadata={"task": TASK}), "e").run())
    # same policy, same env: identical tokens, masks and spans (the tool message in slime's loop has
    # no "name", which this template does not render)
    assert custom.tokens == reference.tokens
    assert custom.loss_mask == reference.loss_mask
    assert [(t.role, t.start, t.end) for t in custom.turns] == [
        (t.role, t.start, t.end) for t in reference.turns]
    assert custom.turns[0].tool_names == ["calculator"]


def test_the_custom_loops_reward_goes_through_the_one_grading_path(monkeypatch):
    """slime's ``compute_reward(sample)`` grades through ``ToolEnv.agrade``, as a terminating
    step does: the env knows it is grading (a sandboxed env logs the grader's commands so)."""
    from agentrl_envs.calc.env import CalcEnv

    seen: list[bool] = []
    graded = CalcEnv.compute_reward

    def recording(self, task, final, state):
        seen.append(self.grading)
        return graded(self, task, final, state)

    monkeypatch.setattr(CalcEnv, "compute_reward", recording)
    ctx = make_ctx()
    ctx.config = args()
    sample = run_brief(ctx, [Sample(group_id=0, prompt=_calc_prompt(), metadata={"task": TASK})])[0]
    assert sample.reward == 1.0 and seen == [True]


def _calc_prompt():
    import agentrl

    env = agentrl.make_env("calc")
    messages, _ = env.reset(options={"task": TASK})
    env.close()
    return messages


def test_brief_loop_out_of_turns_is_truncated():
    ctx = make_ctx(lambda text, rid: calc_policy("What is 2 + 2?", rid))
    ctx.config = args(max_turns=2)
    sample = run_brief(ctx, [Sample(group_id=0, prompt=_calc_prompt(), metadata={"task": TASK})])[0]
    assert sample.status is Status.TRUNCATED and sample.metadata["finish"] == "max_turns"
    assert sample.reward == 0.0 and sample.metadata["turns"] == 2
    check_token_exact(ctx, sample, ctx.engine)


def test_custom_generate_crash_fails_its_samples(tmp_path):
    path = tmp_path / "gen.py"
    path.write_text("async def custom_generate(args, samples, evaluation=False):\n"
                    "    raise KeyError('boom')\n")
    ctx = make_ctx()
    ctx.config = args()
    fn = load_custom_generate(str(path))
    samples = asyncio.run(run_custom_generate(fn, ctx, [Sample(group_id=0, prompt="hi")], "r"))
    assert samples[0].status is Status.FAILED
    assert samples[0].metadata["error"] == "PluginError: custom_generate: KeyError: 'boom'"


def test_custom_generate_must_be_async(tmp_path):
    path = tmp_path / "gen.py"
    path.write_text("def custom_generate(args, samples, evaluation=False):\n    return samples\n")
    with pytest.raises(PluginError, match="must be `async def custom_generate"):
        load_custom_generate(str(path))


# -- rewards ---------------------------------------------------------------------------------


def scored(samples, **kw):
    asyncio.run(RewardModels(args(**kw)).apply(samples))
    return samples


def completed(prompt, response, **meta):
    return Sample(group_id=0, prompt=prompt, response=response, status=Status.COMPLETED,
                  reward=0.0, metadata=meta)


def test_brief_reward_model_class():
    samples = [completed("What is 2 + 3?", "Answer: 5"), completed("What is 2 * 3?", "Answer: 5")]
    scored(samples, custom_rm_path=str(EXAMPLES / "custom_rm.py"), rm_model_path="exact")
    assert [s.reward for s in samples] == [1.0, 0.0]
    assert samples[0].metadata["reward_source"].endswith("custom_rm.py")


@pytest.mark.parametrize("source,expected", [
    ("def rm(args, sample):\n    return len(sample.response)\n", [1.0, 2.0]),
    ("async def rm(args, sample):\n    return len(sample.response) * 2\n", [2.0, 4.0]),
    ("def rm(args, samples):\n    return [float(i) for i, _ in enumerate(samples)]\n", [0.0, 1.0]),
    ("async def rm(args, samples):\n    return [True, False]\n", [1.0, 0.0]),
])
def test_reward_function_forms(tmp_path, source, expected):
    path = tmp_path / f"rm{abs(hash(source))}.py"
    path.write_text(source)
    samples = scored([completed("p", "a"), completed("p", "ab")], custom_rm_path=str(path))
    assert [s.reward for s in samples] == expected
    assert all(s.status is Status.COMPLETED for s in samples)


def test_reward_errors_fail_only_their_sample(tmp_path):
    path = tmp_path / "rm_err.py"
    path.write_text("def rm(args, sample):\n"
                    "    if sample.response == 'bad':\n        raise ValueError('no score')\n"
                    "    return 'x' if sample.response == 'nan' else 0.5\n")
    samples = scored([completed("p", "ok"), completed("p", "bad"), completed("p", "nan")],
                     custom_rm_path=str(path))
    assert samples[0].reward == 0.5 and samples[0].status is Status.COMPLETED
    assert samples[1].status is Status.FAILED and "ValueError: no score" in samples[1].metadata["reward_error"]
    assert samples[2].status is Status.FAILED and "not a number" in samples[2].metadata["reward_error"]


def test_batched_reward_with_wrong_count_fails_the_batch(tmp_path):
    path = tmp_path / "rm_count.py"
    path.write_text("def rm(args, samples):\n    return [1.0]\n")
    samples = scored([completed("p", "a"), completed("p", "b")], custom_rm_path=str(path))
    assert all(s.status is Status.FAILED for s in samples)
    assert "returned 1 rewards for 2 samples" in samples[0].metadata["reward_error"]


def test_per_sample_reward_overrides_the_flag(tmp_path):
    one = tmp_path / "one.py"
    one.write_text("def rm(args, sample):\n    return 1.0\n")
    two = tmp_path / "two.py"
    two.write_text("def rm(args, sample):\n    return 2.0\n")
    samples = [completed("p", "a"), completed("p", "b", custom_rm_path=str(two))]
    scored(samples, custom_rm_path=str(one))
    assert [s.reward for s in samples] == [1.0, 2.0]


def test_failed_and_aborted_samples_are_not_scored(tmp_path):
    path = tmp_path / "rm1.py"
    path.write_text("def rm(args, sample):\n    return 1.0\n")
    failed = Sample(group_id=0, status=Status.FAILED, reward=0.0)
    aborted = Sample(group_id=0, status=Status.ABORTED)
    scored([failed, aborted], custom_rm_path=str(path))
    assert failed.reward == 0.0 and aborted.reward is None


def test_bad_reward_plugins_are_named(tmp_path):
    path = tmp_path / "rm_bad.py"
    path.write_text("def rm(sample):\n    return 1.0\n")
    with pytest.raises(PluginError, match=r"--custom-rm-path .*takes \(args, sample\)"):
        load_reward_model(str(path), args())
    with pytest.raises(PluginError, match="no such file"):
        load_reward_model(str(tmp_path / "missing.py"), args())


def test_a_reward_model_class_is_built_once_per_run(tmp_path):
    path = tmp_path / "rm_count.py"
    path.write_text("BUILT = []\n"
                    "class CustomRewardModel:\n"
                    "    def __init__(self, model_path):\n"
                    "        BUILT.append(model_path)\n"
                    "    def compute_reward(self, prompts, responses):\n"
                    "        return [1.0 for _ in responses]\n")
    run = RewardModels(args(custom_rm_path=str(path), rm_model_path="m"))
    for _ in range(3):
        asyncio.run(run.apply([completed("q", "a")]))
    other_run = RewardModels(args(custom_rm_path=str(path), rm_model_path="m"))
    asyncio.run(other_run.apply([completed("q", "a")]))
    assert run.get(str(path)) is run.get(str(path)) is not other_run.get(str(path))
    module = __import__("sys").modules[type(run.get(str(path))._fn.__self__).__module__]
    assert module.BUILT == ["m", "m"]  # once per run, not once per call


def test_a_failing_reward_plugin_is_reported_once_with_the_sample(tmp_path, caplog):
    import logging

    path = tmp_path / "rm_broken.py"
    path.write_text("def rm(args, sample):\n    return 'high'\n")
    samples = [completed("q", "a"), completed("q", "b")]
    with caplog.at_level(logging.WARNING, logger="agentrl.rollout.rewards"):
        scored(samples, custom_rm_path=str(path))
    assert all(s.status is Status.FAILED for s in samples)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "rm_broken.py failed on sample 0/0" in warnings[0]
    assert "not a number" in warnings[0]
