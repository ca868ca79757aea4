"""Whether a micro-batch's activations fit: the default of ``--recompute-activations``.

A training forward keeps every layer's activations for the backward pass: memory grows with
the micro-batch's tokens x layers x width. Multi-turn agent episodes are long: on swe-tools
(5 turns) a SmolLM2-135M sample reaches about 5,500 tokens, whose activations alone took the
trainer past 20 GiB on a 24 GiB machine (float32, CPU), where the kernel killed the run; with
``--recompute-activations`` (megatron's full recompute, one layer at a time) the same run
peaked at 7.3 GiB. Recomputing costs a second forward in the backward pass and changes no
result, so without the flag the trainer recomputes exactly the micro-batches whose estimated
activations would take more than half the memory free at that moment.

The estimate is :data:`ACTIVATION_BYTES_PER_UNIT` bytes per token, layer and unit of width at
float32 (half at 16-bit), measured from that run: (20.3 - 7.3) GiB over 5,500 tokens x 30 layers
x 576 wide is about 145 bytes; 160 keeps a margin.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = ["ACTIVATION_BYTES_PER_UNIT", "activation_bytes", "free_bytes", "too_large_to_keep"]

ACTIVATION_BYTES_PER_UNIT = 160
"""Bytes of kept activations per token, decoder layer and unit of hidden width, at float32."""


def activation_bytes(tokens: int, layers: int, hidden: int, dtype: torch.dtype) -> int:
    """Estimated activations a training forward of ``tokens`` tokens keeps for the backward."""
    scale = torch.finfo(dtype).bits / 32
    return int(tokens * layers * hidden * ACTIVATION_BYTES_PER_UNIT * scale)


def free_bytes(device: torch.device) -> int:
    """Memory free for new allocations now: the GPU's free memory, or the host's
    ``MemAvailable`` (what Linux can give without swapping)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    meminfo = Path("/proc/meminfo")
    lines = meminfo.read_text().splitlines() if meminfo.is_file() else []
    available = [int(line.split()[1]) * 1024 for line in lines if line.startswith("MemAvailable:")]
    # without it (not Linux, or a kernel before 3.14): the free pages, which ignore the page cache
    return available[0] if available else os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def too_large_to_keep(tokens: int, layers: int, hidden: int, dtype: torch.dtype,
                      device: torch.device) -> bool:
    """Whether a micro-batch's estimated activations exceed half the free memory."""
    return activation_bytes(tokens, layers, hidden, dtype) > free_bytes(device) // 2
