import json
import subprocess
from pathlib import Path

OUT = Path("/app/out")
BEFORE = Path("/app/archive/inventory-before-restock.csv")
RESTOCKED = {"items": 5, "units": 120, "out_of_stock": []}
SUMMARY = {"items": 4, "units": 77, "out_of_stock": ["B-300"]}


def run(*args, cwd):
    subprocess.run(["python3", "/app/summary.py", *args], check=True, timeout=20, cwd=cwd)


def test_restocked_written():
    assert json.loads((OUT / "restocked.json").read_text()) == RESTOCKED


def test_both_forms_rerun_and_leave_the_inventory(tmp_path):
    for name in ("restocked.json", "summary.json"):
        (OUT / name).unlink(missing_ok=True)
    run("--restock", "/app/restock.csv", cwd=tmp_path)
    run(cwd=tmp_path)
    assert json.loads((OUT / "restocked.json").read_text()) == RESTOCKED
    assert json.loads((OUT / "summary.json").read_text()) == SUMMARY
    assert Path("/app/inventory.csv").read_text() == BEFORE.read_text()
