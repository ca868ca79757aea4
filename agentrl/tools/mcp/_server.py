"""``McpServer``: the declaration of an MCP server whose tools an env offers the model.

Nothing here starts a process or imports the MCP SDK: declarations are cheap, validated when
they are made, and compared by :attr:`McpServer.key`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from agentrl.tools.tool import DEFAULT_TIMEOUT_S

Lifetime = Literal["episode", "run"]
"""How long one server process (or connection) lives: one episode, or the whole run."""

_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


@dataclasses.dataclass(frozen=True, eq=False)
class McpServer:
    """An MCP server whose tools an env offers the model (``ToolEnv.mcp_servers``).

    Exactly one transport is declared: **stdio** (``command`` with ``args``, ``env``, ``cwd``;
    the server is a child process speaking newline-delimited JSON-RPC on stdin/stdout) or
    **streamable HTTP** (``url`` with ``headers``; the server already runs somewhere).

    The server's ``tools/list`` becomes agentrl tools when an episode first starts it: each
    tool keeps its name (after ``tool_prefix``), description and input JSON schema, and the
    model's arguments are validated against that schema before anything is sent, as for
    ``@agentrl.tool``.

    Attributes:
        command: The stdio server's executable (looked up on ``PATH``).
        args: Its arguments.
        env: Extra environment variables. On the host they are added to a small safe set
            (``HOME``, ``LOGNAME``, ``PATH``, ``SHELL``, ``TERM``, ``USER``); in a sandbox to
            the sandbox's own minimal environment.
        cwd: The stdio server's working directory (``None``: the host process's own on the
            host, ``/workspace`` in a sandbox).
        url: The streamable-HTTP endpoint (``http://host:port/mcp``).
        headers: HTTP headers sent with every request (e.g. ``Authorization``).
        name: The label used in messages, logs and ``check-env`` output; defaults to the
            command's base name or the URL's host. Labels are unique within an env.
        lifetime: ``"episode"`` (default): a fresh server per episode, for servers with
            state. ``"run"``: one server shared by every episode of the run (on each event
            loop), for stateless servers; one found dead is restarted for the next episode.
        sandbox: Run the stdio server inside the episode's sandbox (a
            :class:`~agentrl.env.SandboxedToolEnv`), so that what it does to files happens in
            the episode's workspace under the sandbox's isolation and limits. Needs
            ``command`` and ``lifetime="episode"``.
        tools: Allow-list of the server's tool names to offer (``None``: all). A name the
            server does not list fails the episode's start.
        tool_prefix: Prepended to every tool name the model sees (``"git_"``): for servers
            whose names clash with other tools or do not start with a letter or ``_``.
        timeout: Seconds per call (``None``: no limit); a call past it is cancelled and
            reported as ``Error (timeout)``.
        startup_timeout: Seconds for starting or connecting, the handshake and ``tools/list``.
        max_output_chars: Longest result text shown to the model; longer ones are cut with a
            marker saying how much was cut.
        handshake: ``"legacy"`` (default): the ``initialize`` handshake every MCP server
            understands. ``"auto"``: first ask the server for the newer ``server/discover``,
            falling back to ``initialize``.

    Raises:
        ValueError: An inconsistent declaration (both or neither of ``command`` / ``url``, a
            field of the other transport, ``sandbox=True`` with ``url`` or
            ``lifetime="run"``, a bad ``tool_prefix``, a timeout that is not positive).
    """

    command: str | None = None
    args: Sequence[str] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] | None = None
    name: str | None = None
    lifetime: Lifetime = "episode"
    sandbox: bool = False
    tools: Sequence[str] | None = None
    tool_prefix: str = ""
    timeout: float | None = DEFAULT_TIMEOUT_S
    startup_timeout: float = 30.0
    max_output_chars: int = 16_000
    handshake: Literal["legacy", "auto"] = "legacy"

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError("McpServer needs exactly one of command= (stdio) or url= (HTTP)")
        if self.command is not None:
            if not isinstance(self.command, str) or not self.command:
                raise ValueError(f"McpServer command must be a non-empty string, got {self.command!r}")
            if self.headers is not None:
                raise ValueError("McpServer headers= is for url= servers, not command= ones")
        else:
            if not isinstance(self.url, str) or urllib.parse.urlsplit(self.url).scheme not in ("http", "https") \
                    or not urllib.parse.urlsplit(self.url).hostname:
                raise ValueError(f"McpServer url must be an http:// or https:// URL, got {self.url!r}")
            if self.args or self.env is not None or self.cwd is not None:
                raise ValueError("McpServer args=, env= and cwd= are for command= servers, not url= ones")
        _freeze(self, "args", _strings(self.args, "args"))
        if self.env is not None:
            _freeze(self, "env", _string_map(self.env, "env"))
        if self.headers is not None:
            _freeze(self, "headers", _string_map(self.headers, "headers"))
        if self.tools is not None:
            _freeze(self, "tools", _strings(self.tools, "tools"))
        if self.lifetime not in ("episode", "run"):
            raise ValueError(f"McpServer lifetime must be 'episode' or 'run', got {self.lifetime!r}")
        if self.sandbox and self.url is not None:
            raise ValueError("McpServer(sandbox=True) runs a command= server in the sandbox; a url= "
                             "server runs elsewhere")
        if self.sandbox and self.lifetime != "episode":
            raise ValueError("McpServer(sandbox=True) needs lifetime='episode': the sandbox is the "
                             "episode's and goes away with it")
        if self.tool_prefix and not _PREFIX.match(self.tool_prefix):
            raise ValueError(f"McpServer tool_prefix {self.tool_prefix!r} must start with a letter or "
                             "'_' and hold only letters, digits, '_', '.', '-'")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"McpServer timeout must be > 0 or None, got {self.timeout!r}")
        if not self.startup_timeout > 0:
            raise ValueError(f"McpServer startup_timeout must be > 0, got {self.startup_timeout!r}")
        if not isinstance(self.max_output_chars, int) or self.max_output_chars < 1:
            raise ValueError(f"McpServer max_output_chars must be an int >= 1, got {self.max_output_chars!r}")
        if self.handshake not in ("legacy", "auto"):
            raise ValueError(f"McpServer handshake must be 'legacy' or 'auto', got {self.handshake!r}")
        if self.name is not None and (not isinstance(self.name, str) or not self.name.strip()):
            raise ValueError(f"McpServer name must be a non-empty string, got {self.name!r}")

    @classmethod
    def python_module(
        cls, module: str, *args: str, python: str = sys.executable, **kwargs: Any
    ) -> McpServer:
        """A stdio server run as ``python -m module args...``.

        Args:
            module: The server's module (``mcp_server_git``).
            *args: Its command-line arguments.
            python: The interpreter. The default is this process's; inside a sandbox, use one
                the sandbox can see (``/usr/bin/python3``, with ``PYTHONPATH`` in ``env`` and the
                packages' directory in the sandbox's ``ro_binds`` on bwrap).
            **kwargs: Other :class:`McpServer` fields; ``name`` defaults to ``module``.
        """
        kwargs.setdefault("name", module)
        return cls(command=python, args=("-m", module, *args), **kwargs)

    @property
    def label(self) -> str:
        """``name``, else the command's base name, else the URL's host."""
        if self.name:
            return self.name
        if self.command is not None:
            return os.path.basename(self.command) or self.command
        return urllib.parse.urlsplit(self.url or "").hostname or str(self.url)

    @property
    def key(self) -> str:
        """The declaration's identity (JSON of every field): equal keys, same server."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=list)

    @property
    def target(self) -> str:
        """The command line or URL, for messages."""
        if self.command is not None:
            return " ".join([self.command, *self.args])
        return str(self.url)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, McpServer) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        where = f"command={self.target!r}" if self.command is not None else f"url={self.url!r}"
        return f"McpServer({self.label!r}, {where}, lifetime={self.lifetime!r}, sandbox={self.sandbox})"


def _freeze(server: McpServer, field: str, value: Any) -> None:
    object.__setattr__(server, field, value)


def _strings(values: Any, field: str) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, Sequence) \
            or not all(isinstance(v, str) for v in values):
        raise ValueError(f"McpServer {field} must be a list of strings, got {values!r}")
    return tuple(values)


def _string_map(values: Any, field: str) -> dict[str, str]:
    if not isinstance(values, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in values.items()
    ):
        raise ValueError(f"McpServer {field} must map strings to strings, got {values!r}")
    return dict(values)


def checked_servers(servers: Iterable[McpServer]) -> tuple[McpServer, ...]:
    """``servers`` as a tuple, each an McpServer with a label of its own (an env's
    ``mcp_servers``)."""
    servers = tuple(servers)
    labels: set[str] = set()
    for server in servers:
        if not isinstance(server, McpServer):
            raise TypeError(f"mcp_servers must hold agentrl.tools.mcp.McpServer declarations, got "
                            f"{type(server).__name__}")
        if server.label in labels:
            raise ValueError(f"two MCP servers are labelled {server.label!r}; give one a name=")
        labels.add(server.label)
    return servers
