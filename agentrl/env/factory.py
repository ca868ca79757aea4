"""``EnvFactory``: the one way a run builds its environments.

A run makes envs in several places: the data source reads the task set, every episode gets a
fresh env, in-training evaluation and ``agentrl eval`` play eval sets. All of them go through
one factory, built once from the run's flags, so that ``--env-kwarg``, ``--max-turns`` and
``--tool-call-format`` reach every env the same way, and so that sandboxed envs share the run's
sandbox pools and envs with MCP servers the run's ``lifetime="run"`` servers (the run owns
them and closes them at its end).

Which settings reach which env:

====================  =======================================  ==================================
setting               envs of the run's ``--env`` id           other ids (``--eval-env OTHER``)
====================  =======================================  ==================================
``--env-kwarg``       yes (they are that env's constructor's)  no (another constructor)
``--max-turns``       yes                                      yes
tool-call format      yes                                      yes
sandbox pools         shared                                   shared
MCP pool              shared                                   shared
====================  =======================================  ==================================

Imported on first use: the MCP client (the MCP SDK), only for an env with ``mcp_servers``;
``SandboxedToolEnv`` (its module imports this one).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from agentrl.env.core import ToolEnv, task_set_of
from agentrl.env.registry import env_spec
from agentrl.env.sandboxed import SandboxedToolEnv
from agentrl.errors import NoTaskSetError
from agentrl.sandbox import SandboxPools
from agentrl.tools.mcp._client import McpPool

__all__ = ["EnvFactory", "EnvInfo"]


@dataclasses.dataclass(frozen=True)
class EnvInfo:
    """What a probe instance of an env says about itself.

    Attributes:
        env_id: The registry id (``calc-v0``).
        max_turns: The turn limit its episodes run under.
        tool_schemas: Its tools' OpenAI-style schemas (empty: no tools). The tools of MCP
            servers are not among them: they are known only once a server has started, at an
            episode's ``reset``.
    """

    env_id: str
    max_turns: int
    tool_schemas: tuple[Mapping[str, Any], ...]


class EnvFactory:
    """Builds the envs of one run.

    Args:
        env_id: The run's env (``calc``, ``my_module:my-env``).
        env_kwargs: Constructor arguments of that env (``--env-kwarg``).
        max_turns: ``--max-turns``; ``None`` keeps each env's own default.
        tool_call_format: How the model writes tool calls.
        sandbox_pools: Pools the run's sandboxed envs share (``None``: the factory creates one
            set on first use, with ``make_sandbox_pools``, and closes it in :meth:`aclose`).
        mcp_pool: Where the run's envs share their ``lifetime="run"`` MCP servers (``None``:
            the factory creates one on first use and closes it in :meth:`aclose`).
        make_sandbox_pools: Makes the pools the factory creates: local sandboxes by default;
            :class:`agentrl.placement.sandbox_hosts.RemoteSandboxPools` puts them on Ray
            nodes (``--sandbox-placement ray``).
        sandbox_retries: How many times an episode whose sandbox was lost (its node died,
            :class:`~agentrl.sandbox.SandboxLost`) is played again from its start
            (``--use-fault-tolerance``); 0: it stays failed.

    Raises:
        UnknownEnvError: ``env_id`` is not registered (raised here, at start-up).
    """

    def __init__(
        self,
        env_id: str,
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        max_turns: int | None = None,
        tool_call_format: str = "hermes",
        sandbox_pools: SandboxPools | None = None,
        mcp_pool: McpPool | None = None,
        make_sandbox_pools: Callable[[], SandboxPools] = SandboxPools,
        sandbox_retries: int = 0,
    ) -> None:
        if sandbox_retries < 0:
            raise ValueError(f"sandbox_retries must be >= 0, got {sandbox_retries}")
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.max_turns = max_turns
        self.tool_call_format = tool_call_format
        self._own_pools = sandbox_pools is None
        self.sandbox_pools = sandbox_pools
        self._make_sandbox_pools = make_sandbox_pools
        self.sandbox_retries = sandbox_retries
        self._own_mcp = mcp_pool is None
        self.mcp_pool = mcp_pool
        self._spec = env_spec(env_id)
        self._info: EnvInfo | None = None

    def __call__(self) -> ToolEnv:
        """A fresh env of the run's id."""
        return self.make(self.env_id)

    def make(self, env_id: str) -> ToolEnv:
        """A fresh env of ``env_id`` with the run's settings (see the module docstring)."""
        spec = env_spec(env_id)
        kwargs: dict[str, Any] = {"tool_call_format": self.tool_call_format}
        if spec.id == self._spec.id:
            kwargs.update(self.env_kwargs)
        if self.max_turns is not None:
            kwargs["max_turns"] = self.max_turns
        if _takes_sandbox_pools(spec):
            kwargs["sandbox_pools"] = self._pools()
        env = spec.make(**kwargs)
        if getattr(env, "mcp_servers", ()):
            env.use_mcp_pool(self._mcp())
        return env

    def for_env(self, env_id: str) -> EnvFactory:
        """A factory of ``env_id`` that shares this run's settings and sandbox pools."""
        other = EnvFactory.__new__(EnvFactory)
        other.__dict__.update(self.__dict__)
        other.env_id = env_id
        other._spec = env_spec(env_id)
        other._info = None
        other._own_pools = False
        other.sandbox_pools = self._pools()
        other._own_mcp = False
        other.mcp_pool = self._mcp()
        if other._spec.id != self._spec.id:
            other.env_kwargs = {}
        return other

    @property
    def info(self) -> EnvInfo:
        """The env's id, turn limit and tool schemas (from one probe instance, made once)."""
        if self._info is None:
            probe = self()
            try:
                self._info = EnvInfo(probe.env_id or self.env_id, probe.max_turns,
                                     tuple(probe.toolbox.schemas))
            finally:
                probe.close()
        return self._info

    def task_set(self, split: str, limit: int | None = None) -> list[Mapping[str, Any]] | None:
        """The env's tasks of ``split``; ``None`` when the env has no task set (it is played
        on seeds).

        Raises:
            UnknownSplitError: The env has task sets, but not ``split``.
        """
        probe = self()
        try:
            return list(task_set_of(probe, split, limit))
        except NoTaskSetError:
            return None
        finally:
            probe.close()

    async def aclose(self) -> None:
        """Closes the sandbox pools and the MCP pool this factory created (not ones it was
        given), in the running event loop."""
        mcp, self.mcp_pool = self.mcp_pool, None
        pools, self.sandbox_pools = self.sandbox_pools, None
        try:
            if mcp is not None and self._own_mcp:
                await mcp.aclose()
        finally:
            if pools is not None and self._own_pools:
                await pools.aclose()

    def _mcp(self) -> McpPool:
        if self.mcp_pool is None:
            self.mcp_pool = McpPool()
            self._own_mcp = True
        return self.mcp_pool

    def _pools(self) -> SandboxPools:
        if self.sandbox_pools is None:
            self.sandbox_pools = self._make_sandbox_pools()
            self._own_pools = True
        return self.sandbox_pools


def _takes_sandbox_pools(spec: Any) -> bool:
    """Whether the spec's entry point is a sandboxed env class (it accepts ``sandbox_pools``)."""
    target = spec.load()
    return inspect.isclass(target) and issubclass(target, SandboxedToolEnv)
