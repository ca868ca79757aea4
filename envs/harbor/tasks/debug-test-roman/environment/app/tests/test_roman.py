import sys

import pytest

sys.path.insert(0, "/app")

from roman import from_roman, to_roman

KNOWN = [
    (1, "I"), (2, "II"), (3, "III"), (4, "IV"), (9, "IX"), (14, "XIV"),
    (40, "XL"), (90, "XC"), (99, "XCIX"), (400, "CD"), (444, "CDXLIV"),
    (1994, "MCMXCIV"), (2024, "MMXXIV"), (3888, "MMMDCCCLXXXVIII"),
    (3999, "MMMCMXCIX"),
]


@pytest.mark.parametrize("n, numeral", KNOWN)
def test_to_roman_known_values(n, numeral):
    assert to_roman(n) == numeral


@pytest.mark.parametrize("n, numeral", KNOWN)
def test_from_roman_known_values(n, numeral):
    assert from_roman(numeral) == n


def test_from_roman_accepts_lowercase():
    assert from_roman("mcmxciv") == 1994


def test_round_trip_everything():
    for n in range(1, 4000):
        assert from_roman(to_roman(n)) == n


@pytest.mark.parametrize("n", [0, -1, 4000, 10**6])
def test_to_roman_out_of_range(n):
    with pytest.raises(ValueError):
        to_roman(n)


@pytest.mark.parametrize("n", [1.0, "5", None, True])
def test_to_roman_wrong_type(n):
    with pytest.raises(TypeError):
        to_roman(n)


@pytest.mark.parametrize("s", ["", "IIII", "VV", "IC", "XM", "MMMM", "ABC", "IIV"])
def test_from_roman_rejects_invalid(s):
    with pytest.raises(ValueError):
        from_roman(s)
