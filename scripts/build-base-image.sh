#!/usr/bin/env bash
# Builds the Docker sandbox base image (agentrl-base:bookworm-py3-v2) when the daemon lacks it, so
# that CI pays for debootstrap once, before the tests. Needs root and a running daemon
# (scripts/dockerd.sh start). Extra arguments go to `python -m agentrl.sandbox.images`
# (--tag, --docker-host, --force). Reads the Debian archive from this machine's apt sources;
# AGENTRL_DEBIAN_MIRROR overrides it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
if [ -z "${DOCKER_HOST:-}" ] && [ -S "${AGENTRL_DOCKER_DIR:-/var/lib/agentrl-docker}/docker.sock" ]; then
    export DOCKER_HOST="unix://${AGENTRL_DOCKER_DIR:-/var/lib/agentrl-docker}/docker.sock"
fi
cd "$ROOT"
exec "$PY" -m agentrl.sandbox.images "$@"
