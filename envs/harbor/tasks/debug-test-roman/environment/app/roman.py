"""Convert between integers and Roman numerals (standard form, 1 to 3999)."""

_NUMERALS = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"),
    (100, "C"), (50, "L"), (40, "XL"),
    (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]
_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(n):
    """Return the standard Roman numeral for n (an int from 1 to 3999).

    Raises TypeError if n is not an int (bool is rejected too) and
    ValueError if it is out of range.
    """
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError("n must be an int")
    if n < 1 or n > 4000:
        raise ValueError("n must be between 1 and 3999")
    parts = []
    for value, numeral in _NUMERALS:
        count, n = divmod(n, value)
        parts.append(numeral * count)
    return "".join(parts)


def from_roman(s):
    """Return the integer value of the Roman numeral s.

    Lowercase letters are accepted. Only the standard form is valid:
    from_roman(to_roman(n)) == n, and anything that is not exactly
    to_roman(n) for some n (for example "IIII", "IC", "" or "ABC")
    raises ValueError.
    """
    if not isinstance(s, str) or not s:
        raise ValueError("not a Roman numeral")
    s = s.upper()
    if any(ch not in _VALUES for ch in s):
        raise ValueError(f"not a Roman numeral: {s!r}")
    total = 0
    for i, ch in enumerate(s):
        value = _VALUES[ch]
        if i + 1 < len(s) and value <= _VALUES[s[i + 1]]:
            total -= value
        else:
            total += value
    if total < 1 or total > 3999 or to_roman(total) != s:
        raise ValueError(f"not a standard Roman numeral: {s!r}")
    return total
