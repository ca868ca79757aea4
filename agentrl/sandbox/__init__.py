"""Sandboxes: where tools run model-written commands.

Backends (see each class's docstring for what it does and does not guarantee):

* ``bwrap`` - bubblewrap namespaces, no network, dropped capabilities, own uid (isolated).
* ``docker`` - one long-lived, locked-down container per episode (isolated).
* ``process`` - a plain subprocess with rlimits. Isolates nothing: trusted code only.
* ``auto`` - ``docker`` when a daemon answers, else ``bwrap`` when installed, else an error that
  says how to install either (``process`` is never chosen implicitly).

Imports neither Ray, Megatron nor SGLang; the Docker SDK is imported only by the docker backend.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from agentrl.sandbox.base import (
    WORKSPACE,
    ExecResult,
    Limits,
    Sandbox,
    SandboxError,
    SandboxLost,
    SandboxProcess,
    SandboxUnavailableError,
    ShellSession,
)
from agentrl.sandbox.bwrap import BwrapSandbox
from agentrl.sandbox.local import ProcessSandbox
from agentrl.sandbox.pool import (
    SandboxPool,
    SandboxPools,
    note_sandbox_made,
    reap_leftovers,
    reap_own_at_exit,
)

BACKENDS = ("auto", "bwrap", "docker", "process")


def resolve_backend(backend: str = "auto") -> str:
    """The concrete backend ``backend`` stands for on this machine.

    Raises:
        SandboxUnavailableError: ``auto`` found neither a Docker daemon nor bubblewrap.
        ValueError: Unknown backend name.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; choose one of {BACKENDS}")
    if backend != "auto":
        return backend
    docker_reason = _docker_reason()
    if docker_reason is None:
        return "docker"
    if shutil.which("bwrap"):
        return "bwrap"
    raise SandboxUnavailableError(
        "no isolating sandbox is available. Install bubblewrap (`apt-get install bubblewrap`), "
        "or start Docker (`scripts/dockerd.sh start` and export the DOCKER_HOST it prints; "
        f"docker said: {docker_reason}). To run trusted code without isolation, choose "
        "the `process` backend explicitly (`--env-kwarg sandbox=process`)."
    )


def create_sandbox(backend: str = "auto", limits: Limits | None = None, **options: Any) -> Sandbox:
    """A new, not yet started sandbox of ``backend`` (``auto`` resolved on this machine).

    Args:
        backend: ``auto``, ``bwrap``, ``docker`` or ``process``.
        limits: Resource limits (defaults: :class:`Limits`).
        **options: Backend options (docker: ``image``, ``docker_host``, ``labels``, ``network``,
            ``workspace_aliases``, ``private_dirs``, see :class:`DockerSandbox`; bwrap and
            process: ``ro_binds``, host directories visible read-only inside).
    """
    name = resolve_backend(backend)
    note_sandbox_made(name, options.get("docker_host"))  # what is left at exit is removed then
    if name == "bwrap":
        return BwrapSandbox(limits, **options)
    if name == "process":
        return ProcessSandbox(limits, **options)
    from agentrl.sandbox.docker import DockerSandbox

    labels = {"agentrl.owner_pid": str(os.getpid()), **options.pop("labels", {})}
    return DockerSandbox(limits, labels=labels, **options)


def _docker_reason() -> str | None:
    try:
        from agentrl.sandbox.docker import docker_unavailable_reason
    except ImportError as exc:
        return f"the docker SDK is not importable ({exc})"
    return docker_unavailable_reason()


__all__ = [
    "BACKENDS",
    "WORKSPACE",
    "BwrapSandbox",
    "ExecResult",
    "Limits",
    "ProcessSandbox",
    "Sandbox",
    "SandboxError",
    "SandboxLost",
    "SandboxPool",
    "SandboxPools",
    "SandboxProcess",
    "SandboxUnavailableError",
    "ShellSession",
    "create_sandbox",
    "reap_leftovers",
    "reap_own_at_exit",
    "resolve_backend",
]
