"""Rollouts of groups: explicit group ids, dynamic sampling, partial rollout, custom generate."""

from __future__ import annotations

import asyncio
import json
import re

from agentrl.records.sample import Status
from agentrl.rollout.buffer import RolloutDataSourceWithBuffer
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.filters import reward_std_positive
from agentrl.rollout.runner import RolloutRunner
from tests.support.engines import ScriptedEngine
from tests.support.tokenizers import tiny_tokenizer
from tests.unit.test_rollout_episode import calc_policy, make_ctx

TASKS = [
    {"task_id": f"t{i}", "question": f"What is {i} + {i}?", "expression": f"{i} + {i}", "answer": 2 * i}
    for i in range(12)
]


def setup(tmp_path, policy=calc_policy, delay=0.0, **flags):
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    config = RolloutConfig(env="calc", prompt_data=str(data), **flags)
    config.validate()
    ctx = make_ctx(engine=ScriptedEngine(tiny_tokenizer(), policy, delay_s=delay))
    ctx.config = config
    source = RolloutDataSourceWithBuffer(config)
    return RolloutRunner.from_context(ctx, source), source


def wrong_for_odd_samples(text, rid):
    """Right answers except for sample 1 of groups whose id is even (mixed rewards there)."""
    reply = calc_policy(text, rid)
    group, index = map(int, re.search(r"-g(\d+)-s(\d+)", rid).groups())
    if "Answer:" in reply and index == 1 and group % 2 == 0:
        return reply.replace("Answer:", "Answer: -1 not")
    return reply


def test_groups_share_explicit_ids(tmp_path):
    runner, _ = setup(tmp_path, rollout_batch_size=3, n_samples_per_prompt=2)
    batch = asyncio.run(runner.generate(0))
    assert len(batch.groups) == 3 and len(batch.samples) == 6
    for group in batch.groups:
        assert len({s.group_id for s in group}) == 1 and [s.index for s in group] == [0, 1]
        assert all(s.status is Status.COMPLETED and s.reward == 1.0 for s in group)
        for s in group:
            s.check()
    assert len({g[0].group_id for g in batch.groups}) == 3
    assert batch.metrics["rollout/completed"] == 6 and batch.metrics["rollout/reward_mean"] == 1.0


def test_dynamic_sampling_keeps_groups_with_reward_spread(tmp_path):
    runner, _ = setup(tmp_path, wrong_for_odd_samples, rollout_batch_size=2, n_samples_per_prompt=2,
                      over_sampling_batch_size=4,
                      dynamic_sampling_filter_path="agentrl.rollout.filters:reward_std_positive")
    batch = asyncio.run(runner.generate(0))
    assert len(batch.groups) == 2
    assert all(reward_std_positive(None, g) for g in batch.groups)
    assert all(g[0].group_id % 2 == 0 for g in batch.groups)
    assert batch.metrics["rollout/filtered_groups"] >= 1
    assert "rollout/dynamic_sampling_exhausted" not in batch.metrics


def test_dynamic_sampling_gives_up_after_max_groups_and_says_so(tmp_path):
    runner, _ = setup(tmp_path, rollout_batch_size=2, n_samples_per_prompt=2,
                      dynamic_sampling_max_groups=4,
                      dynamic_sampling_filter_path="agentrl.rollout.filters:reward_std_positive")
    batch = asyncio.run(runner.generate(0))
    assert len(batch.groups) == 2  # topped up with filtered-out groups
    assert batch.metrics["rollout/dynamic_sampling_exhausted"] == 1
    assert batch.metrics["rollout/groups_submitted"] == 4


def slow_odd_groups(rid):
    group = int(re.search(r"-g(\d+)", rid).group(1))
    return 30.0 if group % 2 else 0.0


def test_partial_rollout_returns_unfinished_groups_and_resumes_them(tmp_path):
    runner, source = setup(tmp_path, delay=slow_odd_groups, rollout_batch_size=2,
                           n_samples_per_prompt=2, over_sampling_batch_size=4, partial_rollout=True)

    async def scenario():
        first = await runner.generate(0)
        suspended = dict(runner.suspended)
        buffered = [[(s.group_id, s.index, s.status, s.response_length) for s in g]
                    for g in source.buffer]
        runner.ctx.engine.delay_s = 0.0
        second = await runner.generate(1)
        await runner.close()
        return first, suspended, buffered, second

    first, suspended, buffered, second = asyncio.run(scenario())
    assert [g[0].group_id % 2 for g in first.groups] == [0, 0]
    assert first.metrics["rollout/aborted_groups"] == 2
    assert len(buffered) == 2 and all(s[2] is Status.ABORTED for g in buffered for s in g)
    assert len(suspended) == 4  # their episodes, envs open, waiting to resume
    partial = {(s[0], s[1]): s[3] for g in buffered for s in g}
    assert len(second.groups) == 2
    resumed = {(s.group_id, s.index): s for g in [*second.groups, *source.buffer] for s in g
               if (s.group_id, s.index) in partial}
    assert len(resumed) == 4  # in this batch, or finished and buffered as surplus
    for key, sample in resumed.items():
        assert sample.status is Status.COMPLETED and sample.reward == 1.0
        assert "restarted" not in sample.metadata
        assert sample.response_length >= partial[key]
        sample.check()
    assert runner.suspended == {}


def test_without_partial_rollout_unfinished_groups_are_dropped_and_closed(tmp_path):
    runner, source = setup(tmp_path, delay=slow_odd_groups, rollout_batch_size=2,
                           n_samples_per_prompt=1, over_sampling_batch_size=4)
    batch = asyncio.run(runner.generate(0))
    assert len(batch.groups) == 2 and batch.metrics["rollout/aborted_groups"] == 2
    assert runner.suspended == {} and source.buffer == []


def test_custom_generate_through_the_runner(tmp_path):
    from tests.unit.test_rollout_custom import EXAMPLES

    runner, _ = setup(tmp_path, rollout_batch_size=2, n_samples_per_prompt=2, max_turns=4,
                      custom_generate_function_path=str(EXAMPLES / "custom_generate.py"))
    batch = asyncio.run(runner.generate(0))
    assert len(batch.samples) == 4
    assert all(s.status is Status.COMPLETED and s.reward == 1.0 for s in batch.samples)
    for s in batch.samples:
        s.check()
        assert s.loss_mask.count(1) > 0 and s.loss_mask.count(0) > 0


def test_config_validation_names_the_flag():
    import pytest

    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError, match="--rollout-batch-size must be >= 1"):
        RolloutConfig(env="calc", rollout_batch_size=0).validate()
    with pytest.raises(ConfigError, match="--eval-prompt-data names must be unique"):
        RolloutConfig(env="calc", eval_prompt_data=[["a", "x"], ["a", "y"]]).validate()


def _failed(gid, index, error="KeyError: 'question'"):
    from agentrl.records.sample import Sample

    return Sample(group_id=gid, index=index, status=Status.FAILED, reward=0.0,
                  metadata={"error": error, "task_id": f"t{gid}"})


def test_a_rollout_where_every_sample_failed_stops_the_run():
    import pytest

    from agentrl.errors import RolloutFailedError
    from agentrl.rollout.runner import RolloutBatch

    batch = RolloutBatch([[_failed(0, 0), _failed(0, 1)]], {})
    with pytest.raises(RolloutFailedError, match=r"2 of 2 samples failed \(every sample\); the first, "
                       r"sample 0/0 \(task t0\): KeyError: 'question'"):
        batch.check_failures()


def test_max_failed_fraction_bounds_the_failures_a_rollout_may_have():
    import pytest

    from agentrl.errors import RolloutFailedError
    from agentrl.records.sample import Sample
    from agentrl.rollout.runner import RolloutBatch

    ok = Sample(group_id=1, index=0, status=Status.COMPLETED, reward=1.0)
    batch = RolloutBatch([[_failed(0, 0), ok], [ok, ok]], {})
    batch.check_failures()  # one of four: the default stops only when all failed
    batch.check_failures(0.25)
    with pytest.raises(RolloutFailedError, match="more than --max-failed-fraction 0.2"):
        batch.check_failures(0.2)


def test_a_filter_that_raises_is_named(tmp_path):
    import pytest

    from agentrl.errors import PluginError

    plugin = tmp_path / "bad_filter.py"
    plugin.write_text("def keep(args, group):\n    return group[0].reward['x']\n")
    runner, _ = setup(tmp_path, dynamic_sampling_filter_path=f"{plugin}:keep")
    with pytest.raises(PluginError, match=r"--dynamic-sampling-filter-path .*bad_filter.py:keep: "
                       r"TypeError: .* \(on group \d+\)"):
        asyncio.run(runner.generate(0))
