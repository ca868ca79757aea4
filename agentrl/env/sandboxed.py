"""``SandboxedToolEnv``: a ToolEnv whose episodes each get a sandbox.

The sandbox is acquired from a pool when an episode starts (after the task is chosen; the env's
:class:`~agentrl.sandbox.SandboxPools` picks the pool), filled by
:meth:`SandboxedToolEnv.prepare_sandbox`, injected into every tool that annotates a
parameter with :class:`agentrl.sandbox.Sandbox`, still available to ``compute_reward`` (grading
runs in it), and released (closed, workspace deleted) when the episode ends. Tools and the
grader get it through a :class:`~agentrl.sandbox.recording.RecordingSandbox`, whose log
becomes the episode record's ``commands`` (:meth:`SandboxedToolEnv.episode_record`).

Tools that open longer-lived things inside the sandbox (a shell session, a server) register
them with :func:`register_episode_resource`; the env closes them when the episode ends, before
the sandbox is released.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from agentrl.env.core import EpisodeState, ToolEnv
from agentrl.sandbox import BACKENDS, Limits, Sandbox, SandboxPool, SandboxPools, resolve_backend
from agentrl.sandbox.recording import CommandLog, RecordingSandbox

_log = logging.getLogger(__name__)

EPISODE_RESOURCES_KEY = "agentrl.episode_resources"
"""Key of ``EpisodeState.data`` holding the objects :func:`register_episode_resource` adds."""

RESOURCE_CLOSE_TIMEOUT_S = 10.0
"""How long the teardown waits for one registered resource's ``close()``."""


def register_episode_resource(state: EpisodeState, resource: Any) -> Any:
    """Has the episode's env close ``resource`` when the episode ends.

    :meth:`SandboxedToolEnv.teardown_episode` calls ``resource.close()`` (awaited when it
    returns an awaitable) for every registered object, newest first, before the sandbox is
    released. A failing or hanging ``close`` is logged and skipped; it never keeps the sandbox
    from being released. Registering the same object twice closes it once.

    Args:
        state: The episode's state (tools receive it by injection).
        resource: An object with a ``close()`` method, e.g. a
            :class:`agentrl.sandbox.ShellSession`.

    Returns:
        ``resource``, for chaining.

    Raises:
        TypeError: ``resource`` has no callable ``close``.
    """
    if not callable(getattr(resource, "close", None)):
        raise TypeError(f"an episode resource needs a close() method, got {type(resource).__name__}")
    resources: list[Any] = state.data.setdefault(EPISODE_RESOURCES_KEY, [])
    if not any(r is resource for r in resources):
        resources.append(resource)
    return resource


async def close_episode_resources(state: EpisodeState | None) -> None:
    """Closes (newest first) and forgets what was registered with
    :func:`register_episode_resource`; errors and timeouts are logged, not raised."""
    if state is None:
        return
    resources: list[Any] = state.data.pop(EPISODE_RESOURCES_KEY, None) or []
    for resource in reversed(resources):
        try:
            result = resource.close()
            if inspect.isawaitable(result):
                await asyncio.wait_for(result, RESOURCE_CLOSE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - teardown must go on to release the sandbox
            _log.warning("closing episode resource %r failed: %r", resource, exc)


class SandboxedToolEnv(ToolEnv):
    """A :class:`ToolEnv` with one sandbox per episode.

    Args:
        sandbox: Backend name (``auto``, ``bwrap``, ``docker``, ``process``); resolved once,
            when the env is built, so a missing backend fails early with instructions (with
            remote ``sandbox_pools``, on the machine each sandbox runs on instead).
        limits: Resource limits of each episode's sandbox.
        max_concurrent_sandboxes: Sandboxes alive at once over every episode that draws from
            the same ``sandbox_pools`` (with the same backend, limits and this value); more
            episodes wait for a slot.
        sandbox_options: Backend options (docker: ``image``); per task, see
            :meth:`sandbox_options_for`.
        sandbox_pools: The run's pools, shared by all its envs so that
            ``max_concurrent_sandboxes`` bounds them together. Without it the env makes its own
            and closes it in :meth:`close` / :meth:`aclose`.
        **kwargs: Passed to :class:`ToolEnv`.

    Subclasses implement :meth:`prepare_sandbox` (write the task's files) and use
    ``self.sandbox`` in ``compute_reward`` to grade; :meth:`sandbox_options_for` picks backend
    options per task (e.g. an image per instance).
    """

    default_limits = Limits()
    local_sandboxes_only: ClassVar[str | None] = None
    """Why this env's sandboxes must run on the driver's machine (``--sandbox-placement ray``
    is then refused with this reason), e.g. it reads their files through host paths; ``None``:
    they may run on any node."""

    def __init__(
        self,
        *,
        sandbox: str = "auto",
        limits: Limits | None = None,
        max_concurrent_sandboxes: int = 16,
        sandbox_options: Mapping[str, Any] | None = None,
        sandbox_pools: SandboxPools | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if sandbox_pools is not None and not isinstance(sandbox_pools, SandboxPools):
            raise TypeError(
                f"sandbox_pools must be an agentrl.sandbox.SandboxPools, got {type(sandbox_pools).__name__}"
            )
        self._owns_pools = sandbox_pools is None
        self.sandbox_pools = SandboxPools() if sandbox_pools is None else sandbox_pools
        if not self.sandbox_pools.remote:
            self.sandbox_backend = resolve_backend(sandbox)
        elif sandbox in BACKENDS:  # `auto` means what each sandbox's own node has
            self.sandbox_backend = sandbox
        else:
            raise ValueError(f"unknown sandbox backend {sandbox!r}; choose one of {BACKENDS}")
        self.limits = limits or self.default_limits
        self.max_concurrent_sandboxes = max_concurrent_sandboxes
        self.sandbox_options = dict(sandbox_options or {})
        self.sandbox: Sandbox | None = None
        """The episode's sandbox as tools and the grader see it: a recording wrapper of the
        one the pool lent (``_lent``)."""
        self.command_log: CommandLog | None = None
        self._lent: Sandbox | None = None
        self._preparing = False
        self._pool: SandboxPool | None = None

    async def prepare_sandbox(self, sandbox: Sandbox, task: Mapping[str, Any]) -> None:
        """Fills a fresh sandbox for ``task`` (files, set-up commands). Default: nothing."""

    def sandbox_options_for(self, task: Mapping[str, Any]) -> Mapping[str, Any]:
        """The backend options of ``task``'s sandbox; episodes with different options draw
        from different pools (which still share ``max_concurrent_sandboxes``). Default:
        ``self.sandbox_options`` for every task."""
        return self.sandbox_options

    def limits_for(self, task: Mapping[str, Any]) -> Limits:
        """The resource limits of ``task``'s sandbox (e.g. from a task's own configuration).
        Default: ``self.limits`` for every task."""
        return self.limits

    async def setup_episode(self, task: Mapping[str, Any]) -> None:
        """Acquires a sandbox from the pool of :meth:`limits_for` and
        :meth:`sandbox_options_for` (waiting while ``max_concurrent_sandboxes`` are in use) and
        fills it with :meth:`prepare_sandbox`."""
        self._pool = self.sandbox_pools.get(
            self.sandbox_backend, self.limits_for(task), self.max_concurrent_sandboxes,
            self.sandbox_options_for(task),
        )
        self._lent = await self._pool.acquire()
        self.command_log = CommandLog(self._log_position)
        self.sandbox = RecordingSandbox(self._lent, self.command_log)
        self._preparing = True
        try:
            await self.prepare_sandbox(self.sandbox, task)
        except BaseException:
            await self.teardown_episode()
            raise
        finally:
            self._preparing = False

    async def teardown_episode(self) -> None:
        """Closes the episode's registered resources, then releases its sandbox."""
        try:
            await close_episode_resources(self.state)
        finally:
            sandbox, self.sandbox, self._lent = self._lent, None, None
            if sandbox is not None and self._pool is not None:
                await self._pool.release(sandbox)

    def episode_record(self) -> dict[str, Any]:
        """The base record plus ``commands``: what the episode's sandbox ran (set-up, tools and
        grader; see :class:`~agentrl.sandbox.recording.CommandLog`)."""
        record = super().episode_record()
        if self.command_log is not None:
            record["commands"] = self.command_log.to_list()
        return record

    def _log_position(self) -> tuple[str, int]:
        phase = "setup" if self._preparing else "grade" if self.grading else "tools"
        return phase, self._turn

    def tool_context(self) -> list[Any]:
        return [self.state, self.sandbox]

    async def aclose(self) -> None:
        """Ends any open episode, then closes the env's own pools (made when no
        ``sandbox_pools`` was given); shared pools are left to the run that made them."""
        await super().aclose()
        if self._owns_pools:
            await self.sandbox_pools.aclose()
