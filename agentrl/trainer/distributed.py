"""Process-group and Megatron model-parallel set-up for the trainer.

:func:`init_model_parallel` works in the three ways the trainer runs:

* **One process** (tests, a laptop, ``world_size == 1``): a private ``gloo`` group on a free
  127.0.0.1 port; nothing else needs to be set.
* **Under torchrun or spawned workers**: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
  ``MASTER_PORT`` come from the environment (``LOCAL_RANK`` picks the GPU when there is one).
* **An existing process group** (e.g. created by Ray actors): it is reused as is.

It then creates Megatron's tensor/pipeline/data-parallel groups, applies the CPU redirections
of :mod:`agentrl.trainer.megatron_compat` when there is no CUDA, and seeds the model-parallel
RNG tracker (attention and embeddings fork it even with dropout 0).
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist

from agentrl.errors import ConfigError
from agentrl.trainer.megatron_compat import apply_cpu_compat, model_parallel_manual_seed

__all__ = ["destroy_model_parallel", "init_model_parallel", "is_initialized"]

_OWNS_PROCESS_GROUP = False
"""Whether :func:`init_model_parallel` created the default process group (so destroys it)."""

_ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _init_process_group(backend: str, timeout: datetime.timedelta) -> None:
    """Creates the default process group from the environment, or a one-process group."""
    present = [name for name in _ENV_VARS if name in os.environ]
    if present and len(present) < len(_ENV_VARS):
        missing = [name for name in _ENV_VARS if name not in os.environ]
        raise ConfigError(
            f"distributed environment is incomplete: {', '.join(present)} set but "
            f"{', '.join(missing)} missing (launch with torchrun or set all four)"
        )
    if present:
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if backend == "nccl":
            torch.cuda.set_device(
                int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
            )
        dist.init_process_group(
            backend, init_method="env://", rank=rank, world_size=world_size, timeout=timeout
        )
    else:
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{_free_port()}",
            rank=0,
            world_size=1,
            timeout=timeout,
        )


def _validate_sizes(tp: int, pp: int, world_size: int, ep: int = 1) -> None:
    """Checks the parallel sizes against the world size; errors name the flags."""
    if ep < 1:
        raise ConfigError(f"--expert-model-parallel-size must be >= 1, got {ep}")
    if tp < 1:
        raise ConfigError(f"--tensor-model-parallel-size must be >= 1, got {tp}")
    if pp < 1:
        raise ConfigError(f"--pipeline-model-parallel-size must be >= 1, got {pp}")
    if world_size % (tp * pp) != 0:
        raise ConfigError(
            f"--tensor-model-parallel-size ({tp}) x --pipeline-model-parallel-size ({pp}) = "
            f"{tp * pp} does not divide the world size ({world_size} processes); change one of "
            "them so the product divides the number of trainer processes"
        )
    if world_size % (tp * pp * ep) != 0:
        raise ConfigError(
            f"--expert-model-parallel-size ({ep}) must divide the data-parallel ranks ({world_size} "
            f"processes / ({tp} x {pp}) = {world_size // (tp * pp)}): the experts are split over "
            "ranks that train other samples"
        )


def init_model_parallel(
    tp: int = 1,
    pp: int = 1,
    *,
    ep: int = 1,
    backend: str | None = None,
    seed: int = 1234,
    timeout_s: float = 600.0,
) -> None:
    """Initialises torch.distributed (if needed) and Megatron's model-parallel groups.

    Data parallelism takes the rest: ``dp = world_size / (tp * pp)``.

    Args:
        tp: Tensor-parallel size (``--tensor-model-parallel-size``).
        pp: Pipeline-parallel size (``--pipeline-model-parallel-size``).
        ep: Expert-parallel size (``--expert-model-parallel-size``): the experts of each
            mixture-of-experts layer are split over ``ep`` data-parallel ranks (with the tensor
            parallelism of the dense layers).
        backend: ``torch.distributed`` backend; defaults to ``nccl`` with CUDA, ``gloo``
            without. Ignored when a process group already exists.
        seed: Seed of the model-parallel RNG tracker (see
            :func:`~agentrl.trainer.megatron_compat.model_parallel_manual_seed`).
        timeout_s: Collective timeout of a process group created here.

    Raises:
        ConfigError: A size is invalid, ``tp * pp`` does not divide the world size, the
            environment names only some of ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/
            ``MASTER_PORT``, or model parallelism is already initialised with other sizes.
        MegatronVersionError: megatron-core is not the pinned release.
    """
    global _OWNS_PROCESS_GROUP
    from megatron.core import parallel_state

    apply_cpu_compat()
    if parallel_state.model_parallel_is_initialized():
        current = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_expert_model_parallel_world_size(),
        )
        if current != (tp, pp, ep):
            raise ConfigError(
                f"model parallelism is already initialised with tensor/pipeline/expert sizes "
                f"{current}; asked for ({tp}, {pp}, {ep}): call destroy_model_parallel() first"
            )
        return
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    # Validate before creating a group, using the size the group will have.
    world_size = (
        dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))
    )
    _validate_sizes(tp, pp, world_size, ep)
    if not dist.is_initialized():
        _init_process_group(backend, datetime.timedelta(seconds=timeout_s))
        _OWNS_PROCESS_GROUP = True
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        expert_model_parallel_size=ep,
    )
    model_parallel_manual_seed(seed)


def is_initialized() -> bool:
    """Whether Megatron's model-parallel groups exist in this process."""
    from megatron.core import parallel_state

    return bool(parallel_state.model_parallel_is_initialized())


def destroy_model_parallel() -> None:
    """Destroys Megatron's groups, and the default process group if
    :func:`init_model_parallel` created it. Safe to call when nothing is initialised."""
    global _OWNS_PROCESS_GROUP
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if _OWNS_PROCESS_GROUP and dist.is_initialized():
        dist.destroy_process_group()
    _OWNS_PROCESS_GROUP = False
