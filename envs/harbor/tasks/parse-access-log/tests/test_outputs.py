import json
from pathlib import Path

REPORT = Path("/app/out/report.json")
EXPECTED = json.loads(Path("/tests/expected.json").read_text())


def load():
    return json.loads(REPORT.read_text(encoding="utf-8"))


def test_report_is_json_object():
    report = load()
    assert isinstance(report, dict)
    assert set(report) == set(EXPECTED)


def test_counts():
    report = load()
    for key in ("total_requests", "malformed_lines", "unique_ips", "bytes_total"):
        assert type(report[key]) is int, key
        assert report[key] == EXPECTED[key], key


def test_status_counts():
    assert load()["status_counts"] == EXPECTED["status_counts"]


def test_top_paths():
    assert load()["top_paths"] == EXPECTED["top_paths"]


def test_error_rate():
    rate = load()["error_rate"]
    assert isinstance(rate, (int, float)) and not isinstance(rate, bool)
    assert abs(rate - EXPECTED["error_rate"]) < 1e-9
