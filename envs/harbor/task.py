"""Harbor task directories, read with :mod:`tomllib` against Harbor's task schema 1.x.

A task directory holds::

    task.toml              the configuration (schema 1.x, see HarborTask for what is read)
    instruction.md         the prompt
    environment/Dockerfile the image (or [environment].docker_image: a local image)
    tests/test.sh          the verifier; writes /logs/verifier/reward.txt or reward.json
    solution/solve.sh      the oracle (optional)

The ``harbor`` package itself needs Python >= 3.12, so this module reads the documented schema
itself; ``tests/integration/test_harbor_schema.py`` loads every shipped task with Harbor's own
``Task`` model as a cross-check. What agentrl cannot honour (multi-step tasks, docker-compose
environments, a separate verifier image, Windows, GPUs) is refused with an error naming the task
and the field, never ignored.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.errors import DataError

SHIPPED_TASKS = Path(__file__).parent / "tasks"
"""The folder of Harbor tasks written for agentrl (``harbor-v0``'s default ``path``)."""
SCHEMA_MAJOR = "1"
DEFAULT_SCHEMA = "1.4"
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*$")
NETWORK_MODES = ("no-network", "public", "allowlist")
MCP_TRANSPORTS = ("stdio", "sse", "streamable-http")
_CANARY = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)


class HarborTaskError(DataError):
    """A Harbor task directory cannot be used: a missing file, a malformed ``task.toml``, an
    unknown schema version or a feature agentrl does not run. The message names the task
    directory, the file and the field."""


@dataclasses.dataclass(frozen=True)
class McpServerEntry:
    """One ``[[environment.mcp_servers]]`` entry: ``name``, ``transport`` (``stdio``, ``sse``
    or ``streamable-http``), ``url`` (HTTP) or ``command`` + ``args`` (stdio), ``headers``."""

    name: str
    transport: str
    url: str | None = None
    command: str | None = None
    args: tuple[str, ...] = ()
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class HarborTask:
    """One Harbor task, as read from its directory.

    Attributes:
        path: The task directory.
        name: ``[task].name`` (``org/name``), else the directory's name.
        version: ``[task].version``.
        schema_version: ``schema_version`` (``1.x``).
        description: ``[task].description``.
        instruction: ``instruction.md`` with Harbor's leading canary lines removed.
        agent_timeout_s: ``[agent].timeout_sec``: the agent's wall-clock budget (None: none).
        verifier_timeout_s: ``[verifier].timeout_sec`` (Harbor's default 600).
        verifier_env: ``[verifier].env``: the environment of ``tests/test.sh``.
        build_timeout_s: ``[environment].build_timeout_sec`` (default 600).
        docker_image: ``[environment].docker_image``: a prebuilt image instead of a Dockerfile.
        cpus, memory_mb, storage_mb: ``[environment]`` resources (None: agentrl's defaults).
        network_mode: ``no-network``, ``public`` or ``allowlist``; Harbor's default is
            ``public`` (``network_mode_set`` says whether the task asked explicitly).
        workdir: ``[environment].workdir`` (None: the image's WORKDIR).
        env: ``[environment].env``: variables of the agent's commands.
        solution_env: ``[solution].env``: variables of the oracle's ``solve.sh``.
        mcp_servers: ``[environment].mcp_servers``.
        metadata: ``[metadata]``.
    """

    path: Path
    name: str
    version: str | None
    schema_version: str
    description: str
    instruction: str
    agent_timeout_s: float | None
    verifier_timeout_s: float
    verifier_env: Mapping[str, str]
    build_timeout_s: float
    docker_image: str | None
    cpus: float | None
    memory_mb: int | None
    storage_mb: int | None
    network_mode: str
    network_mode_set: bool
    workdir: str | None
    env: Mapping[str, str]
    solution_env: Mapping[str, str]
    mcp_servers: tuple[McpServerEntry, ...]
    metadata: Mapping[str, Any]

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"

    @property
    def has_solution(self) -> bool:
        return (self.solution_dir / "solve.sh").is_file()

    def row(self) -> dict[str, Any]:
        """The task as a JSON row for data sources and trajectories (``id`` is its name)."""
        return {"id": self.name, "path": str(self.path), "instruction": self.instruction}


class _Reader:
    """Typed access to one table of a task.toml, with errors that name the field."""

    def __init__(self, task_dir: Path, table: Mapping[str, Any], prefix: str) -> None:
        self.task_dir, self.table, self.prefix = task_dir, table, prefix

    def fail(self, key: str, problem: str) -> HarborTaskError:
        field = f"{self.prefix}.{key}" if self.prefix else key
        return HarborTaskError(f"Harbor task {self.task_dir}: task.toml: {field}: {problem}")

    def sub(self, key: str) -> _Reader:
        value = self.table.get(key, {})
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a table, not {type(value).__name__}")
        return _Reader(self.task_dir, value, f"{self.prefix}.{key}" if self.prefix else key)

    def string(self, key: str, default: str | None = None) -> str | None:
        value = self.table.get(key, default)
        if value is not None and not isinstance(value, str):
            raise self.fail(key, f"must be a string, not {value!r}")
        return value

    def number(self, key: str, default: float | None, *, integer: bool = False) -> Any:
        value = self.table.get(key, default)
        if value is None:
            return None
        ok = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok or not math.isfinite(value) or value <= 0:
            kind = "a positive integer" if integer else "a positive number"
            raise self.fail(key, f"must be {kind}, not {value!r}")
        return value

    def strings(self, key: str) -> dict[str, str]:
        value = self.table.get(key, {})
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise self.fail(key, "must be a table of string values")
        return dict(value)

    def refuse(self, key: str, unsupported: str, why: str) -> None:
        value = self.table.get(key)
        if isinstance(value, str) and value.lower() == unsupported:
            raise self.fail(key, why)


def load_task(task_dir: str | Path) -> HarborTask:
    """Reads one Harbor task directory.

    Raises:
        HarborTaskError: A missing or malformed file or field, an unknown schema version
            (agentrl reads 1.x), or a feature agentrl does not run.
    """
    path = Path(task_dir).resolve()
    config_path = path / "task.toml"
    if not config_path.is_file():
        raise HarborTaskError(f"Harbor task {path}: task.toml is missing (a task directory holds "
                              "task.toml, instruction.md, environment/, tests/test.sh)")
    try:
        data = tomllib.loads(config_path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise HarborTaskError(f"Harbor task {path}: task.toml is not valid TOML: {exc}") from exc
    root = _Reader(path, data, "")
    schema = data.get("schema_version", data.get("version", DEFAULT_SCHEMA))
    if not isinstance(schema, str) or schema.split(".")[0] != SCHEMA_MAJOR:
        raise root.fail("schema_version", f"unknown schema version {schema!r}: agentrl reads "
                        f"Harbor task schema {SCHEMA_MAJOR}.x (e.g. {DEFAULT_SCHEMA!r})")
    if data.get("steps"):
        raise root.fail("steps", "multi-step tasks are not supported by agentrl; give the task "
                        "one instruction.md and one tests/ folder")

    meta = root.sub("task")
    name = meta.string("name") if "task" in data else None
    if name is not None and (not NAME_PATTERN.match(name) or ".." in name):
        raise meta.fail("name", f"{name!r} is not in 'org/name' form")
    agent, verifier, environment = root.sub("agent"), root.sub("verifier"), root.sub("environment")
    verifier.refuse("environment_mode", "separate", "a separate verifier environment is not "
                    "supported: agentrl runs tests/test.sh in the agent's container (shared)")
    if "environment" in verifier.table:
        raise verifier.fail("environment", "a separate verifier environment is not supported")
    environment.refuse("os", "windows", "Windows tasks are not supported (linux only)")
    if environment.table.get("gpus"):
        raise environment.fail("gpus", "GPU tasks are not supported by agentrl's Docker sandbox")

    network_set = "network_mode" in environment.table or "allow_internet" in environment.table
    network = environment.string("network_mode")
    if network is None:
        legacy = environment.table.get("allow_internet")
        if legacy is not None and not isinstance(legacy, bool):
            raise environment.fail("allow_internet", f"must be true or false, not {legacy!r}")
        network = "no-network" if legacy is False else "public"
    if network not in NETWORK_MODES:
        raise environment.fail("network_mode", f"{network!r} is not one of {NETWORK_MODES}")
    workdir = environment.string("workdir")
    if workdir is not None and not workdir.startswith("/"):
        raise environment.fail("workdir", f"must be an absolute path, not {workdir!r}")

    docker_image = environment.string("docker_image")
    if docker_image is None:
        env_dir = path / "environment"
        if (env_dir / "docker-compose.yaml").is_file() or (env_dir / "docker-compose.yml").is_file():
            raise HarborTaskError(f"Harbor task {path}: environment/docker-compose.yaml: multi-"
                                  "container environments are not supported; give one Dockerfile")
        if not (env_dir / "Dockerfile").is_file():
            raise HarborTaskError(f"Harbor task {path}: environment/Dockerfile is missing (or set "
                                  "[environment].docker_image to a local image)")
    if not (path / "tests" / "test.sh").is_file():
        raise HarborTaskError(f"Harbor task {path}: tests/test.sh is missing (the verifier)")
    instruction_path = path / "instruction.md"
    if not instruction_path.is_file():
        raise HarborTaskError(f"Harbor task {path}: instruction.md is missing (the prompt)")
    instruction = _strip_canary(instruction_path.read_text(encoding="utf-8")).strip()
    if not instruction:
        raise HarborTaskError(f"Harbor task {path}: instruction.md is empty")

    return HarborTask(
        path=path,
        name=name or path.name,
        version=meta.string("version"),
        schema_version=schema,
        description=meta.string("description", "") or "",
        instruction=instruction,
        agent_timeout_s=agent.number("timeout_sec", None),
        verifier_timeout_s=float(verifier.number("timeout_sec", 600.0)),
        verifier_env=verifier.strings("env"),
        build_timeout_s=float(environment.number("build_timeout_sec", 600.0)),
        docker_image=docker_image,
        cpus=environment.number("cpus", None),
        memory_mb=environment.number("memory_mb", None, integer=True),
        storage_mb=environment.number("storage_mb", None, integer=True),
        network_mode=network,
        network_mode_set=network_set,
        workdir=workdir,
        env=environment.strings("env"),
        solution_env=root.sub("solution").strings("env"),
        mcp_servers=_mcp_servers(environment),
        metadata=dict(root.sub("metadata").table),
    )


def _mcp_servers(environment: _Reader) -> tuple[McpServerEntry, ...]:
    entries = environment.table.get("mcp_servers", [])
    if not isinstance(entries, list):
        raise environment.fail("mcp_servers", "must be an array of tables ([[environment.mcp_servers]])")
    out: list[McpServerEntry] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise environment.fail(f"mcp_servers[{i}]", "must be a table")
        item = _Reader(environment.task_dir, entry, f"{environment.prefix}.mcp_servers[{i}]")
        name = item.string("name")
        if not name:
            raise item.fail("name", "is required")
        transport = item.string("transport", "sse")
        transport = "streamable-http" if transport == "http" else transport
        if transport not in MCP_TRANSPORTS:
            raise item.fail("transport", f"{transport!r} is not one of {MCP_TRANSPORTS}")
        url, command = item.string("url"), item.string("command")
        if transport != "stdio" and not url:
            raise item.fail("url", f"is required for transport {transport!r}")
        if transport == "stdio" and not command:
            raise item.fail("command", "is required for transport 'stdio'")
        args = entry.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise item.fail("args", "must be an array of strings")
        out.append(McpServerEntry(name, transport, url, command, tuple(args), item.strings("headers")))
    if len({e.name for e in out}) != len(out):
        raise environment.fail("mcp_servers", "two servers have the same name")
    return tuple(out)


def load_tasks(path: str | Path) -> list[HarborTask]:
    """The tasks at ``path``: one task directory, or a folder whose subdirectories holding a
    ``task.toml`` are tasks; sorted by name.

    Raises:
        HarborTaskError: ``path`` is neither, a task is invalid, or two tasks share a name.
    """
    root = Path(path).expanduser()
    if not root.is_dir():
        raise HarborTaskError(f"Harbor tasks: {root} is not a directory (--env-kwarg path= takes a "
                              "task directory or a folder of them)")
    if (root / "task.toml").is_file():
        return [load_task(root)]
    tasks = [load_task(d) for d in sorted(root.iterdir()) if (d / "task.toml").is_file()]
    if not tasks:
        raise HarborTaskError(f"Harbor tasks: no task in {root} (a task directory holds "
                              "task.toml; a folder of tasks holds such directories)")
    seen: dict[str, Path] = {}
    for task in tasks:
        if task.name in seen:
            raise HarborTaskError(f"Harbor tasks: {seen[task.name]} and {task.path} are both "
                                  f"named {task.name!r} ([task].name)")
        seen[task.name] = task.path
    return sorted(tasks, key=lambda t: t.name)


def _strip_canary(text: str) -> str:
    lines = text.split("\n")
    i = 0
    while i < len(lines) and _CANARY.match(lines[i].strip()):
        i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    return "\n".join(lines[i:])
