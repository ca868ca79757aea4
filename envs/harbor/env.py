"""``harbor-v0``: Harbor task directories as an environment, graded the way Harbor grades."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import shlex
import shutil
import stat
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl import EpisodeState
from agentrl.env import TaskFields, check_split
from agentrl.env.sandboxed import SandboxedToolEnv
from agentrl.errors import GradingError
from agentrl.sandbox import WORKSPACE, Limits, Sandbox
from agentrl.tools import Tool, Toolbox, ToolCall
from agentrl.tools.mcp import McpServer
from agentrl_envs.harbor.images import SEED_DIR, TaskImage, ensure_task_image
from agentrl_envs.harbor.task import SHIPPED_TASKS, HarborTask, HarborTaskError, load_tasks
from agentrl_envs.swe_tools.env import made_call
from agentrl_tools import bash, editor, python, run_tests, search, submit

SPLITS = ("train", "test")
NETWORK_POLICIES = ("task", "offline", "public")
TOOLS_BY_NAME: dict[str, Tool] = {
    t.name: t for t in (bash, editor, search, submit, python, run_tests)
}
TESTS, LOGS, SOLUTION = "/tests", "/logs/verifier", "/solution"
GRADER_DIRS = (TESTS, LOGS, SOLUTION)
OUTPUT_TAIL = 2000
VERIFIER_HOME = "/root"
VERIFIER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
REWARD_MAX_BYTES = 1 << 20
MAX_LINK_HOPS = 40  # the kernel's limit on symbolic links followed in one path lookup
PROC_SELF = ("self", "thread-self")
OPEN_FILE_LINKS = ("/dev/stdin", "/dev/stdout", "/dev/stderr")

SYSTEM_PROMPT = """\
You are an agent completing a task in a Linux container (no network). Your working directory \
is {workdir}; the root file system is read-only apart from it and /tmp. Tools:
{tools}
Do the task described by the user, check your work, then call submit. Your work is graded by \
tests you cannot see, after you submit."""

_TOOL_LINES = {
    "bash": "- bash: run shell commands in a persistent shell.",
    "editor": "- editor: view files, and edit them (str_replace needs an exact, unique match).",
    "search": "- search: search file contents (or names) with a regular expression.",
    "python": "- python: run a Python snippet.",
    "run_tests": "- run_tests: run pytest.",
    "submit": "- submit: submit your work and end the episode.",
}


class HarborEnv(SandboxedToolEnv):
    """Harbor tasks (``task.toml``, ``instruction.md``, ``environment/``, ``tests/``,
    ``solution/``), each played in its own Docker image.

    An episode: the task's image is built if the daemon lacks it (see
    :mod:`agentrl_envs.harbor.images`); a locked-down container starts from it (no network
    unless granted, read-only root, unprivileged uid, the task's ``cpus`` / ``memory_mb`` /
    ``storage_mb``); the task's ``mcp_servers`` join the tools (``stdio`` ones run in the
    container); the image's working directory (``/app`` typically) is copied into the
    writable workspace, which is mounted at both ``/workspace`` and that directory; the agent's
    tools run there, as the sandbox's uid, with ``HOME=/workspace``. ``/tests``, ``/solution``
    and ``/logs/verifier`` are empty directories that belong to root: the agent's processes can
    neither read the tests nor write a reward.

    Grading, as Harbor grades, when the agent submits or answers without a tool call (what it
    protects and what it cannot: ``docs/harbor-grading.md``):

    1. Every process of the sandbox is stopped: the container restarts, which kills every
       process in it (background, ``setsid``, double-forked), empties ``/tmp`` and
       ``/dev/shm`` and keeps the workspace. Nothing the agent started runs during grading.
    2. ``tests/`` is copied into ``/tests`` (read-only in the container); ``/logs/verifier`` is
       emptied.
    3. The workspace's symbolic links that lead into ``/tests``, ``/logs/verifier`` or
       ``/solution``, to ``/`` or ``/logs``, or through ``/proc/<pid>`` or ``/dev/fd`` are
       removed (the grade's ``removed_links``). When agentrl runs as root, every file of the
       workspace is given to root, as if root had written it (the agent runs as root in
       Harbor).
    4. ``bash /tests/test.sh`` runs as root (uid 0, every capability still dropped,
       ``no-new-privileges``) in the working directory, killed after
       ``[verifier].timeout_sec``, with the image's variables, then ``HOME=/root``, ``PATH`` of
       the system directories, ``PYTHONNOUSERSITE=1``, ``LANG`` and ``TMPDIR``, then
       ``[verifier].env`` (see :func:`verifier_environment`): nothing the agent set, and no
       place it could write, apart from the working directory itself. Without root on the host
       the files cannot be given away and the verifier runs as the sandbox's uid, with the
       same environment.
    5. The reward is read as Harbor reads it (see :func:`read_reward`): ``reward.json`` (its
       ``reward`` entry, or its only entry) whenever it exists, else ``reward.txt``.

    A missing or malformed reward file, or a verifier that timed out, raises
    :class:`~agentrl.errors.GradingError`: the episode fails with the reason instead of scoring
    0. ``state.grade`` keeps the exit code, output tail, duration, user, removed links and every
    reward entry. Episodes past ``[agent].timeout_sec`` are truncated.

    Args:
        path: A Harbor task directory, or a folder of them (default: the tasks shipped with
            agentrl, ``envs/harbor/tasks``).
        tools: The agent's tools: names among ``bash``, ``editor``, ``search``, ``submit``,
            ``python``, ``run_tests`` (default the first four), or Tool objects.
        network: ``task`` (default): a task that asks for public network (``network_mode =
            "public"``, which is also Harbor's default when the field is absent) or an
            allowlist is refused; ``offline``: every task runs without network; ``public``:
            tasks that ask for public network get Docker's bridge network.
        base_image: Re-base every task onto this local image (replaces external ``FROM``
            images and ``docker_image``), e.g. ``agentrl-base:bookworm-py3-v2``.
        docker_host: The Docker daemon (default: agentrl's private one, see
            :func:`agentrl.sandbox.resolve_docker_host`).
        **kwargs: Passed to :class:`agentrl.env.SandboxedToolEnv`; the backend is docker.

    Raises:
        HarborTaskError: A task directory is invalid (named with its file and field).
    """

    tools = (bash, editor, search, submit)
    default_max_turns = 30
    task_fields = TaskFields({"id": "the task's name (task.toml's task.name) among the tasks under path"},
                             example={"id": "agentrl/debug-test-roman"},
                             public=("id", "instruction"),
                             private=("path",))  # the task folder holds tests/ and solution/
    local_sandboxes_only = (
        "harbor-v0 builds each task's image with this machine's Docker daemon, grades through "
        "the container's host directories (DockerSandbox.host_dir) and runs the tasks' stdio "
        "MCP servers inside the sandbox, none of which reaches a sandbox on another node")
    default_limits = Limits(timeout_s=120, memory_mb=1024, cpu_s=600, pids=256,
                            workspace_mb=512, file_size_mb=256)

    def __init__(
        self,
        *,
        path: str | Path = SHIPPED_TASKS,
        tools: Sequence[str | Tool] | None = None,
        network: str = "task",
        base_image: str | None = None,
        docker_host: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("sandbox", "docker")
        if network not in NETWORK_POLICIES:
            raise ValueError(f"network must be one of {NETWORK_POLICIES}, not {network!r}")
        super().__init__(tools=_resolve_tools(tools), **kwargs)
        if self.sandbox_backend != "docker":
            raise ValueError("harbor-v0 runs each task in its Docker image: use sandbox='docker'")
        self.path = Path(path)
        self.network = network
        self.base_image = base_image
        self.docker_host = docker_host
        self.tasks = {task.name: task for task in load_tasks(self.path)}
        for task in self.tasks.values():
            self._network_for(task)  # refuse what cannot run, at start-up
        self._task_mcp = {task.name: mcp_servers_of(task) for task in self.tasks.values()}
        self._base_tools = tuple(self.toolbox)
        self._images: dict[str, TaskImage] = {}
        self.last_grade: dict[str, Any] | None = None

    # -- tasks -------------------------------------------------------------------------------

    def task_set(self, split: str = "test", limit: int | None = None) -> list[dict[str, Any]]:
        """Every task, sorted by name (a folder of Harbor tasks has no splits: ``train`` and
        ``test`` are the same tasks)."""
        check_split(self, split, SPLITS)
        rows = [task.row() for task in self.tasks.values()]
        return rows if limit is None else rows[:limit]

    def sample_task(self) -> dict[str, Any]:
        rows = self.task_set()
        return rows[int(self.np_random.integers(len(rows)))]

    def harbor_task(self, task: Mapping[str, Any]) -> HarborTask:
        """The :class:`HarborTask` of a task row."""
        try:
            return self.tasks[task["id"]]
        except KeyError:
            raise HarborTaskError(f"no Harbor task {task.get('id')!r} under {self.path} "
                                  f"(tasks: {sorted(self.tasks)})") from None

    def _network_for(self, task: HarborTask) -> str:
        """The Docker network of ``task``'s sandbox under the ``network`` policy."""
        if task.network_mode == "no-network" or self.network == "offline":
            return "none"
        asked = (f"network_mode = {task.network_mode!r}" if task.network_mode_set
                 else "no network_mode, and Harbor's default is 'public'")
        if task.network_mode == "public" and self.network == "public":
            return "bridge"
        if task.network_mode == "allowlist":
            raise HarborTaskError(
                f"Harbor task {task.path}: task.toml: environment.network_mode: 'allowlist' is "
                "not supported; run it offline with --env-kwarg network=offline")
        raise HarborTaskError(
            f"Harbor task {task.path}: task.toml asks for public network ({asked}); agentrl "
            "never grants network silently: pass --env-kwarg network=public to grant it, or "
            "--env-kwarg network=offline to run the task without network (or set "
            "network_mode = \"no-network\" in its [environment])")

    # -- episode -----------------------------------------------------------------------------

    async def task_image(self, task: HarborTask) -> TaskImage:
        """``task``'s image, built on first use (cached by the environment folder's hash)."""
        if task.name not in self._images:
            from agentrl.sandbox.docker import get_client

            client = await asyncio.to_thread(get_client, self.docker_host)
            network = "default" if self._network_for(task) == "bridge" else "none"
            self._images[task.name] = await ensure_task_image(
                client, task, base_image=self.base_image, network=network)
        return self._images[task.name]

    async def setup_episode(self, task: Mapping[str, Any]) -> None:
        """Builds the task's image when needed, then acquires and fills its sandbox; the
        episode's tools are the env's plus those of the task's own MCP servers."""
        harbor = self.harbor_task(task)
        self.toolbox = Toolbox(self._base_tools)
        self.mcp_servers = self._task_mcp[harbor.name]
        await self.task_image(harbor)
        await super().setup_episode(task)

    def limits_for(self, task: Mapping[str, Any]) -> Limits:
        """``self.limits`` with the task's ``memory_mb`` and ``storage_mb``."""
        harbor = self.harbor_task(task)
        return dataclasses.replace(
            self.limits, memory_mb=harbor.memory_mb or self.limits.memory_mb,
            workspace_mb=harbor.storage_mb or self.limits.workspace_mb)

    def sandbox_options_for(self, task: Mapping[str, Any]) -> Mapping[str, Any]:
        harbor = self.harbor_task(task)
        image = self._images[harbor.name]
        aliases = [] if image.workdir in ("/", WORKSPACE) else [image.workdir]
        options: dict[str, Any] = {
            "image": image.tag, "workspace_aliases": aliases,
            "private_dirs": {TESTS: "ro", LOGS: "rw", SOLUTION: "ro"},
            "network": self._network_for(harbor), "cpus": float(harbor.cpus or 1.0),
        }
        if self.docker_host:
            options["docker_host"] = self.docker_host
        return {**options, **self.sandbox_options}

    async def prepare_sandbox(self, sandbox: Sandbox, task: Mapping[str, Any]) -> None:
        """Copies the image's working directory into the workspace."""
        result = await sandbox.exec(f"cp -R {SEED_DIR}/. {WORKSPACE}/", timeout=300)
        if result.exit_code != 0:
            raise HarborTaskError(f"Harbor task {task['id']}: cannot copy the working directory "
                                  f"into the workspace: {(result.stderr or result.stdout)[-500:]}")
        self.state.data["harbor.started"] = time.monotonic()

    def make_prompt(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The system message (working directory, tools) and ``instruction.md``."""
        workdir = self._images.get(task["id"])
        lines = "\n".join(_TOOL_LINES.get(name, f"- {name}") for name in self.toolbox.names)
        system = SYSTEM_PROMPT.format(
            workdir=workdir.workdir if workdir and workdir.workdir != "/" else WORKSPACE,
            tools=lines)
        return [{"role": "system", "content": system},
                {"role": "user", "content": self.harbor_task(task).instruction}]

    async def astep(self, action: Any) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        """One turn; an episode still running past ``[agent].timeout_sec`` is truncated."""
        task = self.harbor_task(self.state.task)
        started = self.state.data.get("harbor.started")
        observation, reward, terminated, truncated, info = await super().astep(action)
        if (task.agent_timeout_s is not None and started is not None and not (terminated or truncated)
                and time.monotonic() - started > task.agent_timeout_s):
            truncated = True
            info["truncated_by"] = f"agent timeout ({task.agent_timeout_s:g} s, task.toml [agent])"
            self._done = True
            await self._close_episode()
        return observation, reward, terminated, truncated, info

    # -- grading -----------------------------------------------------------------------------

    async def compute_reward(
        self, task: Mapping[str, Any], final: Mapping[str, Any], state: EpisodeState
    ) -> float:
        """Grades the episode as Harbor does (see the class docstring); ``state.grade``
        and ``self.last_grade`` keep the verifier's exit code, output tail and rewards."""
        harbor = self.harbor_task(task)
        sandbox = self.sandbox
        assert sandbox is not None
        reward, details = await grade(sandbox, harbor, self._images[harbor.name].workdir)
        state.grade = self.last_grade = details
        return reward

    def oracle_action(self, task: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> str:
        """Mounts ``solution/`` at /solution and runs ``bash /solution/solve.sh`` (with
        ``[solution].env``), then submits."""
        harbor = self.harbor_task(task)
        if not harbor.has_solution:
            raise HarborTaskError(f"Harbor task {harbor.path}: solution/solve.sh is missing, so "
                                  "the task has no oracle")
        command = f"bash {SOLUTION}/solve.sh"
        if harbor.solution_env:
            variables = " ".join(f"{k}={shlex.quote(v)}" for k, v in harbor.solution_env.items())
            command = f"env {variables} {command}"
        call = ToolCall("bash", {"command": command, "timeout": 600})
        if not made_call(history, call):
            if self.sandbox is not None:
                _fill(self.sandbox.host_dir(SOLUTION), harbor.solution_dir)  # type: ignore[attr-defined]
            return self.format.render("I will run the reference solution.", [call])
        return self.format.render("The solution ran.", [ToolCall("submit", {})])


def mcp_servers_of(task: HarborTask) -> tuple[McpServer, ...]:
    """The task's ``[[environment.mcp_servers]]`` as agentrl MCP servers: a ``stdio`` server
    runs inside the episode's container (one per episode), a ``streamable-http`` one is
    connected to from the host. ``sse`` (Harbor's default transport) is refused."""
    servers = []
    for entry in task.mcp_servers:
        if entry.transport == "sse":
            raise HarborTaskError(
                f"Harbor task {task.path}: task.toml: environment.mcp_servers {entry.name!r}: the "
                "'sse' transport (Harbor's default) is not supported: agentrl's MCP client speaks "
                "stdio and streamable HTTP; set transport = \"streamable-http\" if the server "
                "serves it")
        if entry.transport == "stdio":
            servers.append(McpServer(command=entry.command, args=entry.args, name=entry.name, sandbox=True))
        else:
            servers.append(McpServer(url=entry.url, headers=dict(entry.headers) or None, name=entry.name))
    return tuple(servers)


async def grade(sandbox: Any, task: HarborTask, workdir: str) -> tuple[float, dict[str, Any]]:
    """Runs ``task``'s verifier in ``sandbox`` (a DockerSandbox with HarborEnv's private dirs)
    and returns (reward, details), as the class docstring of :class:`HarborEnv` describes.

    Raises:
        GradingError: The verifier timed out or wrote no valid reward file.
    """
    await sandbox.stop_processes()
    cwd = workdir if workdir != "/" else WORKSPACE
    mounts = (WORKSPACE, *sandbox.workspace_aliases)
    as_root = os.geteuid() == 0  # only then can the agent's files be given to root
    removed = await asyncio.to_thread(_hand_over, sandbox, task, cwd, mounts, as_root)
    as_user = {"user": "root"} if as_root else {}
    result = await sandbox.exec(["bash", f"{TESTS}/test.sh"], timeout=task.verifier_timeout_s,
                                env=verifier_environment(task, mounts), cwd=cwd, **as_user)
    tail = (result.stdout + result.stderr)[-OUTPUT_TAIL:]
    details: dict[str, Any] = {"exit_code": result.exit_code, "output_tail": tail,
                               "seconds": round(result.duration_s, 3),
                               "user": "root" if as_root else str(sandbox.uid),
                               "removed_links": removed}
    where = f"Harbor task {task.name}: tests/test.sh"
    if result.timed_out:
        raise GradingError(f"{where} did not finish within {task.verifier_timeout_s:g} s "
                           "(task.toml [verifier].timeout_sec); its output ends with: " + tail[-500:])
    reward, rewards = read_reward(sandbox.host_dir(LOGS), where, result.exit_code, tail)
    details["rewards"] = rewards
    return reward, details


def verifier_environment(task: HarborTask, mounts: Sequence[str] = (WORKSPACE,)) -> dict[str, str]:
    """The variables of ``bash /tests/test.sh`` on top of the image's own: ``HOME`` (``/root``),
    ``PATH`` (the system directories), ``PYTHONNOUSERSITE=1``, ``LANG`` and ``TMPDIR``, then
    the task's ``[verifier].env``. A directory under one of ``mounts`` (where the agent's
    workspace is mounted) is never among them."""
    home = VERIFIER_HOME if not _within_any(VERIFIER_HOME, mounts) else "/nonexistent"
    path = ":".join(d for d in VERIFIER_PATH.split(":") if not _within_any(d, mounts))
    return {"HOME": home, "PATH": path, "PYTHONNOUSERSITE": "1", "LANG": "C.UTF-8",
            "TMPDIR": "/tmp", **task.verifier_env}


def read_reward(logs: str, where: str, exit_code: int | None,
                tail: str = "") -> tuple[float, dict[str, float | int]]:
    """The reward a verifier wrote into ``logs``, read as Harbor reads it, and every entry.

    ``reward.json`` wins whenever it exists (``reward.txt`` is then not read). It must be a
    JSON object whose values are all numbers (``true``/``false`` count as 1.0/0.0, as Harbor's
    result model makes them) and finite; the episode's reward is its ``reward`` entry, else its
    only entry. ``reward.txt`` must hold one finite number as Python's ``float`` reads it
    (surrounding whitespace allowed). The files are UTF-8.

    Returns:
        (the reward, the entries as Harbor records them: ``{"reward": value}`` for
        ``reward.txt``; ints stay ints).

    Raises:
        GradingError: Neither file exists; the one read is empty, malformed, a symbolic link or
            not a regular file, larger than 1 MiB; a value is not a finite number; or
            ``reward.json`` has several entries and none named ``reward`` (or none at all),
            for which Harbor records no reward either.
    """
    json_path, txt_path = os.path.join(logs, "reward.json"), os.path.join(logs, "reward.txt")
    if os.path.lexists(json_path):
        text = _reward_text(json_path, where)
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise GradingError(f"{where} wrote a malformed /logs/verifier/reward.json: {exc}") from exc
        for value in data.values() if isinstance(data, dict) else [data]:
            if not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value)):
                raise GradingError(f"{where} wrote /logs/verifier/reward.json with a value that is "
                                   f"not a finite number: {str(value)[:200]}")
        if not isinstance(data, dict):
            raise GradingError(f"{where} wrote /logs/verifier/reward.json that is a bare number, "
                               f"not a JSON object of rewards: {text[:200]}")
        rewards = {k: float(v) if isinstance(v, bool) else v for k, v in data.items()}
        if "reward" in rewards:
            primary = rewards["reward"]
        elif len(rewards) == 1:
            primary = next(iter(rewards.values()))
        else:
            raise GradingError(f"{where} wrote /logs/verifier/reward.json with "
                               f"{len(rewards) or 'no'} entries and none named 'reward': "
                               f"{sorted(rewards)[:20]}")
        try:
            return float(primary), rewards
        except OverflowError:
            raise GradingError(f"{where} wrote /logs/verifier/reward.json with a reward too large "
                               "for a float") from None
    if os.path.lexists(txt_path):
        text = _reward_text(txt_path, where)
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise GradingError(f"{where} wrote /logs/verifier/reward.txt that is not one finite "
                               f"number: {text.strip()[:200]!r}")
        return value, {"reward": value}
    raise GradingError(f"{where} wrote no /logs/verifier/reward.txt or reward.json (exit code "
                       f"{exit_code}); its output ends with: {tail[-500:]}")


def _reward_text(path: str, where: str) -> str:
    """The text of a reward file: a regular file (never followed through a symbolic link, which
    could point anywhere on this machine), not empty, at most REWARD_MAX_BYTES, UTF-8."""
    name = "/logs/verifier/" + os.path.basename(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        kind = "a symbolic link" if os.path.islink(path) else f"unreadable ({exc.strerror})"
        raise GradingError(f"{where} wrote {name} that is {kind}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise GradingError(f"{where} wrote {name} that is not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= REWARD_MAX_BYTES and (chunk := os.read(fd, REWARD_MAX_BYTES + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if not data:
        raise GradingError(f"{where} wrote an empty {name}")
    if len(data) > REWARD_MAX_BYTES:
        raise GradingError(f"{where} wrote {name} larger than {REWARD_MAX_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GradingError(f"{where} wrote {name} that is not UTF-8: {exc}") from exc


def _hand_over(sandbox: Any, task: HarborTask, cwd: str, mounts: Sequence[str],
               as_root: bool) -> list[str]:
    """Readies the sandbox for the verifier once nothing of the agent runs any more: copies the
    tests in, empties the log directory, removes the workspace's symbolic links that lead into
    the grader's directories (see :func:`_leads_to_grader`), and gives every file of the
    workspace to root when ``as_root`` (else the log directory to the sandbox's uid, which then
    runs the verifier). Returns the removed links, as paths under ``cwd``."""
    _fill(sandbox.host_dir(TESTS), task.tests_dir)
    logs = sandbox.host_dir(LOGS)
    _empty(logs)
    removed = _clean_workspace(sandbox.workspace, mounts, cwd, owner=0 if as_root else None)
    if not as_root:
        try:
            os.chown(logs, sandbox.uid, sandbox.uid)
        except PermissionError:  # not root: the directory is ours, so open it up instead
            os.chmod(logs, 0o777)
    return removed


def _clean_workspace(root: str, mounts: Sequence[str], shown_under: str, owner: int | None) -> list[str]:
    """Removes the symbolic links of the host directory ``root`` (mounted in the container at
    each of ``mounts``) that lead to the grader's directories, and with ``owner`` gives every
    other file and directory (``root`` included) to that uid and gid. Returns the removed links
    as container paths under ``shown_under``."""
    links: list[str] = []
    stack = [root]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except PermissionError:  # not root, and the agent locked it: the verifier cannot enter either
            continue
        with entries:
            for entry in entries:
                if entry.is_symlink():
                    links.append(entry.path)
                    continue
                if owner is not None:
                    os.lchown(entry.path, owner, owner)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    if owner is not None:
        os.chown(root, owner, owner)

    doomed = {link for link in links
              if any(_leads_to_grader(mount + link[len(root):], root, mounts) for mount in mounts)}
    for link in doomed:
        os.unlink(link)
    for link in links:
        if owner is not None and link not in doomed:
            os.lchown(link, owner, owner)
    return sorted(shown_under.rstrip("/") + link[len(root):] for link in doomed)


def _host_path(path: str, root: str, mounts: Sequence[str]) -> str | None:
    """The host path of the container path ``path`` when it lies in the workspace (mounted at
    each of ``mounts``, backed by the host directory ``root``), else None."""
    for mount in sorted(mounts, key=len, reverse=True):
        if path == mount or path.startswith(mount + "/"):
            return root + path[len(mount):]
    return None


def _leads_to_grader(path: str, root: str, mounts: Sequence[str]) -> bool:
    """Whether resolving the container path ``path`` as the kernel would, following the
    symbolic links of the workspace (the host directory ``root``, mounted at each of
    ``mounts``), reaches one of the grader's directories (``/tests``, ``/logs/verifier``,
    ``/solution``), ends on a directory that holds one (``/``, ``/logs``), or goes through a
    process's own directory under ``/proc`` or an open-file link (``/dev/fd``, ``/dev/stdin``,
    ...), which reach any file a process has open, or its root or working directory.

    The image's own links are not visible from here, so a ``..`` taken outside the workspace
    (where one of them may have led: ``/var/run/..`` is ``/``, not ``/var``) counts as reaching
    the grader too."""
    pending = [part for part in path.split("/") if part]
    here: list[str] = []
    hops = 0
    while pending:
        part = pending.pop(0)
        current = "/" + "/".join(here)
        if part == ".":
            continue
        if part == "..":
            if here and _host_path(current, root, mounts) is None:
                return True
            if here:
                here.pop()
            continue
        here.append(part)
        current = "/" + "/".join(here)
        if (any(_within(current, d) for d in GRADER_DIRS) or current in OPEN_FILE_LINKS
                or _within(current, "/dev/fd")
                or (here[0] == "proc" and len(here) >= 2 and (here[1].isdigit() or here[1] in PROC_SELF))):
            return True
        host = _host_path(current, root, mounts)
        if host is not None and os.path.islink(host):
            hops += 1
            if hops > MAX_LINK_HOPS:  # the kernel gives up too (ELOOP)
                return False
            target = os.readlink(host)
            here.pop()
            if target.startswith("/"):
                here = []
            pending[:0] = [p for p in target.split("/") if p]
    final = "/" + "/".join(here)
    return any(_within(d, final) for d in GRADER_DIRS)


def _within(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or lies under it (absolute, normalized paths)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _within_any(path: str, directories: Sequence[str]) -> bool:
    return any(_within(path, d) for d in directories)


def _fill(host_dir: str, source: Path) -> None:
    """Replaces ``host_dir``'s contents with a copy of ``source``."""
    _empty(host_dir)
    if source.is_dir():
        shutil.copytree(source, host_dir, dirs_exist_ok=True, symlinks=False)


def _empty(host_dir: str) -> None:
    for name in os.listdir(host_dir):
        path = os.path.join(host_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def _resolve_tools(tools: Sequence[str | Tool] | None) -> list[Tool] | None:
    if tools is None:
        return None
    if isinstance(tools, str):
        tools = [t.strip() for t in tools.split(",") if t.strip()]
    resolved = []
    for item in tools:
        if isinstance(item, str):
            if item not in TOOLS_BY_NAME:
                raise ValueError(f"unknown tool {item!r} for harbor-v0 (--env-kwarg tools=...): "
                                 f"choose among {sorted(TOOLS_BY_NAME)}")
            resolved.append(TOOLS_BY_NAME[item])
        else:
            resolved.append(item)
    return resolved
