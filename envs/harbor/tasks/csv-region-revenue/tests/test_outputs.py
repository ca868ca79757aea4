from pathlib import Path

OUTPUT = Path("/app/out/region_summary.csv")
EXPECTED = Path("/tests/expected.csv")


def test_output_exists():
    assert OUTPUT.is_file()


def test_output_matches_expected():
    got = OUTPUT.read_text(encoding="utf-8").replace("\r\n", "\n")
    want = EXPECTED.read_text(encoding="utf-8")
    # at most one trailing newline, no blank lines
    assert not got.endswith("\n\n")
    assert got.rstrip("\n").split("\n") == want.rstrip("\n").split("\n")
