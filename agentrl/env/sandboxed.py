"""``SandboxedToolEnv``: a ToolEnv whose episodes each get a sandbox.

The sandbox is acquired from a pool when an episode starts (after the task is chosen), filled
by :meth:`SandboxedToolEnv.prepare_sandbox`, injected into every tool that annotates a
parameter with :class:`agentrl.sandbox.Sandbox`, still available to ``compute_reward`` (grading
runs in it), and released (closed, workspace deleted) when the episode ends.

Tools that open longer-lived things inside the sandbox (a shell session, a server) register
them with :func:`register_episode_resource`; the env closes them when the episode ends, before
the sandbox is released.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from collections.abc import Mapping
from typing import Any

from agentrl.env.core import EpisodeState, ToolEnv
from agentrl.sandbox import Limits, Sandbox, SandboxPool, create_sandbox, resolve_backend

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


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, SandboxPool]] = (
    weakref.WeakKeyDictionary()
)


def shared_pool(
    backend: str, limits: Limits, max_concurrent: int, options: Mapping[str, Any] | None = None
) -> SandboxPool:
    """The pool for (this event loop, backend, limits, options), created on first use.

    Envs of one event loop share it, so ``max_concurrent`` bounds the sandboxes of all their
    episodes together; pools are per loop because asyncio primitives are.
    """
    loop = asyncio.get_running_loop()
    options = dict(options or {})
    key = (backend, limits, max_concurrent, tuple(sorted(options.items())))
    pools = _pools.setdefault(loop, {})
    if key not in pools:
        pools[key] = SandboxPool(
            lambda: create_sandbox(backend, limits, **options), max_concurrent=max_concurrent
        )
    return pools[key]


class SandboxedToolEnv(ToolEnv):
    """A :class:`ToolEnv` with one sandbox per episode.

    Args:
        sandbox: Backend name (``auto``, ``bwrap``, ``docker``, ``process``); resolved once,
            when the env is built, so a missing backend fails early with instructions.
        limits: Resource limits of each episode's sandbox.
        max_concurrent_sandboxes: Sandboxes of this event loop's episodes alive at once; more
            episodes wait for a slot.
        sandbox_options: Backend options (docker: ``image``).
        **kwargs: Passed to :class:`ToolEnv`.

    Subclasses implement :meth:`prepare_sandbox` (write the task's files) and use
    ``self.sandbox`` in ``compute_reward`` to grade.
    """

    default_limits = Limits()

    def __init__(
        self,
        *,
        sandbox: str = "auto",
        limits: Limits | None = None,
        max_concurrent_sandboxes: int = 16,
        sandbox_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.sandbox_backend = resolve_backend(sandbox)
        self.limits = limits or self.default_limits
        self.max_concurrent_sandboxes = max_concurrent_sandboxes
        self.sandbox_options = dict(sandbox_options or {})
        self.sandbox: Sandbox | None = None
        self._pool: SandboxPool | None = None

    async def prepare_sandbox(self, sandbox: Sandbox, task: Mapping[str, Any]) -> None:
        """Fills a fresh sandbox for ``task`` (files, set-up commands). Default: nothing."""

    async def setup_episode(self, task: Mapping[str, Any]) -> None:
        self._pool = shared_pool(
            self.sandbox_backend, self.limits, self.max_concurrent_sandboxes, self.sandbox_options
        )
        self.sandbox = await self._pool.acquire()
        try:
            await self.prepare_sandbox(self.sandbox, task)
        except BaseException:
            await self.teardown_episode()
            raise

    async def teardown_episode(self) -> None:
        """Closes the episode's registered resources, then releases its sandbox."""
        try:
            await close_episode_resources(self.state)
        finally:
            sandbox, self.sandbox = self.sandbox, None
            if sandbox is not None and self._pool is not None:
                await self._pool.release(sandbox)

    def tool_context(self) -> list[Any]:
        return [self.state, self.sandbox]
