"""The asynchronous rollout pipeline: staleness bound, admission pacing, no length bias,
trainer waits, errors, exactly-once restore (ScriptedEngine, calc env, a fake trainer loop)."""

from __future__ import annotations

import asyncio
import collections
import math
import random
import re

import pytest

from agentrl.errors import PluginError
from agentrl.records.sample import Status
from agentrl.rollout.pipeline import AsyncRollout
from tests.unit.test_rollout_runner import setup


def group_of(rid: str) -> int:
    return int(re.search(r"-g(\d+)", rid).group(1))


def is_long(gid: int) -> bool:
    return gid % 3 == 0


def calls_policy(text: str, rid: str) -> str:
    """One calculator call for most groups, three for every third ("long" episodes)."""
    results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.S)
    if len(results) >= (3 if is_long(group_of(rid)) else 1):
        return f"Answer: {results[0]}"
    expression = re.findall(r"What is (.*)\?", text)[-1]
    return ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "' + expression
            + '"}}\n</tool_call>')


def pipeline_for(tmp_path, *, K=1, B=2, n=2, delay=0.0, policy=calls_policy, **flags):
    tmp_path.mkdir(parents=True, exist_ok=True)
    runner, source = setup(tmp_path, policy, delay=delay, rollout_batch_size=B,
                           n_samples_per_prompt=n, **flags)
    return AsyncRollout.from_runner(runner, max_staleness=K), runner, source


async def train(pipeline, iterations, *, train_s=0.02, interval=1, start=0, close=True):
    """The loop of train.py in miniature: batch t, 'train', push every `interval` steps."""
    engine = pipeline.runner.ctx.engine
    await engine.update_weights(version=str(start))  # a resumed run pushes its weights first
    pipeline.start(start)
    batches = []
    try:
        for t in range(start, start + iterations):
            batches.append((t, await pipeline.next_batch(t)))
            await asyncio.sleep(train_s)
            if (t + 1) % interval == 0:
                await engine.update_weights(version=str(t + 1))
                pipeline.published(t + 1)
    finally:
        if close:
            await pipeline.aclose()
    return batches


@pytest.mark.parametrize(("K", "interval"), [(0, 1), (1, 1), (1, 2), (2, 1), (2, 3)])
def test_no_group_trained_exceeds_max_staleness(tmp_path, K, interval):
    rng = random.Random(K * 10 + interval)
    delays = collections.defaultdict(lambda: rng.uniform(0.0, 0.03))
    pipeline, _, _ = pipeline_for(tmp_path, K=K, B=2, delay=lambda rid: delays[rid])
    batches = asyncio.run(train(pipeline, 10, interval=interval))
    histogram = collections.Counter()
    for t, batch in batches:
        assert len(batch.groups) == 2 and len(batch.samples) == 4
        for sample in batch.samples:
            assert sample.status is Status.COMPLETED and sample.metadata["trainer_version"] == t
            assert 0 <= t - sample.oldest_version() <= K
        assert batch.metrics["async/staleness_max"] <= K
        histogram.update({k: v for k, v in batch.metrics.items() if k.startswith("async/staleness/")})
    assert sum(histogram.values()) == 10 * 4  # the histogram counts every trained sample
    if K == 1 and interval == 1:  # one-step-off: the pipeline does run ahead of the trainer
        assert histogram["async/staleness/1"] > 0
    trained = [g[0].group_id for _, b in batches for g in b.groups]
    assert len(trained) == len(set(trained))


def test_admission_stops_new_groups_when_the_pipeline_would_exceed_max_staleness(tmp_path):
    pipeline, runner, _ = pipeline_for(tmp_path, K=1, B=2)

    async def scenario():
        admitted = lambda: len({group_of(rid) for rid, _ in runner.ctx.engine.requests})  # noqa: E731
        pipeline.start(0)
        await asyncio.sleep(0.3)
        at_version_0 = admitted()  # (0 + K + 1) * B, and no more however long it waits
        pipeline.published(1)
        await asyncio.sleep(0.3)
        at_version_1 = admitted()
        await pipeline.next_batch(0)
        await asyncio.sleep(0.1)
        after_training = admitted()  # training frees no room: only a new version does
        await pipeline.aclose()
        return at_version_0, at_version_1, after_training

    assert asyncio.run(scenario()) == (4, 6, 6)


def test_running_episodes_continue_across_weight_updates_and_are_not_restarted(tmp_path):
    # group 0 is long (three tool calls, a slow engine turn each); the others are quick
    pipeline, _, _ = pipeline_for(tmp_path, K=3, B=1, n=1,
                                  delay=lambda rid: 0.15 if group_of(rid) == 0 else 0.0)
    batches = asyncio.run(train(pipeline, 5, train_s=0.05))
    long = next(s for _, b in batches for s in b.samples if s.group_id == 0)
    versions = [v for v, m in zip(long.token_versions, long.loss_mask, strict=True) if m]
    assert versions == sorted(versions) and versions[-1] > versions[0]  # it lived through updates
    assert "restarted" not in long.metadata and long.status is Status.COMPLETED
    assert long.metadata["turns"] == 4 and long.metadata["trainer_version"] - versions[0] <= 3
    long.check()


def drop_late_run(runner, iterations, *, B, K, train_s):
    """A policy the pipeline does not use, for contrast: keep the pipeline full, train the first
    groups to finish, drop any finished group older than K when its turn comes."""
    engine = runner.ctx.engine

    async def scenario():
        version, started, trained, ready, running = 0, [], [], [], set()

        async def play(group, admitted):
            await runner.play_group(group, f"d-g{group[0].group_id}")
            ready.append((admitted, group))

        for t in range(iterations):
            batch = []
            while len(batch) < B:
                running = {task for task in running if not task.done()}
                while len(running) + len(ready) < (K + 1) * B:
                    group = runner.data_source.get_samples(1)[0]
                    started.append(group[0].group_id)
                    running.add(asyncio.create_task(play(group, version)))
                while ready and len(batch) < B:
                    admitted, group = ready.pop(0)
                    if t - admitted <= K:
                        batch.append(group[0].group_id)
                await asyncio.sleep(0.002)
            trained += batch
            await asyncio.sleep(train_s)
            version = t + 1
            await engine.update_weights(version=str(version))
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        return started, trained

    return asyncio.run(scenario())


def test_long_episodes_are_trained_in_the_share_they_were_started(tmp_path):
    # long episodes: three tool calls of a slow engine turn each; short ones: one quick call
    def delay(rid):
        return 0.03 if is_long(group_of(rid)) else 0.005

    iterations, B, K = 30, 4, 1
    pipeline, runner, _ = pipeline_for(tmp_path / "a", K=K, B=B, n=1, delay=delay)
    batches = asyncio.run(train(pipeline, iterations, train_s=0.03))
    trained = [g[0].group_id for _, b in batches for g in b.groups]
    started = sorted({group_of(rid) for rid, _ in runner.ctx.engine.requests})
    share = sum(map(is_long, trained)) / len(trained)
    started_share = sum(map(is_long, started)) / len(started)
    # every started group but the last (K + 1) * B in flight is trained, whatever its length
    assert abs(share - started_share) <= (K + 1) * B / len(started) + 1e-9
    assert abs(share - 1 / 3) <= 3 * math.sqrt(1 / 3 * 2 / 3 / len(trained))

    runner2 = pipeline_for(tmp_path / "b", K=K, B=B, n=1, delay=delay)[1]
    started2, trained2 = drop_late_run(runner2, iterations, B=B, K=K, train_s=0.03)
    share2 = sum(map(is_long, trained2)) / len(trained2)
    started_share2 = sum(map(is_long, started2)) / len(started2)
    assert started_share2 - share2 > 3 * math.sqrt(started_share2 * (1 - started_share2) / len(trained2))


def test_a_due_group_makes_the_trainer_wait_not_the_rollout(tmp_path):
    # group 0 takes long; with K = 0 it is due in the first batch, which waits for it
    pipeline, _, _ = pipeline_for(tmp_path, K=0, B=2, n=1,
                                  delay=lambda rid: 0.4 if group_of(rid) == 0 else 0.0)
    batches = asyncio.run(train(pipeline, 2))
    (t0, first), _ = batches
    assert 0 in [g[0].group_id for g in first.groups]
    assert first.metrics["async/due_waits"] >= 1 and first.metrics["async/trainer_wait_s"] >= 0.3


def test_a_failing_background_group_surfaces_in_next_batch(tmp_path):
    plugin = tmp_path / "bad_filter.py"
    plugin.write_text("def keep(args, group):\n    return group[0].reward['x']\n")
    pipeline, runner, _ = pipeline_for(tmp_path, dynamic_sampling_filter_path=f"{plugin}:keep")
    with pytest.raises(PluginError, match=r"bad_filter.py:keep: TypeError"):
        asyncio.run(train(pipeline, 1))
    assert runner.suspended == {}


def test_dynamic_sampling_and_custom_generate_run_through_the_pipeline(tmp_path):
    from tests.unit.test_rollout_custom import EXAMPLES
    from tests.unit.test_rollout_runner import wrong_for_odd_samples

    pipeline, _, _ = pipeline_for(
        tmp_path / "filter", B=2, n=2, policy=wrong_for_odd_samples,
        dynamic_sampling_filter_path="agentrl.rollout.filters:reward_std_positive")
    batches = asyncio.run(train(pipeline, 3))
    assert all(g[0].group_id % 2 == 0 for _, b in batches for g in b.groups)  # mixed rewards only
    assert sum(b.metrics["rollout/filtered_groups"] for _, b in batches) >= 2

    pipeline, _, _ = pipeline_for(tmp_path / "custom", B=2, n=2, max_turns=4,
                                  custom_generate_function_path=str(EXAMPLES / "custom_generate.py"))
    batches = asyncio.run(train(pipeline, 2))
    for sample in (s for _, b in batches for s in b.samples):
        assert sample.status is Status.COMPLETED and sample.reward == 1.0
        sample.check()


def test_a_restored_pipeline_trains_every_prompt_exactly_once(tmp_path):
    delay = lambda rid: 0.05 if is_long(group_of(rid)) else 0.0  # noqa: E731
    pipeline, _, source = pipeline_for(tmp_path, K=2, B=2, n=2, delay=delay)

    async def first_part():
        batches = await train(pipeline, 3, close=False)
        state, data = pipeline.snapshot(), source.state_dict()  # one instant, as train.py saves
        await pipeline.aclose()
        return batches, state, data

    batches, state, data = asyncio.run(first_part())
    assert state["trained_groups"] == 6 and state["groups"]  # some were still in flight
    resumed, _, source2 = pipeline_for(tmp_path, K=2, B=2, n=2, delay=delay)
    source2.load_state_dict(data)
    resumed.restore(state)

    async def second_part():
        batches = await train(resumed, 4, start=3, close=False)
        state = resumed.snapshot()
        await resumed.aclose()
        return batches, state

    more, end = asyncio.run(second_part())
    trained = [g[0].group_id for _, b in batches + more for g in b.groups]
    untrained = [g[0]["group_id"] for g in end["groups"]]
    assert len(trained) == len(set(trained)) == 14 and not set(trained) & set(untrained)
    assert sorted(trained + untrained) == list(range(len(trained) + len(untrained)))  # none lost
    replayed = {g[0]["group_id"] for g in state["groups"]}
    restarted = {s.group_id for _, b in more for s in b.samples if s.metadata.get("restarted")}
    assert restarted == replayed & {g[0].group_id for _, b in more for g in b.groups}
    # the ledger says the same: each trained once, the replayed ones restarted once
    entries = end["ledger"]["entries"]
    assert sorted(e["group_id"] for e in entries if e["state"] == "trained") == sorted(trained)
    assert {e["group_id"] for e in entries if e["restarts"]} == replayed
    assert {e["state"] for e in entries if e["group_id"] in untrained} <= {"in_flight", "finished"}


def test_an_eval_rollout_stopping_its_episodes_leaves_the_pipelines_alone(tmp_path):
    from agentrl.rollout.build import eval_context
    from agentrl.rollout.runner import RolloutRunner

    # training groups take a while per turn; the eval needs 1 of 3 quick groups, then stops
    # the other 2 (its stop flag) while the pipeline's episodes are mid-way
    pipeline, runner, source = pipeline_for(
        tmp_path, K=1, B=2, n=1, delay=lambda rid: 0.0 if rid.startswith("reval") else 0.1)

    async def scenario():
        engine = runner.ctx.engine
        pipeline.start(0)
        await asyncio.sleep(0.15)
        evaluation = RolloutRunner(eval_context(runner.ctx), source, evaluation=True)
        await evaluation.generate("eval0", num_groups=1, submit_size=3)
        await evaluation.close()
        batch = await pipeline.next_batch(0)
        await engine.update_weights(version="1")
        pipeline.published(1)
        second = await pipeline.next_batch(1)
        await pipeline.aclose()
        return batch, second

    batch, second = asyncio.run(scenario())
    for b in (batch, second):
        assert "rollout/aborted_groups" not in b.metrics
        assert all(s.status is Status.COMPLETED and "restarted" not in s.metadata for s in b.samples)
    assert not runner.ctx.stopping.is_set()
    assert eval_context(runner.ctx).stopping is not runner.ctx.stopping  # each rollout its own
