#!/usr/bin/env bash
# System set-up for the sandbox backends (run by `make test` and CI; needs root):
#   - installs bubblewrap, util-linux (nsenter, prlimit, setpriv), the Docker engine, iptables,
#     debootstrap, Chromium (the viewer's browser tests) and python3-pytest (bwrap sandboxes
#     see the host's /usr, so tools such as run_tests need pytest for /usr/bin/python3) from
#     the distribution's packages when missing;
#   - starts a private Docker daemon (scripts/dockerd.sh) and builds the offline base image.
# Without root it changes nothing and says so: tests of a missing backend are then skipped,
# each with its reason. A daemon that fails to start is reported (with its log) and its tests
# are skipped with the daemon's error; that does not stop the other tests.
# `--bwrap-only` (make demo) installs bubblewrap and its helpers and leaves Docker alone.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BWRAP_ONLY=0
[ "${1:-}" = "--bwrap-only" ] && BWRAP_ONLY=1

if [ "$(id -u)" != 0 ]; then
    echo "setup-system: not root; not installing bubblewrap/Docker (their tests skip with the reason)"
    exit 0
fi

missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
for tool in nsenter prlimit setpriv; do command -v "$tool" >/dev/null || { missing+=(util-linux); break; }; done
if [ "$BWRAP_ONLY" = 0 ]; then
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v iptables-restore >/dev/null || missing+=(iptables)  # Harbor's per-phase network rules
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v chromium >/dev/null || missing+=(chromium)  # agentrl view's browser tests
fi
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import pytest' 2>/dev/null || missing+=(python3-pytest)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup-system: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || echo "setup-system: apt-get install ${missing[*]} failed; the affected tests will skip"
fi

[ "$BWRAP_ONLY" = 1 ] && exit 0
if "$ROOT/scripts/dockerd.sh" start; then
    "$ROOT/scripts/build-base-image.sh" \
        || echo "setup-system: building the Docker base image failed; Docker tests will report it"
else
    echo "setup-system: the Docker daemon did not start; Docker tests will be skipped with its error"
fi
exit 0
