"""A Harbor task's network policies as agentrl enforces them (envs/harbor/network.py): which
tasks run under which grant, and what each phase's egress is. Enforcement on the daemon:
tests/integration/test_harbor.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.sandbox.egress import Egress
from agentrl_envs.harbor import HarborTaskError, load_task
from agentrl_envs.harbor.network import NetworkPlan, egress_of, plan_network
from agentrl_envs.harbor.task import NetworkPolicy
from tests.unit.test_harbor_task import make_task


def task_with(tmp_path: Path, tables: str):
    return load_task(make_task(tmp_path, '[task]\nname = "a/b"\n' + tables))


def test_no_network_anywhere_needs_no_network(tmp_path: Path) -> None:
    task = task_with(tmp_path, '[environment]\nnetwork_mode = "no-network"\n')
    assert plan_network(task, "task", "bridge") == NetworkPlan("none", False)


def test_public_is_granted_only_on_request(tmp_path: Path) -> None:
    task = task_with(tmp_path, '[environment]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "public"\n')
    with pytest.raises(HarborTaskError, match=r"asks for public network \(verifier.network_mode = 'public'\)"):
        plan_network(task, "task", "bridge")
    assert plan_network(task, "offline", "bridge") == NetworkPlan("none", False)
    # granted: the phases differ, so each sets its own egress on the network
    assert plan_network(task, "public", "testnet") == NetworkPlan("testnet", True)
    everywhere = task_with(tmp_path / "p", "")  # Harbor's default: public
    assert plan_network(everywhere, "public", "bridge") == NetworkPlan("bridge", False)


def test_an_allowlist_runs_per_phase_and_a_wildcard_is_refused(tmp_path: Path) -> None:
    task = task_with(tmp_path, '[environment]\nnetwork_mode = "no-network"\n'
                     '[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["api.test"]\n')
    assert plan_network(task, "task", "testnet") == NetworkPlan("testnet", True)
    wild = task_with(tmp_path / "w", '[environment]\nnetwork_mode = "no-network"\n'
                     '[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["*.test"]\n')
    with pytest.raises(HarborTaskError, match=r"agent.allowed_hosts: '\*.test': .* a wildcard names no host"):
        plan_network(wild, "task", "testnet")


class NoNetworks:
    """A daemon without the named network: only the error path of the container lookup."""

    class networks:  # the attribute of a docker client
        @staticmethod
        def get(name: str):
            import docker.errors

            raise docker.errors.NotFound(f"network {name} not found")


def test_each_policy_becomes_an_egress() -> None:
    assert egress_of(NetworkPolicy("public"), NoNetworks(), "n") == Egress.unrestricted()
    assert egress_of(NetworkPolicy("no-network"), NoNetworks(), "n") == Egress.nothing()
    policy = NetworkPolicy("allowlist", ("10.0.0.7", "10.1.0.0/16", "localhost", "nowhere.invalid"))
    egress = egress_of(policy, NoNetworks(), "n")
    assert egress.addresses[:2] == ("10.0.0.7/32", "10.1.0.0/16")
    assert ("localhost", "127.0.0.1") in egress.hosts  # this machine's resolver
    assert not any(name == "nowhere.invalid" for name, _ in egress.hosts)  # unreachable, not an error
