"""Evaluation metrics that do not depend on any environment."""

from __future__ import annotations

SUCCESS_REWARD = 1.0 - 1e-9
"""A sample or episode succeeded when its reward reaches this (1.0 on binary-reward tasks, with
room for float noise): what success rates and pass@k count everywhere."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate for one task: ``1 - C(n-c, k) / C(n, k)``.

    ``n`` samples were drawn for the task and ``c`` of them were correct; the result is the
    probability that at least one of ``k`` samples drawn without replacement from those ``n``
    is correct. Computed as the product ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``, which never
    forms the (huge) binomial coefficients and stays accurate for large ``n``.

    Args:
        n: Samples drawn for the task (>= 1).
        c: Correct samples among them (0 <= c <= n).
        k: Samples the metric is about (1 <= k <= n).

    Returns:
        A probability in [0, 1]: 0.0 when ``c == 0``, 1.0 when every draw of ``k`` samples
        must contain a correct one (``n - c < k``).

    Raises:
        ValueError: The counts are inconsistent (negative, ``c > n``, ``k`` outside 1..n).
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"pass_at_k: {name} must be an int, got {value!r}")
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    failure = 1.0
    for i in range(n - c + 1, n + 1):
        failure *= 1.0 - k / i
    return 1.0 - failure
