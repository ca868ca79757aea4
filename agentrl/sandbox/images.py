"""The base image of the Docker sandboxes, built locally without any container registry.

:func:`ensure_base_image` returns the image tag, building it when the daemon lacks it: a Debian
``bookworm`` root file system made by ``debootstrap --variant=minbase`` (Python 3 with pytest,
bash, coreutils and procps), tarred and ``docker import``-ed. Debian's package archive is the
only thing reached; its address is read from this machine's own apt configuration (or
``AGENTRL_DEBIAN_MIRROR``).

Building needs root (debootstrap) and takes about a minute; an ``fcntl`` lock file makes
concurrent builders on one machine wait for each other instead of racing. CI prebuilds it with
``scripts/build-base-image.sh`` (``python -m agentrl.sandbox.images``).
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from agentrl.sandbox.base import SandboxUnavailableError

DEFAULT_IMAGE = "agentrl-base:bookworm-py3-v2"
SUITE = "bookworm"
INCLUDE = ("python3-minimal", "python3-pytest", "bash", "coreutils", "procps")
IMAGE_CHANGES = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    "LABEL agentrl.image=1",
    'CMD ["/bin/bash"]',
]
# Files of the root file system that a sandbox never needs (apt caches, docs, man pages).
TRIM = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
        "usr/share/info")


def debian_mirror() -> str:
    """The Debian archive to bootstrap from: ``$AGENTRL_DEBIAN_MIRROR``, else the first plain
    (not security) Debian archive of this machine's apt sources.

    Raises:
        SandboxUnavailableError: when neither gives one.
    """
    override = os.environ.get("AGENTRL_DEBIAN_MIRROR", "").strip()
    if override:
        return override
    candidates: list[str] = []
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        candidates += _deb822_uris(_read(path))
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
        candidates += _one_line_uris(_read(path))
    for uri in candidates:
        if "security" not in uri and uri.startswith(("http://", "https://", "file:/")):
            return uri
    raise SandboxUnavailableError(
        "cannot find a Debian archive in this machine's apt sources (/etc/apt/sources.list, "
        "/etc/apt/sources.list.d/); set AGENTRL_DEBIAN_MIRROR to one to build the sandbox image"
    )


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _deb822_uris(text: str) -> list[str]:
    """URIs of the enabled ``Types: deb`` stanzas of a deb822 ``.sources`` file whose suites
    include a plain release name (no ``-security``/``-updates`` suffix) first, then the rest."""
    plain: list[str] = []
    other: list[str] = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if line[0] in " \t" and key:
                fields[key] += " " + line.strip()
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        suites = fields.get("suites", "").split()
        target = plain if any("-" not in s and "/" not in s for s in suites) else other
        target += fields.get("uris", "").split()
    return plain + other


def _one_line_uris(text: str) -> list[str]:
    uris = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        words = words[1:]
        if words and words[0].startswith("["):  # [arch=amd64 signed-by=...]
            while words and not words[0].endswith("]"):
                words = words[1:]
            words = words[1:]
        if words:
            uris.append(words[0])
    return uris


def _tail(text: str | bytes | None, lines: int = 20) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return "\n".join((text or "").strip().splitlines()[-lines:])


def _run(cmd: list[str], what: str, timeout: float, **kwargs: Any) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False, **kwargs)
    except FileNotFoundError as exc:
        raise SandboxUnavailableError(f"{what}: {cmd[0]} is not installed ({exc})") from None
    except subprocess.TimeoutExpired:
        raise SandboxUnavailableError(f"{what}: `{' '.join(cmd)}` ran over {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise SandboxUnavailableError(
            f"{what}: `{' '.join(cmd)}` exited with {proc.returncode}:\n"
            f"{_tail(proc.stderr) or _tail(proc.stdout)}"
        )


def ensure_debootstrap() -> str:
    """Path of ``debootstrap``, installing it with apt-get when missing (needs root)."""
    found = shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin:/sbin")
    if found:
        return found
    if os.geteuid() != 0:
        raise SandboxUnavailableError(
            "debootstrap is missing and installing it needs root: apt-get install debootstrap"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-q"], "apt-get update", 600, env=env)
    _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "debootstrap"],
         "installing debootstrap", 600, env=env)
    found = shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin:/sbin")
    if not found:
        raise SandboxUnavailableError("debootstrap was installed but is not on PATH")
    return found


def _has_image(client: Any, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.DockerException as exc:
        raise SandboxUnavailableError(f"cannot look up image {tag!r}: {exc}") from exc


def _lock_path(tag: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", tag)
    return os.path.join(tempfile.gettempdir(), f"agentrl-image-{safe}.lock")


def ensure_base_image(client: Any, tag: str = DEFAULT_IMAGE, *, force: bool = False) -> str:
    """Returns ``tag``, building the image first when the daemon of ``client`` lacks it.

    Args:
        client: A ``docker.DockerClient``.
        tag: Image name:tag to look up or create.
        force: Rebuild even when the image exists.

    Raises:
        SandboxUnavailableError: the build failed (the message has the failing command's
            stderr tail) or the daemon cannot be asked.
    """
    if not force and _has_image(client, tag):
        return tag
    with open(_lock_path(tag), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another builder finishes first; then re-check
        try:
            if not force and _has_image(client, tag):
                return tag
            _build(client, tag)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return tag


def _build(client: Any, tag: str) -> None:
    import docker.errors

    if os.geteuid() != 0:
        raise SandboxUnavailableError(
            f"image {tag!r} is missing and building it (debootstrap) needs root: run "
            "scripts/build-base-image.sh as root, or pass an existing image"
        )
    debootstrap = ensure_debootstrap()
    mirror = debian_mirror()
    workdir = tempfile.mkdtemp(prefix="agentrl-image-")
    rootfs = os.path.join(workdir, "rootfs")
    tarball = os.path.join(workdir, "rootfs.tar")
    started = time.monotonic()
    try:
        _run([debootstrap, "--variant=minbase", f"--include={','.join(INCLUDE)}", SUITE,
              rootfs, mirror], f"debootstrap of {SUITE} from {mirror}", 1800)
        for rel in TRIM:
            target = os.path.join(rootfs, rel)
            if os.path.isdir(target) and not os.path.islink(target):
                for entry in os.listdir(target):
                    path = os.path.join(target, entry)
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        os.unlink(path)
        _run(["tar", "--numeric-owner", "-C", rootfs, "-cf", tarball, "."],
             "packing the root file system", 600)
        repository, _, version = tag.rpartition(":")
        if not repository or "/" in version:  # no tag part, e.g. "host:5000/name"
            repository, version = tag, "latest"
        try:
            with open(tarball, "rb") as f:
                client.api.import_image_from_data(
                    f, repository=repository, tag=version, changes=IMAGE_CHANGES
                )
        except docker.errors.DockerException as exc:
            raise SandboxUnavailableError(f"docker import of {tag!r} failed: {exc}") from exc
        if not _has_image(client, tag):
            raise SandboxUnavailableError(f"docker import finished but {tag!r} is not there")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"agentrl: built {tag} in {time.monotonic() - started:.0f} s", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentrl.sandbox.images",
        description="Build the Docker sandbox base image (when missing) and print its tag.",
    )
    parser.add_argument("--tag", default=DEFAULT_IMAGE)
    parser.add_argument("--docker-host", default=None, help="daemon address (default: as "
                        "DockerSandbox resolves it)")
    parser.add_argument("--force", action="store_true", help="rebuild even when present")
    args = parser.parse_args(argv)
    from agentrl.sandbox._docker_api import docker_unavailable_reason, get_client

    reason = docker_unavailable_reason(args.docker_host)
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 1
    try:
        print(ensure_base_image(get_client(args.docker_host), args.tag, force=args.force))
    except SandboxUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
