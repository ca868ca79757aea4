"""Launching SGLang servers for a run: one Ray actor per engine, on its placement-group bundle,
runs the server process; an ``sglang-router`` in front of several; the client
(:class:`~agentrl.rollout.engine.sglang.SGLangEngine`) talks to them.

``--rollout-backend sglang`` starts ``python -m sglang.launch_server --model-path ... --tp-size
<--rollout-num-gpus-per-engine>`` with every ``--sglang-X VALUE`` passed on as ``--X VALUE``;
``sglang-compat`` starts agentrl's SGLang-compatible server over the embedded engine instead (the
same client, router and protocol on machines where SGLang cannot run). ``--rollout-engine-urls``
(and ``--rollout-router-url``) use servers that are already running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import EngineError
from agentrl.orchestration.bundles import engine_bundles
from agentrl.rollout.engine.sglang import SGLangEngine

__all__ = ["SGLangServers", "launch_sglang", "router_command", "server_command"]

log = logging.getLogger(__name__)

SERVER_MODULES = {"sglang": "sglang.launch_server",
                  "sglang-compat": "agentrl.rollout.engine.sglang_compat_server"}


def server_command(backend: str, checkpoint: str | Path, *, port: int | str, host: str = "127.0.0.1",
                   tp_size: int = 1, sglang_args: Mapping[str, str | None] | None = None,
                   seed: int | None = None) -> list[str]:
    """The command line of one engine's server."""
    command = [sys.executable, "-m", SERVER_MODULES[backend], "--model-path", str(checkpoint),
               "--host", host, "--port", str(port)]
    if backend == "sglang":
        command += ["--tp-size", str(tp_size)]
    args = dict(sglang_args or {})
    if seed is not None:
        args.setdefault("random-seed", str(seed))
    for name, value in args.items():
        command += [f"--{name}"] if value is None else [f"--{name}", value]
    return command


def router_command(workers: Sequence[str], *, port: int, policy: str) -> list[str]:
    """The command line of the ``sglang-router`` in front of ``workers``."""
    return [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
            "--port", str(port), "--worker-urls", *workers, "--policy", policy,
            "--log-level", "warn", "--prometheus-port", str(_free_port())]


class _ServerProcess:
    """One server process on this actor's node (a Ray actor; see :class:`SGLangServers`)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"agentrl-sglang-{os.getpid()}.log"

    def start(self, command_template: list[str], driver_ip: str) -> str:
        """Starts the server (on the port of its first start, or a free one); its base URL. On
        the driver's node it listens on loopback only; on another node, on every interface."""
        import ray

        self.stop()
        self.port = self.port or _free_port()
        node_ip = ray.util.get_node_ip_address()
        host = "127.0.0.1" if node_ip == driver_ip else "0.0.0.0"
        fill = {"{port}": str(self.port), "{host}": host}
        command = [fill.get(part, part) for part in command_template]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        return f"http://{'127.0.0.1' if host == '127.0.0.1' else node_ip}:{self.port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """Kills the server process as a crash would (fault-tolerance drills and tests)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.is_file() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class SGLangServers:
    """The servers a run started: their actors, the router, and (``--use-fault-tolerance``)
    their supervision. A server found dead (its process exited, its actor died, or it stopped
    answering ``/health_generate``) is left out of routing at once and restarted on its bundle,
    on its port, from the latest weights pushed from disk, under the latest version; it serves
    again when healthy. Fault tolerance therefore needs disk weight pushes."""

    def __init__(self, rollout: Any, cluster: Any, checkpoint: str | Path, where: Any) -> None:
        import ray

        self.rollout, self.cluster, self.checkpoint, self.where = rollout, cluster, str(checkpoint), where
        self.per_engine = -(-rollout.rollout_concurrency // max(1, cluster.num_engines))
        self.sglang_args = dict(rollout.sglang_args)
        if rollout.rollout_backend == "sglang-compat":
            self.sglang_args.setdefault("max-running-requests", str(self.per_engine))
        self.driver_ip = ray.util.get_node_ip_address()
        self.actors = [self._new_actor(bundle) for bundle in where.bundles]
        self.urls: list[str] = []
        self.router: subprocess.Popen[bytes] | None = None
        self.engine: SGLangEngine | None = None
        self.restarts = 0
        self._watch: asyncio.Task[None] | None = None

    def _new_actor(self, bundle: int) -> Any:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return ray.remote(_ServerProcess).options(
            **self.where.resources, scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.where.placement, placement_group_bundle_index=bundle),
        ).remote()

    def command(self, index: int, model_path: str | None = None, version: str | None = None) -> list[str]:
        args = dict(self.sglang_args)
        if version is not None:
            args["weight-version"] = version
        return server_command(self.rollout.rollout_backend, model_path or self.checkpoint, port="{port}",
                              host="{host}", tp_size=self.cluster.rollout_num_gpus_per_engine,
                              sglang_args=args, seed=self.rollout.rollout_seed + index)

    async def start(self, tokenizer: Any) -> SGLangEngine:
        import ray

        self.urls = ray.get([a.start.remote(self.command(i), self.driver_ip) for i, a in enumerate(self.actors)])
        try:
            engine = await SGLangEngine.connect(
                self.urls, tokenizer=tokenizer, concurrency=self.per_engine, wait_s=900.0,
                tp_size=self.cluster.rollout_num_gpus_per_engine,
                alive=lambda: all(ray.get([a.alive.remote() for a in self.actors])))
            if len(self.urls) > 1 and self.rollout.router_policy != "none":
                port = _free_port()
                self.router = subprocess.Popen(router_command(self.urls, port=port, policy=self.rollout.router_policy),
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                engine.router = f"http://127.0.0.1:{port}"
                await engine.wait_router(self.router)
        except BaseException as exc:
            tails = ray.get([a.log_tail.remote() for a in self.actors])
            await self.stop()
            if isinstance(exc, EngineError):
                raise EngineError(f"{exc}\n--- server log tail ---\n{tails[0]}") from exc
            raise
        self.engine = engine
        engine.on_close.append(self.stop)
        if self.cluster.use_fault_tolerance:
            self._watch = asyncio.create_task(self._supervise(), name="agentrl-sglang-health")
        return engine

    async def _supervise(self) -> None:
        assert self.engine is not None
        while True:
            await asyncio.sleep(self.cluster.rollout_health_check_interval)
            for index, url in enumerate(self.urls):
                if not await self._alive(index, url):
                    await self._restart(index, url)

    async def _alive(self, index: int, url: str) -> bool:
        from ray.exceptions import RayActorError

        try:
            process_up = await asyncio.wait_for(self.actors[index].alive.remote(),
                                                self.cluster.rollout_health_check_timeout)
        except (RayActorError, TimeoutError):
            process_up = False
        assert self.engine is not None
        return process_up and await self.engine._healthy(url)

    async def _restart(self, index: int, url: str) -> None:
        import ray
        from ray.exceptions import RayActorError

        engine = self.engine
        assert engine is not None
        engine._mark_down(url)
        log.warning("SGLang server %s is down; restarting it (weights %s)", url, engine.weight_version)
        try:
            await self.actors[index].alive.remote()
        except RayActorError:  # the actor itself died: a new one on the same bundle
            self.actors[index] = self._new_actor(self.where.bundles[index])
        command = self.command(index, engine.last_weights_path, engine.weight_version)
        new_url = await self.actors[index].start.remote(command, self.driver_ip)
        if new_url != url:  # a new actor got a new port
            engine.replace_worker(url, new_url)
            self.urls[index] = new_url
            if engine.router is not None:
                await engine._request("POST", f"{engine.router}/workers",
                                      {"url": new_url, "worker_type": "regular"})
        deadline = asyncio.get_running_loop().time() + 900
        while not await engine._healthy(new_url):
            if asyncio.get_running_loop().time() > deadline or not await self.actors[index].alive.remote():
                log.warning("SGLang server %s did not come back: %s", new_url,
                            ray.get(self.actors[index].log_tail.remote()))
                return  # the next health check tries again
            await asyncio.sleep(0.5)
        engine.readmit(new_url)
        self.restarts += 1
        log.warning("SGLang server %s restarted (weights %s)", new_url, engine.weight_version)

    def kill_server(self, index: int) -> None:
        """Kills server ``index``'s process now, as a crash would."""
        import ray

        ray.get(self.actors[index].kill.remote())

    async def stop(self) -> None:
        import ray

        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        if self.router is not None and self.router.poll() is None:
            self.router.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.router.wait(timeout=30)
        with contextlib.suppress(Exception):
            ray.get([a.stop.remote() for a in self.actors])
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        if self.where.owns_placement:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.where.placement)
            self.where.owns_placement = False


async def launch_sglang(rollout: Any, cluster: Any, checkpoint: str | Path, trainer: Any = None) -> SGLangEngine:
    """Starts (or connects to) the run's SGLang servers and returns the client; closing the
    client stops what was started here (see :class:`SGLangServers`).

    Raises:
        EngineError: A server or the router did not come up (with its log's tail).
    """
    from agentrl.models.hf_config import load_tokenizer

    tokenizer = load_tokenizer(checkpoint)
    if rollout.rollout_engine_urls:
        per_engine = -(-rollout.rollout_concurrency // len(rollout.rollout_engine_urls))
        return await SGLangEngine.connect(rollout.rollout_engine_urls, router_url=rollout.rollout_router_url,
                                          tokenizer=tokenizer, concurrency=per_engine,
                                          tp_size=cluster.rollout_num_gpus_per_engine)
    servers = SGLangServers(rollout, cluster, checkpoint, await engine_bundles(cluster, trainer))
    engine = await servers.start(tokenizer)
    engine.servers = servers
    return engine
