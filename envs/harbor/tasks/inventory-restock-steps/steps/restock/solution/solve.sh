#!/bin/bash
set -e
cat > /app/summary.py <<'PY'
import argparse
import csv
import json
from pathlib import Path


def read(path):
    with open(path, newline="") as f:
        return {r["sku"]: {"name": r["name"], "qty": int(r["qty"])} for r in csv.DictReader(f)}


parser = argparse.ArgumentParser()
parser.add_argument("--restock")
args = parser.parse_args()
stock = read("/app/inventory.csv")
if args.restock:
    for sku, row in read(args.restock).items():
        stock.setdefault(sku, {"name": row["name"], "qty": 0})["qty"] += row["qty"]
out = Path("/app/out")
out.mkdir(exist_ok=True)
summary = {"items": len(stock), "units": sum(r["qty"] for r in stock.values()),
           "out_of_stock": sorted(s for s, r in stock.items() if r["qty"] == 0)}
name = "restocked.json" if args.restock else "summary.json"
(out / name).write_text(json.dumps(summary))
PY
python3 /app/summary.py --restock /app/restock.csv
