"""Gymnasium's own ``check_env`` passes on every built-in env that runs offline, without a
warning about the env.

Each env is made with ``gymnasium.make`` and checked unwrapped (as Gymnasium recommends), so
the checker also re-makes it from its spec for the render and close checks. Sandboxed envs use
the ``bwrap`` backend and are skipped (with the reason) where bubblewrap is missing.
"""

from __future__ import annotations

import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import agentrl
from agentrl import SandboxedToolEnv
from tests.support.sandboxes import backend_skip_reason

NEEDS_USER_DATA = {
    "swe-bench-v0": "swe-bench-v0 needs the user's SWE-bench instances and their Docker "
    "images; tests/integration/test_swe_tools.py checks it on a hand-made instance",
    "openenv-v0": "openenv-v0 plays an OpenEnv server; tests/integration/test_openenv.py runs "
    "Gymnasium's checker on it against a served env",
}
BWRAP_SKIP = backend_skip_reason("bwrap")
DOCKER_ONLY = {"harbor-v0"}  # plays each task in its own Docker image


@pytest.fixture(autouse=True)
def _no_docker_reaping(monkeypatch):
    """Only bwrap sandboxes run here. A pool's start also reaps dead owners' docker containers,
    and that listing fails when another process removes a container between docker's list and
    inspect; keep such races out of these tests."""
    monkeypatch.setattr("agentrl.sandbox.pool._reap_containers", lambda pid_alive, docker_host: 0)


@pytest.mark.parametrize("env_id", [spec.id for spec in agentrl.list_envs()])
def test_gymnasium_check_env_passes_without_warnings(env_id):
    if env_id in NEEDS_USER_DATA:
        pytest.skip(NEEDS_USER_DATA[env_id])
    kwargs = {}
    if env_id in DOCKER_ONLY:
        if (docker_skip := backend_skip_reason("docker")) is not None:
            pytest.skip(docker_skip)
        kwargs["sandbox"] = "docker"
    elif issubclass(agentrl.env_spec(env_id).load(), SandboxedToolEnv):
        if BWRAP_SKIP is not None:
            pytest.skip(BWRAP_SKIP)
        kwargs["sandbox"] = "bwrap"
    env = gymnasium.make(f"agentrl/{env_id}", **kwargs)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env.unwrapped)
    finally:
        env.close()
    from_gymnasium = [str(w.message) for w in caught if "gymnasium" in w.filename]
    assert from_gymnasium == []
