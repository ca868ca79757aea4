#!/bin/bash
set -e
cd /app
cat > /app/config/service.json <<'JSON'
{
  "name": "billing-api",
  "host": "0.0.0.0",
  "port": 8443,
  "workers": 4,
  "debug": false,
  "log_level": "info",
  "upstreams": [
    {"url": "http://10.0.0.5:9000", "weight": 3},
    {"url": "http://10.0.0.6:9000", "weight": 1}
  ]
}
JSON
python3 /app/service.py
