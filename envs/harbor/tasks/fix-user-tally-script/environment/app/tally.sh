#!/bin/bash
# Usage: tally.sh FILE
# FILE holds one account per line as "name:uid:shell".
set -euo pipefail

file=$1
total=0
system=0
regular=0
nologin=0

grep -v '^#' "$file" | while IFS=: read name uid shell; do
    [ -z "$name" ] && continue
    total=$((total + 1))
    if [[ $uid < 1000 ]]; then
        system=$((system + 1))
    else
        regular=$((regular + 1))
    fi
    case $shell in
        */nologin) nologin=$((nologin + 1)) ;;
    esac
done

echo "total: $total"
echo "system: $system"
echo "regular: $regular"
echo "nologin: $nologin"
