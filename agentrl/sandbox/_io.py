"""Helpers shared by the sandbox backends: capped output, process-group kills, and file I/O
confined to a host-side workspace directory."""

from __future__ import annotations

import asyncio
import errno
import os
import posixpath
import signal
import stat

from agentrl.sandbox.base import WORKSPACE, SandboxError

TRUNCATION_MARKER = "\n[... output truncated: {dropped} more bytes not shown ...]\n"


class CappedBuffer:
    """Collects bytes up to ``cap``; counts (and drops) the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.dropped += max(0, len(chunk) - max(room, 0))

    def text(self) -> str:
        """The kept bytes as text, with a visible marker when something was dropped."""
        out = self.data.decode("utf-8", errors="replace")
        if self.dropped:
            out += TRUNCATION_MARKER.format(dropped=self.dropped)
        return out


async def drain(stream: asyncio.StreamReader | None, buffer: CappedBuffer) -> None:
    """Reads ``stream`` to EOF into ``buffer`` (memory stays bounded by the cap)."""
    if stream is None:
        return
    while chunk := await stream.read(65536):
        buffer.feed(chunk)


def kill_process_group(pid: int) -> None:
    """SIGKILLs the process group led by ``pid``; a vanished group is not an error."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def workspace_relpath(path: str) -> str:
    """Maps a sandbox path (absolute under ``/workspace`` or relative to it) to a normalized
    relative path, refusing anything that leaves the workspace lexically (``..``)."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise SandboxError(f"invalid path {path!r}")
    full = path if path.startswith("/") else posixpath.join(WORKSPACE, path)
    norm = posixpath.normpath(full)
    if norm == WORKSPACE:
        return "."
    if not norm.startswith(WORKSPACE + "/"):
        raise SandboxError(f"path {path!r} is outside {WORKSPACE}; only workspace files are accessible")
    return norm[len(WORKSPACE) + 1 :]


def _open_parent(root: str, rel: str, *, create: bool, owner: tuple[int, int] | None) -> tuple[int, str]:
    """Opens the directory holding ``rel`` under ``root`` without following any symlink.

    Returns (directory fd, final component). Each component is opened relative to the previous
    one with O_NOFOLLOW, so a symlink planted by sandboxed code cannot redirect the host.
    """
    parts = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                if owner:
                    os.fchown(nxt, *owner)
            os.close(fd)
            fd = nxt
    except OSError:
        os.close(fd)
        raise
    return fd, parts[-1]


def _explain(path: str, exc: OSError) -> SandboxError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR) or (exc.errno == errno.EMLINK):
        return SandboxError(f"{path!r}: symbolic links are not followed by read_file/write_file")
    if isinstance(exc, FileNotFoundError):
        return SandboxError(f"{path!r}: no such file")
    if isinstance(exc, IsADirectoryError):
        return SandboxError(f"{path!r} is a directory")
    return SandboxError(f"{path!r}: {exc.strerror or exc}")


def read_workspace_file(root: str, path: str, max_bytes: int) -> bytes:
    """Reads ``path`` of the workspace whose host directory is ``root`` (no symlinks, no
    ``..``, regular files only, at most ``max_bytes``)."""
    rel = workspace_relpath(path)
    if rel == ".":
        raise SandboxError(f"{path!r} is a directory")
    try:
        dir_fd, name = _open_parent(root, rel, create=False, owner=None)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise SandboxError(f"{path!r} is not a regular file")
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise _explain(path, exc) from None
    if len(data) > max_bytes:
        raise SandboxError(f"{path!r} is larger than {max_bytes} bytes")
    return data


def write_workspace_file(
    root: str, path: str, data: bytes, owner: tuple[int, int] | None, max_bytes: int
) -> None:
    """Writes ``path`` of the workspace (parents created, owned by ``owner``), replacing an
    existing regular file; never follows a symlink."""
    rel = workspace_relpath(path)
    if rel == ".":
        raise SandboxError(f"{path!r} is a directory")
    if len(data) > max_bytes:
        raise SandboxError(f"refusing to write {len(data)} bytes to {path!r}: limit {max_bytes}")
    try:
        dir_fd, name = _open_parent(root, rel, create=True, owner=owner)
        try:
            fd = os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK,
                0o644, dir_fd=dir_fd,
            )
        finally:
            os.close(dir_fd)
        with os.fdopen(fd, "wb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise SandboxError(f"{path!r} is not a regular file")
            f.write(data)
            if owner:
                os.fchown(f.fileno(), *owner)
    except OSError as exc:
        raise _explain(path, exc) from None
