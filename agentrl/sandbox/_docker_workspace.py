"""Host directories bind-mounted as the ``/workspace`` of Docker sandboxes."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping

from agentrl.sandbox.base import SandboxUnavailableError

WORKSPACE_PREFIX = "agentrl-docker-"
PRIVATE_SUFFIX = "-private"


def make_workspace(root: str, uid: int, size_mb: int) -> str:
    """Creates a fresh workspace directory under ``root`` owned by ``uid`` (mode 0700) and
    returns its path. As root it is a file system of its own capped at ``size_mb``."""
    os.makedirs(root, mode=0o711, exist_ok=True)
    path = tempfile.mkdtemp(prefix=WORKSPACE_PREFIX, dir=root)
    try:
        if os.geteuid() == 0:
            _make_capped_dir(path, size_mb)
        os.chmod(path, 0o700)
        if os.geteuid() == 0 or uid != os.geteuid():
            os.chown(path, uid, uid)
    except PermissionError as exc:
        remove_workspace(path)
        raise SandboxUnavailableError(
            f"cannot give the workspace to uid {uid} ({exc}): run as root or pass "
            f"uid={os.geteuid()}"
        ) from exc
    except BaseException:
        remove_workspace(path)
        raise
    return path


def _make_capped_dir(path: str, size_mb: int) -> None:
    """Mounts a fresh ext4 file system of ``size_mb`` (a sparse image file beside ``path``, on a
    loop device) at ``path``: a disk-fill inside stops there. Unlike a tmpfs, its pages are
    ordinary reclaimable page cache, not memory charged to the container for good."""
    image = path + ".img"
    steps = [
        ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
         "-E", "lazy_itable_init=1", image],
        ["mount", "-o", "loop,nodev,nosuid,noatime", image, path],
    ]
    with open(image, "wb") as f:
        f.truncate(size_mb * 1024 * 1024)
    for cmd in steps:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailableError(f"cannot make the workspace file system: {exc}") from exc
        if proc.returncode != 0:
            raise SandboxUnavailableError(
                f"cannot make the workspace file system: `{' '.join(cmd)}` failed: "
                f"{(proc.stderr or proc.stdout).strip()[-500:]}"
            )
    with contextlib.suppress(OSError):
        os.rmdir(os.path.join(path, "lost+found"))


def make_private_dirs(workspace: str, paths: Mapping[str, str]) -> dict[str, str]:
    """Creates one empty host directory per container path of ``paths`` in a directory beside
    ``workspace`` (``<workspace>-private``, removed with the workspace), owned by the caller
    (root, when running as root) with mode 0755: the sandbox's uid can read them but never
    write. Returns container path -> host path."""
    root = workspace + PRIVATE_SUFFIX
    os.mkdir(root, 0o755)
    made = {}
    for i, path in enumerate(sorted(paths)):
        made[path] = os.path.join(root, str(i))
        os.mkdir(made[path], 0o755)
    return made


def remove_workspace(path: str | None) -> None:
    """Deletes a sandbox workspace (unmounting its file system, removing its image), only when
    ``path`` looks like one of ours."""
    if not path or not os.path.isabs(path) or ".." in path.split("/"):
        return
    if not os.path.basename(path).startswith(WORKSPACE_PREFIX):
        return
    if os.path.ismount(path):
        subprocess.run(["umount", "-l", path], capture_output=True, check=False)
    if os.path.isdir(path) and not os.path.islink(path) and not os.path.ismount(path):
        shutil.rmtree(path, ignore_errors=True)
    private = path + PRIVATE_SUFFIX
    if os.path.isdir(private) and not os.path.islink(private):
        shutil.rmtree(private, ignore_errors=True)
    with contextlib.suppress(OSError):
        image = path + ".img"
        if os.path.isfile(image) and not os.path.islink(image):
            os.unlink(image)
