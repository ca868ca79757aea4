#!/bin/bash
set -e
cd /app
mkdir -p /app/out
export LC_ALL=C
cat /app/inbox/*.txt \
    | grep -oE '[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}' \
    | tr 'A-Z' 'a-z' | sort -u > /app/out/emails.txt
cut -d@ -f2 /app/out/emails.txt | sort | uniq -c \
    | awk '{ print $2, $1 }' | sort -k2,2nr -k1,1 > /app/out/domains.txt
cat /app/out/emails.txt /app/out/domains.txt
