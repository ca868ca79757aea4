"""Every CPU redirection agentrl applies to megatron-core, in one place.

megatron-core assumes a CUDA device: about 250 places allocate on ``torch.cuda.current_device()``
or ``device="cuda"``, seed CUDA generators or call ``torch.cuda.synchronize()``. On a machine
without CUDA (our tests, laptops, CI) the trainer must still run the same Megatron code, so
:func:`apply_cpu_compat` redirects exactly the CUDA uses that the paths agentrl exercises hit:

* **Device names.** In the megatron modules listed in :data:`_REDIRECTED_MODULES` the global name
  ``torch`` is replaced by a view of ``torch`` whose ``torch.cuda.current_device()`` names the
  CPU, whose ``torch.cuda.synchronize()`` does nothing and whose tensor factories
  (``torch.zeros(..., device="cuda")`` and friends) allocate on the CPU. Nothing else changes:
  every other attribute is the real ``torch`` object. Each entry names the megatron functions
  that need it and why. ``torch`` itself is never modified, so code outside those modules sees
  the real CUDA-less ``torch.cuda``.
* **RNG tracker.** Attention, embeddings and tensor-parallel layers always enter
  ``get_cuda_rng_tracker().fork()``, even with dropout 0, and the stock tracker keeps CUDA
  generator states. :class:`CpuRNGStatesTracker` keeps CPU generator states instead and
  :func:`model_parallel_manual_seed` replaces ``model_parallel_cuda_manual_seed`` (which
  asserts CUDA).
* **Activation recomputation.** ``CheckpointFunction`` saves the "CUDA" generator state before
  a checkpointed forward and restores it for the recompute, through ``_get_cuda_rng_state`` /
  ``_set_cuda_rng_state``; on CPU those read and write the CPU generator, so recomputed dropout
  masks equal the original ones.
* **Gradient clipping.** ``clip_grad_by_total_norm_fp32`` asserts that every gradient is a
  ``torch.cuda.FloatTensor``; :func:`_clip_grad_by_total_norm_fp32_cpu` does the same scaling
  for CPU fp32 gradients.

The redirections are written against megatron-core 0.16.1 and nothing else: the module checks
the installed version first and raises :class:`MegatronVersionError` on any other, so an
upgrade that moves a CUDA use fails loudly here instead of deep inside a training step
(``tests/integration/test_megatron_compat.py`` covers every redirected path).

* **bf16 optimizer.** ``Float16OptimizerWithFloat16Params.__init__`` sorts parameters by their
  ``type()`` string and refuses anything but ``torch.cuda.*Tensor``; :func:`_float16_optimizer_init`
  sorts CPU bf16 and fp32 parameters the same way (fp32 master copies of the bf16 ones), so
  ``--bf16`` trains on CPU with megatron's own mixed-precision step.

* **Mixture of experts without Transformer Engine.** ``moe_utils`` imports
  ``te_general_gemm`` (and the fused MoE kernels) only when Transformer Engine imports, yet
  ``RouterGatingLinearFunction`` tests ``te_general_gemm is not None`` unconditionally: without
  Transformer Engine every router forward raised ``NameError``. :func:`_define_absent_te_kernels`
  binds the absent names to ``None`` (CPU or CUDA), so the router takes its ``torch.mm`` path.

Not redirected, so CUDA-only (expect megatron's own CUDA errors on CPU): the distributed optimizer
(``use_distributed_optimizer``), sequence parallelism (the local spec's norm refuses it),
fp16 mixed precision (its loss scaler), overlapped gradient reduction (CUDA streams), CUDA graphs,
fully-parallel checkpoint strategies and megatron's inference engine.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from agentrl.errors import AgentRLError

__all__ = [
    "PINNED_MEGATRON_VERSION",
    "CpuRNGStatesTracker",
    "MegatronVersionError",
    "apply_cpu_compat",
    "check_megatron_version",
    "cpu_compat_applied",
    "installed_megatron_version",
    "model_parallel_manual_seed",
]

PINNED_MEGATRON_VERSION = "0.16.1"
"""The one megatron-core release these redirections were written and tested against."""

_CPU = torch.device("cpu")

_REDIRECTED_MODULES: dict[str, str] = {
    "megatron.core.models.common.embeddings.rotary_pos_embedding": (
        "RotaryEmbedding.get_emb moves inv_freq to torch.cuda.current_device() on the first "
        "forward."
    ),
    "megatron.core.utils": (
        "GlobalMemoryBuffer.get_tensor (the attention score buffer) allocates on "
        "torch.cuda.current_device(); local_multi_tensor_l2_norm (the optimizer's grad norm "
        "without Apex) returns a device='cuda' tensor."
    ),
    "megatron.core.transformer.utils": (
        "get_default_causal_mask builds the mask used when attention_mask=None with device='cuda'."
    ),
    "megatron.core.tensor_parallel.mappings": (
        "_gather_along_last_dim (gathering vocab-parallel logits: GPTModel.forward with "
        "runtime_gather_output=True) and _gather_along_first_dim / "
        "_reduce_scatter_along_first_dim allocate their output on torch.cuda.current_device()."
    ),
    "megatron.core.transformer.moe.router": (
        "Router.gating moves the router's weight to torch.cuda.current_device() on every "
        "forward (mixture-of-experts models)."
    ),
    "megatron.core.pipeline_parallel.schedules": (
        "forward_backward_no_pipelining and the pipelined schedules count tokens in "
        "torch.zeros([], device='cuda')."
    ),
    "megatron.core.distributed.param_and_grad_buffer": (
        "_ParamAndGradBuffer.__init__ allocates the contiguous param/grad buffers of Megatron "
        "DDP on torch.cuda.current_device()."
    ),
    "megatron.core.optimizer.clip_grads": (
        "get_grad_norm_fp32 creates its overflow flag and norm accumulators with device='cuda'."
    ),
    "megatron.core.optimizer.optimizer": (
        "FP32Optimizer.__init__ creates its constant loss scale (1.0) with device='cuda'."
    ),
    "megatron.core.dist_checkpointing.strategies.state_dict_saver": (
        "save_state_dict_async_finalize all-reduces its failure flag in a tensor on "
        "torch.cuda.current_device()."
    ),
    "megatron.core.dist_checkpointing.strategies.filesystem_async": (
        "FileSystemWriterAsync.preload_tensors calls torch.cuda.synchronize() after staging "
        "the shards on the CPU, before the writer reads them."
    ),
}
"""Megatron module -> the functions in it that hard-code CUDA, and why the path needs them.

In these modules only, the global ``torch`` becomes :class:`_TorchOnCpu`."""

_FACTORIES = frozenset({
    "arange", "empty", "empty_like", "full", "full_like", "ones", "ones_like", "rand",
    "randn", "tensor", "zeros", "zeros_like",
})
"""Tensor factories whose ``device=`` argument the CPU view rewrites."""


class MegatronVersionError(AgentRLError):
    """The installed megatron-core is not the release agentrl's CPU redirections were written
    for; the message names both versions."""


def installed_megatron_version() -> str:
    """Returns the version string of the importable megatron-core (``megatron.core``)."""
    from megatron.core import package_info

    return str(package_info.__version__)


def check_megatron_version(found: str | None = None) -> None:
    """Raises unless megatron-core is exactly :data:`PINNED_MEGATRON_VERSION`.

    Args:
        found: The version to check; defaults to the installed one.

    Raises:
        MegatronVersionError: The version differs; the message names both and what to do.
    """
    found = installed_megatron_version() if found is None else found
    if found != PINNED_MEGATRON_VERSION:
        raise MegatronVersionError(
            f"megatron-core {found} is installed, but agentrl's trainer is pinned to "
            f"megatron-core {PINNED_MEGATRON_VERSION}: its CPU redirections "
            "(agentrl/trainer/megatron_compat.py) and weight mapping are written against that "
            f"release. Install it with `pip install megatron-core=={PINNED_MEGATRON_VERSION}`, "
            "or port megatron_compat.py and rerun tests/integration/test_megatron_compat.py."
        )


def _device_on_cpu(device: Any) -> Any:
    """Maps a CUDA device (``"cuda"``, ``"cuda:0"``, an ordinal, a ``torch.device``) to the CPU."""
    if isinstance(device, int) and not isinstance(device, bool):
        return _CPU  # a bare int is a CUDA ordinal to torch factories
    if isinstance(device, str) and device.startswith("cuda"):
        return _CPU
    if isinstance(device, torch.device) and device.type == "cuda":
        return _CPU
    return device


def _factory_on_cpu(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Wraps a torch tensor factory so a CUDA ``device=`` argument allocates on the CPU."""

    @functools.wraps(factory)
    def wrapper(*args: Any, **kwargs: Any) -> torch.Tensor:
        if "device" in kwargs:
            kwargs["device"] = _device_on_cpu(kwargs["device"])
        return factory(*args, **kwargs)

    return wrapper


class _CudaOnCpu:
    """``torch.cuda`` as seen by a redirected megatron module: the current device is the CPU
    and synchronisation is a no-op (CPU kernels are synchronous); the rest is the real module."""

    def current_device(self) -> torch.device:
        return _CPU

    def synchronize(self, device: Any = None) -> None:
        del device

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class _TorchOnCpu:
    """``torch`` as seen by a redirected megatron module (see :data:`_REDIRECTED_MODULES`)."""

    cuda = _CudaOnCpu()

    def __getattr__(self, name: str) -> Any:
        value = getattr(torch, name)
        if name in _FACTORIES:
            value = _factory_on_cpu(value)
            # Cached on the instance, so __getattr__ runs once per factory, not per call.
            setattr(self, name, value)
        return value

    def __repr__(self) -> str:
        return "<torch as seen by megatron on CPU (agentrl.trainer.megatron_compat)>"


_TORCH_ON_CPU = _TorchOnCpu()


class CpuRNGStatesTracker:
    """Named CPU generator states, standing in for megatron's ``CudaRNGStatesTracker``.

    Megatron forks a named RNG state around every region whose randomness must differ (or
    agree) across tensor-parallel ranks, e.g. attention dropout. On CPU the only generator is
    the default CPU one, so :meth:`fork` swaps its state for the named one and back; with dropout
    0 nothing is drawn, but the fork still has to succeed. The interface is megatron's
    (``reset``, ``get_states``, ``set_states``, ``add``, ``fork``, ``is_initialized``).
    """

    def __init__(
        self, use_cudagraphable_rng: bool = False, is_inference_rng_tracker: bool = False
    ) -> None:
        """Creates an empty tracker; the arguments exist for megatron's factory and must be
        off (CUDA graphs do not exist on CPU)."""
        if use_cudagraphable_rng:
            raise AgentRLError("CUDA-graph-safe RNG tracking is not available on CPU")
        self.use_cudagraphable_rng = False
        self.is_inference_rng_tracker = is_inference_rng_tracker
        self.reset()

    def is_initialized(self) -> bool:
        """Whether a state was added or set."""
        return self._is_initialized

    def reset(self) -> None:
        """Forgets every named state and seed."""
        self._is_initialized = False
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()

    def get_states(self) -> dict[str, torch.Tensor]:
        """Returns a shallow copy of the named states (for checkpointing)."""
        return dict(self.states_)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        """Replaces the named states (from :meth:`get_states`)."""
        self._is_initialized = True
        self.states_ = states

    def add(self, name: str, seed: int) -> None:
        """Adds a state ``name`` seeded with ``seed``.

        Raises:
            AgentRLError: ``name`` or ``seed`` is already tracked (megatron's contract).
        """
        if seed in self.seeds_:
            raise AgentRLError(f"RNG seed {seed} is already tracked")
        if name in self.states_:
            raise AgentRLError(f"RNG state {name!r} is already tracked")
        self._is_initialized = True
        self.seeds_.add(seed)
        generator = torch.Generator(device="cpu")
        generator.manual_seed(seed)
        self.states_[name] = generator.get_state()

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        """Runs the body with the CPU generator in state ``name``, then restores the outer
        state and keeps the advanced ``name`` state for the next fork.

        Raises:
            AgentRLError: ``name`` was never added (call :func:`model_parallel_manual_seed`).
        """
        if name not in self.states_:
            raise AgentRLError(
                f"RNG state {name!r} is not tracked; call "
                "agentrl.trainer.megatron_compat.model_parallel_manual_seed(seed) after "
                "initialising model parallelism"
            )
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)


def _clip_grad_by_total_norm_fp32_cpu(
    parameters: list[torch.Tensor] | torch.Tensor,
    max_norm: float,
    total_norm: float,
    use_decoupled_grad: bool = False,
) -> None:
    """Scales gradients in place by ``max_norm / (total_norm + 1e-6)`` when that is below 1.

    Replaces megatron's ``clip_grad_by_total_norm_fp32``, whose only CUDA dependency is an
    assertion that each gradient's type is ``torch.cuda.FloatTensor`` (and a multi-tensor
    kernel's dummy overflow buffer); the arithmetic and the 1e-6 epsilon are the same, and the
    fp32 check is kept for CPU tensors.
    """
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = []
    for param in parameters:
        grad = getattr(param, "decoupled_grad", None) if use_decoupled_grad else param.grad
        if grad is None:
            continue
        if grad.dtype != torch.float32 and not (
            use_decoupled_grad and grad.dtype == torch.bfloat16
        ):
            raise AgentRLError(f"gradient clipping expects fp32 gradients, got {grad.dtype}")
        grads.append(grad.detach())
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0:
        torch._foreach_mul_(grads, clip_coeff)


def _float16_optimizer_init(self: Any, optimizer: torch.optim.Optimizer, config: Any,
                            grad_scaler: Any, init_state_fn: Callable) -> None:
    """``Float16OptimizerWithFloat16Params.__init__`` for CPU parameters.

    Megatron's keeps three lists per parameter group: the bf16 model parameters, an fp32 master
    copy of each (which the wrapped optimizer steps instead) and the parameters that are fp32
    already. It picks them by ``param.type()``, which names CUDA tensors only; this one picks
    them by dtype and device, and fills the same attributes, so every other method of the class
    (grad copies, the step, the state dict) runs unchanged.
    """
    from megatron.core import tensor_parallel
    from megatron.core.optimizer.optimizer import MixedPrecisionOptimizer

    MixedPrecisionOptimizer.__init__(self, optimizer, config, grad_scaler, init_state_fn)
    self.is_stub_optimizer = not optimizer
    self.float16_groups, self.fp32_from_float16_groups, self.fp32_from_fp32_groups = [], [], []
    for group in optimizer.param_groups if optimizer else ():
        half, masters, full = [], [], []
        for i, param in enumerate(group["params"]):
            if not param.requires_grad:
                continue
            if param.dtype in (torch.bfloat16, torch.float16):
                master = param.detach().clone().float()
                tensor_parallel.copy_tensor_model_parallel_attributes(master, param)
                if hasattr(param, "shared"):
                    master.shared = param.shared
                group["params"][i] = master  # the wrapped optimizer steps the fp32 copy
                param.main_param = master
                if param in optimizer.state:
                    optimizer.state[master] = optimizer.state.pop(param)
                half.append(param)
                masters.append(master)
            elif param.dtype == torch.float32:
                full.append(param)
            else:
                raise AgentRLError(f"the mixed-precision optimizer cannot hold a {param.dtype} "
                                   "parameter")
        self.float16_groups.append(half)
        self.fp32_from_float16_groups.append(masters)
        self.fp32_from_fp32_groups.append(full)


def _get_cpu_rng_state(
    device: Any = None, clone: bool = False, graph_safe: bool = False
) -> torch.Tensor:
    """Replaces megatron's ``_get_cuda_rng_state``: the CPU generator's state (a copy)."""
    del device, clone, graph_safe
    return torch.get_rng_state()


def _set_cpu_rng_state(new_state: torch.Tensor, device: Any = -1, graph_safe: bool = False) -> None:
    """Replaces megatron's ``_set_cuda_rng_state``: sets the CPU generator's state."""
    del device, graph_safe
    torch.set_rng_state(new_state)


def model_parallel_manual_seed(seed: int) -> None:
    """Seeds the model-parallel RNG states (data-, tensor- and expert-parallel).

    With CUDA this is megatron's ``model_parallel_cuda_manual_seed``. Without it, the CPU
    generator is seeded with ``seed`` and the tracker gets megatron's three named states with
    megatron's seed offsets (tensor-parallel: ``seed + 2718 + tp_rank``; expert-parallel:
    ``seed + 1024 + 100 * ep_rank + etp_rank``; data-parallel: ``seed``), so dropout masks
    follow the same rules as on GPU. Call it after model parallelism is initialised.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mp_random

    if torch.cuda.is_available():
        mp_random.model_parallel_cuda_manual_seed(seed)
        return
    apply_cpu_compat()
    tracker = mp_random.get_cuda_rng_tracker()
    tracker.reset()
    torch.manual_seed(seed)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    etp_rank = parallel_state.get_expert_tensor_parallel_rank()
    tracker.add(mp_random.get_data_parallel_rng_tracker_name(), seed)
    tracker.add("model-parallel-rng", seed + 2718 + tp_rank)
    tracker.add(
        mp_random.get_expert_parallel_rng_tracker_name(), seed + 1024 + 100 * ep_rank + etp_rank
    )


_APPLIED = False
_LOCK = threading.Lock()


def cpu_compat_applied() -> bool:
    """Whether :func:`apply_cpu_compat` has redirected megatron in this process."""
    return _APPLIED


_TE_KERNELS_OF_MOE_UTILS = (
    "fused_compute_score_for_moe_aux_loss", "fused_moe_aux_loss", "fused_permute",
    "fused_permute_with_probs", "fused_sort_chunks_by_index", "fused_sort_chunks_by_index_with_probs",
    "fused_topk_with_score_function", "fused_unpermute", "te_general_gemm",
)
"""The Transformer Engine kernels ``megatron.core.transformer.moe.moe_utils`` imports by name."""


def _define_absent_te_kernels() -> None:
    """Binds the Transformer Engine kernels ``moe_utils`` did not import to ``None`` (its own
    "not available" value), leaving those it did import alone."""
    from megatron.core.transformer.moe import moe_utils

    for name in _TE_KERNELS_OF_MOE_UTILS:
        if not hasattr(moe_utils, name):
            setattr(moe_utils, name, None)


def apply_cpu_compat() -> bool:
    """Checks megatron-core's version and, without CUDA, applies every CPU redirection.

    Idempotent and thread-safe; with CUDA available it only checks the version. Call it before
    building models (the :mod:`agentrl.trainer` helpers do).

    Returns:
        Whether the redirections are in place (``False`` when CUDA is available).

    Raises:
        MegatronVersionError: megatron-core is not :data:`PINNED_MEGATRON_VERSION`.
    """
    global _APPLIED
    check_megatron_version()
    _define_absent_te_kernels()
    if torch.cuda.is_available():
        return False
    with _LOCK:
        if _APPLIED:
            return True
        for name in _REDIRECTED_MODULES:
            importlib.import_module(name).torch = _TORCH_ON_CPU

        from megatron.core.optimizer import clip_grads, optimizer
        from megatron.core.tensor_parallel import random as mp_random

        # initialize_rng_tracker constructs the class it finds under this name (also after a
        # force_reset), and get_all_rng_states type-checks against it.
        mp_random.CudaRNGStatesTracker = CpuRNGStatesTracker
        mp_random.initialize_rng_tracker(force_reset=True)
        # Module globals, looked up at call time by CheckpointFunction and _fork_rng.
        mp_random._get_cuda_rng_state = _get_cpu_rng_state
        mp_random._set_cuda_rng_state = _set_cpu_rng_state
        # optimizer.py imported the function by name, so both bindings are replaced.
        clip_grads.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm_fp32_cpu
        optimizer.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm_fp32_cpu
        optimizer.Float16OptimizerWithFloat16Params.__init__ = _float16_optimizer_init
        _APPLIED = True
    return True
