"""Harbor task directories, read with :mod:`tomllib` against Harbor's task schema 1.x.

A task directory holds::

    task.toml              the configuration (schema 1.x, see HarborTask for what is read)
    instruction.md         the prompt
    environment/Dockerfile the image (or [environment].docker_image: a local image)
    environment/docker-compose.yaml   more services beside the agent's ``main`` (optional)
    tests/test.sh          the verifier; writes /logs/verifier/reward.txt or reward.json
    solution/solve.sh      the oracle (optional)

A multi-step task (``[[steps]]`` in task.toml) has a folder per step instead of the root
``instruction.md``; each step's ``tests/`` is laid over the root ``tests/`` and its
``solution/`` replaces the root one::

    steps/<name>/instruction.md   the step's prompt
    steps/<name>/tests/test.sh    the step's verifier (else the root tests/test.sh)
    steps/<name>/solution/solve.sh
    steps/<name>/workdir/         copied into the working directory before the step;
                                  its setup.sh, if any, then runs there

The ``harbor`` package itself needs Python >= 3.12, so this module reads the documented schema
itself; ``tests/integration/test_harbor_schema.py`` loads every shipped task with Harbor's own
``Task`` model as a cross-check. What agentrl cannot honour (Windows, GPUs, compose features
outside :mod:`agentrl_envs.harbor.compose`'s subset) is refused with an error naming the task
and the field, never ignored.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
import tomllib
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.errors import DataError
from agentrl_envs.harbor.compose import ComposeError, ComposeSpec, compose_file, read_compose

SHIPPED_TASKS = Path(__file__).parent / "tasks"
"""The folder of Harbor tasks written for agentrl (``harbor-v0``'s default ``path``)."""
SCHEMA_MAJOR = "1"
DEFAULT_SCHEMA = "1.4"
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*$")
NETWORK_MODES = ("no-network", "public", "allowlist")
MCP_TRANSPORTS = ("stdio", "sse", "streamable-http")
REWARD_STRATEGIES = ("mean", "final")
_HOST_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_BAD_STEP_NAME = re.compile(r'[<>:"/\\|?*\x00-\x1f\x7f]')
_DEVICE_NAME = re.compile(r"^(CON|PRN|AUX|NUL|CONIN\$|CONOUT\$|(?:COM|LPT)[1-9¹²³])$", re.IGNORECASE)
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
class NetworkPolicy:
    """What one phase may reach: ``network_mode`` and, for ``allowlist``, ``allowed_hosts``.

    Attributes:
        mode: ``no-network``, ``public`` or ``allowlist``.
        allowed_hosts: With ``allowlist``: hostnames, ``*.suffix`` wildcards, IP addresses and
            CIDR blocks, normalised as Harbor normalises them (lower case, no trailing dot).
    """

    mode: str
    allowed_hosts: tuple[str, ...] = ()


NO_NETWORK = NetworkPolicy("no-network")
ARTIFACTS_DIR = "/logs/artifacts"
"""Harbor's convention folder: whatever the agent leaves here reaches a separate verifier."""


@dataclasses.dataclass(frozen=True)
class Artifact:
    """A path a separate verifier receives from the agent's container (``artifacts``).

    Attributes:
        source: An absolute container path (file or folder), restored at the same path.
        exclude: ``fnmatch`` patterns of members to leave out (matched against every path
            component and the path inside the artifact, as ``tar --exclude`` does).
    """

    source: str
    exclude: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class CollectHook:
    """A ``[[verifier.collect]]`` command, run in the agent's container once its processes
    are stopped and before the artifacts are taken (best effort: a failure is recorded)."""

    command: str
    timeout_s: float = 60.0
    user: str | None = None


@dataclasses.dataclass(frozen=True)
class EnvironmentSettings:
    """The fields of an environment table (``[environment]`` or ``[verifier.environment]``):
    ``docker_image``, ``workdir``, ``build_timeout_sec``, ``cpus``, ``memory_mb``,
    ``storage_mb``, and its ``network`` policy (``network_set``: whether it was given)."""

    docker_image: str | None
    workdir: str | None
    build_timeout_s: float
    cpus: float | None
    memory_mb: int | None
    storage_mb: int | None
    network: NetworkPolicy
    network_set: bool


@dataclasses.dataclass(frozen=True)
class VerifierEnvironment:
    """The environment a verifier runs in when it is separate from the agent's
    (``[verifier].environment_mode = "separate"`` or a ``[verifier.environment]`` table).

    Attributes:
        context_dir: The folder its image is built from: the tests folder when it holds a
            ``Dockerfile`` (the image then holds the tests), else ``environment/``.
        context_label: How messages name that folder (``environment``, ``tests``, ...).
        bundled_tests: The image holds ``/tests`` itself (built from the tests folder, or a
            ``docker_image`` of ``[verifier.environment]``); else the tests are copied in.
        settings: Its ``[verifier.environment]`` (else ``[environment]``), with
            ``docker_image`` the image it runs (None: built from ``context_dir``) and
            ``network`` its baseline (an explicit ``[verifier]`` policy overrides it).
    """

    context_dir: Path
    context_label: str
    bundled_tests: bool
    settings: EnvironmentSettings


@dataclasses.dataclass(frozen=True)
class Healthcheck:
    """A readiness check (``[environment].healthcheck`` or a step's ``healthcheck``), run as
    Docker runs a HEALTHCHECK: ``command`` (exit 0: ready) every ``interval_s``, each within
    ``timeout_s``; failures in the first ``start_period_s`` (checked every
    ``start_interval_s``) do not count; ``retries`` consecutive failures after it fail."""

    command: str
    interval_s: float = 5.0
    timeout_s: float = 30.0
    start_period_s: float = 0.0
    start_interval_s: float = 5.0
    retries: int = 3


@dataclasses.dataclass(frozen=True)
class HarborStep:
    """One step of a task: what the agent is asked, what grades it, what the oracle runs.

    A single-step task has one step, named ``""``, made of the root files and tables; a
    multi-step task has one per ``[[steps]]`` entry, in order, each reading its own table
    first and the task's ``[agent]`` / ``[verifier]`` for what it leaves out.

    Attributes:
        name: ``[[steps]].name`` (its folder under ``steps/``); ``""`` for a single-step task.
        instruction: The step's ``instruction.md``, Harbor's leading canary lines removed.
        tests_dirs: Copied into ``/tests`` in order, later files replacing earlier ones: the
            root ``tests/``, then the step's own.
        solution_dir: ``solution/`` of the step if it has one, else the root one.
        workdir_dir: ``steps/<name>/workdir``: copied into the working directory before the
            step (None: the step has none).
        agent_timeout_s: ``[agent].timeout_sec`` of the step, else of the task (None: none).
        verifier_timeout_s: ``[verifier].timeout_sec`` of the step (a step that leaves it out
            gets Harbor's default, 600, not the task's: Harbor reads it so).
        verifier_env: The task's ``[verifier].env``, updated with the step's.
        min_reward: ``min_reward``: the remaining steps are skipped when the step's rewards fall
            below it (a number gates the ``reward`` entry; a table gates each named entry,
            a missing entry counting as below). None: never skipped.
        agent_network: The agent phase's network: the step's ``[steps.agent]`` policy, else
            the task's ``[agent]``, else the environment's (``[environment]``).
        verifier_network: The verifier phase's, from ``[steps.verifier]`` / ``[verifier]``
            alike (a separate verifier's baseline is its own environment's).
        verifier_environment: Where the verifier runs when separate (None: in the agent's
            container, Harbor's ``shared``).
        artifacts: What a separate verifier receives: the task's ``artifacts``, the step's,
            then ``/logs/artifacts``.
        collect: ``[[verifier.collect]]`` of the task, then of the step.
        healthcheck: The step's ``healthcheck``, run after its ``setup.sh``.
    """

    name: str
    instruction: str
    tests_dirs: tuple[Path, ...]
    solution_dir: Path
    workdir_dir: Path | None
    agent_timeout_s: float | None
    verifier_timeout_s: float
    verifier_env: Mapping[str, str]
    min_reward: float | Mapping[str, float] | None = None
    agent_network: NetworkPolicy = NO_NETWORK
    verifier_network: NetworkPolicy = NO_NETWORK
    verifier_environment: VerifierEnvironment | None = None
    artifacts: tuple[Artifact, ...] = ()
    collect: tuple[CollectHook, ...] = ()
    healthcheck: Healthcheck | None = None

    @property
    def has_solution(self) -> bool:
        return (self.solution_dir / "solve.sh").is_file()

    @property
    def has_setup(self) -> bool:
        return self.workdir_dir is not None and (self.workdir_dir / "setup.sh").is_file()

    def passes(self, rewards: Mapping[str, float]) -> bool:
        """Whether ``rewards`` (the step's verifier's entries) meet :attr:`min_reward`."""
        if self.min_reward is None:
            return True
        gates = ({"reward": self.min_reward} if isinstance(self.min_reward, (int, float))
                 else self.min_reward)
        return all(rewards.get(key, -math.inf) >= floor for key, floor in gates.items())


@dataclasses.dataclass(frozen=True)
class HarborTask:
    """One Harbor task, as read from its directory.

    Attributes:
        path: The task directory.
        name: ``[task].name`` (``org/name``), else the directory's name.
        version: ``[task].version``.
        schema_version: ``schema_version`` (``1.x``).
        description: ``[task].description``.
        instruction: The first step's instruction (``instruction.md`` of a single-step task,
            with Harbor's leading canary lines removed).
        agent_timeout_s: ``[agent].timeout_sec``: the agent's wall-clock budget (None: none).
        verifier_timeout_s: ``[verifier].timeout_sec`` (Harbor's default 600).
        verifier_env: ``[verifier].env``: the environment of ``tests/test.sh``.
        build_timeout_s: ``[environment].build_timeout_sec`` (default 600).
        docker_image: ``[environment].docker_image``: a prebuilt image instead of a Dockerfile.
        cpus, memory_mb, storage_mb: ``[environment]`` resources (None: agentrl's defaults).
        network_mode: ``no-network``, ``public`` or ``allowlist``; Harbor's default is
            ``public`` (``network_mode_set`` says whether the task asked explicitly).
        allowed_hosts: ``[environment].allowed_hosts`` (with ``allowlist``).
        workdir: ``[environment].workdir`` (None: the image's WORKDIR).
        env: ``[environment].env``: variables of the agent's commands.
        solution_env: ``[solution].env``: variables of the oracle's ``solve.sh``.
        mcp_servers: ``[environment].mcp_servers``.
        metadata: ``[metadata]``.
        steps: The steps, in order (one for a single-step task; see :class:`HarborStep`).
        multi_step: Whether task.toml has ``[[steps]]``.
        healthcheck: ``[environment].healthcheck``: run in the agent's container once it is
            filled, before the first step.
        compose: ``environment/docker-compose.yaml``: the services beside ``main`` (see
            :mod:`agentrl_envs.harbor.compose`); None: one container.
        reward_strategy: ``multi_step_reward_strategy``: ``mean`` (Harbor's default: per
            entry, the mean over the steps that were graded, an entry a step lacks counting 0)
            or ``final`` (the last graded step's entries).
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
    allowed_hosts: tuple[str, ...]
    workdir: str | None
    env: Mapping[str, str]
    solution_env: Mapping[str, str]
    mcp_servers: tuple[McpServerEntry, ...]
    metadata: Mapping[str, Any]
    steps: tuple[HarborStep, ...] = ()
    multi_step: bool = False
    reward_strategy: str = "mean"
    compose: ComposeSpec | None = None
    healthcheck: Healthcheck | None = None

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
        """Whether every step has a ``solve.sh`` (the task has an oracle)."""
        return all(step.has_solution for step in self.steps)

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
    raw_steps = data.get("steps")
    if raw_steps is not None and not (isinstance(raw_steps, list)
                                      and all(isinstance(t, dict) for t in raw_steps)):
        raise root.fail("steps", "must be an array of tables ([[steps]])")
    strategy = root.string("multi_step_reward_strategy", "mean")
    if strategy not in REWARD_STRATEGIES:
        raise root.fail("multi_step_reward_strategy", f"{strategy!r} is not one of {REWARD_STRATEGIES}")

    meta = root.sub("task")
    name = meta.string("name") if "task" in data else None
    if name is not None and (not NAME_PATTERN.match(name) or ".." in name):
        raise meta.fail("name", f"{name!r} is not in 'org/name' form")
    agent, verifier, environment = root.sub("agent"), root.sub("verifier"), root.sub("environment")
    settings = _environment(environment)
    baseline = settings.network
    docker_image, workdir = settings.docker_image, settings.workdir
    compose = None
    if (file := compose_file(path / "environment")) is not None:
        try:
            compose = read_compose(file)
        except ComposeError as exc:
            raise HarborTaskError(f"Harbor task {path}: environment/{exc}") from None
    if docker_image is None and not (path / "environment" / "Dockerfile").is_file():
        raise HarborTaskError(f"Harbor task {path}: environment/Dockerfile is missing (or set "
                              "[environment].docker_image to a local image)")
    task_artifacts = _artifacts(root)
    separate = _verifier_environment(path, settings, verifier)
    whole_task = HarborStep(
        name="", instruction="", tests_dirs=(path / "tests",), solution_dir=path / "solution",
        workdir_dir=None, agent_timeout_s=agent.number("timeout_sec", None),
        verifier_timeout_s=float(verifier.number("timeout_sec", 600.0)),
        verifier_env=verifier.strings("env"),
        agent_network=_phase_network(agent) or baseline,
        verifier_network=_phase_network(verifier) or (separate.settings.network if separate else baseline),
        verifier_environment=separate,
        artifacts=(*task_artifacts, Artifact(ARTIFACTS_DIR)) if separate else (),
        collect=_collect(verifier))
    if raw_steps:
        steps = _steps(path, root, raw_steps, whole_task, settings, task_artifacts)
    else:
        if not (path / "tests" / "test.sh").is_file():
            raise HarborTaskError(f"Harbor task {path}: tests/test.sh is missing (the verifier)")
        instruction = _instruction(path / "instruction.md", path, "instruction.md")
        steps = (dataclasses.replace(whole_task, instruction=instruction),)

    return HarborTask(
        path=path,
        name=name or path.name,
        version=meta.string("version"),
        schema_version=schema,
        description=meta.string("description", "") or "",
        instruction=steps[0].instruction,
        agent_timeout_s=whole_task.agent_timeout_s,
        verifier_timeout_s=whole_task.verifier_timeout_s,
        verifier_env=whole_task.verifier_env,
        build_timeout_s=settings.build_timeout_s,
        docker_image=docker_image,
        cpus=settings.cpus,
        memory_mb=settings.memory_mb,
        storage_mb=settings.storage_mb,
        network_mode=baseline.mode,
        network_mode_set=settings.network_set,
        allowed_hosts=baseline.allowed_hosts,
        workdir=workdir,
        env=_literal_env(environment),
        solution_env=root.sub("solution").strings("env"),
        mcp_servers=_mcp_servers(environment),
        metadata=dict(root.sub("metadata").table),
        steps=steps,
        multi_step=bool(raw_steps),
        reward_strategy=strategy,
        compose=compose,
        healthcheck=_healthcheck(environment),
    )


def _literal_env(environment: _Reader) -> dict[str, str]:
    """``[environment].env``: the variables of the agent's container. A ``${VAR}`` value would
    read a variable of this machine into the task, which agentrl never does."""
    env = environment.strings("env")
    for key, value in env.items():
        if "${" in value:
            raise environment.fail(f"env.{key}", f"{value!r} reads a variable of this machine; agentrl "
                                   "passes nothing of the host into a task: write the value itself")
    return env


def _instruction(file: Path, task_dir: Path, shown: str) -> str:
    """The prompt in ``file`` (shown in errors as ``shown``), Harbor's canary lines removed."""
    if not file.is_file():
        raise HarborTaskError(f"Harbor task {task_dir}: {shown} is missing (the prompt)")
    text = _strip_canary(file.read_text(encoding="utf-8")).strip()
    if not text:
        raise HarborTaskError(f"Harbor task {task_dir}: {shown} is empty")
    return text


def _steps(path: Path, root: _Reader, tables: list[dict[str, Any]], whole_task: HarborStep,
           settings: EnvironmentSettings, task_artifacts: tuple[Artifact, ...]) -> tuple[HarborStep, ...]:
    """The ``[[steps]]`` of the task at ``path``, each completed from ``whole_task`` (the
    task-level timeouts, verifier variables and environment, root tests and solution) and
    ``settings`` (the task's ``[environment]``)."""
    steps: list[HarborStep] = []
    seen: dict[str, str] = {}
    for i, table in enumerate(tables):
        item = _Reader(path, table, f"steps[{i}]")
        name = item.string("name")
        if not name:
            raise item.fail("name", "is required (the step's folder under steps/)")
        if (not name.strip() or name in (".", "..") or name.endswith((".", " "))
                or _BAD_STEP_NAME.search(name) or len(name.encode()) > 255
                or _DEVICE_NAME.match(name.partition(".")[0].rstrip(" "))):
            raise item.fail("name", f"{name!r} is not a portable directory name (no path "
                            "separators, control or reserved characters, trailing dots or spaces)")
        key = unicodedata.normalize("NFC", name).casefold()
        if key in seen:
            raise item.fail("name", f"{name!r} repeats step {seen[key]!r} (names are compared "
                            "ignoring case)")
        seen[key] = name
        folder = path / "steps" / name
        shown = f"steps/{name}"
        if not folder.is_dir():
            raise HarborTaskError(f"Harbor task {path}: {shown}/ is missing (the folder of step "
                                  f"{name!r}: instruction.md, tests/, solution/, workdir/)")
        tests = tuple(d for d in (path / "tests", folder / "tests") if d.is_dir())
        if not any((d / "test.sh").is_file() for d in tests):
            raise HarborTaskError(f"Harbor task {path}: {shown}/tests/test.sh is missing, and so "
                                  "is tests/test.sh (the step's verifier)")
        agent, verifier = item.sub("agent"), item.sub("verifier")
        timeout = agent.number("timeout_sec", None)
        separate = _verifier_environment(path, settings, root.sub("verifier"), verifier,
                                         folder / "tests", f"{shown}/tests")
        explicit = _phase_network(verifier)
        artifacts = (*task_artifacts, *_artifacts(item), Artifact(ARTIFACTS_DIR)) if separate else ()
        steps.append(HarborStep(
            name=name,
            instruction=_instruction(folder / "instruction.md", path, f"{shown}/instruction.md"),
            tests_dirs=tests,
            solution_dir=folder / "solution" if (folder / "solution").is_dir() else whole_task.solution_dir,
            workdir_dir=folder / "workdir" if (folder / "workdir").is_dir() else None,
            agent_timeout_s=timeout if timeout is not None else whole_task.agent_timeout_s,
            # Harbor reads a step's verifier timeout from the step's table alone (default 600)
            verifier_timeout_s=float(verifier.number("timeout_sec", 600.0)),
            verifier_env={**whole_task.verifier_env, **verifier.strings("env")},
            min_reward=_min_reward(item),
            agent_network=_phase_network(agent) or whole_task.agent_network,
            verifier_network=explicit or (_phase_network(root.sub("verifier"))
                                          or (separate.settings.network if separate else settings.network)),
            verifier_environment=separate,
            artifacts=artifacts,
            collect=(*whole_task.collect, *_collect(verifier)),
            healthcheck=_healthcheck(item),
        ))
    return tuple(steps)


def _environment(table: _Reader) -> EnvironmentSettings:
    """Reads an environment table; refuses Windows and GPUs."""
    table.refuse("os", "windows", "Windows tasks are not supported (linux only)")
    if table.table.get("gpus"):
        raise table.fail("gpus", "GPU tasks are not supported by agentrl's Docker sandbox")
    network_set = "network_mode" in table.table or "allow_internet" in table.table
    network = table.string("network_mode")
    if network is None:
        legacy = table.table.get("allow_internet")
        if legacy is not None and not isinstance(legacy, bool):
            raise table.fail("allow_internet", f"must be true or false, not {legacy!r}")
        network = "no-network" if legacy is False else "public"
    if network not in NETWORK_MODES:
        raise table.fail("network_mode", f"{network!r} is not one of {NETWORK_MODES}")
    workdir = table.string("workdir")
    if workdir is not None and not workdir.startswith("/"):
        raise table.fail("workdir", f"must be an absolute path, not {workdir!r}")
    return EnvironmentSettings(
        docker_image=table.string("docker_image"), workdir=workdir,
        build_timeout_s=float(table.number("build_timeout_sec", 600.0)),
        cpus=table.number("cpus", None), memory_mb=table.number("memory_mb", None, integer=True),
        storage_mb=table.number("storage_mb", None, integer=True),
        network=NetworkPolicy(network, _allowed_hosts(table, network)), network_set=network_set)


def _verifier_environment(task_dir: Path, settings: EnvironmentSettings, task_verifier: _Reader,
                          step_verifier: _Reader | None = None, step_tests: Path | None = None,
                          step_label: str = "") -> VerifierEnvironment | None:
    """Where a verifier runs, resolved as Harbor resolves it (None: shared, in the agent's
    container). The mode: the step's ``environment_mode``, else separate when the step has a
    ``[steps.verifier.environment]``, else the task's likewise, else shared. The settings:
    the step's verifier environment, else the task's, else ``[environment]``. The image: the
    first of (the step's verifier environment and tests folder, the task's) whose table names a
    ``docker_image`` or whose folder holds a ``Dockerfile`` (the image then holds the tests),
    else ``environment/``."""
    def mode_of(verifier: _Reader) -> str | None:
        mode = verifier.string("environment_mode")
        if mode is not None and mode not in ("shared", "separate"):
            raise verifier.fail("environment_mode", f"{mode!r} is not 'shared' or 'separate'")
        if mode == "shared" and "environment" in verifier.table:
            raise verifier.fail("environment", "a verifier environment needs environment_mode = \"separate\"")
        return mode or ("separate" if "environment" in verifier.table else None)

    mode = (mode_of(step_verifier) if step_verifier is not None else None) or mode_of(task_verifier)
    if mode != "separate":
        return None

    def table_of(verifier: _Reader | None) -> EnvironmentSettings | None:
        if verifier is None or "environment" not in verifier.table:
            return None
        return _environment(verifier.sub("environment"))

    step_env, task_env = table_of(step_verifier), table_of(task_verifier)
    own = step_env or task_env or settings
    candidates = [(task_env, task_dir / "tests", "tests")]
    if step_verifier is not None and step_tests is not None:
        candidates.insert(0, (step_env, step_tests, step_label))
    for env, folder, label in candidates:
        for name in ("docker-compose.yaml", "docker-compose.yml"):
            if (folder / name).is_file():
                raise HarborTaskError(f"Harbor task {task_dir}: {label}/{name}: a multi-container "
                                      "verifier environment is not supported; give it a Dockerfile")
        if env is not None and env.docker_image:
            context, label_, bundled, image = folder, label, True, env.docker_image
            break
        if (folder / "Dockerfile").is_file():
            context, label_, bundled, image = folder, label, True, None
            break
    else:
        context, label_, bundled, image = task_dir / "environment", "environment", False, settings.docker_image
    return VerifierEnvironment(context_dir=context, context_label=label_, bundled_tests=bundled,
                               settings=dataclasses.replace(own, docker_image=image))


def _artifacts(table: _Reader) -> tuple[Artifact, ...]:
    """The ``artifacts`` of a task or step table: paths, or ``{source, exclude}`` tables."""
    entries = table.table.get("artifacts", [])
    if not isinstance(entries, list):
        raise table.fail("artifacts", "must be an array of paths or tables")
    out = []
    for i, entry in enumerate(entries):
        item = _Reader(table.task_dir, entry if isinstance(entry, dict) else {}, f"{table.prefix}.artifacts[{i}]"
                       if table.prefix else f"artifacts[{i}]")
        source = entry if isinstance(entry, str) else item.string("source")
        if not isinstance(source, str) or not source:
            raise item.fail("source", "is required (an absolute path in the agent's container)")
        if not source.startswith("/") or ".." in source.split("/"):
            raise item.fail("source", f"{source!r} must be an absolute path without '..'")
        if isinstance(entry, dict) and entry.get("service") not in (None, "main"):
            raise item.fail("service", "artifacts of another compose service are not supported")
        exclude = entry.get("exclude", []) if isinstance(entry, dict) else []
        if not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude):
            raise item.fail("exclude", "must be an array of patterns")
        out.append(Artifact(source.rstrip("/") or "/", tuple(exclude)))
    return tuple(out)


def _healthcheck(table: _Reader) -> Healthcheck | None:
    """The ``healthcheck`` table of ``[environment]`` or of a step."""
    if "healthcheck" not in table.table:
        return None
    check = table.sub("healthcheck")
    command = check.string("command")
    if not command:
        raise check.fail("command", "is required (a shell command; exit 0 means ready)")
    retries = check.table.get("retries", 3)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 1:
        raise check.fail("retries", f"must be a positive integer, not {retries!r}")
    start = check.table.get("start_period_sec", 0.0)
    if isinstance(start, bool) or not isinstance(start, (int, float)) or start < 0:
        raise check.fail("start_period_sec", f"must be a number >= 0, not {start!r}")
    return Healthcheck(command, float(check.number("interval_sec", 5.0)), float(check.number("timeout_sec", 30.0)),
                       float(start), float(check.number("start_interval_sec", 5.0)), retries)


def _collect(verifier: _Reader) -> tuple[CollectHook, ...]:
    entries = verifier.table.get("collect", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise verifier.fail("collect", "must be an array of tables ([[verifier.collect]])")
    hooks = []
    for i, entry in enumerate(entries):
        item = _Reader(verifier.task_dir, entry, f"{verifier.prefix}.collect[{i}]")
        command = item.string("command")
        if not command:
            raise item.fail("command", "is required")
        if item.string("service", "main") != "main":
            raise item.fail("service", "collect hooks in another compose service are not supported")
        user = entry.get("user")
        if user is not None and not isinstance(user, (str, int)):
            raise item.fail("user", f"must be a name or a uid, not {user!r}")
        hooks.append(CollectHook(command, float(item.number("timeout_sec", 60.0)),
                                 None if user is None else str(user)))
    return tuple(hooks)


def _phase_network(phase: _Reader) -> NetworkPolicy | None:
    """The explicit policy of an ``[agent]`` / ``[verifier]`` table (None: it inherits)."""
    mode = phase.string("network_mode")
    if mode is None:
        if "allowed_hosts" in phase.table:
            raise phase.fail("allowed_hosts", "is only valid with network_mode = \"allowlist\"")
        return None
    if mode not in NETWORK_MODES:
        raise phase.fail("network_mode", f"{mode!r} is not one of {NETWORK_MODES}")
    return NetworkPolicy(mode, _allowed_hosts(phase, mode))


def _allowed_hosts(table: _Reader, mode: str) -> tuple[str, ...]:
    """``allowed_hosts`` of a table whose ``network_mode`` is ``mode``, validated and
    normalised as Harbor does (hostnames, ``*.suffix``, IP addresses, CIDR blocks)."""
    raw = table.table.get("allowed_hosts")
    if raw is None:
        return ()
    if mode != "allowlist":
        raise table.fail("allowed_hosts", "is only valid with network_mode = \"allowlist\"")
    if not isinstance(raw, list) or not all(isinstance(h, str) for h in raw):
        raise table.fail("allowed_hosts", "must be an array of strings")
    hosts = []
    for entry in raw:
        host = entry.strip().lower().rstrip(".")
        if "/" in host or ":" in host:
            try:
                host = (ipaddress.ip_network(host, strict=True) if "/" in host
                        else ipaddress.IPv6Address(host)).compressed
            except ValueError:
                raise table.fail("allowed_hosts", f"{entry!r}: entries are hostnames, IP addresses or "
                                 "CIDR blocks, not URLs, ports or paths") from None
        else:
            if host.startswith("*.") and _is_address(host[2:]):
                raise table.fail("allowed_hosts", f"{entry!r}: a wildcard names hostnames, not an IP address")
            labels = (host[2:] if host.startswith("*.") else host).split(".")
            if not all(_HOST_LABEL.match(label) for label in labels):
                raise table.fail("allowed_hosts", f"{entry!r} is not a hostname, a '*.suffix' "
                                 "wildcard, an IP address or a CIDR block")
        hosts.append(host)
    return tuple(hosts)


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _min_reward(step: _Reader) -> float | dict[str, float] | None:
    value = step.table.get("min_reward")
    if value is None:
        return None
    if isinstance(value, dict):
        if not value or not all(isinstance(k, str) and _is_number(v) for k, v in value.items()):
            raise step.fail("min_reward", "must be a number or a table of reward name = number")
        return {k: float(v) for k, v in value.items()}
    if not _is_number(value):
        raise step.fail("min_reward", f"must be a number or a table of numbers, not {value!r}")
    return float(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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
