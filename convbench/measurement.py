"""One timed measurement: the raw times, with statistics derived when asked for.

Like PyTorch's `torch.utils.benchmark.Measurement`, the raw repetition times are the record; the
median, IQR, min and mean are computed from them lazily, and a measurement whose spread is large
against its median is flagged noisy, so a report can say which numbers not to trust.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

#: IQR / median above which a measurement is flagged noisy (DESIGN.md §5).
NOISE_THRESHOLD = 0.1


def is_host_bound(host_ms: float | None, device_ms: float) -> bool:
    """Whether issuing a call took the host at least as long as the device took to run it."""
    return host_ms is not None and host_ms >= device_ms


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

    def __post_init__(self) -> None:
        if not self.times_ms:
            raise ValueError("a Measurement needs at least one time")
        object.__setattr__(self, "times_ms", tuple(float(t) for t in self.times_ms))
        object.__setattr__(self, "host_ms", tuple(float(t) for t in self.host_ms))

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

    @property
    def host_median(self) -> float | None:
        """Median host time to issue one call (None where none was recorded)."""
        return float(np.median(self.host_ms)) if self.host_ms else None

    @property
    def host_bound(self) -> bool:
        return is_host_bound(self.host_median, self.median)

    # --- the raw times as one CSV cell ----------------------------------------------------
    def times_text(self) -> str:
        """The raw times joined by spaces (6 significant digits), as the results CSV keeps them."""
        return " ".join(f"{t:.6g}" for t in self.times_ms)

    @classmethod
    def from_text(cls, text: str) -> Measurement:
        return cls(tuple(float(t) for t in text.split()))
