#!/bin/bash
set -e
cd /app
cat > /app/tally.sh <<'SCRIPT'
#!/bin/bash
# Usage: tally.sh FILE
# FILE holds one account per line as "name:uid:shell".
set -euo pipefail

file=$1
total=0
system=0
regular=0
nologin=0

while IFS=: read -r name uid shell; do
    [[ -z $name || $name == \#* ]] && continue
    total=$((total + 1))
    if (( uid < 1000 )); then
        system=$((system + 1))
    else
        regular=$((regular + 1))
    fi
    case $shell in
        */nologin|*/false) nologin=$((nologin + 1)) ;;
    esac
done < "$file"

echo "total: $total"
echo "system: $system"
echo "regular: $regular"
echo "nologin: $nologin"
SCRIPT
