"""Statistics shared by the benchmarks (imported by the scripts of this folder, which run with
the folder first on ``sys.path``)."""


def median_ci(xs: list, level: float = 0.95) -> tuple:
    """A distribution-free confidence interval for the median of ``xs``: order statistics
    ``(x_(k), x_(n+1-k))`` (1-based, ``xs`` sorted), with the largest ``k`` for which
    ``P(Binomial(n, 1/2) < k) <= (1 - level) / 2`` (the sign test's interval; e.g. Conover,
    *Practical Nonparametric Statistics*, 3rd ed., sec. 3.2). It assumes only independent
    rounds, not a normal spread. Returns ``(low, high)``; ``(nan, nan)`` below 6 values (no
    95 % interval exists then)."""
    from math import comb

    xs = sorted(xs)
    n = len(xs)
    tail, k, cum = (1 - level) / 2, 0, 0.0
    for j in range(n + 1):  # cum = P(B < j + 1)
        cum += comb(n, j) / 2**n
        if cum > tail:
            break
        k = j + 1
    if k < 1:
        return float("nan"), float("nan")
    return xs[k - 1], xs[n - k]
