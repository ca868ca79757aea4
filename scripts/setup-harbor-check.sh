#!/usr/bin/env bash
# Makes .venv-harbor: a Python 3.12 venv with Harbor's own package, in which
# tests/integration/test_harbor_schema.py loads every shipped Harbor task with Harbor's `Task`
# model (harbor needs Python >= 3.12; the project runs on 3.11). `make test` runs this.
# Idempotent. Without a Python 3.12 interpreter it says so and exits 0 (the test then skips
# with that reason).
#   - Only what harbor's task model imports is installed (pydantic, toml, pathspec): the rest of
#     harbor's dependencies (litellm, supabase, fastapi, ...) run agents and cloud sandboxes,
#     which the check never touches, and would take minutes to install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=.venv-harbor
HARBOR_VERSION=0.25.0

if "$VENV/bin/python" -c 'import harbor.models.task.task' >/dev/null 2>&1; then
    exit 0
fi
PY312=""
for candidate in "$(command -v python3.12 || true)" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
    # a pyenv shim exists on PATH even when no 3.12 is selected: only one that runs counts
    if [ -n "$candidate" ] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
        PY312="$candidate"
        break
    fi
done
if [ -z "$PY312" ]; then
    echo "setup-harbor-check: no Python 3.12 interpreter (python3.12 on PATH or pyenv's 3.12); the Harbor cross-check will be skipped"
    exit 0
fi
echo "setup-harbor-check: making $VENV with $PY312 and harbor==$HARBOR_VERSION"
rm -rf "$VENV"
"$PY312" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "harbor==$HARBOR_VERSION"
# pip reports harbor's other requirements as missing; that report is expected and kept in the log
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "pydantic>=2.11,<3" "toml>=0.10" \
    "pathspec>=0.12" >"$VENV/pip.log" 2>&1 || { cat "$VENV/pip.log"; exit 1; }
HARBOR_TELEMETRY=0 "$VENV/bin/python" -c 'import harbor.models.task.task'
