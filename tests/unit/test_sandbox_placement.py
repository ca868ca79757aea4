"""--sandbox-placement ray without Ray: the driver's side (choosing hosts, admission, lost
sandboxes, retries) against in-memory host handles."""

from __future__ import annotations

import asyncio
import collections
import itertools
from typing import Any

import pytest

from agentrl.chat import ChatRenderer
from agentrl.engine.base import SamplingParams
from agentrl.env.factory import EnvFactory
from agentrl.errors import ConfigError
from agentrl.placement.cluster import ClusterConfig
from agentrl.placement.sandbox_hosts import NodeInfo, RemoteSandboxPools, SandboxHosts
from agentrl.records.sample import Sample, Status
from agentrl.rollout.buffer import RolloutDataSourceWithBuffer
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.episode import Episode, RolloutContext
from agentrl.rollout.runner import RolloutRunner
from agentrl.run.flags import parse_args
from agentrl.sandbox import ExecResult, Limits, SandboxError
from tests.support.engines import ScriptedEngine
from tests.support.sandbox_env_ids import ENV_ID, MCP_ENV_ID, run_then_answer
from tests.support.tokenizers import tiny_tokenizer

NODE_A = NodeInfo("node-a", "10.0.0.1", 2)
NODE_B = NodeInfo("node-b", "10.0.0.2", 2)


class _Method:
    """``handle.method.remote(*args)`` as Ray has it: an awaitable of the result."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Any:
        return self.fn(*args)


class FakeHost:
    """A host handle whose sandboxes are ids. ``dies_on_exec``: the first ``exec`` takes the
    node down without a word (that call and every later one never answer)."""

    def __init__(self, node: NodeInfo, *, dies_on_exec: bool = False) -> None:
        self.node = node
        self.dies_on_exec = dies_on_exec
        self.dead = self.killed = False
        self.sandboxes: set[str] = set()
        self._ids = itertools.count()
        for name in ("create", "exec", "close", "close_all", "stats"):
            setattr(self, name, _Method(getattr(self, f"_{name}")))

    async def _answer(self) -> None:
        if self.dead:
            await asyncio.Event().wait()

    async def _create(self, backend: str, limits: Limits, options: dict[str, Any]) -> tuple[str, str, list[str]]:
        await self._answer()
        sid = f"{self.node.node_id}-{next(self._ids)}"
        self.sandboxes.add(sid)
        return sid, "process", []

    async def _exec(self, sid: str, command: Any, options: dict[str, Any]) -> ExecResult:
        self.dead = self.dead or self.dies_on_exec
        await self._answer()
        return ExecResult(0, f"done on {self.node.node_id}\n", "")

    async def _close(self, sid: str) -> None:
        await self._answer()
        self.sandboxes.discard(sid)

    async def _close_all(self) -> int:
        await self._answer()
        count = len(self.sandboxes)
        self.sandboxes.clear()
        return count

    async def _stats(self) -> dict[str, Any]:
        await self._answer()
        return {"in_use": len(self.sandboxes)}


class FakeLauncher:
    """Nodes that exist until their host is killed after dying (as Ray would see them)."""

    def __init__(self, *nodes: NodeInfo, dying: tuple[str, ...] = ()) -> None:
        self.alive = list(nodes)
        self.dying = dying
        self.started: dict[str, FakeHost] = {}

    def nodes(self) -> list[NodeInfo]:
        return list(self.alive)

    def start(self, node: NodeInfo) -> FakeHost:
        host = self.started[node.node_id] = FakeHost(node, dies_on_exec=node.node_id in self.dying)
        return host

    def kill(self, handle: FakeHost) -> None:
        handle.killed = True
        if handle.dead:
            self.alive = [n for n in self.alive if n.node_id != handle.node.node_id]


def fast_hosts(launcher: FakeLauncher) -> SandboxHosts:
    return SandboxHosts(launcher, poll_interval_s=0.05, call_margin_s=0.05, probe_timeout_s=0.05)


async def settle() -> None:
    await asyncio.sleep(0.1)


def test_hosts_are_chosen_by_free_capacity_and_admission_spans_nodes():
    async def main() -> None:
        launcher = FakeLauncher(NODE_A, NODE_B)
        pools = RemoteSandboxPools(fast_hosts(launcher))
        limits = Limits()
        # two pools (two images) of one run share its admission limit of 3
        pool_x = pools.get("process", limits, 3, {"image": "x"})
        pool_y = pools.get("process", limits, 3, {"image": "y"})
        first = [await pool_x.acquire(), await pool_y.acquire(), await pool_x.acquire()]
        assert [s.host.node.node_id for s in first] == ["node-a", "node-b", "node-a"]
        assert (await first[1].exec("true")).stdout == "done on node-b\n"
        with pytest.raises(SandboxError, match="not supported with --sandbox-placement ray"):
            await first[1].spawn(["cat"])  # its pipes would have to cross the network
        fourth = asyncio.ensure_future(pool_y.acquire())
        await settle()  # node-b has room, but the run's limit is reached
        assert not fourth.done() and pool_y.stats["waiting"] == 1
        await pool_x.release(first[0])
        refill = await fourth
        assert refill.host.node.node_id == "node-a"  # both have one free: the lower id wins
        await pool_x.release(first[2])
        await pool_y.release(first[1])
        await pool_y.release(refill)
        assert {n: len(h.sandboxes) for n, h in launcher.started.items()} == {"node-a": 0, "node-b": 0}

        # a higher limit than the nodes hold: the fifth waits for a host's room, not admission
        wide = pools.get("process", limits, 10)
        held = [await wide.acquire() for _ in range(4)]
        fifth = asyncio.ensure_future(wide.acquire())
        await settle()
        assert not fifth.done() and wide.stats["waiting"] == 0
        on_b = next(s for s in held if s.host.node.node_id == "node-b")
        await wide.release(on_b)
        assert (await fifth).host.node.node_id == "node-b"

        await pools.aclose()  # what is still held is closed on its host, then the hosts go
        assert all(not h.sandboxes and h.killed for h in launcher.started.values())
        assert pools.hosts.hosts == []

    asyncio.run(main())


def episode_ctx(factory: EnvFactory, config: RolloutConfig) -> RolloutContext:
    tokenizer = tiny_tokenizer()
    return RolloutContext(config, ScriptedEngine(tokenizer, run_then_answer),
                          ChatRenderer(tokenizer, "hermes"), SamplingParams(max_new_tokens=256),
                          2048, factory)


def test_a_node_whose_host_never_starts_fails_new_sandboxes_with_the_reason():
    """A node Ray lists but never places the host on (another run holds its resource, or its
    raylet cannot start workers) fails the sandbox after one start timeout; it does not wait."""
    class NeverStarts(FakeLauncher):
        def start(self, node: NodeInfo) -> FakeHost:
            host = super().start(node)
            host.dead = True  # the actor is never scheduled: nothing it is asked answers
            return host

    async def main() -> None:
        launcher = NeverStarts(NODE_A)
        hosts = SandboxHosts(launcher, poll_interval_s=0.05, host_start_timeout_s=0.2)
        with pytest.raises(SandboxError, match=r"no sandbox host could start .*node 10.0.0.1 "
                                               r"\(node-a\) started no host: TimeoutError\(\) \(a host has 0.2 s\)"):
            await asyncio.wait_for(hosts.pick(), 5)
        assert launcher.started["node-a"].killed and hosts.hosts == []

    asyncio.run(main())


def test_a_lost_sandbox_fails_the_episode_not_the_tool_call():
    launcher = FakeLauncher(NODE_A, dying=("node-a",))
    hosts = fast_hosts(launcher)
    factory = EnvFactory(ENV_ID, env_kwargs={"timeout_s": 0.1},
                         make_sandbox_pools=lambda: RemoteSandboxPools(hosts))
    ctx = episode_ctx(factory, RolloutConfig(env=ENV_ID, max_turns=3))
    sample = Sample(group_id=0, metadata={"task": {"id": "t0", "command": "echo done"}})

    async def main() -> tuple[Sample, list[dict[str, Any]]]:
        episode = Episode(ctx, sample, "r0-g0-s0")
        try:
            return await episode.run(), sample.metadata["messages"]
        finally:
            await factory.aclose()

    played, messages = asyncio.run(main())
    assert played.status is Status.FAILED and played.metadata["finish"] == "sandbox_lost"
    assert "SandboxLost" in played.metadata["error"] and "node-a" in played.metadata["error"]
    assert [m["role"] for m in messages] == ["user", "assistant"]  # no tool message
    assert [t.role for t in played.turns] == ["assistant"] and not played.metadata.get("tool_errors")
    assert launcher.started["node-a"].killed and hosts.hosts == []


def test_lost_sandbox_episodes_are_retried_under_fault_tolerance():
    launcher = FakeLauncher(NODE_A, NodeInfo("node-b", "10.0.0.2", 4), dying=("node-a",))
    hosts = fast_hosts(launcher)
    config = RolloutConfig(env=ENV_ID, rollout_batch_size=2, n_samples_per_prompt=3, max_turns=3)
    factory = EnvFactory(ENV_ID, env_kwargs={"timeout_s": 0.1}, sandbox_retries=3,
                         make_sandbox_pools=lambda: RemoteSandboxPools(hosts))
    ctx = episode_ctx(factory, config)
    runner = RolloutRunner.from_context(ctx, RolloutDataSourceWithBuffer(config, envs=factory))

    async def main() -> list[Sample]:
        try:
            return (await runner.generate(0)).samples
        finally:
            await runner.close()
            await factory.aclose()

    samples = asyncio.run(main())
    keys = collections.Counter((s.group_id, s.index) for s in samples)
    assert len(keys) == 6 and set(keys.values()) == {1}
    assert all(s.status is Status.COMPLETED and s.reward == 1.0 for s in samples)
    retried = [s for s in samples if s.metadata.get("sandbox_retries")]
    assert retried and all(s.metadata["sandbox_retries"] == 1 for s in retried)
    assert all("error" not in s.metadata for s in samples)
    rids = [rid for rid, _ in ctx.engine.requests]
    for s in retried:  # the retry's requests have a suffix of their own, under the group's prefix
        assert any(rid.startswith(f"r0-g{s.group_id}-s{s.index}-r1-") for rid in rids)
    assert not launcher.started["node-b"].sandboxes


def test_sandbox_placement_ray_is_refused_where_it_cannot_work(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    joined = ["--ray-address", "127.0.0.1:1"]
    for flags, message in (
        (["--env", "calc", "--no-use-ray"], "--sandbox-placement ray runs the sandboxes on Ray "
                                            "nodes: drop --no-use-ray"),
        (["--env", "calc"], "offers none: start the cluster with `ray start`"),
        (["--env", MCP_ENV_ID, *joined], "runs MCP servers inside its sandboxes (inside)"),
        (["--env", "harbor", *joined], "env harbor needs its sandboxes on this machine"),
    ):
        with pytest.raises(SystemExit):
            parse_args(["--sandbox-placement", "ray", *flags])
        assert message in capsys.readouterr().err
    parse_args(["--sandbox-placement", "ray", "--env", ENV_ID, *joined, "--use-fault-tolerance"])
    with pytest.raises(ConfigError, match="--use-fault-tolerance restarts engine actors"):
        ClusterConfig(use_fault_tolerance=True).validate()
