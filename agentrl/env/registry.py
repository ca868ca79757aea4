"""The environment registry: ids such as ``calc-v0`` or ``swe-tools-v0`` -> how to build them.

* ``register_env("my-env-v0", entry_point="my_pkg.envs:MyEnv", max_turns=5)`` records a lazy
  entry point (the module is imported only when the env is made).
* ``make_env("my-env")`` resolves an id without a version to the highest registered version;
  ``make_env("my_pkg.envs:my-env")`` imports ``my_pkg.envs`` first (it registers its envs at
  import), which is how ``--env my_module:my-env`` finds a user's env.
* Every env is also registered with Gymnasium, so ``gymnasium.make("agentrl/calc-v0")`` works
  once the registering module is imported (ids without a namespace get ``agentrl/``).

The built-in envs live in the ``agentrl_envs`` package (the repository's ``envs/`` folder);
``import agentrl`` registers them (that package only records lazy entry points: no env module
is imported until an env is made), so their ids are known here and to Gymnasium at once.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium

from agentrl.env.core import ToolEnv
from agentrl.errors import EnvArgumentError, EnvRegistrationError, UnknownEnvError

ENV_ID_PATTERN = re.compile(r"^(?:(?P<ns>[\w.-]+)/)?(?P<name>[\w.-]+?)(?:-v(?P<version>\d+))?$")
GYMNASIUM_NAMESPACE = "agentrl"
BUILTIN_ENV_MODULES = ("agentrl_envs",)


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """How to build one registered environment.

    Attributes:
        id: Full id, e.g. ``calc-v0``.
        entry_point: ``"module:Attr"`` or a callable returning a :class:`~agentrl.ToolEnv`.
        kwargs: Default constructor arguments (overridable in :func:`make_env`).
        description: One line for ``agentrl list-envs`` (defaults to the class docstring).
    """

    id: str
    entry_point: str | Callable[..., Any]
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    description: str = ""

    @property
    def name(self) -> str:
        """The id without its version suffix."""
        match = ENV_ID_PATTERN.match(self.id)
        assert match is not None
        ns = f"{match['ns']}/" if match["ns"] else ""
        return ns + match["name"]

    @property
    def version(self) -> int | None:
        """The ``-vN`` version, or ``None`` when the id has none."""
        match = ENV_ID_PATTERN.match(self.id)
        assert match is not None
        return int(match["version"]) if match["version"] is not None else None

    def load(self) -> Callable[..., Any]:
        """Imports and returns the entry point.

        Raises:
            EnvRegistrationError: The module or attribute cannot be loaded.
        """
        if callable(self.entry_point):
            return self.entry_point
        module_name, _, attr = self.entry_point.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            raise EnvRegistrationError(
                f"env {self.id!r}: cannot load entry point {self.entry_point!r}: {exc}"
            ) from exc
        return obj

    def make(self, **kwargs: Any) -> Any:
        """Builds the env with the spec's defaults overridden by ``kwargs``.

        Raises:
            EnvRegistrationError: The entry point cannot be loaded or did not return a ToolEnv.
            EnvArgumentError: An argument the constructor does not accept, or a required one
                missing (the constructor's own errors propagate unchanged).
        """
        factory = self.load()
        arguments = {**self.kwargs, **kwargs}
        try:
            env = factory(**arguments)
        except TypeError as exc:
            problem = self._argument_problem(factory, arguments, exc)
            if problem is None:  # a TypeError of the constructor's own code
                raise
            raise EnvArgumentError(problem) from exc
        if not isinstance(env, ToolEnv):
            raise EnvRegistrationError(
                f"env {self.id!r}: entry point {self.entry_point!r} returned "
                f"{type(env).__name__}, which is not an agentrl.ToolEnv"
            )
        env.env_id = self.id
        gym_spec = gymnasium.registry.get(gymnasium_id(self.id))
        if env.spec is None and gym_spec is not None and gym_spec.entry_point == self.entry_point:
            # As gymnasium.make records it on the unwrapped env, so that Gymnasium tools
            # (check_env's render and close checks, env.spec.make()) can build it again.
            env.spec = dataclasses.replace(
                gym_spec, kwargs=arguments, max_episode_steps=None, order_enforce=False,
                disable_env_checker=True, additional_wrappers=(),
            )
        return env

    def _argument_problem(
        self, factory: Callable[..., Any], arguments: Mapping[str, Any], error: TypeError
    ) -> str | None:
        """What is wrong with ``arguments`` given the constructor's signature, when ``error``
        (raised by calling it) is that mismatch; ``None`` when it is some other TypeError.

        A typo in ``--env-kwarg`` otherwise surfaces as a TypeError from deep in ``__init__``
        (``super().__init__(**kwargs)``) that names neither the env nor what it accepts.
        """
        accepted = _accepted_keywords(factory)
        if accepted is None:
            return None
        names, required = accepted
        text = str(error)
        what = getattr(factory, "__qualname__", repr(factory))
        unknown = sorted(n for n in set(arguments) - names if f"'{n}'" in text)
        if unknown:
            hints = []
            for name in unknown:
                close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.6)
                hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            return (
                f"env {self.id!r} ({what}) got unknown argument(s) {', '.join(hints)}; it "
                f"accepts: {', '.join(sorted(names)) or '(none)'}"
            )
        missing = sorted(n for n in required - set(arguments) if f"'{n}'" in text)
        if missing:
            return (
                f"env {self.id!r} ({what}) needs the argument(s) {', '.join(map(repr, missing))} "
                "(pass them to make_env, or --env-kwarg KEY=VALUE on the command line)"
            )
        return None

    def describe(self) -> str:
        """The description, or the first line of the env class's docstring."""
        if self.description:
            return self.description
        try:
            doc = self.load().__doc__ or ""
        except EnvRegistrationError as exc:
            return f"(cannot load: {exc})"
        return doc.strip().splitlines()[0] if doc.strip() else ""


def _accepted_keywords(factory: Callable[..., Any]) -> tuple[set[str], set[str]] | None:
    """(keyword names ``factory`` accepts, names its own signature requires), or ``None`` when
    any name may be accepted (a ``**kwargs`` that is not forwarded along a class's ``__init__``
    chain, or no signature).

    For a class, ``**kwargs`` of an ``__init__`` is taken to go to the next ``__init__`` of the
    MRO (``super().__init__(**kwargs)``, as ToolEnv subclasses do), so the names of the chain
    are collected until an ``__init__`` without ``**kwargs``.
    """
    if inspect.isclass(factory):
        inits = [k.__dict__["__init__"] for k in factory.__mro__ if "__init__" in k.__dict__]
        skip_self = True
    else:
        inits, skip_self = [factory], False
    names: set[str] = set()
    required: set[str] = set()
    for init in inits:
        if init is object.__init__:
            return names, required
        try:
            params = list(inspect.signature(init).parameters.values())
        except (TypeError, ValueError):  # a builtin without a signature: accept anything
            return None
        if skip_self:
            params = params[1:]
        for p in params:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                # Only the outermost signature's required names are certain: a subclass may
                # pass a parent's required argument itself.
                if p.default is p.empty and init is inits[0]:
                    required.add(p.name)
                names.add(p.name)
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return names, required
    return None


_REGISTRY: dict[str, EnvSpec] = {}
_builtins_loaded = False


def register_env(
    id: str,
    entry_point: str | Callable[..., Any],
    *,
    description: str = "",
    **defaults: Any,
) -> EnvSpec:
    """Registers an environment under ``id``.

    Args:
        id: ``[namespace/]name[-vN]``, e.g. ``swe-tools-v0`` or ``myorg/sql-v2``.
        entry_point: ``"package.module:ClassOrFactory"`` (imported lazily) or a callable.
        description: One line shown by ``agentrl list-envs``.
        **defaults: Constructor keyword arguments (e.g. ``max_turns=5``).

    Returns:
        The registered spec.

    Raises:
        EnvRegistrationError: Malformed id or entry point, or the id is taken by a different
            entry point. Registering the identical spec again (a module re-import) is allowed.
    """
    if not isinstance(id, str) or not ENV_ID_PATTERN.match(id):
        raise EnvRegistrationError(
            f"invalid env id {id!r}: use [namespace/]name[-vN] with letters, digits, '_', '.', '-'"
        )
    if isinstance(entry_point, str) and not re.match(r"^[\w.]+:[\w.]+$", entry_point):
        raise EnvRegistrationError(
            f"env {id!r}: entry_point must look like 'package.module:ClassName', got {entry_point!r}"
        )
    spec = EnvSpec(id, entry_point, dict(defaults), description)
    existing = _REGISTRY.get(id)
    if existing is not None:
        if existing == spec:
            return existing
        raise EnvRegistrationError(
            f"env id {id!r} is already registered with entry point {existing.entry_point!r}; "
            "choose another id or bump its version (-vN)"
        )
    _REGISTRY[id] = spec
    gym_id = gymnasium_id(id)
    if gym_id not in gymnasium.registry:
        gymnasium.register(id=gym_id, entry_point=entry_point, kwargs=dict(defaults))
    return spec


def gymnasium_id(id: str) -> str:
    """The id an env is registered under with Gymnasium: ``agentrl/<id>`` unless ``id`` has a
    namespace of its own."""
    return id if "/" in id else f"{GYMNASIUM_NAMESPACE}/{id}"


def load_builtin_envs() -> None:
    """Imports the built-in env package(s) once, which registers them."""
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    for module in BUILTIN_ENV_MODULES:
        importlib.import_module(module)


def import_env_module(module: str, *, context: str = "") -> None:
    """Imports ``module`` so that its ``register_env`` calls run.

    Args:
        module: A dotted module name, e.g. ``my_pkg.envs``.
        context: Where the name came from, for the message (e.g. ``"from env id 'm:x'"``).

    Raises:
        EnvRegistrationError: The module cannot be imported.
    """
    try:
        importlib.import_module(module)
    except ImportError as exc:
        where = f" ({context})" if context else ""
        raise EnvRegistrationError(
            f"cannot import module {module!r}{where}: {exc}. Is it installed or on PYTHONPATH?"
        ) from exc


def env_spec(id: str) -> EnvSpec:
    """Looks up an id (``name``, ``name-vN`` or ``module:name``).

    Raises:
        UnknownEnvError: Nothing matches; the message lists the closest registered ids.
        EnvRegistrationError: The ``module:`` part cannot be imported.
    """
    load_builtin_envs()
    if ":" in id:
        module, _, id = id.partition(":")
        import_env_module(module, context=f"from env id '{module}:{id}'")
    if id in _REGISTRY:
        return _REGISTRY[id]
    match = ENV_ID_PATTERN.match(id)
    if match and match["version"] is None:
        versions = [s for s in _REGISTRY.values() if s.name == id and s.version is not None]
        if versions:
            return max(versions, key=lambda s: s.version or 0)
    candidates = sorted(set(_REGISTRY) | {s.name for s in _REGISTRY.values()})
    close = difflib.get_close_matches(id, candidates, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise UnknownEnvError(
        f"no env registered as {id!r}.{hint} Run `agentrl list-envs` to see all ids; a user env "
        "is addressed as 'my_module:my-env'."
    )


def make_env(id: str, **kwargs: Any) -> Any:
    """Builds a registered environment.

    Args:
        id: ``name``, ``name-vN``, or ``module:name`` (imports ``module`` first).
        **kwargs: Overrides of the registered defaults (e.g. ``max_turns=5``).

    Returns:
        A new :class:`~agentrl.ToolEnv`.
    """
    return env_spec(id).make(**kwargs)


def list_envs() -> list[EnvSpec]:
    """All registered specs, sorted by id."""
    load_builtin_envs()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]
