#!/bin/bash
# Runs in the verifier's own container, which holds /app as the agent left it (the artifact)
# and /logs/artifacts (what the collect hook wrote), and never ran the agent's code.
mkdir -p /logs/verifier
scratch=$(mktemp -d)
cd "$scratch" || cd /tmp
if PYTHONDONTWRITEBYTECODE=1 timeout 50 python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
exit 0
