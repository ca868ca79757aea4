"""Typed configuration: one dataclass per subsystem, exposed as flat command-line flags.

Each field of a config dataclass is one flag: ``rollout_batch_size`` -> ``--rollout-batch-size``.
Its ``help`` (and, optionally, ``nargs`` / ``action``) live in the field's metadata, via
:func:`option`. ``validate()`` methods raise :class:`~agentrl.errors.ConfigError` naming the flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

from agentrl.errors import AgentRLError, ConfigError

__all__ = ["add_arguments", "flag", "from_namespace", "option", "parse_pairs", "run_command",
           "unknown_flags_message"]

C = TypeVar("C")


class FlagParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: ``prog: error: message`` and where to
    look (``prog --help``), not the full usage first (a hundred lines for ``train.py``).
    Subcommands' parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        for key in ("description", "epilog"):  # module docstrings: reST for the docs site
            if isinstance(kwargs.get(key), str):
                kwargs[key] = plain_text(kwargs[key])
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n(all flags: {self.prog} --help)\n")


_ROLE = re.compile(r":[a-z]+:`~?(?:[\w.]*\.)?([^`<]+?)(?: <[^>]+>)?`")
"""A reST role: ``:class:`~agentrl.env.ToolEnv``` -> its last name."""


def plain_text(text: str) -> str:
    """``text`` (a docstring) with its reST markup removed, for a terminal: roles become
    their name, ````literals```` their text."""
    return _ROLE.sub(r"\1", text).replace("``", "")


def option(default: Any = None, help: str = "", **argparse_kwargs: Any) -> Any:
    """A dataclass field that is also a flag; ``argparse_kwargs`` go to ``add_argument``."""
    metadata = {"help": help, "argparse": argparse_kwargs}
    if isinstance(default, list | dict):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def flag(name: str) -> str:
    """The flag of field ``name``: ``rollout_batch_size`` -> ``--rollout-batch-size``."""
    return "--" + name.replace("_", "-")


def _base_type(annotation: Any) -> Any:
    """``int | None`` -> ``int``; other annotations unchanged."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return annotation


def add_arguments(parser: argparse.ArgumentParser, cls: type, title: str | None = None, *,
                  aliases: Mapping[str, Sequence[str]] | None = None) -> None:
    """Adds one flag per field of dataclass ``cls`` (defaults are applied by ``from_namespace``).

    ``aliases`` maps field names to extra, shorter flags of the same option (``agentrl eval``'s
    ``--limit`` for ``--eval-max-prompts``).
    """
    aliases = aliases or {}
    group = parser.add_argument_group(title or cls.__name__)
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.metadata.get("cli") is False:  # filled by the caller, not a flag of its own
            continue
        kwargs = dict(field.metadata.get("argparse", {}))
        base = _base_type(hints[field.name])
        if base is bool and "action" not in kwargs:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif "action" not in kwargs and typing.get_origin(base) is None and base in (int, float, str):
            kwargs.setdefault("type", base)
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()  # type: ignore[misc]
        help_text = field.metadata.get("help", "")
        group.add_argument(
            flag(field.name), *aliases.get(field.name, ()), dest=field.name, default=argparse.SUPPRESS,
            help=f"{help_text} (default: {default!r})", **kwargs,
        )


def from_namespace(cls: type[C], namespace: argparse.Namespace | Any, **overrides: Any) -> C:
    """Builds ``cls`` from the attributes of ``namespace`` that name its fields (others are
    ignored), then ``overrides``; calls ``validate()`` if the class has one."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = {k: v for k, v in vars(namespace).items() if k in names}
    values.update(overrides)
    try:
        config = cls(**values)
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc
    validate = getattr(config, "validate", None)
    if validate is not None:
        validate()
    return config


def parse_pairs(pairs: Sequence[str], flag_name: str) -> dict[str, Any]:
    """``KEY=VALUE`` command-line pairs as a dict; a VALUE that parses as JSON is read as JSON
    (``compact=true`` -> ``True``), anything else stays a string.

    Raises:
        ConfigError: A pair without ``=`` or whose key is not an identifier; names ``flag_name``.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise ConfigError(f"{flag_name} expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def unknown_flags_message(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
    """``unrecognized arguments: ...`` with the closest flag of ``parser`` for each misspelled one
    (a flag with one letter missing or swapped gets its right spelling)."""
    known = [option for action in parser._actions for option in action.option_strings]
    hints = []
    for token in unknown:
        name = token.partition("=")[0]
        if name.startswith("--"):
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            if close:
                hints.append(f"{name}: did you mean {close[0]}?")
    hint = f" ({'; '.join(hints)})" if hints else ""
    return f"unrecognized arguments: {' '.join(unknown)}{hint}"


def run_command(main: Callable[[], int], prog: str, *, on_interrupt: str | None = None) -> NoReturn:
    """Runs a ``python -m agentrl.X`` program's ``main`` and exits with its status: our own
    errors are one line, ``prog: error: ...`` (status 1), never a traceback.

    Args:
        main: The program; returns its exit status.
        prog: Its name in the messages.
        on_interrupt: Printed after ``prog: `` on Ctrl-C (status 130); ``None``: Ctrl-C is
            not caught.
    """
    try:
        sys.exit(main())
    except AgentRLError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        if on_interrupt is None:
            raise
        print(f"{prog}: {on_interrupt}", file=sys.stderr)
        sys.exit(130)
