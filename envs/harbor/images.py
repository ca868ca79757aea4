"""Building Harbor task images with agentrl's private Docker daemon, offline.

A task's image is its ``environment/Dockerfile`` (or ``[environment].docker_image``) plus one
layer of agentrl's own: a copy of the task's working directory at :data:`SEED_DIR`, from which
each episode fills its writable workspace (the container's root file system is read-only, and
the workspace is mounted over the working directory). Images are tagged with a hash of the
environment folder (every file's path, mode and bytes), the base-image override and this
recipe, so an unchanged task is built once per daemon and an edited one is rebuilt.

Nothing is pulled: an image named by ``FROM`` (or ``docker_image``) must already be on the
daemon. agentrl's own base image is built locally when missing
(:func:`agentrl.sandbox.images.ensure_base_image`); any other missing image is an error that
names it and how to provide it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from agentrl.sandbox.images import DEFAULT_IMAGE
from agentrl_envs.harbor.compose import Service
from agentrl_envs.harbor.task import HarborTask, HarborTaskError, VerifierEnvironment

SEED_DIR = "/.agentrl-seed"
RECIPE = "agentrl-harbor-image-v1"
_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(?P<image>\S+)(?:\s+AS\s+(?P<stage>\S+))?\s*$",
                   re.IGNORECASE)
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


class HarborImageError(HarborTaskError):
    """A task's image cannot be built offline: a ``FROM`` image that is not on the daemon, a
    failed ``docker build``, or a build over ``[environment].build_timeout_sec``."""


@dataclasses.dataclass(frozen=True)
class ImageSource:
    """What one image of a task is built from: the agent's (``environment/``) or a separate
    verifier's (see :class:`~agentrl_envs.harbor.task.VerifierEnvironment`).

    Attributes:
        task: The task (named in tags and messages).
        context_dir: The build context, with its ``Dockerfile``.
        context_label: The folder as messages name it (``environment``, ``tests``, ...).
        docker_image: A local image instead of the Dockerfile.
        workdir: The working directory (None: the image's WORKDIR).
        build_timeout_s: The build's time limit.
        role: ``""`` for the agent's image, ``"verifier"`` for a separate verifier's,
            ``"service-<name>"`` for a compose service's.
        dockerfile: The Dockerfile's name in ``context_dir``.
        seed: Whether agentrl's seed layer is added (not to a compose service's image, which
            keeps its own user and working directory).
    """

    task: HarborTask
    context_dir: Path
    context_label: str
    docker_image: str | None
    workdir: str | None
    build_timeout_s: float
    role: str = ""
    dockerfile: str = "Dockerfile"
    seed: bool = True


def agent_image(task: HarborTask) -> ImageSource:
    """The source of ``task``'s own image: ``environment/`` and ``[environment]``."""
    return ImageSource(task, task.environment_dir, "environment", task.docker_image, task.workdir,
                       task.build_timeout_s)


def verifier_image(task: HarborTask, verifier: VerifierEnvironment) -> ImageSource:
    """The source of the image a separate verifier of ``task`` runs in."""
    settings = verifier.settings
    return ImageSource(task, verifier.context_dir, verifier.context_label, settings.docker_image,
                       settings.workdir, settings.build_timeout_s, "verifier")


def service_image(task: HarborTask, service: Service) -> ImageSource:
    """The source of a compose service's image (``build:`` or ``image:``)."""
    context = service.build_context or task.environment_dir
    label = f"environment/{context.relative_to(task.environment_dir).as_posix()}".rstrip("/.")
    return ImageSource(task, context, label or "environment", service.image, None,
                       task.build_timeout_s, f"service-{service.name}", service.dockerfile, seed=False)


def _source(image: HarborTask | ImageSource) -> ImageSource:
    return image if isinstance(image, ImageSource) else agent_image(image)


@dataclasses.dataclass(frozen=True)
class TaskImage:
    """A built task image: ``tag``, the task's ``workdir`` in it, whether this call ``built``
    it (False: cached) and the ``seconds`` that took."""

    tag: str
    workdir: str
    built: bool
    seconds: float


def environment_hash(image: HarborTask | ImageSource, base_image: str | None = None) -> str:
    """A hash of what the task's image (or ``image``) is made from (see the module docstring)."""
    source = _source(image)
    digest = hashlib.sha256(f"{RECIPE}\0{base_image or ''}\0{source.docker_image or ''}\0"
                            f"{source.workdir or ''}\0".encode())
    if source.role:
        digest.update(f"{source.role}\0{source.dockerfile}\0{source.seed}\0".encode())
    env_dir = source.context_dir
    if env_dir.is_dir():
        for path in sorted(p for p in env_dir.rglob("*") if p.is_file() or p.is_symlink()):
            rel = path.relative_to(env_dir).as_posix()
            mode = os.lstat(path).st_mode & 0o111
            data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
            digest.update(f"{rel}\0{mode:o}\0{len(data)}\0".encode())
            digest.update(data)
    return digest.hexdigest()


def image_tag(image: HarborTask | ImageSource, base_image: str | None = None) -> str:
    """The image tag of a task (or ``image``): ``agentrl-harbor-<name>[-verifier]:<hash>``."""
    source = _source(image)
    slug = re.sub(r"[^a-z0-9_.-]+", "-", source.task.name.lower()).strip("-.") or "task"
    role = f"-{source.role}" if source.role else ""
    return f"agentrl-harbor-{slug}{role}:{environment_hash(source, base_image)[:16]}"


def from_lines(dockerfile: str) -> list[tuple[int, str, str | None]]:
    """``(line number, image, stage name)`` of each ``FROM`` line of a Dockerfile."""
    found = []
    for number, line in enumerate(dockerfile.splitlines(), 1):
        match = _FROM.match(line)
        if match:
            found.append((number, match["image"], match["stage"]))
    return found


def _missing_image_error(task: HarborTask, where: str, image: str) -> HarborImageError:
    return HarborImageError(
        f"Harbor task {task.path}: {where}: the image {image!r} is not on the local Docker "
        "daemon, and agentrl builds task images offline (nothing is pulled). Provide it with "
        f"`docker load -i image.tar` (made by `docker save {image}` on a machine that has it), "
        f"or re-base the task onto agentrl's base image: --env-kwarg base_image={DEFAULT_IMAGE}"
    )


def _ensure_present(client: Any, task: HarborTask, where: str, image: str) -> None:
    import docker.errors

    if image == DEFAULT_IMAGE:
        from agentrl.sandbox.images import ensure_base_image

        ensure_base_image(client)
        return
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise _missing_image_error(task, where, image) from None


def ensure_image_present(client: Any, source: ImageSource) -> None:
    """Checks that the local image a source names (``docker_image`` / ``image:``) is on the
    daemon (agentrl's base image is built when missing).

    Raises:
        HarborImageError: It is not, with how to provide it.
    """
    assert source.docker_image is not None
    where = (f"environment/docker-compose.yaml: services.{source.role[8:]}.image"
             if source.role.startswith("service-") else "task.toml: environment.docker_image")
    _ensure_present(client, source.task, where, source.docker_image)


def _dockerfile(client: Any, source: ImageSource, base_image: str | None) -> str:
    """The source's Dockerfile with external ``FROM`` images checked (or re-based) and
    agentrl's seed layer appended."""
    task, where = source.task, source.context_label
    if source.docker_image is not None:
        image = base_image or source.docker_image
        table = "verifier.environment" if source.role == "verifier" else "environment"
        where = (f"environment/docker-compose.yaml: services.{source.role[8:]}.image"
                 if source.role.startswith("service-") else f"task.toml: {table}.docker_image")
        _ensure_present(client, task, where, image)
        text = f"FROM {image}\n"
    else:
        text = (source.context_dir / source.dockerfile).read_text(encoding="utf-8")
        lines = text.splitlines()
        stages: set[str] = set()
        for number, image, stage in from_lines(text):
            if "$" in image and not base_image:
                raise HarborImageError(
                    f"Harbor task {task.path}: {where}/Dockerfile line {number}: FROM {image} "
                    "uses a build argument; agentrl cannot check it offline: pass --env-kwarg "
                    f"base_image={DEFAULT_IMAGE} (or another local image) to re-base it")
            if image.lower() != "scratch" and image not in stages:
                if base_image:
                    lines[number - 1] = f"FROM {base_image}" + (f" AS {stage}" if stage else "")
                    image = base_image
                _ensure_present(client, task, f"{where}/Dockerfile line {number}", image)
            if stage:
                stages.add(stage)
        if not stages and not from_lines(text):
            raise HarborImageError(f"Harbor task {task.path}: {where}/Dockerfile has no FROM line")
        text = "\n".join(lines) + "\n"
    if not source.seed:
        return text + f"LABEL agentrl.harbor.task={_label(task.name)}\n"
    workdir = f'"{source.workdir}"' if source.workdir else '"$PWD"'
    return text + (
        "USER root\n"
        f"RUN d={workdir}; mkdir -p {SEED_DIR} && if [ \"$d\" != / ] && [ -d \"$d\" ]; then "
        f"cp -R \"$d\"/. {SEED_DIR}/; fi && chmod -R a+rX {SEED_DIR}\n"
        f"LABEL agentrl.harbor.task={_label(task.name)}\n"
    )


def _label(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _build(client: Any, source: ImageSource, tag: str, base_image: str | None, network: str) -> bool:
    """Builds ``tag`` unless the daemon has it; True when it built."""
    task = source.task
    import docker.errors

    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(tag, threading.Lock())
    with lock:
        if client.images.list(name=tag):
            return False  # built before (by this process or an earlier one)
        dockerfile = _dockerfile(client, source, base_image)
        with tempfile.TemporaryDirectory(prefix="agentrl-harbor-build-") as context:
            if source.context_dir.is_dir():
                shutil.copytree(source.context_dir, context, dirs_exist_ok=True, symlinks=True)
            name = ".agentrl.Dockerfile"
            Path(context, name).write_text(dockerfile, encoding="utf-8")
            try:
                client.images.build(path=context, dockerfile=name, tag=tag, rm=True,
                                    forcerm=True, pull=False, network_mode=network)
            except docker.errors.BuildError as exc:
                log = "".join(str(c.get("stream") or c.get("error") or "") for c in exc.build_log)
                raise HarborImageError(
                    f"Harbor task {task.path}: building {source.context_label}/Dockerfile failed: {exc.msg}; "
                    f"the build log ends with: {log.strip()[-800:]}") from exc
            except docker.errors.APIError as exc:
                raise HarborImageError(f"Harbor task {task.path}: docker build failed: {exc}") from exc
        return True


def image_workdir(client: Any, image: HarborTask | ImageSource, tag: str) -> str:
    """The image's working directory: its table's ``workdir``, else the image's WORKDIR."""
    source = _source(image)
    if source.workdir:
        return source.workdir
    return client.images.get(tag).attrs.get("Config", {}).get("WorkingDir") or "/"


async def ensure_task_image(
    client: Any, task: HarborTask | ImageSource, *, base_image: str | None = None, network: str = "none"
) -> TaskImage:
    """Builds ``task``'s image (or the image of an :class:`ImageSource`) unless the daemon has
    it (at most one build per tag at a time in this process), within its
    ``build_timeout_sec``.

    Raises:
        HarborImageError: see the class.
    """
    source = _source(task)
    tag = image_tag(source, base_image)
    start = time.perf_counter()
    work = asyncio.to_thread(_build, client, source, tag, base_image, network)
    try:
        built = await asyncio.wait_for(work, source.build_timeout_s)
    except TimeoutError:
        table = "verifier.environment" if source.role else "environment"
        raise HarborImageError(
            f"Harbor task {source.task.path}: the image did not build within {source.build_timeout_s:g} s "
            f"(task.toml: {table}.build_timeout_sec)") from None
    workdir = await asyncio.to_thread(image_workdir, client, source, tag)
    return TaskImage(tag, workdir, built, time.perf_counter() - start)
