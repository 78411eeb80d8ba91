"""revive bench's statistics against hand-computed values: linear percentiles, the binomial CDF, and the one-sided
order-statistic bounds of the P95 (module_utils/revive_bench/stats.py, docs/bench.md "Statistics")."""
from __future__ import annotations

import math

import pytest

from ansible.module_utils.revive_bench import stats


def direct_cdf(k, n, p):
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))


def test_percentiles_interpolate_linearly_like_numpy():
    assert stats.percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    # position (4 - 1) * 0.95 = 2.85: 3 + 0.85 * (4 - 3)
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 95) == pytest.approx(3.85)
    assert stats.percentile([7.0], 99) == 7.0
    assert stats.percentile([], 50) is None


def test_binomial_cdf_matches_the_sum_of_terms():
    # P(Bin(100, .95) <= 98) = 1 - P(99) - P(100) = 1 - 100 * .95^99 * .05 - .95^100
    assert stats.binomial_cdf(98, 100, 0.95) == pytest.approx(1 - 100 * 0.95 ** 99 * 0.05 - 0.95 ** 100, abs=1e-12)
    for k in (0, 3, 10, 19):
        assert stats.binomial_cdf(k, 20, 0.3) == pytest.approx(direct_cdf(k, 20, 0.3), abs=1e-12)
    assert stats.binomial_cdf(-1, 5, 0.5) == 0.0 and stats.binomial_cdf(5, 5, 0.5) == 1.0


@pytest.mark.parametrize("quantile, confidence, needed", [(0.95, 0.95, 59), (0.99, 0.95, 299), (0.95, 0.99, 90),
                                                          (0.90, 0.95, 29)])
def test_completions_needed_for_an_upper_bound(quantile, confidence, needed):
    # 1 - q^n >= c: the largest of n completions bounds the q-quantile (ln(1 - c) / ln q, rounded up)
    assert stats.min_completions(quantile, confidence) == needed
    assert stats.upper_bound_rank(needed - 1, quantile, confidence) is None
    assert stats.upper_bound_rank(needed, quantile, confidence) == needed


def test_the_upper_bound_of_100_completions_is_the_99th():
    # P(Bin(100, .95) <= 98) = 0.9629 >= .95, P(Bin(100, .95) <= 97) = 0.8817 < .95 (hand-computed above)
    assert direct_cdf(97, 100, 0.95) < 0.95 <= direct_cdf(98, 100, 0.95)
    assert stats.upper_bound_rank(100) == 99


def test_the_lower_bound_is_the_largest_rank_with_enough_confidence():
    k = stats.lower_bound_rank(100)
    assert 1 - direct_cdf(k - 1, 100, 0.95) >= 0.95 > 1 - direct_cdf(k, 100, 0.95)
    assert k == 91
    # one completion is already a 95 % lower bound of the P95: P(X_(1) <= xi) = 0.95
    assert stats.lower_bound_rank(1) == 1 and stats.lower_bound_rank(0) is None


def test_quantile_bounds_pick_the_order_statistics():
    bounds = stats.quantile_bounds([float(v) for v in range(100, 0, -1)])
    assert (bounds["upper_rank"], bounds["upper"], bounds["lower_rank"], bounds["lower"]) == (99, 99.0, 91, 91.0)
    assert bounds["n"] == 100 and bounds["min_completions"] == 59
    few = stats.quantile_bounds([1.0] * 58)
    assert few["upper"] is None and few["lower"] is not None


def test_bounds_of_a_long_level_are_fast_and_bracket_the_point():
    n = 20000
    upper, lower = stats.upper_bound_rank(n), stats.lower_bound_rank(n)
    assert lower < 0.95 * n < upper
    # the normal approximation: n q +- 1.645 sqrt(n q (1 - q)) = 19000 +- 50.7
    assert abs(upper - 19051) <= 1 and abs(lower - 18949) <= 1
