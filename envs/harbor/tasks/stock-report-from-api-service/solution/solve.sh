#!/bin/bash
set -e
python3 - <<'PY'
import json
import os
import urllib.request

with urllib.request.urlopen(os.environ["STOCK_API"] + "/stock.json", timeout=10) as response:
    items = json.load(response)["items"]
low = [(i["reorder_at"] - i["qty"], i["sku"]) for i in items if i["qty"] < i["reorder_at"]]
low.sort(key=lambda m: (-m[0], m[1]))
with open("/app/low_stock.txt", "w") as f:
    f.writelines(f"{sku} {missing}\n" for missing, sku in low)
PY
