"""The MCP servers of one env instance, over its episodes: where they are started, when they
stop, and how their tools join the env's toolbox.

:class:`~agentrl.env.ToolEnv` holds one :class:`EnvMcp` and calls it from ``reset`` (after
``setup_episode``, so a sandboxed server finds the episode's sandbox) and from the episode's
end (before ``teardown_episode``, so sandboxed servers stop before their sandbox goes). What a
server's failure becomes is :class:`~agentrl.env.ToolEnv`'s contract ("MCP servers").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from agentrl.errors import McpServerError, ToolDefinitionError
from agentrl.sandbox import Sandbox
from agentrl.tools.mcp._client import McpEpisode, McpPool
from agentrl.tools.mcp._server import McpServer
from agentrl.tools.toolbox import Toolbox

_log = logging.getLogger(__name__)


class EnvMcp:
    """One env's MCP servers: the pool that shares its ``lifetime="run"`` servers (its own,
    started on first use and stopped by :meth:`aclose`, unless :meth:`share` gives it a run's),
    and the current episode's connections.

    Args:
        owner: The env's class name, for messages.
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.pool: McpPool | None = None
        self.owns_pool = True
        self.episode: McpEpisode | None = None
        self.info: list[dict[str, Any]] = []
        """The latest episode's servers (see :meth:`McpEpisode.describe`), kept after it ends."""
        self._listing_warned = False

    def share(self, pool: McpPool) -> None:
        """Takes ``pool``'s ``lifetime="run"`` servers instead of an own pool; its owner closes
        it, not :meth:`aclose`."""
        self.pool = pool
        self.owns_pool = False

    async def open(self, servers: Sequence[McpServer], toolbox: Toolbox,
                   sandbox: Sandbox | None) -> Toolbox:
        """Starts (or takes from the pool) the episode's servers and returns ``toolbox`` with
        their tools added. A server's tool keeps the object of its first listing, so a later
        episode whose server lists a tool differently is warned about once, not re-validated.

        Raises:
            McpServerError: A server could not start, or one of its tools is named like
                another tool of the env (set ``tool_prefix=`` on the server).
        """
        if self.pool is None:
            self.pool = McpPool()
            self.owns_pool = True
        episode = await self.pool.open_episode(servers, sandbox=sandbox)
        self.episode = episode
        self.info = episode.describe()
        missing, changed = [], []
        for tool in episode.tools:
            known = toolbox.get(tool.name)
            if known is None:
                missing.append(tool)
            elif getattr(known, "server", None) != tool.server:  # another tool has the name
                raise McpServerError(
                    f"{self.owner}: the tool {tool.name!r} of the MCP server "
                    f"{tool.server.label!r} clashes with another tool of the env; set tool_prefix= "
                    "on the McpServer or leave the tool out with tools=[...]")
            elif known is not tool:
                changed.append(tool.name)
        if changed and not self._listing_warned:
            self._listing_warned = True
            _log.warning("%s: the MCP tools %s are listed differently than in an earlier "
                         "episode; the env keeps the first listing", self.owner, changed)
        if not missing:
            return toolbox
        try:  # the first episode (or a setup_episode that rebuilt the toolbox)
            return Toolbox([*toolbox, *missing])
        except ToolDefinitionError as exc:  # two servers list one name
            raise McpServerError(f"{self.owner}: MCP tools clash ({exc}); set "
                                 "tool_prefix= on one of the McpServers") from exc

    async def close_episode(self) -> None:
        """Stops the episode's own servers and gives the shared ones back. Idempotent."""
        episode, self.episode = self.episode, None
        if episode is not None:
            await episode.close()

    async def aclose(self) -> None:
        """Stops the shared servers of the env's own pool (a pool given by :meth:`share`
        stays). Idempotent."""
        if self.owns_pool and self.pool is not None:
            await self.pool.aclose()

    def status(self) -> list[dict[str, Any]]:
        """The current episode's servers; ``[]`` outside an episode."""
        return self.episode.describe() if self.episode is not None else []

    def running_after_close(self) -> list[Any]:
        """The shared connections of the env's own pool still open (none after :meth:`aclose`)."""
        return self.pool.connections() if self.owns_pool and self.pool is not None else []
