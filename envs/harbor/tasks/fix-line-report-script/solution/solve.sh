#!/bin/bash
set -e
cd /app
cat > /app/report.sh <<'SCRIPT'
#!/bin/bash
# Usage: report.sh DIR
# Prints one line "<file name><TAB><line count>" for every *.txt file directly
# inside DIR, sorted by file name, then a last line "TOTAL<TAB><sum>".
dir=$1
total=0
shopt -s nullglob
export LC_ALL=C
for f in "$dir"/*.txt; do
    [ -f "$f" ] || continue
    n=$(awk 'END { print NR }' "$f")
    printf '%s\t%s\n' "$(basename "$f")" "$n"
    total=$((total + n))
done
printf 'TOTAL\t%s\n' "$total"
SCRIPT
