"""The import rule inside packages (docs/architecture.md, "Packages, in layers"): an import goes
at the top of its module, and one inside a function is kept only to defer a heavy or optional
dependency, saying why. import-linter checks the layers and that no package has an import loop
(``make lint``); this test checks the function-level imports, so that a new one that defers
nothing fails here and is moved to the top instead."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "agentrl"

HEAVY = frozenset({
    "torch", "megatron", "ray", "vllm", "sglang", "transformers", "tokenizers", "safetensors",
    "peft", "gguf", "numpy", "docker", "playwright", "aiohttp", "openai", "wandb", "tensorboard",
    "rich", "pyarrow", "datasets", "openenv", "fastapi", "uvicorn", "mcp", "mcp_types", "httpx2",
    "pydantic",
})
"""Third-party packages that take long to import or are optional: a module may import them where
they are used, so that importing it (every ``--help``, every config) stays light."""

DEFERRED = {
    ("agentrl.chat", "agentrl.chat.tiny_tokenizer"):
        "builds a tokenizer with the tokenizers and transformers packages: only when one is built",
    ("agentrl.run.interrupts", "agentrl.sandbox"):
        "the sandbox reaper (and the Docker back-end's helpers) only when a signal stops the run",
    ("agentrl.run.serving", "agentrl.placement.servers"):
        "the server launcher (aiohttp clients, Ray) only for --rollout-backend sglang / vllm",
    ("agentrl.sandbox", "agentrl.sandbox.docker"):
        "the Docker back-end only when a Docker sandbox is asked for (its SDK is optional)",
    ("agentrl.sandbox.docker", "agentrl.sandbox.images"):
        "the base image's build (debootstrap, a tarball) only when no image is given",
    ("agentrl.sandbox.images", "agentrl.sandbox._docker_api"):
        "the Docker SDK's client only when an image is built",
    ("agentrl.sandbox.pool", "agentrl.sandbox"):
        "the package, which imports this module first: its creator and the Docker back-end",
}
"""Function-level imports of light modules kept on purpose: (importer, imported) -> why."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _function_level_imports() -> list[tuple[str, int, str]]:
    """``(module, line, imported module)`` of every import inside a function of agentrl."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import):
                    found += [(module, inner.lineno, alias.name) for alias in inner.names]
                elif isinstance(inner, ast.ImportFrom) and inner.module and not inner.level:
                    found.append((module, inner.lineno, inner.module))
    return found


def test_a_function_level_import_defers_a_heavy_or_optional_dependency():
    light = []
    for module, line, imported in _function_level_imports():
        if imported.split(".")[0] in HEAVY:
            continue
        if imported.startswith("agentrl") and (module, imported) in DEFERRED:
            continue
        if imported.startswith("agentrl") and _imports_heavy_at_top(imported):
            continue
        light.append(f"{module}:{line} imports {imported}")
    assert not light, ("imports inside functions that defer nothing heavy; move them to the top "
                       "of the module (or, if one must wait, add it to DEFERRED with the reason):\n"
                       + "\n".join(light))


def test_every_deferred_import_is_still_there():
    present = {(m, i) for m, _, i in _function_level_imports()}
    assert set(DEFERRED) <= present, set(DEFERRED) - present  # a stale entry hides nothing


_HEAVY_AT_TOP: dict[str, bool] = {}


def _imports_heavy_at_top(module: str, seen: frozenset[str] = frozenset()) -> bool:
    """Whether importing ``module`` imports a HEAVY package (through its module-level imports,
    agentrl's own followed)."""
    if module in _HEAVY_AT_TOP:
        return _HEAVY_AT_TOP[module]
    path = PACKAGE.parent / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    if module in seen or not path.is_file():
        return False
    heavy = False
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                 else [])
        for name in names:
            if name.split(".")[0] in HEAVY or (
                    name.startswith("agentrl") and _imports_heavy_at_top(name, seen | {module})):
                heavy = True
    _HEAVY_AT_TOP[module] = heavy
    return heavy
