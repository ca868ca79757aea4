import subprocess
import sys

sys.path.insert(0, "/app")


def test_unit_tests_pass():
    # The pristine copy of the task's unit tests, run against /app/roman.py.
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "/tests/test_roman.py"], capture_output=True, text=True, timeout=40,
                       cwd="/tmp")
    assert r.returncode == 0, r.stdout[-3000:]


def test_full_range_against_reference():
    from roman import from_roman, to_roman
    table = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
             (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]

    def ref(n):
        out = ""
        for v, s in table:
            while n >= v:
                out += s
                n -= v
        return out

    for n in range(1, 4000):
        assert to_roman(n) == ref(n)
        assert from_roman(ref(n).lower()) == n
