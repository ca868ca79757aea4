"""pass@k: the unbiased estimator against hand-computed values."""

from __future__ import annotations

import math

import pytest

from agentrl.eval.metrics import pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (1, 0, 1, 0.0),
        (1, 1, 1, 1.0),
        (10, 0, 5, 0.0),
        (10, 3, 1, 0.3),              # pass@1 = c / n
        (5, 2, 2, 0.7),               # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (4, 1, 2, 0.5),               # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (6, 2, 3, 0.8),               # 1 - C(4,3)/C(6,3) = 1 - 4/20
        (10, 1, 10, 1.0),             # every draw of all samples holds the correct one
        (10, 8, 3, 1.0),              # n - c = 2 < k: a correct sample is always drawn
        (20, 5, 10, 1 - 3003 / 184756),  # 1 - C(15,10)/C(20,10)
    ],
)
def test_hand_computed_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_matches_the_binomial_form_and_is_stable_for_large_n():
    for n, c, k in [(50, 7, 5), (100, 1, 10), (200, 40, 100)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)
    value = pass_at_k(100_000, 3, 1_000)  # binomials with thousands of digits: no overflow
    assert value == pytest.approx(1 - math.comb(99_997, 1_000) / math.comb(100_000, 1_000), rel=1e-9)
    assert 0.0 < value < 1.0


def test_monotone_in_c_and_k():
    assert [pass_at_k(10, c, 3) for c in range(11)] == sorted(pass_at_k(10, c, 3) for c in range(11))
    assert [pass_at_k(10, 2, k) for k in range(1, 11)] == sorted(pass_at_k(10, 2, k) for k in range(1, 11))


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6), (5.0, 2, 1), (5, True, 1)])
def test_inconsistent_counts_raise(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)
