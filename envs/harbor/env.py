"""``harbor-v0``: Harbor task directories as an environment, graded the way Harbor grades."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl import EpisodeState
from agentrl.env import TaskFields, check_split
from agentrl.env.sandboxed import SandboxedToolEnv
from agentrl.errors import GradingError
from agentrl.sandbox import WORKSPACE, Limits, Sandbox, create_sandbox
from agentrl.sandbox.egress import Egress
from agentrl.tools import Tool, Toolbox, ToolCall
from agentrl.tools.mcp import McpServer
from agentrl_envs.harbor.compose import ComposeError, ComposeProject, owner_labels
from agentrl_envs.harbor.images import (
    SEED_DIR,
    TaskImage,
    ensure_image_present,
    ensure_task_image,
    service_image,
    verifier_image,
)
from agentrl_envs.harbor.network import GRANTS, NetworkPlan, egress_of, plan_network
from agentrl_envs.harbor.task import (
    ARTIFACTS_DIR,
    SHIPPED_TASKS,
    HarborStep,
    HarborTask,
    HarborTaskError,
    Healthcheck,
    NetworkPolicy,
    load_tasks,
)
from agentrl_envs.harbor.verifier import (
    LOGS,
    SOLUTION,
    TESTS,
    fill,
    grade,
    grade_separately,
    reopen,
)
from agentrl_envs.swe_tools.env import made_call
from agentrl_tools import bash, editor, python, run_tests, search, submit
from agentrl_tools.bash import SHELL_KEY

SPLITS = ("train", "test")
TOOLS_BY_NAME: dict[str, Tool] = {
    t.name: t for t in (bash, editor, search, submit, python, run_tests)
}

SYSTEM_PROMPT = """\
You are an agent completing a task in a Linux container ({network}). Your working directory \
is {workdir}; the root file system is read-only apart from it and /tmp. Tools:
{tools}
Do the task described by the user, check your work, then call submit. Your work is graded by \
tests you cannot see, after you submit.{steps}"""

STEPS_LINE = """ The task has {count} steps: once you submit a step, it is graded \
and the next step's instruction follows; your files stay."""
SETUP_TIMEOUT_S = 300.0

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
       ``[verifier].env`` (see
       :func:`~agentrl_envs.harbor.verifier.verifier_environment`): nothing the agent set,
       and no place it could write, apart from the working directory itself. Without root on the host
       the files cannot be given away and the verifier runs as the sandbox's uid, with the
       same environment.
    5. The reward is read as Harbor reads it (see
       :func:`~agentrl_envs.harbor.verifier.read_reward`): ``reward.json`` (its ``reward``
       entry, or its only entry) whenever it exists, else ``reward.txt``.

    A missing or malformed reward file, or a verifier that timed out, raises
    :class:`~agentrl.errors.GradingError`: the episode fails with the reason instead of scoring
    0. ``state.grade`` keeps the exit code, output tail, duration, user, removed links and every
    reward entry. Episodes past ``[agent].timeout_sec`` are truncated.

    **Multi-step tasks** (``[[steps]]``) are one episode in one sandbox, whose files carry over
    from step to step. Before each step its ``workdir/`` is copied into the working directory
    and its ``setup.sh`` runs there as the agent's uid (a failing ``setup.sh`` fails the
    episode, naming the step). The first step's instruction is the prompt; when the agent
    submits a step, that step is graded as above with its own tests (``/tests`` holds the root
    ``tests/`` with the step's laid over it), then ``/tests`` and ``/logs/verifier`` are emptied
    and the workspace goes back to the agent's uid, and the next step's instruction comes as a
    user message (:meth:`~agentrl.env.ToolEnv.next_stage`). The episode ends after the last
    step, or after a step whose rewards fall below its ``min_reward``. Its reward follows
    ``multi_step_reward_strategy``: ``mean`` (per entry, over the steps graded) or ``final``;
    ``state.grade`` holds ``strategy``, the combined ``rewards`` and ``steps``: each graded
    step's name, reward and details, which a custom reward function can read from
    ``sample.metadata["grade"]``. ``[agent].timeout_sec`` counts per step.

    **Network per phase**: the sandbox's egress follows the phase that runs (see
    :mod:`agentrl_envs.harbor.network`). **A separate verifier** (``environment_mode =
    "separate"``) grades in a container of its own that receives only the artifacts (see
    :func:`~agentrl_envs.harbor.verifier.grade_separately`). **Compose tasks**
    (``environment/docker-compose.yaml``) start their services on a private network before
    the sandbox joins it as ``main``, and remove them when the episode ends (see
    :mod:`agentrl_envs.harbor.compose`). ``[environment].healthcheck`` and a step's
    ``healthcheck`` run before the agent. Guide: ``docs/guides/harbor.md``.

    Args:
        path: A Harbor task directory, or a folder of them (default: the tasks shipped with
            agentrl, ``envs/harbor/tasks``).
        tools: The agent's tools: names among ``bash``, ``editor``, ``search``, ``submit``,
            ``python``, ``run_tests`` (default the first four), or Tool objects.
        network: ``task`` (default): each phase gets the network its task asks for
            (``[environment]``: start-up and ``setup.sh``; ``[agent]``; ``[verifier]``; and
            a step's own tables), except that a task asking for public network
            (``network_mode = "public"``, also Harbor's default when the field is absent) is
            refused; ``public``: public network is granted too; ``offline``: every phase of
            every task runs without network. ``allowlist`` phases reach only their
            ``allowed_hosts`` (see :mod:`agentrl_envs.harbor.network`).
        egress_network: The Docker network a sandbox joins when a phase of its task has
            network (default ``bridge``); an allowlist's hostnames are looked up among its
            containers first.
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
        egress_network: str = "bridge",
        base_image: str | None = None,
        docker_host: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("sandbox", "docker")
        if network not in GRANTS:
            raise ValueError(f"network must be one of {GRANTS}, not {network!r}")
        super().__init__(tools=_resolve_tools(tools), **kwargs)
        if self.sandbox_backend != "docker":
            raise ValueError("harbor-v0 runs each task in its Docker image: use sandbox='docker'")
        self.path = Path(path)
        self.network = network
        self.base_image = base_image
        self.docker_host = docker_host
        self.egress_network = egress_network
        self.tasks = {task.name: task for task in load_tasks(self.path)}
        # refuses what cannot run, at start-up
        self._networks = {name: plan_network(task, network, egress_network)
                          for name, task in self.tasks.items()}
        self._task_mcp = {task.name: mcp_servers_of(task) for task in self.tasks.values()}
        self._base_tools = tuple(self.toolbox)
        self._images: dict[str, TaskImage] = {}
        self._services: ComposeProject | None = None
        self._service_images: dict[str, dict[str, str]] = {}
        """Task name -> its compose services' image tags."""
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

    def network_plan(self, task: HarborTask) -> NetworkPlan:
        """How ``task``'s sandbox is networked (see :func:`~agentrl_envs.harbor.network.plan_network`)."""
        return self._networks[task.name]

    async def _enter_phase(self, harbor: HarborTask, policy: NetworkPolicy) -> None:
        """Sets the sandbox's egress to ``policy`` when the task's phases differ."""
        egress = await self._phase_egress(harbor, policy)
        if egress is not None:
            assert self.sandbox is not None
            await self.sandbox.set_egress(egress)  # type: ignore[attr-defined]

    async def _phase_egress(self, harbor: HarborTask, policy: NetworkPolicy) -> Any:
        plan = self.network_plan(harbor)
        if not plan.per_phase:
            return None
        from agentrl.sandbox.docker import get_client

        network = plan.network
        if harbor.compose is not None:  # the services' network; no-network there reaches them all
            assert self._services is not None
            network = self._services.network_name
            if policy.mode == "no-network":
                policy = NetworkPolicy("public")
        client = await asyncio.to_thread(get_client, self.docker_host)
        return await asyncio.to_thread(egress_of, policy, client, network)

    # -- episode -----------------------------------------------------------------------------

    async def task_image(self, task: HarborTask) -> TaskImage:
        """``task``'s image, built on first use (cached by the environment folder's hash)."""
        if task.name not in self._images:
            from agentrl.sandbox.docker import get_client

            client = await asyncio.to_thread(get_client, self.docker_host)
            # only a granted public [environment] builds with network (an allowlist cannot
            # be enforced on a build)
            public = task.network_mode == "public" and self.network == "public"
            network = "default" if public else "none"
            self._images[task.name] = await ensure_task_image(
                client, task, base_image=self.base_image, network=network)
        return self._images[task.name]

    async def setup_episode(self, task: Mapping[str, Any]) -> None:
        """Builds the task's image when needed, starts its compose services (if any), then
        acquires and fills its sandbox; the episode's tools are the env's plus those of the
        task's own MCP servers."""
        harbor = self.harbor_task(task)
        self.toolbox = Toolbox(self._base_tools)
        self.mcp_servers = self._task_mcp[harbor.name]
        await self.task_image(harbor)
        if harbor.compose is not None:
            self._services = await self._start_services(harbor)
        try:
            await super().setup_episode(task)
        except BaseException:
            await self._stop_services()
            raise

    async def teardown_episode(self) -> None:
        """Releases the sandbox, then removes the episode's compose services."""
        try:
            await super().teardown_episode()
        finally:
            await self._stop_services()

    async def _start_services(self, harbor: HarborTask) -> ComposeProject:
        """Builds (offline) or finds the images of ``harbor``'s compose services and starts
        them on a private network (see :mod:`agentrl_envs.harbor.compose`)."""
        from agentrl.sandbox.docker import get_client
        from agentrl.sandbox.pool import note_sandbox_made

        assert harbor.compose is not None
        client = await asyncio.to_thread(get_client, self.docker_host)
        if harbor.name not in self._service_images:  # once per task, not per episode
            images = {}
            for service in harbor.compose.services:
                source = service_image(harbor, service)
                if service.build_context is not None:
                    images[service.name] = (await ensure_task_image(client, source)).tag
                else:
                    await asyncio.to_thread(ensure_image_present, client, source)
                    images[service.name] = service.image
            self._service_images[harbor.name] = images
        note_sandbox_made("docker", self.docker_host)  # a killed run's services are reclaimed
        project = ComposeProject(client, harbor.compose, self._service_images[harbor.name], owner_labels())
        try:
            await project.start()
        except ComposeError as exc:
            raise HarborTaskError(f"Harbor task {harbor.path}: environment/{exc}") from None
        return project

    async def _stop_services(self) -> None:
        services, self._services = self._services, None
        if services is not None:
            await services.close()

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
            "private_dirs": {TESTS: "ro", LOGS: "rw", SOLUTION: "ro",
                             # where the agent leaves artifacts for a separate verifier
                             **({ARTIFACTS_DIR: "rw"} if _separate(harbor) else {})},
            "network": self.network_plan(harbor).network, "cpus": float(harbor.cpus or 1.0),
        }
        variables = {**harbor.env, **(harbor.compose.main_environment if harbor.compose else {})}
        if variables:
            options["env"] = variables
        if self.network_plan(harbor).per_phase and harbor.compose is None:
            options["egress"] = Egress.nothing()  # nothing reachable until a phase says what is
        if self.docker_host:
            options["docker_host"] = self.docker_host
        return {**options, **self.sandbox_options}

    async def prepare_sandbox(self, sandbox: Sandbox, task: Mapping[str, Any]) -> None:
        """Copies the image's working directory into the workspace, then opens the first step."""
        harbor = self.harbor_task(task)
        if self._services is not None:  # main joins its services' network
            await sandbox.join_network(self._services.network_name, aliases=["main"])  # type: ignore[attr-defined]
        if _separate(harbor):  # /logs/artifacts is the agent's to write
            host = sandbox.host_dir(ARTIFACTS_DIR)  # type: ignore[attr-defined]
            if os.geteuid() == 0:
                os.chown(host, sandbox.uid, sandbox.uid)  # type: ignore[attr-defined]
            else:
                os.chmod(host, 0o777)
        await self._enter_phase(harbor, NetworkPolicy(harbor.network_mode, harbor.allowed_hosts))
        result = await sandbox.exec(f"cp -R {SEED_DIR}/. {WORKSPACE}/", timeout=300)
        if result.exit_code != 0:
            raise HarborTaskError(f"Harbor task {task['id']}: cannot copy the working directory "
                                  f"into the workspace: {(result.stderr or result.stdout)[-500:]}")
        await self._run_healthcheck(sandbox, harbor, harbor.healthcheck, "environment.healthcheck")
        await self._open_step(sandbox, harbor, 0)

    async def _open_step(self, sandbox: Sandbox, harbor: HarborTask, index: int) -> None:
        """Stages step ``index`` under the environment's network policy: its ``workdir/`` is
        written into the workspace and its ``setup.sh`` run there, as the agent's uid. Then
        the step's agent phase begins: its network policy, its timeout."""
        step = harbor.steps[index]
        baseline = NetworkPolicy(harbor.network_mode, harbor.allowed_hosts)
        if index:
            await self._enter_phase(harbor, baseline)
        if step.workdir_dir is not None:
            for file in sorted(p for p in step.workdir_dir.rglob("*") if p.is_file()):
                await sandbox.write_file(file.relative_to(step.workdir_dir).as_posix(), file.read_bytes())
        if step.has_setup:
            result = await sandbox.exec(["bash", "setup.sh"], timeout=SETUP_TIMEOUT_S,
                                        cwd=self._workdir(harbor))
            if result.exit_code != 0:
                raise HarborTaskError(
                    f"Harbor task {harbor.name}: steps/{step.name}/workdir/setup.sh exited with "
                    f"{result.exit_code}: {(result.stderr or result.stdout)[-500:]}")
        await self._run_healthcheck(sandbox, harbor, step.healthcheck, f"steps[{index}].healthcheck")
        await self._enter_phase(harbor, step.agent_network)
        self.state.data["harbor.step"] = index
        self.state.data["harbor.started"] = time.monotonic()

    async def _run_healthcheck(self, sandbox: Sandbox, harbor: HarborTask, check: Healthcheck | None,
                               field: str) -> None:
        """Runs a task.toml healthcheck in the agent's container, as the agent's uid, as Docker
        runs a HEALTHCHECK (see :class:`~agentrl_envs.harbor.task.Healthcheck`).

        Raises:
            HarborTaskError: It failed ``retries`` times in a row after its start period.
        """
        if check is None:
            return
        start_period_ends = time.monotonic() + check.start_period_s
        failures = 0
        while True:
            result = await sandbox.exec(["bash", "-c", check.command], timeout=check.timeout_s,
                                        cwd=self._workdir(harbor))
            if result.exit_code == 0:
                return
            if time.monotonic() < start_period_ends:
                await asyncio.sleep(check.start_interval_s)
                continue
            failures += 1
            if failures >= check.retries:
                raise HarborTaskError(
                    f"Harbor task {harbor.name}: task.toml: {field}: {check.command!r} failed "
                    f"{check.retries} times in a row (exit {result.exit_code}): "
                    f"{(result.stderr or result.stdout)[-500:]}")
            await asyncio.sleep(check.interval_s)

    def _workdir(self, harbor: HarborTask) -> str:
        """The container's working directory of ``harbor``'s episodes (the workspace)."""
        workdir = self._images[harbor.name].workdir
        return workdir if workdir != "/" else WORKSPACE

    def make_prompt(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The system message (working directory, tools) and ``instruction.md``."""
        lines = "\n".join(_TOOL_LINES.get(name, f"- {name}") for name in self.toolbox.names)
        harbor = self.harbor_task(task)
        # before the image is built (a data source asks for prompts first) task.toml's workdir
        # is all there is; the image's WORKDIR once it is
        image = self._images.get(harbor.name)
        workdir = image.workdir if image else harbor.workdir or WORKSPACE
        steps = STEPS_LINE.format(count=len(harbor.steps)) if harbor.multi_step else ""
        system = SYSTEM_PROMPT.format(workdir=workdir if workdir != "/" else WORKSPACE,
                                      tools=lines, steps=steps, network=self._network_words(harbor))
        return [{"role": "system", "content": system},
                {"role": "user", "content": harbor.instruction}]

    async def astep(self, action: Any) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        """One turn; an episode still running past ``[agent].timeout_sec`` (of the current
        step) is truncated."""
        task = self.harbor_task(self.state.task)
        step = task.steps[self.state.data.get("harbor.step", 0)]
        started = self.state.data.get("harbor.started")
        observation, reward, terminated, truncated, info = await super().astep(action)
        if (step.agent_timeout_s is not None and started is not None and not (terminated or truncated)
                and time.monotonic() - started > step.agent_timeout_s):
            truncated = True
            info["truncated_by"] = f"agent timeout ({step.agent_timeout_s:g} s, task.toml [agent])"
            self._done = True
            await self._close_episode()
        return observation, reward, terminated, truncated, info

    # -- grading -----------------------------------------------------------------------------

    async def compute_reward(
        self, task: Mapping[str, Any], final: Mapping[str, Any], state: EpisodeState
    ) -> float:
        """Grades the episode as Harbor does (see the class docstring); ``state.grade``
        and ``self.last_grade`` keep the verifier's exit code, output tail and rewards (of
        every step of a multi-step task, and how they combine)."""
        harbor = self.harbor_task(task)
        graded: list[dict[str, Any]] = state.data.setdefault("harbor.steps", [])
        if len(graded) <= state.data.get("harbor.step", 0):
            await self._grade_step(harbor, state)
        if not harbor.multi_step:
            details = dict(graded[0])
            reward = details.pop("reward")
            del details["step"]
        else:
            reward, rewards = combine_steps(harbor, graded)
            details = {"strategy": harbor.reward_strategy, "rewards": rewards,
                       "steps_total": len(harbor.steps), "steps": graded}
        state.grade = self.last_grade = details
        return reward

    async def _grade_step(self, harbor: HarborTask, state: EpisodeState) -> dict[str, Any]:
        """Grades the current step and keeps its result in ``state.data["harbor.steps"]``."""
        sandbox = self.sandbox
        assert sandbox is not None
        step = harbor.steps[state.data.get("harbor.step", 0)]
        workdir = self._images[harbor.name].workdir
        if step.verifier_environment is None:
            egress = await self._phase_egress(harbor, step.verifier_network)
            reward, details = await grade(sandbox, harbor, step, workdir, egress=egress)
        else:
            image = await self._verifier_image(harbor, step)
            reward, details = await grade_separately(
                sandbox, harbor, step, workdir, image.tag, image.workdir,
                await self._verifier_sandbox_maker(harbor, step))
        record = {"step": step.name, "reward": reward, **details}
        state.data.setdefault("harbor.steps", []).append(record)
        return record

    async def _verifier_image(self, harbor: HarborTask, step: HarborStep) -> TaskImage:
        """The image of ``step``'s separate verifier, built on first use."""
        assert step.verifier_environment is not None
        source = verifier_image(harbor, step.verifier_environment)
        key = f"{harbor.name}\0verifier\0{step.name}"  # not its tag: that hashes the folder again
        if key not in self._images:
            from agentrl.sandbox.docker import get_client

            client = await asyncio.to_thread(get_client, self.docker_host)
            self._images[key] = await ensure_task_image(client, source, base_image=self.base_image)
        return self._images[key]

    async def _verifier_sandbox_maker(self, harbor: HarborTask, step: HarborStep) -> Any:
        """What makes the container of ``step``'s separate verifier: its own resources, and
        its phase's network (none, or the egress network held to its policy)."""
        assert step.verifier_environment is not None
        verifier = step.verifier_environment.settings
        limits = dataclasses.replace(
            self.limits, memory_mb=verifier.memory_mb or self.limits.memory_mb,
            workspace_mb=verifier.storage_mb or self.limits.workspace_mb)
        base: dict[str, Any] = {"cpus": float(verifier.cpus or 1.0), "network": "none"}
        if self.docker_host:
            base["docker_host"] = self.docker_host
        if self.network != "offline" and step.verifier_network.mode != "no-network":
            from agentrl.sandbox.docker import get_client

            base["network"] = self.egress_network
            if step.verifier_network.mode == "allowlist":
                client = await asyncio.to_thread(get_client, self.docker_host)
                base["egress"] = await asyncio.to_thread(egress_of, step.verifier_network, client,
                                                         self.egress_network)

        def make(options: Mapping[str, Any]) -> Any:
            return create_sandbox("docker", limits, **{**base, **options})

        return make

    async def next_stage(self, final: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """A multi-step task's step ends: it is graded, and unless it was the last step or
        fell below its ``min_reward``, the next step opens and its instruction is returned as
        a user message (see the class docstring)."""
        state = self.state
        assert state is not None and self.sandbox is not None
        harbor = self.harbor_task(state.task)
        if not harbor.multi_step:
            return None
        index = state.data.get("harbor.step", 0)
        self.grading = True
        try:
            record = await self._grade_step(harbor, state)
        finally:
            self.grading = False
        if index + 1 >= len(harbor.steps) or not harbor.steps[index].passes(record["rewards"]):
            return None
        await reopen(self.sandbox, (WORKSPACE, *self.sandbox.workspace_aliases))
        state.data.pop(SHELL_KEY, None)  # every process was stopped: the next call opens a shell
        await self._open_step(self.sandbox, harbor, index + 1)
        return [{"role": "user", "content": harbor.steps[index + 1].instruction}]

    def oracle_action(self, task: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> str:
        """Mounts the current step's ``solution/`` at /solution and runs
        ``bash /solution/solve.sh`` (with ``[solution].env``), then submits; on every step of
        a multi-step task."""
        harbor = self.harbor_task(task)
        step = self._current_step(harbor)
        if not step.has_solution:
            where = f"steps/{step.name}/solution/solve.sh" if step.name else "solution/solve.sh"
            raise HarborTaskError(f"Harbor task {harbor.path}: {where} is missing, so the task "
                                  "has no oracle")
        command = f"bash {SOLUTION}/solve.sh"
        if harbor.solution_env:
            variables = " ".join(f"{k}={shlex.quote(v)}" for k, v in harbor.solution_env.items())
            command = f"env {variables} {command}"
        call = ToolCall("bash", {"command": command, "timeout": 600})
        since_instruction = list(history)
        for i in range(len(history) - 1, -1, -1):
            if history[i].get("role") == "user":
                since_instruction = list(history[i + 1:])
                break
        if not made_call(since_instruction, call):
            if self.sandbox is not None:
                fill(self.sandbox.host_dir(SOLUTION), step.solution_dir)  # type: ignore[attr-defined]
            return self.format.render("I will run the reference solution.", [call])
        return self.format.render("The solution ran.", [ToolCall("submit", {})])

    def _network_words(self, harbor: HarborTask) -> str:
        """What the prompt says of the first step's agent network."""
        policy = harbor.steps[0].agent_network
        if harbor.compose is not None:  # its services are part of its environment, offline too
            names = ", ".join(s.name for s in harbor.compose.services)
            return f"no network beyond the task's services, reached by name: {names}"
        if self.network_plan(harbor).network == "none" or policy.mode == "no-network":
            return "no network"
        if policy.mode == "public":
            return "with network access"
        return "network access only to " + ", ".join(policy.allowed_hosts) if policy.allowed_hosts else "no network"

    def _current_step(self, harbor: HarborTask) -> HarborStep:
        index = self.state.data.get("harbor.step", 0) if self.state is not None else 0
        return harbor.steps[index]


def _separate(task: HarborTask) -> bool:
    """Whether a step of ``task`` is graded in a separate verifier environment."""
    return any(step.verifier_environment is not None for step in task.steps)


def combine_steps(task: HarborTask, graded: Sequence[Mapping[str, Any]]) -> tuple[float, dict[str, float]]:
    """The episode's reward and entries from its graded steps (each ``{"reward", "rewards"}``),
    by ``task.reward_strategy``: ``final`` takes the last step's; ``mean`` averages each entry
    over the graded steps, a step without the entry counting 0 (as Harbor does).

    Raises:
        GradingError: The combined entries have no ``reward`` and more than one entry.
    """
    if task.reward_strategy == "final":
        return float(graded[-1]["reward"]), dict(graded[-1]["rewards"])
    keys = sorted({key for step in graded for key in step["rewards"]})
    rewards = {key: sum(float(step["rewards"].get(key, 0)) for step in graded) / len(graded)
               for key in keys}
    if "reward" in rewards:
        return rewards["reward"], rewards
    if len(rewards) == 1:
        return next(iter(rewards.values())), rewards
    raise GradingError(f"Harbor task {task.name}: the steps' rewards {keys[:20]} have no entry "
                       "named 'reward' to average into the episode's reward")


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
