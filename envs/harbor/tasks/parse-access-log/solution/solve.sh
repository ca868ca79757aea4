#!/bin/bash
set -e
cd /app
mkdir -p /app/out
python3 - <<'PY'
import json
import re
from collections import Counter

LINE = re.compile(r'(?P<ip>\S+) \S+ \S+ \[[^\]]*\] "(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[0-9.]+" '
                  r'(?P<status>\d{3}) (?P<bytes>\d+|-)( .*)?')
total = malformed = bytes_total = errors = 0
ips, statuses, paths = set(), Counter(), Counter()
with open("/app/logs/access.log", encoding="utf-8") as f:
    for raw in f:
        line = raw.rstrip("\n")
        if line == "":
            continue
        m = LINE.fullmatch(line)
        if not m:
            malformed += 1
            continue
        total += 1
        ips.add(m["ip"])
        statuses[m["status"]] += 1
        paths[m["path"].split("?", 1)[0]] += 1
        bytes_total += 0 if m["bytes"] == "-" else int(m["bytes"])
        errors += int(m["status"]) >= 400
top = sorted(paths.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
report = {
    "total_requests": total,
    "malformed_lines": malformed,
    "unique_ips": len(ips),
    "status_counts": dict(sorted(statuses.items())),
    "top_paths": [{"path": p, "count": c} for p, c in top],
    "bytes_total": bytes_total,
    "error_rate": round(errors / total, 4) if total else 0.0,
}
with open("/app/out/report.json", "w") as f:
    json.dump(report, f, indent=2)
    f.write("\n")
PY
cat /app/out/report.json
