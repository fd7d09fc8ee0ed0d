import math
import random

import numpy as np
import pytest

from convbench.core import stats


def coverage(n: int, k: int) -> float:
    """P(x(k) <= median <= x(n+1-k)) for n draws of any continuous distribution."""
    return 1 - 2 * sum(math.comb(n, j) for j in range(k)) / 2**n


@pytest.mark.parametrize("n", [6, 7, 10, 20, 50, 200, 1000])
def test_the_order_statistic_interval_is_the_narrowest_at_95_percent(n):
    k = stats._rank(n, 0.95)
    assert coverage(n, k) >= 0.95 and coverage(n, k + 1) < 0.95


def test_too_few_repetitions_have_no_interval():
    assert stats.median_interval([1.0] * 5) is None and stats.half_width([1.0] * 5) is None
    assert stats.median_interval([3, 1, 2, 6, 5, 4]) == (1, 6)  # sorted, the extremes at n=6
    assert stats.half_width([10.0] * 6) == 0


def test_the_interval_holds_the_true_median_about_95_percent_of_the_time():
    rng = random.Random(0)
    hits = 0
    for _ in range(400):
        lo, hi = stats.median_interval([rng.lognormvariate(0, 0.5) for _ in range(15)])
        hits += lo <= 1.0 <= hi  # the lognormal's median is e^0 = 1
    assert 0.92 < hits / 400 <= 1.0


def test_ratio_intervals_decide_only_beyond_noise():
    rng = np.random.default_rng(3)
    a = rng.normal(10, 0.2, 20)
    assert stats.ratio(a * 1.2, a, paired=True).decided  # a real 20% gap
    same = stats.ratio(rng.normal(10, 0.5, 20), rng.normal(10, 0.5, 20))
    assert not same.decided and same.low < 1 < same.high
    few = stats.ratio([1.0, 1.1, 1.2], [2.0, 2.1, 2.2])  # too few to bootstrap: the ranges
    assert few.value == pytest.approx(1.1 / 2.1) and few.decided
    assert (few.low, few.high) == pytest.approx((1 / 2.2, 1.2 / 2.0))
    assert not stats.ratio([1.0, 2.0, 3.0], [2.5, 3.5, 4.5]).decided  # the ranges overlap
    single = stats.ratio([1.0], [2.0])
    assert single.value == 0.5 and single.low is None and not single.decided
    assert stats.ratio(a, a, paired=True) == stats.ratio(a, a, paired=True)  # seeded
    assert "× [" in stats.ratio(a * 1.2, a).text() and single.text() == "0.5×"
    with pytest.raises(ValueError, match="equal lengths"):
        stats.ratio(a, a[:10], paired=True)


def test_pairing_cancels_drift_shared_by_a_round():
    drift = np.linspace(1, 1.5, 30)
    a, b = 10 * drift, 10.3 * drift  # b 3% slower in every round, both drifting 50%
    assert stats.ratio(b, a, paired=True).decided
    assert not stats.ratio(b, a, paired=False).decided


def test_bootstrap_medians_from_counts_match_numpy():
    rng = np.random.default_rng(0)
    for n in (6, 7, 30):
        x = rng.normal(size=n)
        counts = stats._counts(rng, n, 40)
        assert (counts.sum(axis=1) == n).all()
        want = [np.median(np.repeat(x, c)) for c in counts]
        assert np.allclose(stats._medians(x, counts), want)
