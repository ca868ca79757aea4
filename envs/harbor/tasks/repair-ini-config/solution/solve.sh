#!/bin/bash
set -e
cd /app
cat > /app/backup.ini <<'INI'
# Nightly backup of the data volume.
[job]
name = nightly
source = /srv/data
destination = /mnt/backup/%(name)s
archive_name = %(name)s-%%Y%%m%%d.tar.gz
compress = yes

[schedule]
time = 02:30
days = daily

[retention]
keep_daily = 7
keep_weekly = 4
keep_monthly = 6
INI
python3 /app/backup_tool.py
