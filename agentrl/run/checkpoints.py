"""Checkpoint folders under ``--save``: their names, the seal that marks one complete, and the
choice of the one ``--load`` resumes from.

A run saves before rollout ``n`` into ``<save>/rollout_<n>`` (:func:`checkpoint_folder`): the
trainer's Megatron distributed checkpoint (``.metadata``, ``*.distcp``, ``common.pt``,
``metadata.json``), the data position (``data.json``) and, for ``--async-training``, the
pipeline's state (``pipeline.json``: its ledger and the groups it had started but not trained).
:func:`publish_checkpoint` writes them into a hidden staging folder, seals it (``manifest.json``,
every file's size), renames it to ``rollout_<n>`` and then points ``<save>/latest`` at it, so a
kill at any instant leaves the previous checkpoint usable and never a half-written folder under
a checkpoint's name. A folder damaged afterwards (a truncated file, a full disk) fails its
manifest; :func:`latest_checkpoint` skips such folders, says why, and falls back to the newest
older one that is complete.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError

__all__ = ["DATA_FILE", "MANIFEST", "PIPELINE_FILE", "checkpoint_folder", "checkpoint_problem",
           "check_resumable", "latest_checkpoint", "mark_latest", "nothing_left", "publish_checkpoint",
           "read_pipeline_state", "resume_advice", "write_atomically"]

MANIFEST = "manifest.json"
"""``{"files": {relative path: size in bytes}}`` of a sealed checkpoint."""

DATA_FILE = "data.json"
"""The data source's position, written beside the trainer's files."""

PIPELINE_FILE = "pipeline.json"
"""An asynchronous run's pipeline state (:meth:`~agentrl.rollout.pipeline.AsyncRollout.snapshot`)."""

MARKER = "latest"
"""``<save>/latest``: the name of the newest sealed checkpoint folder."""

_FOLDER = re.compile(r"rollout_(\d+)")


def checkpoint_folder(root: str | Path, next_rollout: int) -> Path:
    """``<root>/rollout_<n>``: the checkpoint taken before rollout ``n``."""
    return Path(root) / f"rollout_{next_rollout:05d}"


def publish_checkpoint(root: str | Path, next_rollout: int, write: Callable[[Path], None]) -> Path:
    """Writes the checkpoint taken before rollout ``next_rollout`` whole or not at all.

    ``write(staging)`` fills a fresh hidden folder next to the checkpoint's; it is sealed,
    renamed to :func:`checkpoint_folder` (replacing a folder of that name a killed save left)
    and marked latest. Returns the checkpoint folder.
    """
    folder = checkpoint_folder(root, next_rollout)
    staging = folder.with_name(f".{folder.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)  # an earlier save that was killed
    staging.mkdir(parents=True)
    write(staging)
    _seal(staging)
    if folder.exists():  # never the marker's: saves go forward from it
        shutil.rmtree(folder)
    staging.rename(folder)
    write_atomically(Path(root) / MARKER, folder.name + "\n")
    return folder


def mark_latest(root: str | Path, folder: Path) -> None:
    """Seals ``folder`` (its manifest of file sizes) and records it as the newest complete
    checkpoint: for a folder written in place, e.g. by hand (runs use
    :func:`publish_checkpoint`). The marker is written last, atomically."""
    _seal(Path(folder))
    write_atomically(Path(root) / MARKER, Path(folder).name + "\n")


def read_pipeline_state(folder: Path) -> dict[str, Any] | None:
    """The asynchronous pipeline's state saved in checkpoint ``folder``, or ``None`` when a
    synchronous run wrote it."""
    path = Path(folder) / PIPELINE_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def check_resumable(folder: Path, *, async_training: bool) -> None:
    """Refuses to resume an asynchronous checkpoint synchronously: the groups it had started
    but not trained would be lost.

    Raises:
        ConfigError: Naming ``--load`` and ``--async-training``.
    """
    state = read_pipeline_state(folder)
    if state is not None and state.get("groups") and not async_training:
        raise ConfigError(f"--load {folder}: this checkpoint was written by an --async-training "
                          f"run with {len(state['groups'])} groups started but not trained; "
                          "resume it with --async-training, so that they are trained (once)")


def _seal(folder: Path) -> None:
    sizes = {str(path.relative_to(folder)): path.stat().st_size
             for path in sorted(folder.rglob("*"))
             if path.is_file() and path.name not in (MANIFEST, MANIFEST + ".tmp")}
    write_atomically(folder / MANIFEST, json.dumps({"files": sizes}, indent=1) + "\n")


def checkpoint_problem(folder: Path) -> str | None:
    """Why ``folder`` is not a complete checkpoint, or ``None`` if it is.

    Complete means: sealed (a readable manifest), every file the manifest lists present at the
    size it had when sealed, and a ``data.json`` that parses. Reads sizes and ``data.json``
    only, so it is cheap.
    """
    if not folder.is_dir():
        return "the folder does not exist"
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return (f"no {MANIFEST}: its save did not finish (a checkpoint is sealed once every "
                "file is written)")
    try:
        sizes = json.loads(manifest.read_text(encoding="utf-8"))["files"]
        sizes = {str(name): int(size) for name, size in sizes.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{MANIFEST} is damaged ({type(exc).__name__}: {exc})"
    for name, size in sizes.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        actual = path.stat().st_size
        if actual != size:
            return f"{name} is {actual} bytes, {size} when it was saved (truncated or overwritten)"
    data = folder / DATA_FILE
    if not data.is_file():
        return f"{DATA_FILE} is missing"
    try:
        json.loads(data.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"{DATA_FILE} is not valid JSON ({exc})"
    return None


def _warn(message: str) -> None:
    print(f"WARNING: {message}", file=sys.stderr, flush=True)


def latest_checkpoint(root: str | Path, report: Callable[[str], None] | None = _warn, *,
                      flag: str = "--load") -> Path:
    """The checkpoint ``--load`` names: ``root`` itself if it is one, else the newest complete
    one under it.

    Under a ``--save`` folder the candidates are the folder ``latest`` names, then the older
    ``rollout_<n>`` folders, newest first (folders newer than the marker are saves that never
    finished, or a run the marker was moved back from); without a marker, every ``rollout_<n>``
    folder. The first complete one (:func:`checkpoint_problem`) is the answer.

    Args:
        root: The ``--load`` folder.
        report: Called with one line for each damaged checkpoint skipped (default: a warning
            on stderr); ``None`` for silence (e.g. checking the flag before the run starts).
        flag: What gave ``root``, for the messages (``--load``, or a command's name).

    Raises:
        ConfigError: ``root`` is a damaged checkpoint, holds no checkpoint at all, or only
            damaged ones; the message names ``--load`` and each folder with what is wrong.
    """
    root = Path(root)
    if any((root / name).is_file() for name in (DATA_FILE, MANIFEST, "metadata.json")):
        problem = checkpoint_problem(root)
        if problem is not None:
            raise ConfigError(f"{flag} {str(root)!r}: this checkpoint is damaged: {problem}; "
                              "pass the --save folder above it to resume from its newest "
                              "complete checkpoint")
        return root
    candidates = _candidates(root)
    if not candidates:
        raise ConfigError(f"{flag} {str(root)!r}: no checkpoint there (no '{MARKER}' marker "
                          f"and no {DATA_FILE}); pass the --save folder of an earlier run")
    skipped: list[str] = []
    for folder in candidates:
        problem = checkpoint_problem(folder)
        if problem is None:
            if report is not None and skipped:
                report(f"{flag}: using {folder}, the newest complete checkpoint")
            return folder
        skipped.append(f"{folder.name}: {problem}")
        if report is not None:
            report(f"{flag}: checkpoint {folder} is damaged and skipped: {problem}")
    advice = "pass another --load, or drop it to start afresh" if flag == "--load" else "pass another checkpoint"
    raise ConfigError(f"{flag} {str(root)!r}: no complete checkpoint there (" + "; ".join(skipped) + f"); {advice}")


def resume_advice(root: str | Path, argv: Sequence[str], prog: str = "train.py") -> str:
    """How to continue a stopped run: the newest complete checkpoint under ``root`` and the
    command line (``argv`` with ``--load root``), or that there is none yet."""
    try:
        folder = latest_checkpoint(root, report=None)
    except ConfigError:
        return f"no complete checkpoint under {root} yet: a new run starts from the beginning"
    rest, skip = [], False
    for arg in argv:  # the same flags, but --load pointing at this run's checkpoints
        if skip:
            skip = False
        elif arg == "--load":
            skip = True
        elif not arg.startswith("--load="):
            rest.append(arg)
    command = shlex.join(["python", prog, *rest, "--load", str(root)])
    return f"newest complete checkpoint: {folder}; continue with: {command}"


def nothing_left(load: str | Path | None, num_rollout: int) -> str | None:
    """What to say when ``--load`` names a checkpoint already at ``--num-rollout`` (the run
    would start Ray, load the model and train nothing); ``None`` when there is work left (or
    no ``--load``). Read from the checkpoint folder's name (``rollout_<next>``), so nothing
    heavy is loaded."""
    if not load:
        return None
    folder = latest_checkpoint(load, report=None)
    found = re.fullmatch(r"rollout_(\d+)", folder.name)
    if found is None or int(found.group(1)) < num_rollout:
        return None
    done = int(found.group(1))
    return (f"nothing to do: {folder} is the checkpoint after rollout {done - 1}, and --num-rollout "
            f"{num_rollout} is the total: pass --num-rollout {done + 1} or more to train on from it "
            f"(nothing was trained or exported; `agentrl export {load} --hf DIR` exports it without "
            "training)")


def _candidates(root: Path) -> list[Path]:
    """The folders :func:`latest_checkpoint` tries, in order."""
    numbered = {}
    if root.is_dir():
        for path in root.iterdir():
            match = _FOLDER.fullmatch(path.name)
            if match and path.is_dir():
                numbered[int(match.group(1))] = path
    newest_first = [numbered[n] for n in sorted(numbered, reverse=True)]
    marker = root / MARKER
    if not marker.is_file():
        return newest_first
    target = root / marker.read_text(encoding="utf-8").strip()
    match = _FOLDER.fullmatch(target.name)
    if match is None:  # a folder named by hand: only it
        return [target]
    bound = int(match.group(1))
    return [target, *(numbered[n] for n in sorted(numbered, reverse=True) if n < bound)]


def write_atomically(path: Path, text: str) -> None:
    """Replaces ``path`` with ``text`` all at once (a temporary file renamed over it): a reader,
    or a kill, never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
