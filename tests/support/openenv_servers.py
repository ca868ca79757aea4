"""OpenEnv servers for tests: ``agentrl serve-env`` and servers written with ``openenv`` itself,
run with the ``openenv`` package's venv (``.venv-openenv``, made by scripts/setup-openenv.sh)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.support.distributed import free_port
from tests.support.processes import stop_process_group

REPO = Path(__file__).resolve().parents[2]
OPENENV_PYTHON = REPO / ".venv-openenv" / "bin" / "python"
DRIVER = Path(__file__).with_name("openenv_driver.py")


def openenv_missing() -> str | None:
    """Why the OpenEnv tests cannot run here, or ``None``."""
    if not OPENENV_PYTHON.exists():
        return "no .venv-openenv: run scripts/setup-openenv.sh (make test does)"
    return None


def wait_healthy(url: str, proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}")
        with contextlib.suppress(OSError):  # not listening yet
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if json.loads(response.read()).get("status") == "healthy":
                    return
        if time.monotonic() > deadline:
            raise AssertionError(f"the server at {url} did not become healthy in {timeout} s")
        time.sleep(0.2)


@contextlib.contextmanager
def running(command: list[str], *, port: int, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Runs a server command (it listens on ``port``) until the block ends; stopped by PID."""
    proc = subprocess.Popen(command, cwd=cwd, env={**os.environ, **(env or {})}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url, proc
    finally:
        stop_process_group(proc, timeout=30)


def serve_env(env_id: str, *extra: str, env: dict[str, str] | None = None):
    """``agentrl serve-env ENV_ID`` on a free loopback port, in .venv-openenv."""
    port = free_port()
    return running([str(OPENENV_PYTHON), "-m", "agentrl", "serve-env", env_id, "--port", str(port), *extra],
                   port=port, env=env)


def drive(url: str, env_id: str, *args: str, env_kwargs: dict | None = None,
          timeout: float = 300) -> list[dict]:
    """Runs openenv's own client (tests/support/openenv_driver.py) against ``url``; returns the
    JSON lines it printed."""
    done = subprocess.run([str(OPENENV_PYTHON), str(DRIVER), url, env_id,
                           json.dumps(env_kwargs or {}), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
