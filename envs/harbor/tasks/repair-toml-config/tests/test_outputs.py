import subprocess
import tomllib
from pathlib import Path

EXPECTED_CONFIG = {
    "app": "storefront",
    "region": "eu-west-1",
    "replicas": 3,
    "hosts": ["web-1", "web-2", "web-3"],
    "env": {"LOG_FORMAT": "json", "CACHE_TTL": "300"},
    "image": {"repository": "registry.local/storefront", "tag": "2.7.1"},
    "database": {"host": "db.internal", "port": 5432, "pool_size": 20},
    "healthcheck": {"path": "/healthz", "interval_seconds": 10, "timeout_seconds": 2.5},
}

EXPECTED_OUTPUT = (
    "deploy storefront 2.7.1 to eu-west-1\n"
    "image registry.local/storefront:2.7.1\n"
    "replicas 3: web-1, web-2, web-3\n"
    "database db.internal:5432 pool=20\n"
    "healthcheck /healthz every 10s timeout 2.5s\n"
    "env CACHE_TTL=300\n"
    "env LOG_FORMAT=json\n"
)


def test_program_unchanged():
    assert Path("/app/deploy.py").read_bytes() == Path("/tests/deploy.py.orig").read_bytes()


def test_valid_toml_with_intended_settings():
    with open("/app/deploy.toml", "rb") as f:
        cfg = tomllib.load(f)
    assert cfg == EXPECTED_CONFIG
    assert type(cfg["replicas"]) is int
    assert type(cfg["healthcheck"]["timeout_seconds"]) is float


def test_plan_output():
    r = subprocess.run(["python3", "/app/deploy.py"], capture_output=True, text=True,
                       timeout=20, cwd="/tmp")
    assert r.returncode == 0, r.stderr
    assert r.stdout == EXPECTED_OUTPUT
