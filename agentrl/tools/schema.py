"""JSON Schema from Python signatures and Google-style docstrings.

Supported annotations: ``str``, ``int``, ``float``, ``bool``, ``None``, ``list[T]``,
``tuple[T, ...]``, ``tuple[A, B]``, ``dict`` / ``dict[str, T]``, ``Literal[...]``,
``Optional[T]`` / ``T | None`` / other unions, ``Enum`` subclasses, ``TypedDict``, dataclasses,
``typing.Any`` (no constraint) and ``Annotated[T, "description"]``. Anything else is a
:class:`~agentrl.errors.ToolDefinitionError` at decoration time, never a surprise at call time.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.errors import ToolDefinitionError

_NONE_TYPE = type(None)
_SECTION_RE = re.compile(r"^(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?):\s*$")
_ARG_RE = re.compile(r"^(\*{0,2}\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")


@dataclasses.dataclass(frozen=True)
class Docstring:
    """The parts of a Google-style docstring a tool schema needs."""

    description: str
    params: dict[str, str]


def parse_docstring(doc: str | None) -> Docstring:
    """Splits a Google-style docstring into its description and ``Args:`` entries.

    Args:
        doc: The raw docstring (``None`` gives empty parts).

    Returns:
        The description (text before the first section, paragraphs joined by a blank line) and
        a mapping from parameter name to its description (continuation lines joined by spaces).
    """
    if not doc:
        return Docstring("", {})
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    arg_indent: int | None = None
    for line in lines:
        header = _SECTION_RE.match(line)
        if header and not line.startswith(" "):
            section, current, arg_indent = header.group(1), None, None
            continue
        if section is None:
            description.append(line)
            continue
        if section not in ("Args", "Arguments", "Parameters") or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if arg_indent is None:
            arg_indent = indent
        match = _ARG_RE.match(line.strip())
        if indent <= arg_indent and match:
            current = match.group(1).lstrip("*")
            params[current] = match.group(3).strip()
        elif current is not None:
            params[current] = f"{params[current]} {line.strip()}".strip()
    text = "\n".join(description).strip()
    text = re.sub(r"\n{3,}", "\n\n", text)
    return Docstring(text, params)


def annotation_schema(annotation: Any, *, where: str) -> dict[str, Any]:
    """Returns the JSON Schema of one type annotation.

    Args:
        annotation: A resolved type hint.
        where: Human-readable location for error messages (e.g. ``"parameter 'x' of f"``).

    Raises:
        ToolDefinitionError: The annotation has no JSON Schema equivalent.
    """
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    if annotation is _NONE_TYPE or annotation is None:
        return {"type": "null"}
    simple = {str: "string", bool: "boolean", int: "integer", float: "number"}
    if annotation in simple:
        return {"type": simple[annotation]}
    if annotation in (list, tuple, Sequence):
        return {"type": "array"}
    if annotation in (dict, Mapping):
        return {"type": "object"}

    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        schema = annotation_schema(args[0], where=where)
        notes = [a for a in args[1:] if isinstance(a, str)]
        if notes:
            schema = {**schema, "description": " ".join(notes)}
        return schema
    if origin is typing.Literal:
        values = list(args)
        schema: dict[str, Any] = {"enum": values}
        kinds = {type(v) for v in values}
        if len(kinds) == 1 and (kind := kinds.pop()) in simple:
            schema["type"] = simple[kind]
        return schema
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not _NONE_TYPE]
        variants = [annotation_schema(a, where=where) for a in members]
        if len(members) < len(args):
            variants.append({"type": "null"})
        return variants[0] if len(variants) == 1 else {"anyOf": variants}
    if origin in (list, Sequence, set, frozenset) or (origin is tuple and args[-1:] == (Ellipsis,)):
        schema = {"type": "array"}
        if args:
            schema["items"] = annotation_schema(args[0], where=where)
        if origin in (set, frozenset):
            schema["uniqueItems"] = True
        return schema
    if origin is tuple:
        items = [annotation_schema(a, where=where) for a in args]
        return {"type": "array", "prefixItems": items, "minItems": len(items), "maxItems": len(items)}
    if origin in (dict, Mapping):
        if args and args[0] is not str:
            raise ToolDefinitionError(f"{where}: JSON object keys are strings; got {annotation!r}")
        schema = {"type": "object"}
        if len(args) == 2 and args[1] is not Any:
            schema["additionalProperties"] = annotation_schema(args[1], where=where)
        return schema
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = [member.value for member in annotation]
        schema = {"enum": values}
        kinds = {type(v) for v in values}
        if len(kinds) == 1 and (kind := kinds.pop()) in simple:
            schema["type"] = simple[kind]
        return schema
    if typing.is_typeddict(annotation):
        return _object_schema(
            annotation,
            typing.get_type_hints(annotation, include_extras=True),
            required=set(annotation.__required_keys__),
            where=where,
        )
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        hints = typing.get_type_hints(annotation, include_extras=True)
        fields = [f for f in dataclasses.fields(annotation) if f.init]
        required = {
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        return _object_schema(annotation, {f.name: hints[f.name] for f in fields}, required, where)
    raise ToolDefinitionError(
        f"{where}: type {annotation!r} has no JSON Schema mapping. Use str, int, float, bool, "
        "list, dict, Literal, Enum, TypedDict, a dataclass, or pass parameters= explicitly."
    )


def _object_schema(cls: type, hints: dict[str, Any], required: set[str], where: str) -> dict:
    doc = parse_docstring(cls.__doc__)
    properties = {}
    for name, hint in hints.items():
        prop = annotation_schema(hint, where=f"{where}, field '{name}' of {cls.__name__}")
        if name in doc.params and "description" not in prop:
            prop = {**prop, "description": doc.params[name]}
        properties[name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = sorted(required)
    schema["additionalProperties"] = False
    return schema


def needs_coercion(annotation: Any) -> bool:
    """Whether JSON values for ``annotation`` may need :func:`coerce_argument` (computed once
    per parameter, so plain ``str``/``int``/``bool``/``list``/``dict`` cost nothing per call)."""
    if annotation in (str, int, bool, _NONE_TYPE, Any, list, dict, inspect.Parameter.empty):
        return False
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return False
    if origin in (list, dict) and all(not needs_coercion(a) for a in typing.get_args(annotation)):
        return False
    if origin in (typing.Union, types.UnionType):
        return any(needs_coercion(a) for a in typing.get_args(annotation))
    if typing.is_typeddict(annotation):
        return False
    return True


def coerce_argument(value: Any, annotation: Any) -> Any:
    """Turns a validated JSON value into the annotated Python type (dataclass, Enum, tuple).

    Only structural conversions the schema already guarantees are done; other values pass
    through unchanged.
    """
    if value is None or annotation is inspect.Parameter.empty or annotation is Any:
        return value
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return coerce_argument(value, args[0])
    if origin in (typing.Union, types.UnionType):
        for member in args:
            if member is not _NONE_TYPE and _matches(value, member):
                return coerce_argument(value, member)
        return value
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return annotation(value)
    if dataclasses.is_dataclass(annotation) and isinstance(value, dict):
        hints = typing.get_type_hints(annotation, include_extras=True)
        return annotation(**{k: coerce_argument(v, hints.get(k, Any)) for k, v in value.items()})
    if origin is tuple and isinstance(value, list):
        if args[-1:] == (Ellipsis,):
            return tuple(coerce_argument(v, args[0]) for v in value)
        return tuple(coerce_argument(v, a) for v, a in zip(value, args, strict=False))
    if origin in (set, frozenset) and isinstance(value, list):
        return origin(value)
    if origin in (list, Sequence) and args and isinstance(value, list):
        return [coerce_argument(v, args[0]) for v in value]
    if origin in (dict, Mapping) and len(args) == 2 and isinstance(value, dict):
        return {k: coerce_argument(v, args[1]) for k, v in value.items()}
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _matches(value: Any, annotation: Any) -> bool:
    """Whether a JSON value fits a union member well enough to convert it to that member."""
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return value in {m.value for m in annotation}
    if dataclasses.is_dataclass(annotation) or typing.is_typeddict(annotation):
        return isinstance(value, dict)
    origin = typing.get_origin(annotation) or annotation
    if origin in (list, tuple, set, frozenset, Sequence):
        return isinstance(value, list)
    if origin in (dict, Mapping):
        return isinstance(value, dict)
    return True
