"""A real vLLM server on the built-in tiny model, started the way agentrl starts one
(:func:`agentrl.placement.servers.server_command` with :func:`vllm_defaults`), for tests and
benchmarks.

vLLM is installed by ``make test`` (``scripts/setup-vllm.sh``); where it is not, the tests that
need it are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from agentrl.models import build_tiny_model
from agentrl.placement.servers import _merged, server_command, vllm_defaults, vllm_model_dir
from agentrl.rollout.config import RolloutConfig
from tests.support.distributed import free_port
from tests.support.processes import stop_process_group

START_TIMEOUT_S = 900.0
"""A cold start on a loaded 2-core machine (eager mode: about a minute when idle)."""


def require_vllm() -> None:
    import pytest

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (make test installs it with scripts/setup-vllm.sh)")


@contextlib.contextmanager
def vllm_server(log: Path, *, seed: int = 0, model: str | Path | None = None,
                rollout: RolloutConfig | None = None,
                server_args: dict[str, str | None] | None = None,
                env: dict[str, str] | None = None) -> Iterator[str]:
    """A vLLM server with agentrl's defaults for ``rollout``'s sampling flags (and
    ``server_args`` over them, vLLM's names: ``{"tool-call-parser": "hermes"}``, and ``env`` added
    to its environment); its base URL.
    Its output goes to ``log`` (shown when it fails to start)."""
    port = free_port()
    args = _merged(vllm_defaults(rollout or RolloutConfig(env="calc"), gpu=False),
                   dict(server_args or {}))
    served = vllm_model_dir(model or build_tiny_model(), gpu=False, workdir=log.parent)
    command = server_command("vllm", served, port=port, server_args=args, seed=seed)
    with log.open("ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "VLLM_SERVER_DEV_MODE": "1", **(env or {})},
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"vLLM did not start (exit {proc.poll()}):\n"
                                     f"{log.read_text(errors='replace')[-4000:]}")
            time.sleep(0.5)
        yield url
    finally:
        stop_process_group(proc)  # the engine core too, should it outlive the server


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False
