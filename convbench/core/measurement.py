"""One timed measurement: the raw times, with statistics derived when asked for.

Like PyTorch's `torch.utils.benchmark.Measurement`, the raw repetition times are the record; the
median, IQR, min, mean and the median's interval (`stats.median_interval`) are computed from them
lazily, and a measurement that may be wrong says so: noisy (its spread is large against its
median), contended (on the host, its threads were kept off the cores they were ready to run on:
another process had them, or the hypervisor gave the cores to another machine), host-bound (on
a GPU, the host may have set the pace).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from . import stats

#: IQR / median above which a measurement is flagged noisy (docs/pages/design.md §5).
NOISE_THRESHOLD = 0.1
#: Below this share of the time its threads were ready to run spent on a core (median over the
#: repetitions), a host measurement is contended: the machine did not give it the cores its
#: threads need. It sits between what a quiet machine gives (near 1, a little less for short
#: passes of many parallel regions: a sleeping thread's wake-up counts as waiting) and what a
#: busy process beside a pass leaves it. A noisy measurement is contended too where a quarter of
#: its repetitions or more got less than this share: a load that came and went shows in its
#: spread and in those repetitions, not in its median. The hypervisor's steal counts the same
#: way: the share is its threads' share times the share of its cores' busy time the hypervisor
#: left to this machine (1 - `stolen`), so a quiet process on a machine 20% stolen is contended.
#: The shares measured on the project's machine: docs/pages/measurement.md, a busy machine.
CONTENDED_SHARE = 0.8


#: Without a head start (below), a GPU time whose host took at least this share of it to issue
#: may include idle gaps: the event pair brackets the host's work too when the queue runs dry.
HOST_SHARE = 0.5
#: With a head start, a GPU time is host-bound where the GPU may have waited for the host this
#: share of it or more: the host's time to issue a repetition beyond the head start it gave,
#: median over the repetitions. A share, not a count of late repetitions: a host a microsecond
#: late, or one late repetition of six, leaves the median time as it was.
HOST_GAP_SHARE = 0.05


def is_host_bound(host_ms: float | None, device_ms: float) -> bool:
    """Whether issuing a call took the host a sizeable share (`HOST_SHARE`) of the time the
    device took to run it: the rule for rows without a record of the GPU's head start."""
    return host_ms is not None and host_ms >= HOST_SHARE * device_ms


@dataclass(frozen=True)
class Measurement:
    """Raw times of the repetitions of one timed call, in milliseconds.

    On a GPU the times are the device's (CUDA events), and `host_ms` holds, per repetition, how
    long the host took to issue the call: when that is as long as the device's time, the host
    may have set the pace (the GPU waited for launches), and the time says more about Python
    and the driver than about the kernels (`host_bound`). Empty where the host's clock is the
    time itself.
    """

    times_ms: tuple[float, ...]
    host_ms: tuple[float, ...] = ()
    #: per repetition on the host: the process's CPU time (all its threads), and the share of
    #: the time its threads were ready to run that they spent on a core (`contention`); empty
    #: where not read
    cpu_ms: tuple[float, ...] = ()
    cpu_share: tuple[float, ...] = ()
    #: per repetition on a GPU: the head start the timer gave the GPU (a spin kernel queued
    #: ahead of the first event) for the host to issue the pass before the GPU reached it
    slack_ms: tuple[float, ...] = ()
    #: on the host: the share of this machine's busy core time over the repetitions that the
    #: hypervisor gave to other machines (`contention.stolen`); None where not read
    stolen: float | None = None

    def __post_init__(self) -> None:
        if not self.times_ms:
            raise ValueError("a Measurement needs at least one time")
        for name in ("times_ms", "host_ms", "cpu_ms", "cpu_share", "slack_ms"):
            object.__setattr__(self, name, tuple(float(t) for t in getattr(self, name)))

    @property
    def reps(self) -> int:
        return len(self.times_ms)

    @cached_property
    def _quartiles(self) -> tuple[float, float, float]:
        q1, med, q3 = np.quantile(self.times_ms, (0.25, 0.5, 0.75))
        return float(q1), float(med), float(q3)

    @property
    def q1(self) -> float:
        return self._quartiles[0]

    @property
    def median(self) -> float:
        return self._quartiles[1]

    @property
    def q3(self) -> float:
        return self._quartiles[2]

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def min(self) -> float:
        return min(self.times_ms)

    @property
    def mean(self) -> float:
        return float(np.mean(self.times_ms))

    @property
    def noisy(self) -> bool:
        return self.median > 0 and self.iqr / self.median > NOISE_THRESHOLD

    @cached_property
    def interval(self) -> tuple[float, float] | None:
        """The median's order-statistic interval (`stats.median_interval`), None with fewer
        than `stats.MIN_REPS` repetitions."""
        return stats.median_interval(self.times_ms)

    @property
    def half_width(self) -> float | None:
        """Half the interval's width relative to the median (None without an interval)."""
        return stats.half_width(self.times_ms)

    @property
    def cpu_ms_median(self) -> float | None:
        return float(np.median(self.cpu_ms)) if self.cpu_ms else None

    @property
    def share(self) -> float | None:
        """The median share of ready time on a core; None where it was not read."""
        return float(np.median(self.cpu_share)) if self.cpu_share else None

    @property
    def low_share(self) -> float | None:
        """The share that three quarters of the repetitions got at least (lower quartile)."""
        return float(np.percentile(self.cpu_share, 25)) if self.cpu_share else None

    @property
    def contended(self) -> bool:
        kept = 1.0 - (self.stolen or 0.0)  # what the hypervisor left this machine
        if self.share is None:
            return self.stolen is not None and kept < CONTENDED_SHARE
        return (self.share * kept < CONTENDED_SHARE
                or (self.noisy and self.low_share * kept < CONTENDED_SHARE))

    @property
    def host_median(self) -> float | None:
        """Median host time to issue one call (None where none was recorded)."""
        return float(np.median(self.host_ms)) if self.host_ms else None

    @property
    def host_gap_ms(self) -> float | None:
        """The most a repetition's GPU may have waited for the host inside the timed region (its
        host's time to issue it beyond its head start, or 0), median over the repetitions; None
        without a record of the head start."""
        if not self.slack_ms or len(self.slack_ms) != len(self.host_ms):
            return None
        return float(np.median([max(0.0, h - s) for h, s in zip(self.host_ms, self.slack_ms)]))

    @property
    def host_bound(self) -> bool:
        """Whether the GPU may have waited for the host for a sizeable share of the time: with a
        head start, `host_gap_ms` at least `HOST_GAP_SHARE` of the median; without one,
        `is_host_bound`."""
        gap = self.host_gap_ms
        if gap is not None:
            return gap >= HOST_GAP_SHARE * self.median
        return is_host_bound(self.host_median, self.median)

    # --- the raw times as one CSV cell ----------------------------------------------------
    def times_text(self) -> str:
        """The raw times joined by spaces (6 significant digits), as the results CSV keeps them."""
        return " ".join(f"{t:.6g}" for t in self.times_ms)

    @classmethod
    def from_text(cls, text: str) -> Measurement:
        return cls(tuple(float(t) for t in text.split()))
