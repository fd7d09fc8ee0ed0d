"""Statistics that decide: how sure a median is, and whether one time is really below another.

A median of repetitions is a number; whether algorithm A beats B is a claim. Two tools, in the
discipline of pyperf and nvbench (a difference within noise is no result):

- **The interval of a median** (`median_interval`): the distribution-free order-statistic
  interval. With n repetitions sorted, [x(k), x(n+1-k)] holds the true median with probability
  1 - 2·P(B ≤ k-1), B ~ Binomial(n, 1/2), whatever the distribution of the times; k is the
  largest that keeps that at `CONFIDENCE` (95%). It needs at least `MIN_REPS` = 6 repetitions
  (with 5, even [min, max] holds the median only 94% of the time). Its half-width relative to
  the median (`half_width`) is nvbench's relative-noise criterion: repetitions go on until it is
  within a target (`--target-noise`, 2% by default) or the budget is spent.
- **The interval of a ratio of medians** (`ratio`): a percentile bootstrap. Times measured in the
  same interleaved rounds are resampled by round (paired), so drift that struck both in a round
  cancels in their ratio; times from different rounds or runs are resampled apart. A winner is
  declared only where the interval excludes 1 (`Ratio.decided`); elsewhere it is a tie within
  noise. The bootstrap is seeded: the same times give the same interval. With fewer than
  `MIN_REPS` repetitions on a side (rows of older runs), the interval is the range of ratios
  the repetitions allow (min a / max b to max a / min b): decided only where the two ranges do
  not overlap, which two sets of 3 draws of one distribution do by chance 1 time in 10. A single
  repetition on a side decides nothing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Probability that an interval holds the value it brackets.
CONFIDENCE = 0.95
#: Fewest repetitions with an order-statistic interval of the median at `CONFIDENCE`.
MIN_REPS = 6
#: Bootstrap resamples of a ratio: its 2.5% and 97.5% quantiles move by < 0.5% beyond this.
RESAMPLES = 2000
#: How `median_interval` is computed, as reports and env.json name it.
MEDIAN_INTERVAL_METHOD = "order-statistic (distribution-free) 95% interval of the median"
RATIO_INTERVAL_METHOD = ("percentile bootstrap (2000 resamples, seeded) of the ratio of medians, "
                         "resampled by round where both were timed in the same rounds; with "
                         f"fewer than {MIN_REPS} repetitions, the range of the ratios")


@functools.lru_cache(maxsize=4096)
def _rank(n: int, confidence: float) -> int:
    """The largest k ≥ 1 with 2·P(B ≤ k-1) ≤ 1 - confidence, B ~ Binomial(n, 1/2); 0 if none."""
    alpha, total, below, k = 1 - confidence, 2**n, 0, 0
    for j in range(n // 2 + 1):
        below += math.comb(n, j)  # P(B <= j) * 2**n
        if 2 * below / total > alpha:
            break
        k = j + 1
    return k


def median_interval(times: Sequence[float],
                    confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The order-statistic interval of the median of `times`; None with too few of them."""
    k = _rank(len(times), confidence)
    if k == 0:
        return None
    x = sorted(times)
    return float(x[k - 1]), float(x[len(x) - k])


def half_width(times: Sequence[float], confidence: float = CONFIDENCE) -> float | None:
    """Half the width of the median's interval, relative to the median; None without one."""
    interval = median_interval(times, confidence)
    median = float(np.median(times)) if len(times) else 0.0
    if interval is None or median <= 0:
        return None
    return (interval[1] - interval[0]) / 2 / median


@dataclass(frozen=True)
class Ratio:
    """median(a) / median(b), and its interval (None where either has too few repetitions)."""

    value: float
    low: float | None
    high: float | None
    paired: bool

    @property
    def decided(self) -> bool:
        """Whether the interval excludes 1: a real difference, not noise."""
        return self.low is not None and (self.low > 1 or self.high < 1)

    def text(self) -> str:
        """`1.21× [1.15, 1.26]`, or the value alone without an interval."""
        if self.low is None:
            return f"{self.value:.3g}×"
        return f"{self.value:.3g}× [{self.low:.3g}, {self.high:.3g}]"


def ratio(a: Sequence[float], b: Sequence[float], paired: bool = False,
          confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0) -> Ratio:
    """median(a) / median(b) with a bootstrap interval. `paired`: a[i] and b[i] were timed in
    the same round i (equal lengths), and are resampled together."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    value = float(np.median(a) / np.median(b))
    if min(len(a), len(b)) < 2:
        return Ratio(value, None, None, paired)
    if min(len(a), len(b)) < MIN_REPS:  # too few for a bootstrap: the range of the ratios
        return Ratio(value, float(a.min() / b.max()), float(a.max() / b.min()), False)
    if paired and len(a) != len(b):
        raise ValueError(f"paired times need equal lengths, not {len(a)} and {len(b)}")
    rng = np.random.default_rng(seed)
    ca = _counts(rng, len(a), resamples)
    cb = ca if paired else _counts(rng, len(b), resamples)
    r = _medians(a, ca) / _medians(b, cb)
    low, high = np.quantile(r, ((1 - confidence) / 2, (1 + confidence) / 2))
    return Ratio(value, float(low), float(high), paired)


def _counts(rng: np.random.Generator, n: int, resamples: int) -> np.ndarray:
    """`resamples` bootstrap resamples of n items as counts: row i, column j says how often
    item j was drawn (each row sums to n)."""
    drawn = rng.integers(0, n, size=(resamples, n)) + (np.arange(resamples) * n)[:, None]
    counts = np.bincount(drawn.ravel(), minlength=resamples * n).reshape(resamples, n)
    return counts.astype(np.int16 if n < 2**15 else np.int64)


def _medians(x: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The median of each resample of `x` given as counts, from x sorted once: the middle
    item(s) are where the running count crosses half (far cheaper than sorting every resample)."""
    order = np.argsort(x, kind="stable")
    running = np.cumsum(counts[:, order], axis=1, dtype=counts.dtype)
    n = len(x)
    low = np.argmax(running >= (n + 1) // 2, axis=1)
    high = np.argmax(running >= n // 2 + 1, axis=1)
    ranked = x[order]
    return (ranked[low] + ranked[high]) / 2
