#!/bin/bash
# Runs as root with every capability dropped: it reads /app and writes only under
# /logs/verifier (and a scratch directory in /tmp).
mkdir -p /logs/verifier
scratch=$(mktemp -d)
cd "$scratch" || cd /tmp
if PYTHONDONTWRITEBYTECODE=1 timeout 50 python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
exit 0
