"""Ray placement of the trainer: one Ray actor per Megatron rank, in a placement group.

``TrainerGroup`` is what the training loop talks to; like :class:`MegatronActor` it is a
:class:`~agentrl.trainer.protocol.Trainer` (``train``, ``hf_state_dict``, ``save_checkpoint``,
``load_checkpoint``, ``save_hf``, the weight-broadcast methods) and runs each on every rank at
once (they are collectives over the model-parallel group), returning rank 0's answer. Ranks
rendezvous over torch.distributed at rank 0's node address. On a machine without GPUs every
rank gets a ``{"CPU": 1}`` bundle; with GPUs, one GPU (and ``--cpus-per-rank`` CPUs). Ray starts
locally unless ``--ray-address`` names a cluster.

Imported on first use: Ray, and the Megatron actor (megatron-core, torch) in the process that
builds a rank.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.config import flag, option
from agentrl.errors import ConfigError
from agentrl.placement.remote_errors import remote_call
from agentrl.trainer.config import TrainerConfig

if TYPE_CHECKING:
    from agentrl.records.sample import Sample

__all__ = ["RAY_NAMESPACE", "SANDBOX_PLACEMENTS", "ClusterConfig", "TrainerGroup", "start_ray"]

RAY_NAMESPACE = "agentrl"
"""The Ray namespace of a run's named actors (engines: ``agentrl-engine-<driver pid>-<i>.<n>``)."""


SANDBOX_PLACEMENTS = ("local", "ray")
"""The choices of ``--sandbox-placement`` (see :mod:`agentrl.placement.sandbox_hosts`)."""


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Where things run: the trainer's ranks and the engines' devices."""

    use_ray: bool = option(True, "place the trainer ranks as Ray actors (--no-use-ray: all in "
                           "this process, one rank)")
    ray_address: str | None = option(None, "join this Ray cluster (default: start Ray locally)")
    actor_num_nodes: int = option(1, "nodes for the trainer")
    actor_num_gpus_per_node: int = option(1, "trainer ranks per node: GPUs, or CPU processes on a "
                                          "machine without GPUs")
    cpus_per_rank: int = option(1, "CPUs reserved per trainer rank")
    rollout_num_gpus: int = option(0, "devices for the policy engines, one engine per "
                                   "--rollout-num-gpus-per-engine, each a Ray actor (CPU processes "
                                   "on a machine without GPUs); 0: one embedded engine in the "
                                   "driver process (with --colocate: one engine per trainer rank)")
    rollout_num_gpus_per_engine: int = option(1, "devices per engine (tensor parallel size of an "
                                              "engine)")
    colocate: bool = option(False, "engines share the trainer's devices (its placement-group "
                            "bundles) and free their KV cache while it trains")
    use_fault_tolerance: bool = option(False, "health-check the engines, restart a dead one and "
                                       "retry its in-flight requests on a live one")
    rollout_health_check_interval: float = option(10.0, "seconds between engine health checks "
                                                  "(with --use-fault-tolerance)")
    rollout_health_check_timeout: float = option(30.0, "seconds an engine may take to answer a "
                                                 "health check before it is restarted")
    sandbox_placement: str = option(
        "local", "where the envs' sandboxes run: local (on this machine) or ray (on the nodes of "
        "the --ray-address cluster that offer a `sandbox` resource, started with `ray start "
        "--address HEAD --resources '{\"sandbox\": 16}'`: as many sandboxes at once as that "
        "amount, one run per such node; each episode's sandbox goes to the node with the most "
        "free room and its tool calls run there; an episode whose node dies fails, and is "
        "played again with --use-fault-tolerance)", choices=SANDBOX_PLACEMENTS)

    @property
    def world_size(self) -> int:
        return self.actor_num_nodes * self.actor_num_gpus_per_node

    @property
    def engine_actors(self) -> bool:
        """Whether the engines run as Ray actors (else one embedded engine in the driver)."""
        return self.colocate or self.rollout_num_gpus > 0

    @property
    def num_engines(self) -> int:
        if not self.engine_actors:
            return 1
        gpus = self.rollout_num_gpus or self.world_size  # --colocate without a count
        return gpus // self.rollout_num_gpus_per_engine

    def validate(self) -> None:
        """Raises ConfigError naming the flag when the placement flags contradict each other
        (checks that also read other configs are in
        :func:`agentrl.run.validation.validate_together`)."""
        for name in ("actor_num_nodes", "actor_num_gpus_per_node", "cpus_per_rank"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag(name)} must be >= 1, got {getattr(self, name)}")
        if not self.use_ray and self.world_size > 1:
            raise ConfigError("--no-use-ray runs one trainer rank in this process: drop it, or use "
                              "--actor-num-nodes 1 --actor-num-gpus-per-node 1")
        if self.rollout_num_gpus < 0:
            raise ConfigError(f"--rollout-num-gpus must be >= 0, got {self.rollout_num_gpus}")
        if self.rollout_num_gpus_per_engine < 1:
            raise ConfigError("--rollout-num-gpus-per-engine must be >= 1, got "
                              f"{self.rollout_num_gpus_per_engine}")
        if self.rollout_num_gpus % self.rollout_num_gpus_per_engine:
            raise ConfigError(f"--rollout-num-gpus {self.rollout_num_gpus} is not a multiple of "
                              f"--rollout-num-gpus-per-engine {self.rollout_num_gpus_per_engine}")
        if not self.use_ray and self.engine_actors:
            raise ConfigError("--rollout-num-gpus / --colocate place engines as Ray actors: drop "
                              "--no-use-ray")
        if self.colocate and self.rollout_num_gpus not in (0, self.world_size):
            raise ConfigError(
                f"--colocate puts one engine on each trainer device: --rollout-num-gpus must be "
                f"{self.world_size} (--actor-num-nodes x --actor-num-gpus-per-node) or unset, got "
                f"{self.rollout_num_gpus}")
        if self.use_fault_tolerance and not self.engine_actors and self.sandbox_placement != "ray":
            raise ConfigError("--use-fault-tolerance restarts engine actors: add --rollout-num-gpus "
                              "N (or --colocate); the default engine lives in the driver process "
                              "(with --sandbox-placement ray it also plays again the episodes "
                              "whose sandbox node died)")
        if self.sandbox_placement not in SANDBOX_PLACEMENTS:
            raise ConfigError(f"--sandbox-placement must be one of {', '.join(SANDBOX_PLACEMENTS)}, "
                              f"got {self.sandbox_placement!r}")
        for name in ("rollout_health_check_interval", "rollout_health_check_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{flag(name)} must be > 0, got {getattr(self, name)}")


def start_ray(config: ClusterConfig) -> None:
    """Starts Ray locally (small object store, no dashboard) or joins ``--ray-address``."""
    # Ray's C++ failure-signal handler would take SIGTERM over from the run's own handler
    # (agentrl.run.interrupts) and end the driver with a stack dump instead of a clean
    # stop. Ray reads the switch when it is imported, and again when the driver connects.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    import ray
    from ray._private import ray_constants

    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    if ray.is_initialized():
        return
    with _keeping_signal_handlers():
        if config.ray_address:
            ray.init(address=config.ray_address, namespace=RAY_NAMESPACE, log_to_driver=True)
            return
        engines = config.num_engines if config.engine_actors and not config.colocate else 0
        cpus = max(os.cpu_count() or 1, config.world_size * config.cpus_per_rank + engines)
        # Ray notes on every local start that it turned token authentication on; it stays on,
        # and the note is about Ray's default, not about the run: it is not printed
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        # "local": a new instance even if `ray start` left a cluster address on this machine
        ray.init(address="local", num_cpus=cpus, object_store_memory=256 * 2**20,
                 include_dashboard=False, log_to_driver=False, namespace=RAY_NAMESPACE)


@contextlib.contextmanager
def _keeping_signal_handlers() -> Iterator[None]:
    """Puts SIGINT's and SIGTERM's handlers back after ``ray.init``, which sets its own SIGTERM
    handler (``sys.exit(15)``): a SIGTERM while the run waits (on a server, say) would end it
    with status 15 and no word instead of the run's clean stop and its one-line message."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in kept.items():
            if handler is not None:
                signal.signal(signum, handler)


class _TrainerRank:
    """One Megatron rank (a Ray actor; see :class:`TrainerGroup`)."""

    def address(self) -> tuple[str, int]:
        """This node's address and a free port on it (rank 0 hosts the rendezvous)."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            return ray.util.get_node_ip_address(), int(sock.getsockname()[1])

    def setup(self, rank: int, world_size: int, master: tuple[str, int], threads: int,
              kwargs: dict[str, Any]) -> int:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR=master[0],
                          MASTER_PORT=str(master[1]), LOCAL_RANK="0")
        import torch

        from agentrl.trainer.actor import MegatronActor

        torch.set_num_threads(threads)
        config = TrainerConfig(**kwargs.pop("config"))
        self.rank = rank
        self.actor = MegatronActor(config, **kwargs)
        return self.actor.step

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self.actor, method)(*args, **kwargs)
        return result if self.rank == 0 else None


class _DropMessage(logging.Filter):
    """Drops log records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


class TrainerGroup:
    """The trainer's ranks as Ray actors in one placement group.

    The ranks build their models in the background; every method first waits for that
    (:meth:`ready`), so a caller can do other work (load the engine, play the first rollout)
    meanwhile.

    Args:
        cluster: Placement flags.
        trainer_config: The trainer's flags (sent to every rank as a dict, rebuilt there).
        start_ray_here: Start a local Ray instance first, in a thread of its own that lives as
            long as the group (Ray ties its processes to the thread that started them), so
            that Ray's start-up too runs in the background. Otherwise Ray must be running.
        debug: Errors of the ranks carry their remote traceback (``--debug``).
        **actor_kwargs: Passed to every rank's :class:`~agentrl.trainer.actor.MegatronActor`
            (``hf_checkpoint``, ``rollout_temperature``, ``total_steps``, ``pad_id``).
    """

    def __init__(self, cluster: ClusterConfig, trainer_config: TrainerConfig, *,
                 start_ray_here: bool = False, debug: bool = False, **actor_kwargs: Any) -> None:
        self.cluster = cluster
        self.debug = debug
        self.ranks: list[Any] = []
        self.placement: Any = None
        self._setup: list[Any] | None = None
        self._placed: concurrent.futures.Future[None] | None = None
        self._stop = threading.Event()
        self._owns_ray = start_ray_here
        self._stopping = False
        if not start_ray_here:
            self._place(trainer_config, actor_kwargs)
            return
        self._placed = placed = concurrent.futures.Future()
        threading.Thread(target=self._own_ray, args=(placed, trainer_config, actor_kwargs),
                         name="agentrl-ray", daemon=True).start()

    def _own_ray(self, placed: concurrent.futures.Future[None], trainer_config: TrainerConfig,
                 actor_kwargs: dict[str, Any]) -> None:
        quiet = _DropMessage("SIGTERM handler is not set")
        logging.getLogger("ray._private.worker").addFilter(quiet)  # started here on purpose
        # Ray's processes inherit this thread's signal mask (Ray itself blocks SIGINT in them):
        # with SIGTERM blocked too, a SIGTERM to the whole process group (a scheduler stopping
        # the job) reaches only the driver, whose handler then stops Ray in order
        # (agentrl.run.interrupts). The driver's other threads are unaffected.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            start_ray(self.cluster)
            self._place(trainer_config, actor_kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by ready()
            placed.set_exception(exc)
            return
        placed.set_result(None)
        self._stop.wait()  # Ray's processes die with the thread that started them

    def _place(self, trainer_config: TrainerConfig, actor_kwargs: dict[str, Any]) -> None:
        import ray
        import torch
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cluster = self.cluster
        gpus = 1 if torch.cuda.is_available() else 0
        bundle = {"CPU": cluster.cpus_per_rank, **({"GPU": gpus} if gpus else {})}
        share = 0.5 if cluster.colocate else 1.0  # colocated: an engine takes the other half
        self.placement = placement_group([dict(bundle) for _ in range(cluster.world_size)],
                                         strategy="PACK")
        ray.get(self.placement.ready(), timeout=300)
        remote = ray.remote(_TrainerRank)
        self.ranks = [
            remote.options(
                num_cpus=cluster.cpus_per_rank * share, num_gpus=gpus * share,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.placement, placement_group_bundle_index=rank),
            ).remote()
            for rank in range(cluster.world_size)
        ]
        master = self.ranks[0].address.remote()  # Ray hands setup the value once it exists
        kwargs = {k: str(v) if isinstance(v, Path) else v for k, v in actor_kwargs.items()}
        kwargs["config"] = dataclasses.asdict(trainer_config)
        threads = max(1, cluster.cpus_per_rank)
        # Not awaited here: the ranks build Megatron while the driver loads the engine and plays
        # the first rollout; the first call on the group waits for it (and raises its errors).
        self._setup = [r.setup.remote(i, cluster.world_size, master, threads, dict(kwargs))
                       for i, r in enumerate(self.ranks)]

    def ready(self) -> None:
        """Waits until every rank has built its model (once; later calls return at once).

        Raises:
            ray.exceptions.RayTaskError: A rank's set-up failed.
        """
        import ray

        placed, self._placed = self._placed, None
        if placed is not None:
            placed.result()
        setup, self._setup = self._setup, None
        if setup is not None:
            remote_call(lambda: ray.get(setup), "the trainer's set-up (building the model on every "
                        "rank)", debug=self.debug)

    def _all(self, method: str, *args: Any, **kwargs: Any) -> Any:
        import ray

        self.ready()
        refs = [r.call.remote(method, *args, **kwargs) for r in self.ranks]
        return remote_call(lambda: ray.get(refs), f"the trainer's {method}", debug=self.debug)[0]

    def train(self, samples: Sequence[Sample]) -> dict[str, float]:
        """Every rank trains on the same samples; rank 0's metrics."""
        import ray

        self.ready()
        return self._all("train", ray.put(list(samples)))

    def hf_state_dict(self) -> dict[str, Any]:
        return self._all("hf_state_dict")

    def hf_state_dict_ref(self) -> Any:
        """Like :meth:`hf_state_dict`, but rank 0's answer stays in Ray's object store: the
        ``ObjectRef`` goes to the engine actors without a copy through the driver."""
        import ray

        self.ready()
        refs = [r.call.remote("hf_state_dict") for r in self.ranks]
        # the other ranks answer None once the gather is done; raises their errors
        remote_call(lambda: ray.get(refs[1:]), "the trainer's hf_state_dict", debug=self.debug)
        ray.wait(refs[:1], fetch_local=False)
        return refs[0]

    def rank0_address(self) -> tuple[str, int]:
        """Rank 0's node address and a free port there (e.g. for a weight-broadcast group)."""
        import ray

        self.ready()
        return remote_call(lambda: ray.get(self.ranks[0].address.remote()),
                           "the trainer's rank0_address", debug=self.debug)

    def open_weight_group(self, master_address: str, master_port: int, world_size: int,
                          group_name: str, backend: str) -> None:
        self._all("open_weight_group", master_address, master_port, world_size, group_name,
                  backend)

    def weight_metadata(self) -> dict[str, list[Any]]:
        return self._all("weight_metadata")

    def broadcast_weights(self) -> None:
        self._all("broadcast_weights")

    def save_checkpoint(self, directory: str | Path,
                        extra: Mapping[str, Any] | None = None) -> None:
        self._all("save_checkpoint", str(directory), dict(extra or {}))

    def load_checkpoint(self, directory: str | Path) -> dict[str, Any]:
        return self._all("load_checkpoint", str(directory))

    def save_hf(self, out_dir: str | Path, tokenizer_dir: str | Path | None = None) -> Path:
        return self._all("save_hf", str(out_dir), str(tokenizer_dir) if tokenizer_dir else None)

    def save_adapter(self, out_dir: str | Path, base_model: str | None = None) -> Path:
        return self._all("save_adapter", str(out_dir), base_model)

    def shutdown(self) -> None:
        """Stops the ranks and frees the placement group; also while the ranks still build
        their models (a start-up that failed or was interrupted). Idempotent."""
        import ray
        from ray.util.placement_group import remove_placement_group

        self._stopping = True
        placed, self._placed = self._placed, None
        if placed is not None:
            try:
                placed.result()  # Ray's start in its thread: wait for it, to stop what it made
            except BaseException:  # noqa: BLE001 - it failed: nothing of ours runs in Ray
                self._stop.set()
                return
        self._setup = None  # their set-up dies with them
        ranks, self.ranks = self.ranks, []
        placement, self.placement = self.placement, None

        def stop_ranks() -> None:
            for rank in ranks:
                ray.kill(rank)
            if placement is not None:
                remove_placement_group(placement)

        # A signal sent to the whole process group (a scheduler's SIGTERM) stops Ray's own
        # processes too; then every call to Ray waits a minute for them. Skip the calls when
        # Ray's control process is gone, and give up on them after a while when it is dying.
        answers = _local_ray_alive()
        if answers:
            stopper = threading.Thread(target=stop_ranks, name="agentrl-ray-stop", daemon=True)
            stopper.start()
            stopper.join(RAY_STOP_TIMEOUT_S)
            answers = not stopper.is_alive()
        if self._owns_ray and ray.is_initialized():  # before its thread ends, which takes Ray's processes with it
            if not (answers and _local_ray_alive()):
                ray._private.worker._global_node.kill_all_processes(check_alive=False,
                                                                   allow_graceful=False)
            ray.shutdown()
        self._stop.set()

    def ray_lost(self) -> bool:
        """Whether the local Ray instance the ranks run in died under the run (its control
        processes are gone; a signal to the whole process group does that), as opposed to
        being stopped by :meth:`shutdown`. Safe to call from any thread."""
        import ray

        return not self._stopping and ray.is_initialized() and not _local_ray_alive()


RAY_STOP_TIMEOUT_S = 15.0
"""How long stopping the ranks may take before the run gives up on Ray (it is dying too)."""


def _local_ray_alive() -> bool:
    """Whether Ray answers: a joined cluster is assumed to; a local instance this process
    started only while its GCS server and raylet processes run."""
    import ray

    if not ray.is_initialized():
        return False
    node = ray._private.worker._global_node
    if node is None:  # joined a cluster: its processes are not ours to check
        return True
    control = [*node.all_processes.get("gcs_server", []), *node.all_processes.get("raylet", [])]
    return all(info.process.poll() is None for info in control)
