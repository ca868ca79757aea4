"""Launching inference servers for a run: one Ray actor per engine, on its placement-group
bundle, runs the server process; an ``sglang-router`` in front of several SGLang servers; the
client (:class:`~agentrl.engine.sglang.SGLangEngine` or
:class:`~agentrl.engine.vllm.VLLMEngine`) talks to them.

* ``--rollout-backend sglang``: ``python -m sglang.launch_server --model-path ... --tp-size
  <--rollout-num-gpus-per-engine>`` with every ``--sglang-X VALUE`` passed on as ``--X VALUE``;
* ``sglang-compat``: agentrl's SGLang-compatible server over the embedded engine (the same
  client, router and protocol on machines where SGLang cannot run);
* ``vllm``: ``python -m vllm.entrypoints.openai.api_server --model ... --tensor-parallel-size
  <--rollout-num-gpus-per-engine>`` with ``VLLM_SERVER_DEV_MODE=1`` and every ``--vllm-X VALUE``
  passed on as ``--X VALUE`` over the defaults of :func:`vllm_defaults`.

``--rollout-engine-urls`` (and ``--rollout-router-url`` for SGLang) use servers that are already
running.

Imported on first use: Ray, the SGLang and vLLM clients of the backend asked for, and the tokenizer
(transformers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.engine.http import HTTPEngine
from agentrl.engine.sglang import SGLangEngine
from agentrl.engine.vllm import VLLMEngine, logprobs_mode_for, ties_embeddings, untied_view
from agentrl.errors import ConfigError, EngineError
from agentrl.models.hf_config import load_tokenizer
from agentrl.placement.bundles import EngineBundles, engine_bundles
from agentrl.placement.cluster import ClusterConfig, TrainerGroup
from agentrl.rollout.config import RolloutConfig

__all__ = ["EngineServers", "launch_servers", "router_command", "server_command", "vllm_defaults",
           "vllm_model_dir"]

log = logging.getLogger(__name__)

SERVER_MODULES = {"sglang": "sglang.launch_server",
                  "sglang-compat": "agentrl.engine.sglang_compat_server",
                  "vllm": "vllm.entrypoints.openai.api_server"}
VLLM_CPU_KV_CACHE_BYTES = 2**30
"""The KV cache a vLLM server takes on CPU unless told otherwise (it would take 92% of RAM)."""


def vllm_defaults(rollout: RolloutConfig, *, gpu: bool) -> dict[str, str | None]:
    """The vLLM server flags a run starts with unless ``--vllm-X`` (or ``--vllm-no-X``) says
    otherwise: the token-in/token-out endpoint, cached-token counts, the log-probability mode
    the sampling flags need (see :func:`~agentrl.engine.vllm.logprobs_mode_for`); on CPU
    also float32, a 1 GiB KV cache, eager mode (compiling takes minutes there and was not
    faster for small models) and no chunked prefill: vllm-cpu 0.32's engine dies when a seeded
    request's prefill is chunked (it rewinds the request's random generator, which CPU
    generators cannot do), and every rollout request carries a seed."""
    defaults: dict[str, str | None] = {"enable-scale-out": None, "enable-prompt-tokens-details": None}
    mode = logprobs_mode_for(rollout.rollout_temperature, rollout.rollout_top_p, rollout.rollout_top_k)
    if mode is not None:
        defaults["logprobs-mode"] = mode
    if rollout.engine_context_len is None and rollout.rollout_max_context_len is not None:
        defaults["max-model-len"] = str(rollout.rollout_max_context_len)
    if not gpu:
        defaults.update({"dtype": "float32", "kv-cache-memory-bytes": str(VLLM_CPU_KV_CACHE_BYTES),
                         "enforce-eager": None, "no-enable-chunked-prefill": None})
    return defaults


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``--max-lora-rank`` values vLLM accepts."""


def vllm_lora_args(rank: int) -> dict[str, str | None]:
    """vLLM server flags for LoRA adapters of rank ``rank``: two resident at once (the newest,
    and the previous one that requests in flight still use).

    Raises:
        ConfigError: ``rank`` is above what vLLM serves.
    """
    fitting = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fitting:
        raise ConfigError(f"--lora-rank {rank} is above the largest rank vLLM serves ({VLLM_LORA_RANKS[-1]})")
    return {"enable-lora": None, "max-lora-rank": str(fitting[0]), "max-loras": "2"}


def vllm_model_dir(checkpoint: str | Path, *, gpu: bool, workdir: str | Path) -> Path:
    """What a vLLM server loads for ``checkpoint``: the checkpoint itself, or on CPU, for a
    model with tied embeddings, an untied view of it under ``workdir`` (see
    :mod:`agentrl.engine.vllm`: vLLM's CPU build does not reload a tied output layer)."""
    if gpu or not ties_embeddings(checkpoint):
        return Path(checkpoint)
    return untied_view(checkpoint, Path(workdir) / "untied-model")


def _merged(defaults: Mapping[str, str | None], given: Mapping[str, str | None]) -> dict[str, str | None]:
    """``given`` over ``defaults``: a default is dropped when the user set it, or its opposite
    (``--vllm-no-enforce-eager``, ``--vllm-enable-chunked-prefill``), or another way to size the
    same thing."""
    alternatives = {"kv-cache-memory-bytes": ("gpu-memory-utilization",)}
    merged = {}
    for name, value in defaults.items():
        opposite = name[len("no-"):] if name.startswith("no-") else f"no-{name}"
        overridden = (name in given or opposite in given
                      or any(other in given for other in alternatives.get(name, ())))
        if not overridden:
            merged[name] = value
    return {**merged, **given}


def server_command(backend: str, checkpoint: str | Path, *, port: int | str, host: str = "127.0.0.1",
                   tp_size: int = 1, server_args: Mapping[str, str | None] | None = None,
                   seed: int | None = None) -> list[str]:
    """The command line of one engine's server; ``server_args`` become ``--X VALUE`` (a
    ``None`` value: the bare switch ``--X``)."""
    args = dict(server_args or {})
    if backend == "vllm":
        command = [sys.executable, "-m", SERVER_MODULES[backend], "--model", str(checkpoint),
                   "--host", host, "--port", str(port), "--tensor-parallel-size", str(tp_size)]
        if seed is not None:
            args.setdefault("seed", str(seed))
    else:
        command = [sys.executable, "-m", SERVER_MODULES[backend], "--model-path", str(checkpoint),
                   "--host", host, "--port", str(port)]
        if backend == "sglang":
            command += ["--tp-size", str(tp_size)]
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
    """One server process on this actor's node (a Ray actor; see :class:`EngineServers`). The
    server runs in a session of its own, so that stopping or killing it reaches the processes it
    starts (vLLM's engine core)."""

    def __init__(self, backend: str) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"agentrl-{backend}-{os.getpid()}.log"

    def start(self, command_template: list[str], driver_ip: str, env: Mapping[str, str] | None = None) -> str:
        """Starts the server (on the port of its first start, or a free one) with ``env`` added
        to this process's environment; its base URL. On the driver's node it listens on
        loopback only; on another node, on every interface."""
        import ray

        self.stop()
        self.port = self.port or _free_port()
        node_ip = ray.util.get_node_ip_address()
        host = "127.0.0.1" if node_ip == driver_ip else "0.0.0.0"
        fill = {"{port}": str(self.port), "{host}": host}
        command = [fill.get(part, part) for part in command_template]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **(env or {})}, start_new_session=True)
        return f"http://{'127.0.0.1' if host == '127.0.0.1' else node_ip}:{self.port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """Kills the server and what it started, as a crash would (fault-tolerance drills and
        tests)."""
        if self.proc is not None:
            self._signal(signal.SIGKILL)
            self.proc.wait()

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.is_file() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait()
        if self.proc is not None:  # children that outlived the server
            self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _engine_class(backend: str) -> type[HTTPEngine]:
    if backend == "vllm":
        return VLLMEngine

    return SGLangEngine


class EngineServers:
    """The servers a run started: their actors, the SGLang router, and
    (``--use-fault-tolerance``) their supervision. A server found dead (its process exited, its
    actor died, or it stopped answering its health check) is left out of routing at once and
    restarted on its bundle, on its port, from the latest weights pushed from disk, under the
    latest version; it serves again when healthy. Fault tolerance therefore needs disk weight
    pushes."""

    def __init__(self, rollout: RolloutConfig, cluster: ClusterConfig, checkpoint: str | Path,
                 where: EngineBundles, *,
                 lora_rank: int = 0) -> None:
        import ray
        import torch

        self.rollout, self.cluster, self.checkpoint, self.where = rollout, cluster, str(checkpoint), where
        self.backend = rollout.rollout_backend
        self.engine_class = _engine_class(self.backend)
        self.per_engine = -(-rollout.rollout_concurrency // max(1, cluster.num_engines))
        self.gpu = torch.cuda.is_available()
        self.workdir: Path | None = None
        self.lora_rank = lora_rank
        if self.backend == "vllm":
            defaults = vllm_defaults(rollout, gpu=self.gpu)
            if lora_rank:
                defaults.update(vllm_lora_args(lora_rank))
            self.server_args = _merged(defaults, rollout.vllm_args)
            self.workdir = Path(tempfile.mkdtemp(prefix="agentrl-vllm-"))
            self.checkpoint = str(vllm_model_dir(checkpoint, gpu=self.gpu, workdir=self.workdir))
        else:
            self.server_args = dict(rollout.sglang_args)
            if self.backend == "sglang-compat":
                self.server_args.setdefault("max-running-requests", str(self.per_engine))
        self.driver_ip = ray.util.get_node_ip_address()
        self.actors = [self._new_actor(bundle) for bundle in where.bundles]
        self.urls: list[str] = []
        self.router: subprocess.Popen[bytes] | None = None
        self.engine: HTTPEngine | None = None
        self.restarts = 0
        self._watch: asyncio.Task[None] | None = None

    def _new_actor(self, bundle: int) -> Any:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return ray.remote(_ServerProcess).options(
            **self.where.resources, scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.where.placement, placement_group_bundle_index=bundle),
        ).remote(self.backend)

    def command(self, index: int, model_path: str | None = None, version: str | None = None) -> list[str]:
        args = dict(self.server_args)
        if version is not None and self.backend != "vllm":  # vLLM's is set once it is up
            args["weight-version"] = version
        return server_command(self.backend, model_path or self.checkpoint, port="{port}",
                              host="{host}", tp_size=self.cluster.rollout_num_gpus_per_engine,
                              server_args=args, seed=self.rollout.rollout_seed + index)

    def environment(self, index: int) -> dict[str, str]:
        """What server ``index``'s process gets added to its environment."""
        if self.backend != "vllm":
            return {}
        env = {"VLLM_SERVER_DEV_MODE": "1"}
        if self.lora_rank:  # adapters are loaded while the server runs (/v1/load_lora_adapter)
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if not self.gpu and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(index % (os.cpu_count() or 1))  # one core each
        return env

    def engine_options(self) -> dict[str, Any]:
        """Backend-specific arguments of the client."""
        if self.backend == "vllm":
            return {"sleep_mode": "enable-sleep-mode" in self.server_args and self.gpu}
        return {}

    async def start(self, tokenizer: Any) -> HTTPEngine:
        import ray

        # version "0", what the client assumes, so the first outputs report it, not "default"
        self.urls = ray.get([a.start.remote(self.command(i, version="0"), self.driver_ip, self.environment(i))
                             for i, a in enumerate(self.actors)])
        try:
            engine = await self.engine_class.connect(
                self.urls, tokenizer=tokenizer, concurrency=self.per_engine, wait_s=900.0,
                tp_size=self.cluster.rollout_num_gpus_per_engine, **self.engine_options(),
                alive=lambda: all(ray.get([a.alive.remote() for a in self.actors])))
            if self.backend != "vllm" and len(self.urls) > 1 and self.rollout.router_policy != "none":
                port = _free_port()
                self.router = subprocess.Popen(router_command(self.urls, port=port, policy=self.rollout.router_policy),
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                engine.router = f"http://127.0.0.1:{port}"
                await engine.wait_router(self.router)  # type: ignore[attr-defined]
        except BaseException as exc:
            tails = ray.get([a.log_tail.remote() for a in self.actors])
            await self.stop()
            if isinstance(exc, EngineError):
                raise EngineError(f"{exc}\n--- server log tail ---\n{tails[0]}") from exc
            raise
        self.engine = engine
        engine.on_close.append(self.stop)
        if self.cluster.use_fault_tolerance:
            self._watch = asyncio.create_task(self._supervise(), name=f"agentrl-{self.backend}-health")
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
        return process_up and await self.engine.worker_healthy(url)

    async def _restart(self, index: int, url: str) -> None:
        import ray
        from ray.exceptions import RayActorError

        engine = self.engine
        assert engine is not None
        name = engine.server_name
        engine.mark_down(url)
        log.warning("%s server %s is down; restarting it (weights %s)", name, url, engine.weight_version)
        try:
            await self.actors[index].alive.remote()
        except RayActorError:  # the actor itself died: a new one on the same bundle
            self.actors[index] = self._new_actor(self.where.bundles[index])
        command = self.command(index, engine.last_weights_path, engine.weight_version)
        new_url = await self.actors[index].start.remote(command, self.driver_ip, self.environment(index))
        if new_url != url:  # a new actor got a new port
            await engine.replace_worker(url, new_url)
            self.urls[index] = new_url
        deadline = asyncio.get_running_loop().time() + 900
        while not await engine.worker_healthy(new_url):
            if asyncio.get_running_loop().time() > deadline or not await self.actors[index].alive.remote():
                log.warning("%s server %s did not come back: %s", name, new_url,
                            ray.get(self.actors[index].log_tail.remote()))
                return  # the next health check tries again
            await asyncio.sleep(0.5)
        await engine.prepare_worker(new_url)
        engine.readmit(new_url)
        self.restarts += 1
        log.warning("%s server %s restarted (weights %s)", name, new_url, engine.weight_version)

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
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        if self.where.owns_placement:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.where.placement)
            self.where.owns_placement = False


async def launch_servers(rollout: RolloutConfig, cluster: ClusterConfig, checkpoint: str | Path,
                         trainer: TrainerGroup | None = None,
                         lora_rank: int = 0) -> HTTPEngine:
    """Starts (or connects to) the run's inference servers and returns their client; closing
    the client stops what was started here (see :class:`EngineServers`). ``lora_rank``: vLLM
    servers that load LoRA adapters of up to that rank (``--weight-sync adapter``).

    Raises:
        EngineError: A server or the router did not come up (with its log's tail), or a running
            server is not set up the way the client needs.
    """
    tokenizer = load_tokenizer(checkpoint)
    backend = rollout.rollout_backend
    if rollout.rollout_engine_urls:
        per_engine = -(-rollout.rollout_concurrency // len(rollout.rollout_engine_urls))
        routing = {"router_url": rollout.rollout_router_url} if backend != "vllm" else {}
        return await _engine_class(backend).connect(
            rollout.rollout_engine_urls, tokenizer=tokenizer, concurrency=per_engine,
            tp_size=cluster.rollout_num_gpus_per_engine, **routing)
    servers = EngineServers(rollout, cluster, checkpoint, await engine_bundles(cluster, trainer),
                            lora_rank=lora_rank)
    engine = await servers.start(tokenizer)
    engine.servers = servers
    return engine
