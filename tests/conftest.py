"""Test tiers: every test is marked by its folder (unit / integration / e2e / gpu).

``pytest`` runs all CPU tiers; ``-m unit`` runs the fast tier only. GPU tests are skipped with
the reason when CUDA is absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("unit", "integration", "e2e", "gpu")
TESTS_DIR = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(item.fspath).relative_to(TESTS_DIR).parts
        tier = parts[0] if parts and parts[0] in TIERS else None
        if tier and not item.get_closest_marker(tier):
            item.add_marker(getattr(pytest.mark, tier))
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    cuda_reason = _cuda_missing_reason() if gpu_items else None  # torch imports only if needed
    for item in gpu_items:
        if cuda_reason:
            item.add_marker(pytest.mark.skip(reason=cuda_reason))


def _cuda_missing_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "GPU test: torch is not installed"
    if not torch.cuda.is_available():
        return "GPU test: no CUDA device on this machine (torch.cuda.is_available() is False)"
    return None
