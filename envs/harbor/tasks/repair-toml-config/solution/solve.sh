#!/bin/bash
set -e
cd /app
cat > /app/deploy.toml <<'TOML'
# Deployment plan for the web tier.
app = "storefront"
region = "eu-west-1"
replicas = 3
hosts = ["web-1", "web-2", "web-3"]
env = { LOG_FORMAT = "json", CACHE_TTL = "300" }

[image]
repository = "registry.local/storefront"
tag = "2.7.1"

[database]
host = "db.internal"
port = 5432
pool_size = 20

[healthcheck]
path = "/healthz"
interval_seconds = 10
timeout_seconds = 2.5
TOML
python3 /app/deploy.py
