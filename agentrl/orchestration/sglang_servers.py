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

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import EngineError
from agentrl.rollout.engine.sglang import SGLangEngine

__all__ = ["launch_sglang", "router_command", "server_command"]

SERVER_MODULES = {"sglang": "sglang.launch_server",
                  "sglang-compat": "agentrl.rollout.engine.sglang_compat_server"}  # fmt: skip


def server_command(backend: str, checkpoint: str | Path, *, port: int | str, host: str = "127.0.0.1",
                   tp_size: int = 1, sglang_args: Mapping[str, str | None] | None = None,
                   seed: int | None = None) -> list[str]:  # fmt: skip
    """The command line of one engine's server."""
    command = [sys.executable, "-m", SERVER_MODULES[backend], "--model-path", str(checkpoint),
               "--host", host, "--port", str(port)]  # fmt: skip
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
            "--log-level", "warn", "--prometheus-port", str(_free_port())]  # fmt: skip


class _ServerProcess:
    """One server process on this actor's node (a Ray actor; see :func:`launch_sglang`)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"agentrl-sglang-{os.getpid()}.log"

    def start(self, command_template: list[str], driver_ip: str) -> str:
        """Starts the server on a free port of this node; its base URL. On the driver's node it
        listens on loopback only; on another node, on every interface (the driver must reach it)."""
        import ray

        port = _free_port()
        node_ip = ray.util.get_node_ip_address()
        host = "127.0.0.1" if node_ip == driver_ip else "0.0.0.0"
        fill = {"{port}": str(port), "{host}": host}
        command = [fill.get(part, part) for part in command_template]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        return f"http://{'127.0.0.1' if host == '127.0.0.1' else node_ip}:{port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

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


async def launch_sglang(rollout: Any, cluster: Any, checkpoint: str | Path, trainer: Any = None) -> SGLangEngine:
    """Starts (or connects to) the run's SGLang servers and returns the client; closing the
    client stops what was started here.

    Raises:
        EngineError: A server or the router did not come up (with its log's tail).
    """
    import ray

    from agentrl.orchestration.engines import engine_bundles
    from agentrl.rollout.engine.embedded import load_tokenizer

    tokenizer = load_tokenizer(checkpoint)
    per_engine = -(-rollout.rollout_concurrency // max(1, cluster.num_engines))
    if rollout.rollout_engine_urls:
        return await SGLangEngine.connect(rollout.rollout_engine_urls, router_url=rollout.rollout_router_url,
                                          tokenizer=tokenizer, concurrency=per_engine)  # fmt: skip
    where = await engine_bundles(cluster, trainer)
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    actors = [
        ray.remote(_ServerProcess).options(
            **where.resources, scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=where.placement, placement_group_bundle_index=bundle),
        ).remote()
        for bundle in where.bundles
    ]  # fmt: skip
    sglang_args = dict(rollout.sglang_args)
    if rollout.rollout_backend == "sglang-compat":
        sglang_args.setdefault("max-running-requests", str(per_engine))
    commands = [server_command(rollout.rollout_backend, checkpoint, port="{port}", host="{host}",
                               tp_size=cluster.rollout_num_gpus_per_engine, sglang_args=sglang_args,
                               seed=rollout.rollout_seed + i)
                for i in range(len(actors))]  # fmt: skip
    driver_ip = ray.util.get_node_ip_address()
    urls = ray.get([a.start.remote(c, driver_ip) for a, c in zip(actors, commands, strict=True)])
    router = None

    async def stop() -> None:
        if router is not None and router.poll() is None:
            router.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                router.wait(timeout=30)
        ray.get([a.stop.remote() for a in actors])
        for actor in actors:
            ray.kill(actor)
        if where.owns_placement:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(where.placement)

    try:
        engine = await SGLangEngine.connect(urls, tokenizer=tokenizer, concurrency=per_engine,
                                            wait_s=900.0, alive=lambda: all(ray.get([a.alive.remote() for a in actors])))  # fmt: skip
        if len(urls) > 1 and rollout.router_policy != "none":
            port = _free_port()
            router = subprocess.Popen(router_command(urls, port=port, policy=rollout.router_policy),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            engine.router = f"http://127.0.0.1:{port}"
            await engine.wait_router(router)
    except BaseException as exc:
        tails = ray.get([a.log_tail.remote() for a in actors])
        await stop()
        if isinstance(exc, EngineError):
            raise EngineError(f"{exc}\n--- server log tail ---\n{tails[0]}") from exc
        raise
    engine.on_close.append(stop)
    return engine
