"""Which folder a run writes to (``--output-dir``), and ``runs/latest``.

Without ``--output-dir`` every run gets a folder of its own, ``runs/<date>-<time>`` (``-2``,
``-3``, ... when that name is taken), so running the same command twice never collides; the
symbolic link ``runs/latest`` points at the newest. ``--load`` of a run's folder (or of the
``checkpoints`` folder inside it) continues that run in place: its metrics go on in the same
files. An explicit ``--output-dir`` is used as given (one an earlier run wrote to is refused
unless ``--load`` continues that run; see :mod:`agentrl.run.validation`).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from pathlib import Path

__all__ = ["LATEST", "RUNS_ROOT", "RUN_FILES", "RunFolder", "choose_run_folder", "point_latest"]

RUNS_ROOT = Path("runs")
"""Where runs without ``--output-dir`` go (relative to the current directory)."""
LATEST = "latest"
"""The link under :data:`RUNS_ROOT` that names the newest of those runs."""
RUN_FILES = ("metrics.jsonl", "eval.jsonl")
"""The files a run appends to in its folder."""
CHECKPOINTS = "checkpoints"
"""The checkpoint folder inside a run's folder (``--save``'s default)."""


@dataclasses.dataclass(frozen=True)
class RunFolder:
    """The folder a run writes to, and how it was chosen.

    Attributes:
        path: The folder (``--output-dir``).
        load: What ``--load`` resumes from: as given, or the ``checkpoints`` folder of the run
            folder it named; ``None`` for a fresh run.
        fresh: A new dated folder under :data:`RUNS_ROOT` (``runs/latest`` is to point at it
            once the run starts).
    """

    path: str
    load: str | None
    fresh: bool


def is_run_folder(folder: Path) -> bool:
    """Whether ``folder`` is a run's folder: it holds ``run.json`` or a file a run appends to."""
    return any((folder / name).is_file() for name in ("run.json", *RUN_FILES))


def choose_run_folder(output_dir: str | None, load: str | None,
                      now: datetime.datetime | None = None) -> RunFolder:
    """The run's folder from ``--output-dir`` and ``--load`` (see the module docstring).

    Args:
        output_dir: ``--output-dir`` (``None`` or empty: not given).
        load: ``--load`` (``None``: not given).
        now: The time that names a fresh folder (default: now, local time).
    """
    if load:
        folder = Path(load)
        if is_run_folder(folder):  # a run's folder: continue it there, from its checkpoints
            checkpoints = folder / CHECKPOINTS
            return RunFolder(output_dir or str(folder), str(checkpoints) if checkpoints.is_dir() else load,
                             fresh=False)
        if not output_dir and folder.name == CHECKPOINTS and is_run_folder(folder.parent):
            return RunFolder(str(folder.parent), load, fresh=False)
    if output_dir:
        return RunFolder(output_dir, load, fresh=False)
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    candidate, n = RUNS_ROOT / stamp, 1
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = RUNS_ROOT / f"{stamp}-{n}"
    return RunFolder(str(candidate), load, fresh=True)


def point_latest(folder: str | Path) -> str | None:
    """Points ``runs/latest`` at ``folder`` (a fresh run's folder under :data:`RUNS_ROOT`),
    replacing the link in one step.

    Returns:
        ``None``, or why the link was left alone: ``runs/latest`` is a real folder (a run of an
        agentrl version whose default was that folder), which is never moved or deleted.
    """
    folder = Path(folder)
    latest = folder.parent / LATEST
    if latest.exists() and not latest.is_symlink():
        return (f"{latest} is a folder an earlier run wrote to, not a link: it was left as it is "
                f"(this run is in {folder})")
    temporary = folder.parent / f".{LATEST}-{os.getpid()}"
    if temporary.is_symlink():
        temporary.unlink()
    temporary.symlink_to(folder.name, target_is_directory=True)
    os.replace(temporary, latest)
    return None
