"""The estimate behind --recompute-activations' default, by hand."""

import torch

from agentrl.trainer import activation_memory
from agentrl.trainer.activation_memory import activation_bytes, free_bytes, too_large_to_keep


def test_the_estimate_scales_with_tokens_layers_width_and_precision():
    assert activation_bytes(1000, 30, 576, torch.float32) == 1000 * 30 * 576 * 160
    assert activation_bytes(1000, 30, 576, torch.bfloat16) == 1000 * 30 * 576 * 80


def test_a_micro_batch_is_too_large_past_half_the_free_memory(monkeypatch):
    monkeypatch.setattr(activation_memory, "free_bytes", lambda device: 2 * 160 * 100)
    cpu = torch.device("cpu")
    assert not too_large_to_keep(100, 1, 1, torch.float32, cpu)  # exactly half
    assert too_large_to_keep(101, 1, 1, torch.float32, cpu)


def test_the_host_reports_free_memory():
    assert 0 < free_bytes(torch.device("cpu")) < 1 << 50
