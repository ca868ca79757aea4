"""A Harbor task's network policies, phase by phase, as a Docker sandbox enforces them.

Harbor gives a task a baseline (``[environment]``: start-up and each step's ``setup.sh``) and
lets ``[agent]`` and ``[verifier]`` (and a step's own tables) override it for their phase:
``no-network``, ``public`` or ``allowlist`` with ``allowed_hosts``. :func:`plan_network` picks
the sandbox's Docker network under the env's ``network`` grant and says whether the phases need
egress rules; :func:`egress_of` turns one phase's policy into the
:class:`~agentrl.sandbox.egress.Egress` the sandbox enforces when the phase starts.

Allowed hostnames are resolved when their phase starts: first among the containers on the
sandbox's network (by name and alias), then by this machine's resolver. A name that resolves
nowhere stays unreachable, as it would be behind Harbor's proxy. A ``*.suffix`` wildcard names
no host to resolve in advance, so a task that uses one is refused.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from typing import Any

from agentrl.sandbox.egress import Egress, egress_unsupported
from agentrl_envs.harbor.task import HarborTask, HarborTaskError, NetworkPolicy

GRANTS = ("task", "offline", "public")
"""The env's ``network`` argument: ``task`` honours each phase's policy but refuses ``public``;
``public`` grants it too; ``offline`` runs every phase without network."""


@dataclasses.dataclass(frozen=True)
class NetworkPlan:
    """How a task's sandbox is networked.

    Attributes:
        network: The sandbox's Docker network (``"none"``: loopback only, every phase).
        per_phase: Whether the phases differ from unrestricted access, so the sandbox starts
            with nothing reachable and each phase sets its own egress.
    """

    network: str = "none"
    per_phase: bool = False


def phase_policies(task: HarborTask) -> list[tuple[str, NetworkPolicy]]:
    """Every phase of ``task`` with its policy, named as task.toml names its table."""
    phases = [("environment", NetworkPolicy(task.network_mode, task.allowed_hosts))]
    for step in task.steps:
        where = f"steps.{step.name}." if step.name else ""
        phases += [(f"{where}agent", step.agent_network), (f"{where}verifier", step.verifier_network)]
    return phases


def plan_network(task: HarborTask, grant: str, egress_network: str) -> NetworkPlan:
    """The sandbox network of ``task`` under the env's ``grant`` (see :data:`GRANTS`).

    Raises:
        HarborTaskError: A phase asks for public network and ``grant`` is ``task``; an
            allowlist uses a wildcard; or this machine cannot enforce per-phase rules.
    """
    phases = phase_policies(task)
    if grant == "offline" or all(p.mode == "no-network" for _, p in phases):
        return NetworkPlan()
    if task.compose is not None:
        # the task's services share a private network with no way out: a no-network phase
        # reaches all of them, an allowlist only those it names, and nothing else is granted
        services = {"main", *(s.name for s in task.compose.services)}
        for phase, policy in phases:
            outside = [h for h in policy.allowed_hosts if h not in services]
            if policy.mode == "public" or outside:
                raise HarborTaskError(
                    f"Harbor task {task.path}: task.toml: {phase}.network_mode: a compose task's "
                    "containers share a private network with no way out, where a phase reaches "
                    f"the task's services ({', '.join(sorted(services))}); agentrl does not grant "
                    f"more beside it ({'public' if policy.mode == 'public' else outside[0]!r}); "
                    "or pass --env-kwarg network=offline")
        per_phase = any(p.mode == "allowlist" for _, p in phases)
        if per_phase and (reason := egress_unsupported()) is not None:
            raise HarborTaskError(f"Harbor task {task.path}: an allowlist among its services needs "
                                  f"per-phase rules, and {reason}; or pass --env-kwarg network=offline")
        return NetworkPlan("none", per_phase)
    for phase, policy in phases:
        if policy.mode == "public" and grant != "public":
            asked = ("no network_mode, and Harbor's default is 'public'"
                     if phase == "environment" and not task.network_mode_set
                     else f"{phase}.network_mode = 'public'")
            raise HarborTaskError(
                f"Harbor task {task.path}: task.toml asks for public network ({asked}); agentrl "
                "never grants network silently: pass --env-kwarg network=public to grant it, or "
                "--env-kwarg network=offline to run the task without network (or set "
                "network_mode = \"no-network\" in its [environment])")
        wildcards = [h for h in policy.allowed_hosts if h.startswith("*.")]
        if wildcards:
            raise HarborTaskError(
                f"Harbor task {task.path}: task.toml: {phase}.allowed_hosts: {wildcards[0]!r}: "
                "agentrl enforces an allowlist by resolving each host when the phase starts, and "
                "a wildcard names no host to resolve; list the hosts, or pass --env-kwarg "
                "network=offline")
    per_phase = any(p.mode != "public" for _, p in phases)
    if per_phase and (reason := egress_unsupported()) is not None:
        raise HarborTaskError(f"Harbor task {task.path}: its phases have different network "
                              f"policies, and {reason}; or pass --env-kwarg network=offline")
    return NetworkPlan(egress_network, per_phase)


def egress_of(policy: NetworkPolicy, client: Any, network: str) -> Egress:
    """The :class:`Egress` of a phase's ``policy`` for a sandbox on the Docker ``network``
    (``client``: the daemon's), its hostnames resolved now (see the module docstring)."""
    if policy.mode == "public":
        return Egress.unrestricted()
    if policy.mode == "no-network":
        return Egress.nothing()
    names = [entry for entry in policy.allowed_hosts if _address_block(entry) is None]
    on_network = _containers_on(client, network, names) if names else {}
    addresses: list[str] = []
    hosts: list[tuple[str, str]] = []
    for entry in policy.allowed_hosts:
        if (block := _address_block(entry)) is not None:
            addresses.append(block)
            continue
        for address in on_network.get(entry) or _resolve(entry):
            addresses.append(address)
            hosts.append((entry, address))
    return Egress(addresses=tuple(dict.fromkeys(addresses)), hosts=tuple(dict.fromkeys(hosts)))


def _address_block(entry: str) -> str | None:
    """``entry`` as an address block (``10.0.0.7/32``, ``10.1.0.0/16``); None for a hostname."""
    try:
        return str(ipaddress.ip_network(entry, strict=False))
    except ValueError:
        return None


def _containers_on(client: Any, network: str, names: list[str]) -> dict[str, list[str]]:
    """The addresses on the Docker ``network`` of the containers called one of ``names``, by
    container name (from the network's own listing) or, for a name not found so, by alias
    (which needs each container's settings: asked only then)."""
    import docker.errors

    try:
        attrs = client.networks.get(network).attrs
    except docker.errors.NotFound:
        return {}
    members = attrs.get("Containers") or {}
    found: dict[str, list[str]] = {}
    for member in members.values():
        if member.get("Name", "").lower() in names:
            found[member["Name"].lower()] = [a.split("/")[0] for a in (member.get("IPv4Address"),
                                                                         member.get("IPv6Address")) if a]
    if all(name in found for name in names):
        return found
    for container_id in members:
        try:
            container = client.containers.get(container_id)
        except docker.errors.NotFound:
            continue
        settings = (container.attrs.get("NetworkSettings", {}).get("Networks") or {}).get(network) or {}
        addresses = [a for a in (settings.get("IPAddress"), settings.get("GlobalIPv6Address")) if a]
        for alias in settings.get("Aliases") or ():
            if alias.lower() in names and alias.lower() not in found:
                found[alias.lower()] = addresses
    return found


def _resolve(host: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))
