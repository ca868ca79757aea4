#!/bin/bash
set -e
cd /app
mkdir -p /app/out
python3 - <<'PY'
import csv

rows = []
with open("/app/employees.csv", newline="") as f:
    for r in csv.DictReader(f):
        if r["department"].strip() != "Engineering" or r["active"].strip().lower() != "yes":
            continue
        m, d, y = (int(x) for x in r["start_date"].strip().split("/"))
        rows.append((f"{y:04d}-{m:02d}-{d:02d}", int(r["id"]),
                     f"{r['last_name'].strip()}, {r['first_name'].strip()}",
                     r["email"].strip().lower()))
rows.sort(key=lambda t: (t[0], t[1]))
with open("/app/out/engineering.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["name", "email", "start_date"])
    for date, _id, name, email in rows:
        w.writerow([name, email, date])
PY
