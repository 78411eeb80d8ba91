"""Percentiles and distribution-free confidence bounds for a quantile (the P95 the SLO is written on).

Point estimates use linear interpolation between order statistics (Hyndman & Fan type 7, numpy's default
`np.percentile`), the method vLLM's `benchmark_serving` and `vllm bench serve` use (docs/facts/loadtest.md §3.3), so
the numbers read the same as theirs.

The verdict does not trust a point estimate. For n independent completions sorted X_(1) <= ... <= X_(n) and the true
q-quantile xi_q of a continuous distribution, the number of X_i below xi_q is Binomial(n, q), so
    P(X_(k) >= xi_q) = P(Binomial(n, q) <= k - 1)      (an upper bound)
    P(X_(k) <= xi_q) = P(Binomial(n, q) >= k)          (a lower bound)
whatever the distribution (order-statistic confidence bounds, e.g. Hahn & Meeker, "Statistical Intervals", ch. 5).
The upper bound at confidence c is the smallest k with P(Bin(n, q) <= k - 1) >= c; it exists only when k = n is
enough, i.e. 1 - q**n >= c: n >= ln(1 - c) / ln(q) completions (59 for q = c = 0.95). The lower bound is the largest k
with P(Bin(n, q) >= k) >= c.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

# Comparisons of probabilities against the confidence tolerate float rounding (1 - 0.05 vs 0.95).
EPSILON = 1e-12


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The q-th percentile (0..100) by linear interpolation (numpy's default); None for no values."""
    if not values:
        return None
    data = sorted(values)
    position = (len(data) - 1) * q / 100.0
    low = int(math.floor(position))
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (position - low)


def mean(values: Sequence[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) <= k), summed in log space: n in the hundred thousands neither overflows nor underflows."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    return _cumulative(n, p)[k]


def min_completions(q: float = 0.95, confidence: float = 0.95) -> int:
    """The fewest completions for which an upper confidence bound of the q-quantile exists (1 - q**n >= confidence)."""
    n = max(1, math.ceil(math.log(1.0 - confidence) / math.log(q)))
    while 1.0 - q ** n < confidence - EPSILON:
        n += 1
    while n > 1 and 1.0 - q ** (n - 1) >= confidence - EPSILON:
        n -= 1
    return n


def _cumulative(n: int, p: float) -> List[float]:
    """[P(Binomial(n, p) <= i) for i in 0..n], from the log pmf: O(n), for the rank searches below."""
    log_p, log_q, log_n = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    running, out = 0.0, []
    for i in range(n + 1):
        running += math.exp(log_n - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q)
        out.append(min(running, 1.0))
    return out


def upper_bound_rank(n: int, q: float = 0.95, confidence: float = 0.95) -> Optional[int]:
    """The smallest rank k (1-based) with P(X_(k) >= xi_q) = P(Bin(n, q) <= k - 1) >= confidence; None when n is
    too small."""
    if n < 1:
        return None
    cdf = _cumulative(n, q)
    cdf[n - 1] = 1.0 - q ** n  # the top term exactly: it decides whether the bound exists at all
    for k in range(1, n + 1):
        if cdf[k - 1] >= confidence - EPSILON:
            return k
    return None


def lower_bound_rank(n: int, q: float = 0.95, confidence: float = 0.95) -> Optional[int]:
    """The largest rank k (1-based) with P(X_(k) <= xi_q) = 1 - P(Bin(n, q) <= k - 1) >= confidence; None when n
    is too small."""
    if n < 1:
        return None
    cdf = _cumulative(n, q)
    cdf[0] = (1.0 - q) ** n
    for k in range(n, 0, -1):
        if 1.0 - cdf[k - 1] >= confidence - EPSILON:
            return k
    return None


def quantile_bounds(values: Sequence[float], q: float = 0.95, confidence: float = 0.95) -> dict:
    """Both one-sided bounds of the q-quantile, each with its rank, and the completions an upper bound needs."""
    data: List[float] = sorted(values)
    upper = upper_bound_rank(len(data), q, confidence)
    lower = lower_bound_rank(len(data), q, confidence)
    return {
        "n": len(data),
        "quantile": q,
        "confidence": confidence,
        "min_completions": min_completions(q, confidence),
        "upper_rank": upper,
        "upper": data[upper - 1] if upper else None,
        "lower_rank": lower,
        "lower": data[lower - 1] if lower else None,
    }
