"""The exception hierarchy of agentrl.

Two families, kept apart on purpose:

* :class:`ToolCallError` and its subclasses describe something the *model* did wrong (a call it
  could not parse, an unknown tool, arguments that break the schema, a tool that timed out or
  raised). The environment catches these and turns them into ``role: tool`` error messages the
  model sees; they never end a training run.
* Everything else under :class:`AgentRLError` is a *framework or user-code* problem (a broken
  env, an invalid tool schema, an unknown env id, a chat template that is not prefix-stable).
  These propagate: silently continuing would train on garbage.
"""

from __future__ import annotations

import enum


class AgentRLError(Exception):
    """Base class of every exception raised by agentrl itself."""


# --- framework / configuration errors (propagate) -------------------------------------------


class ToolDefinitionError(AgentRLError):
    """A function cannot become a tool: bad name, un-schematisable type hint, invalid schema."""


class EnvRegistrationError(AgentRLError):
    """An env id is malformed, registered twice, or its entry point cannot be loaded."""


class UnknownEnvError(EnvRegistrationError):
    """No env is registered under the requested id. The message lists close matches."""


class EnvArgumentError(EnvRegistrationError):
    """The arguments given to an env's constructor do not match its signature (an unknown or a
    missing argument). The message names the env, the argument and the accepted ones."""


class UnknownSplitError(AgentRLError, ValueError):
    """An env was asked for a task split it does not have. The message names the split and the
    available ones. Also a ``ValueError``, which is what an unknown split raised before.

    Attributes:
        available: The env's splits, when the raiser said (``()``: not said).
    """

    def __init__(self, message: str, available: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.available = tuple(available)


class NoTaskSetError(AgentRLError):
    """An env without a fixed task set was asked for one (it is played on seeds instead)."""


class EnvCheckError(AgentRLError):
    """An environment violates the :class:`agentrl.ToolEnv` contract (raised by ``check_env``)."""


class ChatTemplateError(AgentRLError):
    """A (tokenizer, chat template, tool-call format) triple is not usable for token-exact RL."""


class ToolCallRenderError(AgentRLError):
    """A tool call cannot be written in the requested format (e.g. a key the format cannot hold)."""


class ConfigError(AgentRLError):
    """A flag or config value is invalid; the message names the flag and what to change."""


class DataError(AgentRLError):
    """A prompt data file or row is unusable; the message names the file, line and field."""


class EngineError(AgentRLError):
    """The inference engine cannot serve a request (closed, broken, input too long, weights that
    do not match the model)."""


class PolicyServerError(AgentRLError):
    """An OpenAI-compatible server playing the policy (``agentrl eval --policy openai``) refused
    a request, kept failing after the retries, or replied with something that is not a chat
    completion. The message names the URL, the HTTP status and the server's own message.

    Attributes:
        url: The endpoint requested, when known.
        status: The HTTP status of the last reply (``None``: no reply, e.g. a timeout).
    """

    def __init__(self, message: str, *, url: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status


class RewardError(AgentRLError):
    """A custom reward function or model failed or returned something that is not a number."""


class GradingError(RewardError):
    """An env's grader could not produce a reward (e.g. a Harbor verifier that timed out or
    wrote no valid reward file): the episode fails with this reason instead of scoring 0."""


class RolloutFailedError(AgentRLError):
    """Too many samples of a rollout failed to train on (``--max-failed-fraction``)."""


class ResourceLost(AgentRLError):
    """Something an episode runs on is gone (a sandbox whose node died, with everything that ran
    in it). Nothing the model wrote caused it, so a tool call that meets it does not show it to
    the model as a tool error: it propagates, and the episode fails."""


class EnvServerError(AgentRLError):
    """An environment served over the network (an OpenEnv server) answered with an error, or
    cannot be used: not an OpenEnv server, no free session before the admission timeout, an
    error for a reset or a step. The message names the env and its URL. The episode it happens
    in fails with it; the server itself is still there."""


class EnvServerLost(EnvServerError, ResourceLost):
    """An environment server is gone: it cannot be reached, closed the connection, or did not
    answer within the timeout. Nothing the model wrote caused it: the episode fails, and under
    ``--use-fault-tolerance`` it is played again."""


class RunInterrupted(AgentRLError):
    """A run was stopped by SIGINT or SIGTERM and has cleaned up; the message says what was
    interrupted and how to continue.

    Attributes:
        signal_name: ``SIGINT`` or ``SIGTERM``.
        exit_code: The status to exit with: 128 + the signal's number, as a shell reports it.
    """

    def __init__(self, message: str, *, signal_name: str, exit_code: int) -> None:
        super().__init__(message)
        self.signal_name = signal_name
        self.exit_code = exit_code


class McpServerError(AgentRLError):
    """An MCP server cannot be used: it cannot be started or reached, does not finish the
    handshake and ``tools/list`` within its startup timeout, or lists tools that cannot become
    agentrl tools (a name outside ``TOOL_NAME_PATTERN``, an invalid JSON schema, a name another
    tool of the env already has, an allow-listed tool it does not list). The message names the
    server, its command or URL and, for a server that failed to start, the end of its stderr.

    A server that fails *during* an episode is not this error: its calls become ``tool_error``
    messages (:class:`ToolServerError`) and it is restarted for the next episode.
    """


class PluginError(AgentRLError):
    """A user plug-in (``--custom-generate-function-path``, ``--custom-rm-path``, a filter)
    cannot be loaded or has the wrong form."""


# --- errors the model caused (become observations) -------------------------------------------


class ToolErrorKind(enum.StrEnum):
    """Why a tool call failed. Counted per episode in ``info["tool_errors"]``."""

    PARSE_ERROR = "parse_error"
    """The assistant text contained a tool call that could not be parsed."""
    UNKNOWN_TOOL = "unknown_tool"
    """The call named a tool the environment does not have."""
    MALFORMED_ARGUMENTS = "malformed_arguments"
    """The arguments were not a JSON object (e.g. a string that is not JSON, or a list)."""
    SCHEMA_VIOLATION = "schema_violation"
    """The arguments were an object but failed the tool's JSON schema."""
    TIMEOUT = "timeout"
    """The tool did not finish within its timeout."""
    TOOL_EXCEPTION = "tool_exception"
    """The tool itself raised an exception."""
    TOOL_ERROR = "tool_error"
    """The server behind the tool (an MCP server) reported the call as failed (an ``isError``
    result or a JSON-RPC error), returned an invalid result, or stopped or lost the connection
    during or before the call."""


class ToolCallError(AgentRLError):
    """A tool call failed because of what the model wrote or what the tool did.

    Attributes:
        kind: The failure category.
        tool_name: The tool the model asked for, when known.
    """

    kind: ToolErrorKind = ToolErrorKind.TOOL_EXCEPTION

    def __init__(self, message: str, *, tool_name: str | None = None) -> None:
        super().__init__(message)
        self.tool_name = tool_name


class ToolCallParseError(ToolCallError, ValueError):
    """Text that looks like a tool call in the given format could not be parsed.

    This is the only exception a tool-call parser raises, whatever its input.

    Attributes:
        format_name: The tool-call format being parsed.
        position: Character offset in the text where the problem was found, when known.
    """

    kind = ToolErrorKind.PARSE_ERROR

    def __init__(self, message: str, *, format_name: str, position: int | None = None) -> None:
        super().__init__(message)
        self.format_name = format_name
        self.position = position


class UnknownToolError(ToolCallError):
    """The model called a tool that does not exist in this environment."""

    kind = ToolErrorKind.UNKNOWN_TOOL


class MalformedArgumentsError(ToolCallError):
    """The call's arguments are not a JSON object."""

    kind = ToolErrorKind.MALFORMED_ARGUMENTS


class SchemaViolationError(ToolCallError):
    """The call's arguments do not satisfy the tool's JSON schema.

    Attributes:
        json_path: JSON path of the offending value, e.g. ``$.options.depth``.
    """

    kind = ToolErrorKind.SCHEMA_VIOLATION

    def __init__(self, message: str, *, tool_name: str | None = None, json_path: str = "$") -> None:
        super().__init__(message, tool_name=tool_name)
        self.json_path = json_path


class ToolTimeoutError(ToolCallError):
    """The tool ran longer than its timeout and was cancelled."""

    kind = ToolErrorKind.TIMEOUT


class ToolExecutionError(ToolCallError):
    """The tool raised; the message carries the exception type and text the model will see."""

    kind = ToolErrorKind.TOOL_EXCEPTION


class ToolServerError(ToolCallError):
    """A tool served by an external server (an MCP server) failed; the message is what the
    model sees after ``Error (tool_error): ``.

    Attributes:
        server: The server's label.
        connection_lost: The server is gone for the rest of the episode (it stopped, or the
            connection broke); it is restarted for the next one.
    """

    kind = ToolErrorKind.TOOL_ERROR

    def __init__(
        self,
        message: str,
        *,
        tool_name: str | None = None,
        server: str = "",
        connection_lost: bool = False,
    ) -> None:
        super().__init__(message, tool_name=tool_name)
        self.server = server
        self.connection_lost = connection_lost
