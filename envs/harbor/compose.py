"""Multi-container Harbor environments (``environment/docker-compose.yaml``), run by agentrl.

Harbor starts a task's compose project with ``docker compose up --wait``: the agent's service
is ``main``, the others are the task's services, and all of them share the project's network,
where each is reached by its service name. agentrl runs the same project with the Docker API
(no compose CLI is needed), with its own sandbox as ``main``:

* :func:`read_compose` reads the file when the task is loaded and refuses, naming the service
  and key, what it does not run: host binds and volumes, ``privileged``, added capabilities,
  devices, other network or namespace modes, published ports, variable interpolation.
* :class:`ComposeProject` starts an episode's services on a private Docker network of their
  own (``internal``: no way out of it), in ``depends_on`` order, waiting for each to run, to be
  healthy when it has a healthcheck (its own or its image's), or to finish with status 0 for
  ``condition: service_completed_successfully``; ``main`` (the episode's sandbox) then joins
  the network as ``main``. Images are built offline like the task's own (``build:``) or must
  be on the daemon (``image:``). :meth:`ComposeProject.close` removes the containers and the
  network; they carry agentrl's owner labels, so a killed run's are reclaimed as its sandboxes
  are.

``main`` takes ``environment`` (added to the sandbox's variables) and ``depends_on`` (what the
episode waits for; every service is waited for anyway, as ``--wait`` does); its image is the
task's ``environment/Dockerfile``, so a ``build`` other than the task's folder, an ``image``,
or a ``command`` is refused.

A few keys are accepted with no effect, each for a reason: ``expose`` (documentation in compose
too), ``container_name`` and ``hostname`` (a service is named per episode, and its service
name is its host name), ``restart`` (a service that stops fails the episode instead), and
``stop_grace_period`` (services are removed by force when the episode ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MAIN = "main"
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml")
SERVICE_KEYS = {"image", "build", "command", "entrypoint", "environment", "healthcheck",
                "depends_on", "working_dir", "user", "expose", "container_name", "restart",
                "labels", "tty", "stdin_open", "hostname", "stop_grace_period"}
MAIN_KEYS = {"build", "image", "environment", "depends_on", "expose"}
CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")
WAIT_S = 300.0
_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)")
_UNITS = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9}


class ComposeError(ValueError):
    """A compose file agentrl cannot run; the message names the service and the key."""


@dataclasses.dataclass(frozen=True)
class Service:
    """One service of the project other than ``main``.

    Attributes:
        name: Its service name (its host name on the project's network).
        image: A local image to run (None: ``build``).
        build_context: The folder its image is built from (``build:``), under ``environment/``.
        dockerfile: The Dockerfile's name in ``build_context``.
        command, entrypoint: Overrides of the image's (None: the image's own).
        environment: Its variables.
        healthcheck: Docker's healthcheck (``test``, and durations in nanoseconds); None: the
            image's own, if any.
        depends_on: Service name -> condition it waits for before starting.
        working_dir, user: Overrides of the image's.
    """

    name: str
    image: str | None
    build_context: Path | None
    dockerfile: str
    command: list[str] | str | None
    entrypoint: list[str] | str | None
    environment: Mapping[str, str]
    healthcheck: Mapping[str, Any] | None
    depends_on: Mapping[str, str]
    working_dir: str | None
    user: str | None
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tty: bool = False
    stdin_open: bool = False


@dataclasses.dataclass(frozen=True)
class ComposeSpec:
    """A task's compose project: ``main``'s variables and dependencies, and the services."""

    file: Path
    main_environment: Mapping[str, str]
    main_depends_on: Mapping[str, str]
    services: tuple[Service, ...]


def compose_file(environment_dir: Path) -> Path | None:
    """The task's compose file, if it has one."""
    for name in COMPOSE_FILES:
        if (environment_dir / name).is_file():
            return environment_dir / name
    return None


def read_compose(file: Path) -> ComposeSpec:
    """Reads ``file`` (see the module docstring for what is run and what is refused).

    Raises:
        ComposeError: The file is not YAML, or asks for something agentrl does not run.
    """
    import yaml

    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ComposeError(f"{file.name} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict) or not data["services"]:
        raise ComposeError(f"{file.name}: needs a 'services' mapping")
    for key in data:
        if key not in ("services", "version", "name"):
            raise ComposeError(f"{file.name}: top-level {key!r} is not supported (agentrl runs "
                               "'services' on a private network of its own)")
    raw = data["services"]
    if MAIN not in raw:
        raise ComposeError(f"{file.name}: services: the agent's service must be named 'main'")
    services = []
    for name, body in raw.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ComposeError(f"{file.name}: services: {name!r} is not a service name")
        body = body or {}
        if not isinstance(body, dict):
            raise ComposeError(f"{file.name}: services.{name}: must be a mapping")
        where = f"{file.name}: services.{name}"
        allowed = MAIN_KEYS if name == MAIN else SERVICE_KEYS
        for key in body:
            if key not in allowed:
                raise ComposeError(f"{where}.{key}: {_refusal(name, key)}")
        body = _literal(body, where)
        depends = _depends_on(body.get("depends_on"), f"{where}.depends_on", set(raw))
        environment = _environment(body.get("environment"), f"{where}.environment")
        if name == MAIN:
            _check_main(body, where)
            main_environment, main_depends = environment, depends
            continue
        image, context, dockerfile = body.get("image"), None, "Dockerfile"
        if body.get("build") is not None:
            context_rel, dockerfile = _build(body["build"], where)
            context = (file.parent / context_rel).resolve()
            if file.parent.resolve() not in (context, *context.parents):
                raise ComposeError(f"{where}.build: {context_rel!r} leaves environment/")
            if not (context / dockerfile).is_file():
                raise ComposeError(f"{where}.build: {context_rel}/{dockerfile} is missing")
            image = None
        elif not isinstance(image, str) or not image:
            raise ComposeError(f"{where}: needs 'image' (a local image) or 'build'")
        services.append(Service(
            name=name, image=image, build_context=context, dockerfile=dockerfile,
            command=_argv(body.get("command"), f"{where}.command"),
            entrypoint=_argv(body.get("entrypoint"), f"{where}.entrypoint"),
            environment=environment, healthcheck=_healthcheck(body.get("healthcheck"), f"{where}.healthcheck"),
            depends_on=depends, working_dir=_string(body, "working_dir", where),
            user=None if body.get("user") is None else str(body["user"]),
            labels=_environment(body.get("labels"), f"{where}.labels"),
            tty=bool(body.get("tty", False)), stdin_open=bool(body.get("stdin_open", False))))
    _acyclic({s.name: s.depends_on for s in services}, file)
    return ComposeSpec(file, main_environment, main_depends, tuple(services))


def _refusal(service: str, key: str) -> str:
    if service == MAIN:
        return ("not supported on 'main', which is agentrl's sandbox built from "
                "environment/Dockerfile (main takes environment, depends_on)")
    if key in ("volumes", "volumes_from", "tmpfs"):
        return "volumes and host binds are not supported: put the files in the service's image"
    if key in ("privileged", "cap_add", "devices", "security_opt", "sysctls", "userns_mode"):
        return "extra privileges are not granted to a task's services"
    if key in ("network_mode", "networks", "pid", "ipc", "extra_hosts", "dns", "links"):
        return "the services share one private network of agentrl's, where each is its service name"
    if key == "ports":
        return "no port is published on the host: the services reach each other by name ('expose' is fine)"
    return f"not supported (agentrl runs {sorted(SERVICE_KEYS)})"


def _literal(value: Any, where: str) -> Any:
    """``value`` with compose's ``$$`` escapes undone; a ``$VAR`` / ``${VAR}`` left to
    interpolate is refused (agentrl does not read variables of the host into a task)."""
    if isinstance(value, str):
        text = value.replace("$$", "\0")
        if re.search(r"\$(\{|[A-Za-z_])", text):
            raise ComposeError(f"{where}: variable interpolation ({value!r}) is not supported; "
                               "write $$ for a literal $")
        return text.replace("\0", "$")
    if isinstance(value, dict):
        return {key: _literal(item, where) for key, item in value.items()}
    if isinstance(value, list):
        return [_literal(item, where) for item in value]
    return value


def _build(build: Any, where: str) -> tuple[str, str]:
    """A service's ``build``: a context path, or ``{context, dockerfile}``."""
    if isinstance(build, str):
        return build, "Dockerfile"
    if not isinstance(build, dict):
        raise ComposeError(f"{where}.build: must be a path or a mapping of context and dockerfile")
    extra = set(build) - {"context", "dockerfile"}
    if extra:
        raise ComposeError(f"{where}.build: {sorted(extra)[0]!r} is not supported (context and dockerfile are)")
    context, dockerfile = build.get("context", "."), build.get("dockerfile", "Dockerfile")
    if not isinstance(context, str) or not isinstance(dockerfile, str):
        raise ComposeError(f"{where}.build: context and dockerfile must be strings")
    return context, dockerfile


def _check_main(body: Mapping[str, Any], where: str) -> None:
    if body.get("build") is not None and _build(body["build"], where) not in (
            (".", "Dockerfile"), ("./", "Dockerfile")):
        raise ComposeError(f"{where}.build: main is built from environment/Dockerfile; other contexts "
                           "are not supported")
    if body.get("image") is not None:
        raise ComposeError(f"{where}.image: main is agentrl's sandbox built from environment/Dockerfile "
                           "(set [environment].docker_image for a prebuilt image)")


def _string(body: Mapping[str, Any], key: str, where: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise ComposeError(f"{where}.{key}: must be a string")
    return value


def _argv(value: Any, where: str) -> list[str] | str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise ComposeError(f"{where}: must be a string or a list of strings")


def _environment(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, list):
        out = {}
        for item in value:
            if not isinstance(item, str) or "=" not in item:
                raise ComposeError(f"{where}: {item!r} is not NAME=value")
            key, _, val = item.partition("=")
            out[key] = val
        return out
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in value.items()}
    raise ComposeError(f"{where}: must be a mapping or a list of NAME=value")


def _depends_on(value: Any, where: str, names: set[str]) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, list):
        value = {name: {} for name in value}
    if not isinstance(value, dict):
        raise ComposeError(f"{where}: must be a list or a mapping of services")
    out = {}
    for name, spec in value.items():
        if name not in names or name == MAIN:
            raise ComposeError(f"{where}: {name!r} is not another service of the file")
        condition = (spec or {}).get("condition", "service_started") if isinstance(spec, dict) else None
        if condition not in CONDITIONS:
            raise ComposeError(f"{where}.{name}: condition must be one of {CONDITIONS}")
        out[name] = condition
    return out


def _duration_ns(value: Any, where: str) -> int:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value * 1e9)
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ComposeError(f"{where}: {value!r} is not a duration (like 5s, 1m30s, 500ms)")
    return int(sum(float(n) * _UNITS[u] for n, u in parts))


def _healthcheck(value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ComposeError(f"{where}: must be a mapping")
    if value.get("disable"):
        return {"test": ["NONE"]}
    test = value.get("test")
    if isinstance(test, str):
        test = ["CMD-SHELL", test]
    if not (isinstance(test, list) and test and test[0] in ("CMD", "CMD-SHELL", "NONE")
            and all(isinstance(t, str) for t in test)):
        raise ComposeError(f"{where}.test: must be a command string or a list starting CMD / CMD-SHELL")
    check: dict[str, Any] = {"test": test}
    for key, field in (("interval", "interval"), ("timeout", "timeout"), ("start_period", "start_period"),
                       ("start_interval", "start_interval")):
        if key in value:
            check[field] = _duration_ns(value[key], f"{where}.{key}")
    if "retries" in value:
        if not isinstance(value["retries"], int) or value["retries"] < 0:
            raise ComposeError(f"{where}.retries: must be a whole number")
        check["retries"] = value["retries"]
    return check


def _acyclic(graph: Mapping[str, Mapping[str, str]], file: Path) -> None:
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            raise ComposeError(f"{file.name}: depends_on has a cycle: {' -> '.join((*path, name))}")
        if name in done:
            return
        for dep in graph.get(name, {}):
            visit(dep, (*path, name))
        done.add(name)

    for name in graph:
        visit(name, ())


def start_order(spec: ComposeSpec) -> list[Service]:
    """The services in an order where each comes after what it depends on."""
    by_name = {s.name: s for s in spec.services}
    order: list[Service] = []

    def add(service: Service) -> None:
        if service in order:
            return
        for dep in service.depends_on:
            add(by_name[dep])
        order.append(service)

    for service in spec.services:
        add(service)
    return order


class ComposeProject:
    """One episode's services (see the module docstring).

    Args:
        client: The Docker client.
        spec: The task's compose project.
        images: Service name -> the image tag to run (built or local).
        labels: Labels of every container and of the network (agentrl's owner labels).
    """

    def __init__(self, client: Any, spec: ComposeSpec, images: Mapping[str, str],
                 labels: Mapping[str, str]) -> None:
        self.client, self.spec, self.images, self.labels = client, spec, dict(images), dict(labels)
        self.network_name = f"agentrl-compose-{secrets.token_hex(6)}"
        self.containers: dict[str, Any] = {}
        self._network: Any = None

    async def start(self, wait_s: float = WAIT_S) -> None:
        """Creates the network and starts every service, each once what it depends on is
        ready; returns when all are ready.

        Raises:
            ComposeError: A service could not start, exited, or was not ready in ``wait_s``
                (the message names it and ends with its log).
        """
        import docker.errors

        try:
            self._network = await asyncio.to_thread(
                self.client.networks.create, self.network_name, driver="bridge", internal=True,
                labels=self.labels)
            deadline = time.monotonic() + wait_s
            for service in start_order(self.spec):
                for dep, condition in service.depends_on.items():
                    await self._ready(dep, condition, deadline)
                self.containers[service.name] = await asyncio.to_thread(self._run, service)
            for service in self.spec.services:  # as `up --wait`: all of them
                condition = ("service_completed_successfully"
                             if any(s.depends_on.get(service.name) == "service_completed_successfully"
                                    for s in self.spec.services) else "service_healthy")
                await self._ready(service.name, condition, deadline)
        except docker.errors.DockerException as exc:
            await self.close()
            raise ComposeError(f"{self.spec.file.name}: cannot start the services: {exc}") from exc
        except BaseException:
            await self.close()
            raise

    def _run(self, service: Service) -> Any:
        name = f"{self.network_name}-{service.name}"
        container = self.client.containers.create(
            self.images[service.name], command=service.command, entrypoint=service.entrypoint,
            environment=dict(service.environment), healthcheck=service.healthcheck, name=name,
            hostname=service.name, working_dir=service.working_dir, user=service.user,
            labels={**service.labels, **self.labels, "agentrl.container": name,
                    "agentrl.compose.service": service.name},
            tty=service.tty, stdin_open=service.stdin_open, network=self.network_name, detach=True)
        # the service's name is its address on the network (create() cannot set aliases)
        self._network.disconnect(container)
        self._network.connect(container, aliases=[service.name])
        container.start()
        return container

    async def _ready(self, name: str, condition: str, deadline: float) -> None:
        """Waits until service ``name`` meets ``condition`` (``service_healthy`` falls back to
        running for a service without a healthcheck)."""
        container = self.containers[name]
        while True:
            await asyncio.to_thread(container.reload)
            state = container.attrs.get("State", {})
            status, health = state.get("Status"), (state.get("Health") or {}).get("Status")
            if condition == "service_completed_successfully":
                if status == "exited":
                    if state.get("ExitCode") == 0:
                        return
                    raise ComposeError(self._failure(name, container, f"exited with {state.get('ExitCode')}"))
            elif status in ("exited", "dead"):
                raise ComposeError(self._failure(name, container, f"exited with {state.get('ExitCode')}"))
            elif status == "running" and (condition == "service_started" or health in (None, "healthy")):
                return
            elif health == "unhealthy":
                raise ComposeError(self._failure(name, container, "is unhealthy"))
            if time.monotonic() > deadline:
                raise ComposeError(self._failure(name, container, f"was not ready ({status}, health "
                                                 f"{health}) within {WAIT_S:g} s"))
            await asyncio.sleep(0.2)

    def _failure(self, name: str, container: Any, what: str) -> str:
        try:
            log = container.logs(tail=20).decode("utf-8", "replace").strip()
        except Exception:  # noqa: BLE001 - the log is only added to the message
            log = ""
        checks = (container.attrs.get("State", {}).get("Health") or {}).get("Log") or []
        if checks:
            log += " | last healthcheck: " + str(checks[-1].get("Output", "")).strip()[-300:]
        return f"{self.spec.file.name}: service {name!r} {what}; its log ends with: {log[-800:]}"

    async def close(self) -> None:
        """Removes the services and the network (idempotent)."""
        import docker.errors

        containers, self.containers = list(self.containers.values()), {}
        network, self._network = self._network, None
        # containers first: a network with a container on it cannot be removed. What is already
        # gone (removed by hand, or reaped) is what close() wants anyway.
        for container in containers:
            with contextlib.suppress(docker.errors.NotFound):
                await asyncio.to_thread(container.remove, force=True)
        if network is not None:
            with contextlib.suppress(docker.errors.NotFound):
                await asyncio.to_thread(network.remove)


def owner_labels() -> dict[str, str]:
    """The labels that let agentrl's reaper remove an episode's services after a kill."""
    from agentrl.sandbox._docker_api import OWNER_LABEL, SANDBOX_LABEL

    return {SANDBOX_LABEL: "1", OWNER_LABEL: str(os.getpid()), "agentrl.backend": "harbor-compose"}
