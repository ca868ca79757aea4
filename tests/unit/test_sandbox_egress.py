"""The rules that enforce a Docker sandbox's egress (agentrl/sandbox/egress.py), as text: the
namespaced rules themselves are exercised on the daemon in tests/integration/test_harbor.py."""

from __future__ import annotations

import pytest

from agentrl.sandbox.egress import HOSTS_MARK, Egress, filter_table, hosts_file


def test_unrestricted_accepts_everything() -> None:
    table = filter_table(Egress.unrestricted())
    assert ":OUTPUT ACCEPT" in table and "-A OUTPUT" not in table


def test_an_allowlist_rejects_all_but_loopback_and_its_addresses() -> None:
    egress = Egress(addresses=("10.0.0.7", "192.168.0.0/24", "2001:db8::1"), hosts=(("api", "10.0.0.7"),))
    v4 = filter_table(egress).splitlines()
    # Docker's resolver is refused before loopback is let through: DNS resolves nothing
    assert v4.index("-A OUTPUT -d 127.0.0.11/32 -j REJECT --reject-with icmp-port-unreachable") \
        < v4.index("-A OUTPUT -o lo -j ACCEPT")
    assert "-A OUTPUT -d 10.0.0.7/32 -j ACCEPT" in v4 and "-A OUTPUT -d 192.168.0.0/24 -j ACCEPT" in v4
    assert ":OUTPUT DROP [0:0]" in v4 and v4[-2] == "-A OUTPUT -j REJECT --reject-with icmp-port-unreachable"
    assert not any("conntrack" in line for line in v4)  # no exception for connections already open
    v6 = filter_table(egress, 6).splitlines()
    assert "-A OUTPUT -d 2001:db8::1/128 -j ACCEPT" in v6 and not any("10.0.0.7" in line for line in v6)


def test_nothing_is_loopback_only() -> None:
    rules = [line for line in filter_table(Egress.nothing()).splitlines() if line.startswith("-A")]
    assert rules == ["-A OUTPUT -d 127.0.0.11/32 -j REJECT --reject-with icmp-port-unreachable",
                     "-A OUTPUT -o lo -j ACCEPT", "-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset",
                     "-A OUTPUT -j REJECT --reject-with icmp-port-unreachable"]


def test_hosts_file_replaces_only_its_own_lines() -> None:
    docker = "127.0.0.1\tlocalhost\n172.17.0.5\tsandbox\n"
    once = hosts_file(docker, Egress(addresses=("10.0.0.7",), hosts=(("api", "10.0.0.7"),)))
    assert once == docker + HOSTS_MARK + "\n10.0.0.7\tapi\n"
    assert hosts_file(once, Egress.nothing()) == docker
    assert hosts_file(once, Egress(hosts=(("db", "10.0.0.8"),))).count(HOSTS_MARK) == 1


@pytest.mark.parametrize("bad", [{"addresses": ("example.com",)}, {"hosts": (("a b", "10.0.0.1"),)},
                                 {"hosts": (("api", "not-an-ip"),)}])
def test_malformed_egress_is_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        Egress(**bad)
