#!/usr/bin/env bash
# Fetches SGLang's machine-readable /generate contract (sglang/api/v1/api_types.py, msgspec
# structs) from the sglang wheel on PyPI, without installing sglang (it needs CUDA), for the
# contract tests (tests/unit/test_sglang_contract.py). Idempotent; a failed download leaves
# those tests skipped with the reason.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="${SGLANG_CONTRACT_VERSION:-0.5.23}"
DEST="$ROOT/.venv/sglang-contract"
[ -f "$DEST/$VERSION/api_types.py" ] && exit 0
PY="$ROOT/.venv/bin/python"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if ! "$PY" -m pip download --quiet --no-deps "sglang==$VERSION" -d "$tmp" 2>"$tmp/err"; then
    echo "fetch-sglang-contract: pip download sglang==$VERSION failed: $(tail -1 "$tmp/err")"
    exit 0
fi
mkdir -p "$DEST/$VERSION"
"$PY" - "$tmp" "$DEST/$VERSION" <<'PYEOF'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("sglang-*.whl"))
with zipfile.ZipFile(wheel) as z:
    pathlib.Path(sys.argv[2], "api_types.py").write_bytes(z.read("sglang/api/v1/api_types.py"))
PYEOF
echo "fetch-sglang-contract: $DEST/$VERSION/api_types.py"
