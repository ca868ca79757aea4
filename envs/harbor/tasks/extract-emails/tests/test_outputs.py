from pathlib import Path


def check(name):
    got = Path("/app/out", name).read_bytes()
    want = Path("/tests", "expected_" + name).read_bytes()
    assert got == want


def test_emails():
    check("emails.txt")


def test_domains():
    check("domains.txt")
