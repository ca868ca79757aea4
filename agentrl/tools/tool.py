"""``@agentrl.tool``: a typed, documented Python function becomes a tool a model can call."""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
import json
import typing
from collections.abc import Callable, Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from agentrl.errors import (
    MalformedArgumentsError,
    SchemaViolationError,
    ToolDefinitionError,
)
from agentrl.injection import Injected
from agentrl.tools.calls import TOOL_NAME_PATTERN
from agentrl.tools.schema import (
    annotation_schema,
    coerce_argument,
    needs_coercion,
    parse_docstring,
)

DEFAULT_TIMEOUT_S = 60.0


class Tool:
    """A callable the model may invoke, with a validated JSON-Schema parameter list.

    Create tools with the :func:`tool` decorator. Calling the ``Tool`` object directly calls the
    wrapped function unchanged, so tools stay unit-testable as plain functions.

    Attributes:
        name: Tool name the model uses.
        description: What the tool does (shown to the model).
        parameters: JSON Schema (``type: object``) of the arguments the model supplies.
        timeout: Seconds before a call is cancelled and reported as a timeout; ``None`` = never.
        inline: Run a synchronous function directly on the event loop instead of in a worker
            thread. Only for cheap, non-blocking functions; the timeout cannot interrupt them.
        injected: Parameter name -> type of the context values the environment supplies.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        inline: bool = False,
    ) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        if not TOOL_NAME_PATTERN.match(self.name):
            raise ToolDefinitionError(
                f"tool name {self.name!r} is invalid: use letters, digits, '_', '.', '-' "
                "(at most 64 characters, starting with a letter or '_')"
            )
        if timeout is not None and timeout <= 0:
            raise ToolDefinitionError(f"tool {self.name!r}: timeout must be > 0 or None")
        self.timeout = timeout
        self.is_async = inspect.iscoroutinefunction(fn)
        self.inline = inline and not self.is_async
        doc = parse_docstring(fn.__doc__)
        self.description = description if description is not None else doc.description
        self._signature = inspect.signature(fn)
        try:
            hints = typing.get_type_hints(fn, include_extras=True)
        except Exception as exc:  # unresolvable forward references
            raise ToolDefinitionError(f"tool {self.name!r}: cannot resolve type hints: {exc}") from exc
        self._hints = hints
        self.injected = {
            pname: hint
            for pname, hint in hints.items()
            if pname != "return" and _is_injected(hint)
        }
        self._coerced = {
            pname
            for pname, hint in hints.items()
            if pname != "return" and pname not in self.injected and needs_coercion(hint)
        }
        if parameters is None:
            parameters = self._derive_parameters(doc.params)
        self.parameters = dict(parameters)
        self._check_schema()
        self._validator = schema_validator(self.parameters)(self.parameters)
        functools.update_wrapper(self, fn)

    def _derive_parameters(self, docs: Mapping[str, str]) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        required: list[str] = []
        for pname, param in self._signature.parameters.items():
            if pname in self.injected:
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ToolDefinitionError(
                    f"tool {self.name!r}: *args/**kwargs cannot be described to a model; "
                    "list the parameters explicitly"
                )
            if param.kind is param.POSITIONAL_ONLY:
                raise ToolDefinitionError(
                    f"tool {self.name!r}: positional-only parameter {pname!r}; tools are called "
                    "with keyword arguments"
                )
            hint = self._hints.get(pname, inspect.Parameter.empty)
            prop = annotation_schema(hint, where=f"parameter {pname!r} of tool {self.name!r}")
            if pname in docs and "description" not in prop:
                prop = {**prop, "description": docs[pname]}
            if param.default is inspect.Parameter.empty:
                required.append(pname)
            elif (default := _as_json(param.default)) is not _NOT_JSON:
                prop = {**prop, "default": default}
            properties[pname] = prop
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            schema["required"] = required
        schema["additionalProperties"] = False
        return schema

    def _check_schema(self) -> None:
        if self.parameters.get("type") != "object":
            raise ToolDefinitionError(
                f"tool {self.name!r}: parameters schema must have \"type\": \"object\", "
                f"got {self.parameters.get('type')!r}"
            )
        try:
            schema_validator(self.parameters).check_schema(self.parameters)
        except SchemaError as exc:
            path = "/".join(str(p) for p in exc.path) or "(root)"
            raise ToolDefinitionError(
                f"tool {self.name!r}: invalid JSON schema at {path}: {exc.message}"
            ) from exc

    # -- the OpenAI-style description the model sees ---------------------------------------

    @property
    def schema(self) -> dict[str, Any]:
        """``{"type": "function", "function": {"name", "description", "parameters"}}``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    # -- calling ------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def validate(self, arguments: Any) -> None:
        """Checks the model's arguments against the schema.

        Raises:
            MalformedArgumentsError: ``arguments`` is not a JSON object.
            SchemaViolationError: It is an object but breaks the schema (message has the path).
        """
        if not isinstance(arguments, dict):
            raise MalformedArgumentsError(
                f"arguments of {self.name!r} must be a JSON object, got {type(arguments).__name__}",
                tool_name=self.name,
            )
        error = next(self._validator.iter_errors(arguments), None)
        if error is not None:
            raise SchemaViolationError(
                f"invalid arguments for {self.name!r} at {error.json_path}: {error.message}",
                tool_name=self.name,
                json_path=error.json_path,
            )

    async def invoke(self, arguments: dict[str, Any], context: Mapping[type, Any]) -> Any:
        """Validates ``arguments``, injects context values and runs the tool (no timeout here).

        Args:
            arguments: Decoded arguments from the model.
            context: Injectable objects by type; each injected parameter gets the first value
                that is an instance of its annotation.

        Raises:
            MalformedArgumentsError, SchemaViolationError: Bad arguments.
            ToolDefinitionError: An injected parameter has no matching context value (a
                framework/user-code bug, not the model's).
            Exception: Whatever the tool raises, unchanged.
        """
        self.validate(arguments)
        kwargs = dict(arguments)
        for pname in self._coerced.intersection(kwargs):
            kwargs[pname] = coerce_argument(kwargs[pname], self._hints[pname])
        for pname, hint in self.injected.items():
            kwargs[pname] = _lookup_context(self.name, pname, hint, context)
        if self.is_async:
            return await self.fn(**kwargs)
        if self.inline:
            return self.fn(**kwargs)
        return await asyncio.to_thread(self.fn, **kwargs)

    def __repr__(self) -> str:
        return f"Tool(name={self.name!r}, timeout={self.timeout})"


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    inline: bool = False,
) -> Any:
    """Turns a typed, documented function (sync or async) into a :class:`Tool`.

    Usable bare (``@tool``) or with options (``@tool(timeout=5)``). The name defaults to the
    function name, the description to the docstring's summary, and the parameter schema is
    derived from type hints and the ``Args:`` section unless ``parameters`` is given. The
    schema is checked once here, and a validator is built once.

    Args:
        fn: The function (when used bare).
        name: Tool name; defaults to ``fn.__name__``.
        description: Overrides the docstring description.
        parameters: An explicit JSON Schema for the arguments instead of the derived one.
        timeout: Seconds per call (``None``: no limit). Async tools are cancelled; sync tools
            run in a worker thread whose result is abandoned (Python cannot kill a thread: run
            untrusted or long work in a sandbox, which kills real processes).
        inline: Run a sync tool on the event loop itself (cheap pure functions only).

    Raises:
        ToolDefinitionError: Invalid name, un-schematisable hint or invalid explicit schema.
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(
            f, name=name, description=description, parameters=parameters,
            timeout=timeout, inline=inline,
        )

    return wrap(fn) if fn is not None else wrap


def schema_validator(schema: Mapping[str, Any]) -> type:
    """The jsonschema validator class of ``schema``'s dialect: the one its ``$schema`` names
    (draft 4 to 2020-12), else Draft 2020-12 (what a schema without ``$schema`` means)."""
    return validator_for(schema, default=Draft202012Validator)


def _is_injected(hint: Any) -> bool:
    base = typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint
    return isinstance(base, type) and issubclass(base, Injected)


def _lookup_context(tool_name: str, pname: str, hint: Any, context: Mapping[type, Any]) -> Any:
    wanted = typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint
    value = context.get(wanted)
    if value is not None:
        return value
    for candidate in context.values():
        if isinstance(candidate, wanted):
            return candidate
    raise ToolDefinitionError(
        f"tool {tool_name!r} needs an injected {wanted.__name__} for parameter {pname!r}, but the "
        f"environment provides only {sorted(t.__name__ for t in context)}; add it in the env's "
        "tool_context()"
    )


_NOT_JSON = object()


def _as_json(value: Any) -> Any:
    """``value`` as the JSON data the model would send (tuples become lists), or _NOT_JSON."""
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return _NOT_JSON
