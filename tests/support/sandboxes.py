"""Which sandbox back-ends can run here, and why not."""

from __future__ import annotations

import shutil


def backend_skip_reason(name: str) -> str | None:
    if name == "bwrap" and shutil.which("bwrap") is None:
        return "bwrap backend: bubblewrap is not installed (apt-get install bubblewrap)"
    if name == "docker":
        try:
            from agentrl.sandbox.docker import docker_unavailable_reason
        except ImportError as exc:
            return f"docker backend: cannot import the docker SDK: {exc}"
        reason = docker_unavailable_reason()
        if reason is not None:
            return f"docker backend: {reason}"
    return None
