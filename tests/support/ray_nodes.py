"""A Ray cluster of ``ray start`` processes on this machine: a head, and nodes joined to it that
may offer ``sandbox`` resources. Each node is a session of its own, so a node is killed, as if
its machine died, by killing every process of that session."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.distributed import free_port

HEALTH_CHECKS = {
    # a dead node is declared dead after ~3 missed 1 s health checks, not Ray's ~30 s default
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    "RAY_health_check_initial_delay_ms": "0",
}

OBJECT_STORE_BYTES = 100 * 2**20
"""Each node's object store: the tests pass small objects only."""


@dataclasses.dataclass
class RayNode:
    """One ``ray start --block`` process (the leader of its session).

    Attributes:
        name: Its name in the test; also a resource of its own (``test_node_<name>``), which
            tells its Ray node id.
        process: The ``ray start`` process.
        sandbox_root: ``AGENTRL_SANDBOX_ROOT`` of its processes (where its sandboxes live).
    """

    name: str
    process: subprocess.Popen[bytes]
    sandbox_root: Path

    @property
    def resource(self) -> str:
        return f"test_node_{self.name}"


class LocalRayCluster:
    """Ray nodes on loopback, with token authentication off (nothing but this machine reaches
    them), under ``root``.

    Args:
        root: A short directory (Ray's socket paths must stay under 108 characters).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        root.chmod(0o711)  # sandboxes run as uids of their own: they must reach their workspaces
        self.address = f"127.0.0.1:{free_port()}"
        self.nodes: list[RayNode] = []
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", **HEALTH_CHECKS}
        self._ray = str(Path(sys.executable).with_name("ray"))

    def start_head(self) -> RayNode:
        """The head: the GCS, and one CPU for drivers' tasks; no sandboxes."""
        port = self.address.rsplit(":", 1)[1]
        return self._start("head", ["--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                                    f"--ray-client-server-port={free_port()}"], {})

    def add_node(self, name: str, sandboxes: int, sandbox_root: Path | None = None) -> RayNode:
        """A node offering ``sandboxes`` sandboxes and no CPUs for other work; its sandboxes go
        under ``sandbox_root`` (default: a folder of its own), e.g. a dead node's, as a node
        restarted on the same machine shares that machine's sandbox root."""
        return self._start(name, [f"--address={self.address}", "--num-cpus=0"],
                           {"sandbox": sandboxes}, sandbox_root)

    def _start(self, name: str, args: list[str], resources: dict[str, int],
               sandbox_root: Path | None = None) -> RayNode:
        root = sandbox_root or self.root / f"sandboxes-{name}"
        root.mkdir(parents=True, exist_ok=True)
        resources = {**resources, f"test_node_{name}": 1}
        # Ray's fixed default ports and its default /tmp/ray would be shared with any other Ray
        # instance on this machine (an earlier test's, a run's): each node has its own.
        ports = [f"--{flag}={free_port()}" for flag in (
            "node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")]
        process = subprocess.Popen(
            [self._ray, "start", "--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
             "--include-log-monitor=false", f"--object-store-memory={OBJECT_STORE_BYTES}",
             f"--resources={json.dumps(resources)}", f"--temp-dir={self.root / ('ray-' + name)}",
             *ports, *args],
            env={**self.env, "AGENTRL_SANDBOX_ROOT": str(root)}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        node = RayNode(name, process, root)
        self.nodes.append(node)
        return node

    @contextlib.contextmanager
    def driver_mode(self) -> Iterator[None]:
        """This process as a driver of these nodes: token authentication off, as theirs is.

        A local ``ray.init()`` earlier in the process (another test's) turned token
        authentication on for the whole process (``RAY_AUTH_MODE=token`` in its environment,
        and Ray's cached config); the nodes would then take this driver's calls for
        unauthenticated ones and destroy its actors as they are created."""
        from ray._raylet import AuthenticationTokenLoader, Config

        def refresh() -> None:
            Config.initialize("")
            AuthenticationTokenLoader.instance().reset_cache()

        saved = {name: os.environ.get(name) for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
        os.environ["RAY_AUTH_MODE"] = "disabled"
        os.environ.pop("RAY_AUTH_TOKEN", None)
        refresh()
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            refresh()

    def kill(self, node: RayNode) -> None:
        """Kills every process of ``node``'s session at once (its raylet, its workers, the
        actors in them): the node is gone without a word."""
        for _ in range(20):  # a process may fork while its siblings die
            pids = _session_pids(node.process.pid)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):  # it died meanwhile
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        node.process.wait(timeout=30)

    def stop(self) -> None:
        """Kills every node, newest first, then removes their Ray files."""
        for node in reversed(self.nodes):
            self.kill(node)
            shutil.rmtree(self.root / f"ray-{node.name}", ignore_errors=True)


def _session_pids(session: int) -> list[int]:
    """The live processes whose session id is ``session``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            found.append(int(entry))
    return found
