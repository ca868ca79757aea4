import json
import subprocess
from pathlib import Path

EXPECTED_CONFIG = {
    "name": "billing-api",
    "host": "0.0.0.0",
    "port": 8443,
    "workers": 4,
    "debug": False,
    "log_level": "info",
    "upstreams": [
        {"url": "http://10.0.0.5:9000", "weight": 3},
        {"url": "http://10.0.0.6:9000", "weight": 1},
    ],
}

EXPECTED_OUTPUT = (
    "service billing-api on 0.0.0.0:8443\n"
    "workers=4 debug=false log_level=info\n"
    "upstream http://10.0.0.5:9000 weight=3\n"
    "upstream http://10.0.0.6:9000 weight=1\n"
)


def test_service_program_unchanged():
    assert Path("/app/service.py").read_bytes() == Path("/tests/service.py.orig").read_bytes()


def test_config_is_strict_json_with_intended_values():
    text = Path("/app/config/service.json").read_text(encoding="utf-8")

    def reject_constant(name):
        raise ValueError(f"non-standard constant {name}")

    cfg = json.loads(text, parse_constant=reject_constant)
    assert cfg == EXPECTED_CONFIG
    assert type(cfg["port"]) is int and type(cfg["workers"]) is int
    assert cfg["debug"] is False


def test_service_starts():
    r = subprocess.run(["python3", "/app/service.py"], capture_output=True, text=True,
                       timeout=20, cwd="/tmp")
    assert r.returncode == 0, r.stderr
    assert r.stdout == EXPECTED_OUTPUT
