"""Engines as Ray actors: routing, weight pushes, memory release, and fault tolerance (an engine
killed mid-rollout is restarted and its requests retried: every sample present exactly once)."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.engine.base import SamplingParams
from agentrl.engine.embedded import EmbeddedEngine
from agentrl.engine.model import read_checkpoint
from agentrl.errors import EngineError
from agentrl.models import build_tiny_model
from agentrl.placement.cluster import ClusterConfig, start_ray
from agentrl.placement.engines import launch_engines
from agentrl.records.sample import Status
from agentrl.rollout import RolloutRunner, env_factory, load_data_source
from agentrl.rollout.config import RolloutConfig
from agentrl.run.context import make_rollout_context

SEEDED = SamplingParams(max_new_tokens=24, sampling_seed=11)


@pytest.fixture(scope="module")
def ray_session():
    import ray

    start_ray(ClusterConfig(rollout_num_gpus=2))
    yield
    ray.shutdown()


def cluster(**flags) -> ClusterConfig:
    config = ClusterConfig(**{"rollout_num_gpus": 2, "rollout_health_check_interval": 0.5, **flags})
    config.validate()
    return config


async def wait_for(condition, timeout: float = 120.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def test_requests_of_one_episode_stay_on_one_engine_and_weights_reach_all(ray_session, tmp_path):
    async def scenario():
        group = await launch_engines(cluster(), build_tiny_model(), seed=0, max_batch_size=8)
        try:
            outs = await asyncio.gather(*(group.generate([5, 6, 7], SEEDED, rid=f"r0-g{i}-s0-t0")
                                          for i in range(6)))
            first = dict(group._affinity)
            assert set(first.values()) == {0, 1}  # new episodes spread over both engines
            await group.generate([5, 6, 7], SEEDED, rid="r0-g3-s0-t1")
            assert group._affinity == first  # a later turn goes where its episode went

            # new weights from tensors: every engine serves them, with the version
            reference = EmbeddedEngine.from_pretrained(build_tiny_model())
            state = {k: v * 0.5 for k, v in read_checkpoint(build_tiny_model()).items()}
            await reference.update_weights(state_dict=state, version="1")
            expected = await reference.generate([5, 6, 7], SEEDED)
            await reference.close()
            await group.update_weights(state_dict=state, version="1")
            both = await asyncio.gather(*(group.generate([5, 6, 7], SEEDED, rid=f"{e}-t0")
                                          for e in ("a", "b")))
            assert {group._affinity["a"], group._affinity["b"]} == {0, 1}
            for out in both:
                assert (out.weight_version, out.output_ids) == ("1", expected.output_ids)
            assert outs[0].output_ids != expected.output_ids

            # and from a Hugging Face directory on disk
            await group.update_weights(path=str(build_tiny_model()), version="2")
            out = await group.generate([5, 6, 7], SEEDED, rid="c-t0")
            assert (out.weight_version, out.output_ids) == ("2", outs[0].output_ids)

            await group.release_memory()  # idle: allowed; the next request allocates again
            assert (await group.generate([5, 6, 7], SEEDED, rid="d-t0")).output_ids == outs[0].output_ids
        finally:
            await group.close()

    asyncio.run(scenario())


def test_engine_killed_mid_rollout_is_restarted_and_every_sample_is_present_once(ray_session):
    async def scenario():
        group = await launch_engines(cluster(use_fault_tolerance=True), build_tiny_model(), seed=0,
                                     max_batch_size=16)
        try:
            await group.update_weights(path=str(build_tiny_model()), version="3")
            args = RolloutConfig(env="calc", max_turns=3, rollout_batch_size=8, n_samples_per_prompt=4,
                                 rollout_max_response_len=48, rollout_concurrency=32)
            ctx = make_rollout_context(args, group, env_factory(args))
            runner = RolloutRunner.from_context(ctx, load_data_source(args))
            rollout = asyncio.create_task(runner.generate(0))
            await wait_for(lambda: group.slots[0].inflight > 0)
            group.kill_engine(0)
            batch = await rollout
            await runner.close()

            keys = [(s.group_id, s.index) for s in batch.samples]
            assert len(keys) == 32 and len(set(keys)) == 32
            assert {s.status for s in batch.samples} <= {Status.COMPLETED, Status.TRUNCATED}
            assert group.stats["retried_requests"] >= 1
            await wait_for(lambda: group.stats["restarts"] == 1 and all(s.alive for s in group.slots))
            # the restarted engine serves the latest weights, not the checkpoint it started from
            info = await group.slots[0].handle.info.remote()
            assert info["weight_version"] == "3"
        finally:
            await group.close()

    asyncio.run(scenario())


def test_an_engine_that_stops_answering_health_checks_is_replaced(ray_session):
    async def scenario():
        group = await launch_engines(cluster(use_fault_tolerance=True), build_tiny_model(), seed=0,
                                     max_batch_size=4)
        try:
            old_pid = (await group.slots[1].handle.info.remote())["pid"]
            group.kill_engine(1)  # nothing in flight: only the health check can notice
            await wait_for(lambda: group.stats["restarts"] == 1 and group.slots[1].alive)
            assert (await group.slots[1].handle.info.remote())["pid"] != old_pid
            assert group.stats["retried_requests"] == 0
        finally:
            await group.close()

    asyncio.run(scenario())


def test_without_fault_tolerance_a_dead_engine_is_an_error_naming_the_flag(ray_session):
    async def scenario():
        group = await launch_engines(cluster(), build_tiny_model(), seed=0, max_batch_size=4)
        try:
            await group.generate([5, 6, 7], SEEDED, rid="e-t0")
            engine = group._affinity["e"]
            group.kill_engine(engine)
            with pytest.raises(EngineError, match="--use-fault-tolerance"):
                await group.generate([5, 6, 7], SEEDED, rid="e-t1")
        finally:
            await group.close()

    asyncio.run(scenario())
