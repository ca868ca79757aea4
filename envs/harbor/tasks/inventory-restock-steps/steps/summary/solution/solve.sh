#!/bin/bash
set -e
cat > /app/summary.py <<'PY'
import csv
import json
from pathlib import Path

rows = list(csv.DictReader(open("/app/inventory.csv", newline="")))
out = Path("/app/out")
out.mkdir(exist_ok=True)
summary = {"items": len(rows), "units": sum(int(r["qty"]) for r in rows),
           "out_of_stock": sorted(r["sku"] for r in rows if int(r["qty"]) == 0)}
(out / "summary.json").write_text(json.dumps(summary))
PY
python3 /app/summary.py
