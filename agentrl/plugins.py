"""Loading user plug-ins named on the command line (``--custom-rm-path``, ``--buffer-filter-path``,
``--custom-generate-function-path``, ...).

A plug-in is named as ``path/to/file.py`` (its attribute ``default_name`` is used),
``path/to/file.py:name``, or ``package.module:name``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from agentrl.errors import PluginError

__all__ = ["load_plugin"]


def load_plugin(
    spec: str, *, flag: str, default_name: str | None = None, preferred: tuple[str, ...] = ()
) -> Any:
    """The object ``spec`` names.

    Args:
        spec: ``file.py``, ``file.py:name`` or ``module:name``.
        flag: The flag that gave ``spec``, for error messages (e.g. ``--custom-rm-path``).
        default_name: Attribute taken from a bare ``file.py``; when ``None``, the first of
            ``preferred`` the module has, else its one public function or class.
        preferred: Names looked for in a bare ``file.py`` when ``default_name`` is ``None``.

    Raises:
        PluginError: The file or module cannot be found or imported, or has no such attribute;
            the message names the flag and what to pass instead.
    """
    target, sep, name = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if not sep and not target.endswith(".py"):
        raise PluginError(f"{flag} {spec!r}: give a file ending in .py or 'module:name'")
    if target.endswith(".py") or "/" in target:
        module = _import_file(Path(target), flag)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise PluginError(f"{flag} {spec!r}: cannot import module {target!r}: {exc}") from exc
    if not name and not default_name:
        name = next((n for n in preferred if hasattr(module, n)), "")
    name = name or default_name or _only_definition(module, flag, spec)
    try:
        return getattr(module, name)
    except AttributeError:
        public = sorted(n for n in vars(module) if not n.startswith("_"))
        raise PluginError(
            f"{flag} {spec!r}: {module.__name__} has no attribute {name!r} "
            f"(it defines {', '.join(public) or 'nothing public'}); write it as 'FILE_OR_MODULE:NAME'"
        ) from None


def _import_file(path: Path, flag: str) -> Any:
    path = path.expanduser().resolve()
    if not path.is_file():
        raise PluginError(f"{flag}: no such file {str(path)!r}")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module_name = f"agentrl_plugin_{path.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"{flag}: cannot load {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise PluginError(f"{flag}: importing {str(path)!r} failed: {type(exc).__name__}: {exc}") from exc
    return module


def _only_definition(module: Any, flag: str, spec: str) -> str:
    own = [
        n for n, v in vars(module).items()
        if not n.startswith("_") and callable(v) and getattr(v, "__module__", None) == module.__name__
    ]
    if len(own) != 1:
        raise PluginError(
            f"{flag} {spec!r}: the file defines {len(own)} public functions/classes "
            f"({', '.join(own) or 'none'}); name one as 'FILE.py:NAME'"
        )
    return own[0]
