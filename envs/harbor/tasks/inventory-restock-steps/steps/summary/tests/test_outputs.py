import json
import subprocess
from pathlib import Path

SUMMARY = Path("/app/out/summary.json")


def test_summary_written():
    assert json.loads(SUMMARY.read_text()) == {"items": 4, "units": 77, "out_of_stock": ["B-300"]}


def test_summary_script_reruns(tmp_path):
    SUMMARY.unlink()
    subprocess.run(["python3", "/app/summary.py"], check=True, timeout=20, cwd=tmp_path)
    assert json.loads(SUMMARY.read_text()) == {"items": 4, "units": 77, "out_of_stock": ["B-300"]}
