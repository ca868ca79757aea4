"""What a separate verifier receives from the agent's container: the task's artifacts.

:func:`take` reads each artifact out of the agent's (stopped) container as a tar archive and
unpacks it into a host folder through :mod:`tarfile`'s ``data`` filter: absolute names, names
that climb out with ``..``, links that leave the artifact, devices and other special files are
refused, and set-uid / set-gid bits are cleared. :func:`restore` puts what was taken at the same
paths in the verifier's container: under its working directory (the workspace) or under
``/logs/artifacts``; a source elsewhere cannot be written into the verifier's read-only root
file system and is reported, not restored.
"""

from __future__ import annotations

import fnmatch
import io
import os
import shutil
import tarfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from agentrl.sandbox import WORKSPACE
from agentrl_envs.harbor.task import ARTIFACTS_DIR, Artifact

MAX_ARTIFACT_BYTES = 256 * 1024 * 1024


def _excluded(name: str, patterns: Sequence[str]) -> bool:
    parts = PurePosixPath(name).parts
    return any(fnmatch.fnmatch(name, p) or any(fnmatch.fnmatch(part, p) for part in parts)
               for p in patterns)


async def take(sandbox: Any, artifacts: Sequence[Artifact], staging: Path,
               max_bytes: int = MAX_ARTIFACT_BYTES) -> list[dict[str, Any]]:
    """Copies each of ``artifacts`` out of ``sandbox`` (a DockerSandbox) into
    ``staging/<index>/<name>``; returns one record per artifact: ``source``, ``found``,
    ``files`` and ``refused`` (members the filter or ``exclude`` left out)."""
    records = []
    for index, artifact in enumerate(artifacts):
        data = await sandbox.read_archive(artifact.source, max_bytes)
        record: dict[str, Any] = {"source": artifact.source, "found": data is not None, "files": 0, "refused": []}
        records.append(record)
        if data is None:
            continue
        target = staging / str(index)
        target.mkdir(parents=True)
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            for member in archive.getmembers():
                if _excluded(member.name.split("/", 1)[-1] if "/" in member.name else "", artifact.exclude):
                    record["refused"].append(member.name)
                    continue
                try:
                    archive.extract(member, target, filter="data")
                except (tarfile.FilterError, OSError) as exc:
                    record["refused"].append(f"{member.name} ({type(exc).__name__})")
                    continue
                record["files"] += member.isfile()
    return records


def restore(staging: Path, artifacts: Sequence[Artifact], records: Sequence[dict[str, Any]],
            workspace: str, workdir: str, artifacts_dir: str) -> None:
    """Puts what :func:`take` copied into the verifier's container (its ``workspace``, mounted
    at ``workdir``, and the host folder behind ``/logs/artifacts``), each at its source path.
    Adds ``restored`` (and ``why`` when not) to each record."""
    for index, (artifact, record) in enumerate(zip(artifacts, records, strict=True)):
        if not record["found"]:
            record["restored"] = False
            continue
        where = _host_path(artifact.source, workspace, workdir, artifacts_dir)
        if where is None:
            record["restored"] = False
            record["why"] = (f"agentrl restores artifacts under the verifier's working directory "
                             f"({workdir}) or {ARTIFACTS_DIR}; {artifact.source} is elsewhere")
            continue
        copied = staging / str(index) / PurePosixPath(artifact.source).name  # as `docker cp` names it
        if copied.is_dir():
            shutil.copytree(copied, where, dirs_exist_ok=True, symlinks=True)
        elif copied.exists() or copied.is_symlink():
            os.makedirs(os.path.dirname(where), exist_ok=True)
            if os.path.isdir(where) and not os.path.islink(where):
                shutil.rmtree(where)
            shutil.copy2(copied, where, follow_symlinks=False)
        record["restored"] = True


def _host_path(source: str, workspace: str, workdir: str, artifacts_dir: str) -> str | None:
    for mount, host in ((ARTIFACTS_DIR, artifacts_dir), (workdir, workspace), (WORKSPACE, workspace)):
        if mount != "/" and (source == mount or source.startswith(mount + "/")):
            return host + source[len(mount):]
    return None
