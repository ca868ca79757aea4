#!/bin/bash
# Usage: report.sh DIR
# Prints one line "<file name><TAB><line count>" for every *.txt file directly
# inside DIR, sorted by file name, then a last line "TOTAL<TAB><sum>".
dir=$1
total=0
for f in $(ls $dir/*.txt); do
    n=$(wc -l < $f)
    echo -e "$(basename $f)\t$n"
    total=$total+$n
done
echo -e "TOTAL\t$total"
