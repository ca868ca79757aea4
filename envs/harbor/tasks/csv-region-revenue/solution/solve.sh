#!/bin/bash
set -e
cd /app
mkdir -p /app/out
python3 - <<'PY'
import csv
from decimal import Decimal

totals = {}
with open("/app/data/orders.csv", newline="") as f:
    for row in csv.DictReader(f):
        if row["status"].strip().lower() != "completed":
            continue
        region = row["region"].strip().lower()
        t = totals.setdefault(region, [0, 0, Decimal("0")])
        qty = int(row["quantity"])
        t[0] += 1
        t[1] += qty
        t[2] += qty * Decimal(row["unit_price"])

with open("/app/out/region_summary.csv", "w", newline="") as f:
    f.write("region,orders,units,revenue\n")
    for region, (orders, units, revenue) in sorted(totals.items(), key=lambda kv: (-kv[1][2], kv[0])):
        f.write(f"{region},{orders},{units},{revenue:.2f}\n")
PY
