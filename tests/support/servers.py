"""The fault-tolerance drill both server backends' tests run (SGLang-protocol and vLLM)."""

from __future__ import annotations

import asyncio
from typing import Any

from agentrl.records.sample import Sample, Status
from agentrl.rollout import RolloutRunner, env_factory, load_data_source
from agentrl.rollout.config import RolloutConfig
from agentrl.run.context import make_rollout_context


async def rollout_with_a_server_killed(engine: Any, args: RolloutConfig, *, restart_s: float) -> list[Sample]:
    """Plays rollout 0 through ``engine`` (servers started by ``launch_servers`` under
    ``--use-fault-tolerance``), kills server 0 while it runs, and checks that no sample was
    lost or played twice and none failed; then waits (up to ``restart_s``) until the server was
    restarted and serves again. Returns the rollout's samples."""
    runner = RolloutRunner.from_context(make_rollout_context(args, engine, env_factory(args)),
                                        load_data_source(args))
    rollout = asyncio.create_task(runner.generate(0))
    await asyncio.sleep(0.3)
    engine.servers.kill_server(0)
    batch = await rollout
    await runner.close()
    expected = args.rollout_batch_size * args.n_samples_per_prompt
    keys = [(s.group_id, s.index) for s in batch.samples]
    assert len(keys) == expected and len(set(keys)) == expected
    assert {s.status for s in batch.samples} <= {Status.COMPLETED, Status.TRUNCATED}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + restart_s
    while engine.servers.restarts < 1 or engine.down:
        assert loop.time() < deadline, "the server was not restarted"
        await asyncio.sleep(0.2)
    return batch.samples
