"""What a Docker sandbox's processes may reach over its network, enforced from the host.

A sandbox on a Docker network (not ``network="none"``) can be given an :class:`Egress`. The
host then writes packet-filter rules into the container's own network namespace (``nsenter``
into ``/proc/<pid>/ns/net``, then ``iptables-restore`` / ``ip6tables-restore``) and the names
that may resolve into its ``/etc/hosts``. The sandboxed processes have no capability, so they
can change neither. A restricted egress:

* drops every packet leaving the container except on its loopback and to the allowed
  addresses (IPv4 and IPv6), rejected at once rather than left to time out;
* blocks DNS: Docker's resolver (127.0.0.11) is refused, and a nameserver is only reachable if
  its address is allowed, so the names that resolve are those written into ``/etc/hosts``;
* cuts connections made under an earlier, wider egress, since every packet is checked by
  destination (no "established" exception).

A restart of the container (:meth:`DockerSandbox.stop_processes`) makes a new network
namespace, so the sandbox applies its egress again after every restart, before any command
runs. Needs root on the host, ``nsenter`` and ``iptables`` (IPv4 and IPv6), a kernel with the
packet filter, and a daemon on this machine (:func:`egress_unsupported` says what is missing).
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import os
import shutil
import subprocess

from agentrl.sandbox.base import SandboxError

DOCKER_DNS = "127.0.0.11"
HOSTS_MARK = "# agentrl egress: the names below are the only ones that resolve"


@dataclasses.dataclass(frozen=True)
class Egress:
    """A sandbox's outbound network policy.

    Attributes:
        allow_all: Every destination the sandbox's network reaches, and DNS (no rules).
        addresses: IPv4 / IPv6 addresses or CIDR blocks that may be connected to when not
            ``allow_all``.
        hosts: ``(name, address)`` pairs written into ``/etc/hosts``; with DNS blocked, the
            only names that resolve.
    """

    allow_all: bool = False
    addresses: tuple[str, ...] = ()
    hosts: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for address in self.addresses:
            try:
                ipaddress.ip_network(address, strict=False)
            except ValueError:
                raise ValueError(f"egress address {address!r} is not an IP address or CIDR block") from None
        for name, address in self.hosts:
            ipaddress.ip_address(address)
            if not name or any(c.isspace() for c in name) or name.startswith("#"):
                raise ValueError(f"egress host name {name!r} cannot go into /etc/hosts")

    @classmethod
    def unrestricted(cls) -> Egress:
        """Everything the network reaches."""
        return cls(allow_all=True)

    @classmethod
    def nothing(cls) -> Egress:
        """Loopback only, on a container that stays on its network."""
        return cls()


def filter_table(egress: Egress, version: int = 4) -> str:
    """The ``filter`` table (``iptables-restore`` input) that enforces ``egress`` for IP
    ``version`` 4 or 6; the ``nat`` table (Docker's resolver redirect) is left as it is."""
    if egress.allow_all:
        return "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n"
    reject = "icmp-port-unreachable" if version == 4 else "icmp6-port-unreachable"
    lines = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD DROP [0:0]", ":OUTPUT DROP [0:0]"]
    if version == 4:
        lines.append(f"-A OUTPUT -d {DOCKER_DNS}/32 -j REJECT --reject-with {reject}")
    lines.append("-A OUTPUT -o lo -j ACCEPT")
    for address in egress.addresses:
        network = ipaddress.ip_network(address, strict=False)
        if network.version == version:
            lines.append(f"-A OUTPUT -d {network} -j ACCEPT")
    if version == 4:
        lines.append("-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset")
    lines += [f"-A OUTPUT -j REJECT --reject-with {reject}", "COMMIT", ""]
    return "\n".join(lines)


def hosts_file(current: str, egress: Egress) -> str:
    """``current`` (Docker's ``/etc/hosts``) without agentrl's earlier lines, plus
    ``egress.hosts``."""
    kept = current.split(HOSTS_MARK)[0].rstrip("\n")
    if not egress.hosts:
        return kept + "\n"
    return "\n".join([kept, HOSTS_MARK, *(f"{address}\t{name}" for name, address in egress.hosts), ""])


@functools.lru_cache(maxsize=1)
def egress_unsupported() -> str | None:
    """Why this host cannot enforce an :class:`Egress` (None: it can). Besides root and the
    tools, it loads :meth:`Egress.nothing`'s rules into a scratch network namespace, so a
    kernel without the packet filter is found here, not in an episode."""
    if os.geteuid() != 0:
        return "enforcing a network allowlist needs root on the host (to enter the container's network namespace)"
    for tool in ("nsenter", "unshare", "iptables-restore", "ip6tables-restore"):
        if shutil.which(tool) is None:
            return f"enforcing a network allowlist needs {tool} on the host (apt-get install iptables util-linux)"
    for version, tool in ((4, "iptables-restore"), (6, "ip6tables-restore")):
        try:
            done = subprocess.run(["unshare", "--net", tool], input=filter_table(Egress.nothing(), version),
                                  capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"enforcing a network allowlist needs {tool} to work in a network namespace: {exc}"
        if done.returncode != 0:
            return (f"this host's kernel does not take packet-filter rules in a network namespace "
                    f"({tool}: {done.stderr.strip()[-300:]})")
    return None


def apply_egress(pid: int, hosts_path: str | None, egress: Egress) -> None:
    """Enforces ``egress`` in the network namespace of the process ``pid`` (the container's
    init) and writes its names into ``hosts_path`` (Docker's file behind ``/etc/hosts``).

    Raises:
        SandboxError: The host cannot enforce it (see :func:`egress_unsupported`), or a rule
            could not be loaded.
    """
    reason = egress_unsupported()
    if reason is not None:
        raise SandboxError(reason)
    namespace = f"--net=/proc/{pid}/ns/net"
    for version, tool in ((4, "iptables-restore"), (6, "ip6tables-restore")):
        done = subprocess.run(["nsenter", namespace, tool], input=filter_table(egress, version),
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise SandboxError(f"cannot load the sandbox's egress rules ({tool}): {done.stderr.strip()[-500:]}")
    if hosts_path:
        with open(hosts_path, encoding="utf-8") as f:
            current = f.read()
        with open(hosts_path, "w", encoding="utf-8") as f:
            f.write(hosts_file(current, egress))
