"""--sandbox-placement ray on a real two-node Ray cluster on this machine (two ``ray start``): a
head without sandboxes, and a sandbox node offering ``{"sandbox": 3}``; the ``process`` backend.
The sandbox node is killed mid-rollout like a machine that dies."""

from __future__ import annotations

import asyncio
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.chat import ChatRenderer
from agentrl.engine.base import SamplingParams
from agentrl.placement.cluster import RAY_NAMESPACE, ClusterConfig
from agentrl.placement.sandbox_hosts import (
    RayHostLauncher,
    RemoteSandboxPools,
    SandboxHosts,
    placed_env_factory,
)
from agentrl.records.sample import Sample, Status
from agentrl.rollout.buffer import RolloutDataSourceWithBuffer
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.episode import RolloutContext
from agentrl.rollout.runner import RolloutRunner
from agentrl.sandbox import Limits, reap_leftovers
from tests.support.engines import ScriptedEngine
from tests.support.ray_nodes import LocalRayCluster, RayNode
from tests.support.sandbox_env_ids import ENV_ID, run_then_answer
from tests.support.tokenizers import tiny_tokenizer

ray = pytest.importorskip("ray")

COMMAND = "sleep 3; echo done $PPID"
"""The tool call of every episode: long enough to be killed in, and it names the process that
ran it (the host actor: the sandbox's commands are its children)."""


class Cluster:
    """The module's cluster: its nodes (``nodes.nodes[1]`` is the first sandbox node) and the
    placement flags of a run on it."""

    def __init__(self, nodes: LocalRayCluster) -> None:
        self.nodes = nodes
        self.config = ClusterConfig(ray_address=nodes.address, sandbox_placement="ray")

    def node_id(self, node: RayNode, timeout_s: float = 90.0) -> str:
        """``node``'s Ray node id, once it is alive in the cluster."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for info in ray.nodes():
                if info["Alive"] and info["Resources"].get(node.resource):
                    return info["NodeID"]
            time.sleep(0.2)
        raise TimeoutError(f"node {node.name} did not join the cluster within {timeout_s:g} s")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    nodes = LocalRayCluster(Path(tempfile.mkdtemp(prefix="agentrl-ray-")))
    try:
        nodes.start_head()
        sandbox_node = nodes.add_node("s1", sandboxes=3)  # joins as soon as the head answers
        if ray.is_initialized():  # an earlier test's local instance
            ray.shutdown()
        with nodes.driver_mode():
            deadline = time.monotonic() + 90
            while True:
                try:
                    ray.init(address=nodes.address, namespace=RAY_NAMESPACE, log_to_driver=False)
                    break
                except ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            found = Cluster(nodes)
            found.node_id(sandbox_node)
            yield found
            ray.shutdown()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        nodes.stop()
        for node in nodes.nodes:  # what the hosts killed with their node left behind
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("AGENTRL_SANDBOX_ROOT", str(node.sandbox_root))
                reap_leftovers(docker_hosts=[])
        shutil.rmtree(nodes.root, ignore_errors=True)


def workspaces(node: RayNode) -> list[str]:
    return sorted(p.name for p in node.sandbox_root.glob("ws-*"))


def mounts() -> list[str]:
    """The mount points of this machine."""
    return [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]


def test_tool_calls_run_on_the_sandbox_node(cluster):
    sandbox_node = cluster.nodes.nodes[1]
    expected = cluster.node_id(sandbox_node)

    async def main() -> None:
        pools = RemoteSandboxPools.for_cluster(cluster.config)
        pool = pools.get("process", Limits(timeout_s=30), 4)
        try:
            sandbox = await pool.acquire()
            [host] = await pools.hosts.stats()
            assert sandbox.host.node.node_id == host["node_id"] == expected != ray.get_runtime_context().get_node_id()
            assert host["in_use"] == host["handed_out"] == 1 and sandbox.backend == "process"
            assert workspaces(sandbox_node)  # the workspace is on the sandbox node's disk
            ran = await sandbox.exec("echo $PPID")
            assert ran.ok and ran.stdout.strip() == str(host["pid"])  # a child of the host actor
            await sandbox.write_file("notes.txt", "from the driver\n")
            assert (await sandbox.exec("cat notes.txt; echo made > out.txt")).stdout == "from the driver\n"
            assert await sandbox.read_file("out.txt") == b"made\n"
            shell = await sandbox.open_shell()
            await shell.run("cd /tmp && export MARK=7")
            assert (await shell.run("echo $MARK $(pwd) $PPID")).stdout.split() == ["7", "/tmp", str(host["pid"])]
            await shell.close()
            await pool.release(sandbox)
            [host] = await pools.hosts.stats()
            assert host["in_use"] == host["shells"] == host["handed_out"] == 0
            assert not workspaces(sandbox_node)
        finally:
            await pools.aclose()
        assert pools.hosts.hosts == []

    asyncio.run(main())


def rollout(cluster: Cluster, *, fault_tolerance: bool, kill: RayNode, replacement: str | None
            ) -> tuple[list[Sample], dict[str, Any]]:
    """One rollout of a group of 3 on the cluster's sandbox nodes; once all 3 episodes are in
    their tool call, ``kill`` dies (after ``replacement`` is started, when given). Returns the
    samples and what was seen: the pools' and the surviving hosts' counts before closing."""
    config = ClusterConfig(ray_address=cluster.nodes.address, sandbox_placement="ray",
                           use_fault_tolerance=fault_tolerance)
    rollout_config = RolloutConfig(env=ENV_ID, env_kwarg=[f"command={COMMAND}"], rollout_batch_size=1,
                                   n_samples_per_prompt=3, max_turns=3)
    factory = placed_env_factory(rollout_config, config)
    assert factory is not None
    tokenizer = tiny_tokenizer()
    ctx = RolloutContext(rollout_config, ScriptedEngine(tokenizer, run_then_answer),
                         ChatRenderer(tokenizer, "hermes"), SamplingParams(max_new_tokens=256), 2048,
                         factory)
    runner = RolloutRunner.from_context(ctx, RolloutDataSourceWithBuffer(rollout_config, envs=factory))
    seen: dict[str, Any] = {}

    async def killer() -> None:
        hosts: SandboxHosts = pools.hosts
        while not hosts.hosts or hosts.hosts[0].in_use < 3:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # their `sleep 3` has started
        if replacement is not None:  # on the same machine: the same sandbox root
            seen["replacement"] = cluster.nodes.add_node(replacement, sandboxes=3,
                                                         sandbox_root=kill.sandbox_root)
        seen["killed_workspaces"] = workspaces(kill)  # what its death leaves behind
        await asyncio.to_thread(cluster.nodes.kill, kill)

    async def main() -> list[Sample]:
        try:
            killing = asyncio.ensure_future(killer())
            samples = (await runner.generate(0)).samples
            await killing
            seen["pool"] = pools.get("process", Limits(timeout_s=30.0), 16).stats
            seen["hosts"] = await pools.hosts.stats()
            return samples
        finally:
            await runner.close()
            await factory.aclose()
            seen["hosts_after_close"] = len(pools.hosts.hosts)

    pools = factory.sandbox_pools  # made when the data source built its env
    assert isinstance(pools, RemoteSandboxPools) and isinstance(pools.hosts.launcher, RayHostLauncher)
    return asyncio.run(main()), seen


def test_killing_the_sandbox_node_mid_rollout_fails_its_episodes_and_leaks_nothing_on_the_survivors(cluster):
    first = cluster.nodes.nodes[1]
    # without fault tolerance: the episodes fail with the reason; nothing waits for a new node
    samples, seen = rollout(cluster, fault_tolerance=False, kill=first, replacement="s2")
    assert [s.status for s in samples] == [Status.FAILED] * 3
    assert {s.metadata["finish"] for s in samples} == {"sandbox_lost"}
    assert all("died" in s.metadata["error"] and s.reward == 0.0 for s in samples)
    assert seen["pool"]["in_use"] == 0 and seen["hosts"] == [] and seen["hosts_after_close"] == 0

    first_killed = seen["killed_workspaces"]

    # with fault tolerance: the node dies again; the episodes are played again on its replacement
    second = seen["replacement"]
    cluster.node_id(second)
    samples, seen = rollout(cluster, fault_tolerance=True, kill=second, replacement="s3")
    keys = collections.Counter((s.group_id, s.index) for s in samples)
    assert len(keys) == 3 and set(keys.values()) == {1}
    assert all(s.status is Status.COMPLETED and s.reward == 1.0 for s in samples)
    assert [s.metadata["sandbox_retries"] for s in samples] == [1, 1, 1]
    [survivor] = seen["hosts"]
    assert survivor["node_id"] == cluster.node_id(seen["replacement"])
    assert all(f"done {survivor['pid']}" in s.response for s in samples)  # ran there
    assert survivor["in_use"] == survivor["handed_out"] == survivor["shells"] == 0
    assert seen["pool"] == {"in_use": 0, "waiting": 0, "warm": 0} and seen["hosts_after_close"] == 0
    # the first dead node's workspaces were reclaimed by a host that started on its machine
    # since (they share the sandbox root); the second's are left to the cleanup command
    root = first.sandbox_root
    assert first_killed and not set(first_killed) & set(workspaces(first))
    cleaned = subprocess.run([sys.executable, "-m", "agentrl", "clean-sandboxes", "--sandbox-root", str(root)],
                             capture_output=True, text=True, timeout=120)
    assert cleaned.returncode == 0 and "nothing of a running process was touched" in cleaned.stdout
    assert not workspaces(first)  # nothing of either dead node remains
    assert not [m for m in mounts() if m.startswith(str(root))]
    assert not list((root / "uids").iterdir())
