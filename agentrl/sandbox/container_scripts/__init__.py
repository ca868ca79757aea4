"""Python scripts that run *inside* a Docker sandbox container.

Each is a real module of this package (so linters and tests see it) whose source is passed
to the container's ``python3 -c``: the image's python3-minimal has only a bare standard library
(no ``json``), and nothing from ``agentrl`` is importable there. Importing one on the host runs
nothing (their entry points are guarded by ``__name__ == "__main__"``), so the host side can
share their protocol constants.
"""

from __future__ import annotations

import functools
from importlib import resources


@functools.cache
def script(name: str) -> str:
    """The source of ``container_scripts/<name>.py``, for ``python3 -c``."""
    return resources.files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8")
