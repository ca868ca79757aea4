import csv
from pathlib import Path

OUTPUT = Path("/app/out/engineering.csv")
EXPECTED = Path("/tests/expected.csv")


def read_rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return [row for row in csv.reader(f)]


def test_output_exists():
    assert OUTPUT.is_file()


def test_rows_match_expected():
    got = read_rows(OUTPUT)
    want = read_rows(EXPECTED)
    assert got[0] == ["name", "email", "start_date"]
    assert got == want


def test_no_blank_lines():
    text = OUTPUT.read_text(encoding="utf-8").replace("\r\n", "\n")
    assert "\n\n" not in text.rstrip("\n") and not text.endswith("\n\n")
