"""A row read against its device's ceilings: the guard that fails a row faster than the device
can go, and the roofline (a row's intensity and attained rate, and which roof bounds it).

A row faster than its ceiling allows is a timing bug, never a win (docs/pages/design.md §5): the
runner fails it with `implausible`'s reason. The report states every row's share of the roof
it is under (`bound`). Both read a `ceilings.record.Ceilings` and measure nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .record import Ceilings

#: How far above its ceiling (times its arithmetic reduction) a row may be before it is not a
#: result (`implausible`). The attainable is a library SGEMM at 80-95% of the hardware and the
#: theoretical peak assumes a clock and an FMA count; a real row beats them by what its shape
#: or a turbo bin favours (a few to ~15%), while a missed synchronisation or a timer around the
#: wrong call is 2x to 1000x out: 1.25 sits between.
MARGIN = 1.25


def implausible(gflops_direct: float | None, algo_ops_ratio: float | None,
                ceilings: Ceilings, margin: float = MARGIN) -> str | None:
    """Why a row's rate is not a result, or None. The rate (direct-convolution flops over its
    time) may exceed the device's ceiling (the highest of its compute roof, the larger of the
    best SGEMM and the measured FMA peak, and its theoretical peak) only
    by the algorithm's arithmetic reduction (`algo_ops_ratio`: direct flops over the
    algorithm's own op count, Winograd's and FFT's; None or 1 for direct and GEMM) and
    `margin` (`MARGIN`); beyond that the timer missed work: a timing or synchronisation bug."""
    if gflops_direct is None or np.isnan(gflops_direct):
        return None
    ratio = 1.0 if algo_ops_ratio is None else float(algo_ops_ratio)
    if ratio <= 0:
        raise ValueError(f"algo_ops_ratio {ratio}: direct flops over an algorithm's op count "
                         "is positive")
    roof = max(ceilings.compute_roof[0], ceilings.gflops_peak_theoretical or 0.0)
    limit = roof * ratio * margin
    if gflops_direct <= limit:
        return None
    return (f"{gflops_direct:.4g} GFLOP/s is above what {ceilings.model} can do: its ceiling "
            f"{roof:.4g} GFLOP/s x arithmetic reduction {ratio:.3g} x margin {margin:g} = "
            f"{limit:.4g}; a timing or synchronisation bug, not a result")


@dataclass(frozen=True)
class RooflinePoint:
    """A measurement on the roofline: flops per byte moved, and GFLOP/s attained."""

    intensity: float
    gflops: float


def roofline_point(flops: float, nbytes: float, seconds: float) -> RooflinePoint:
    """Arithmetic intensity (flops / bytes) and attained GFLOP/s; ValueError for a
    non-positive byte count or time."""
    if nbytes <= 0 or seconds <= 0:
        raise ValueError(f"a roofline point needs bytes and seconds > 0, not {nbytes}, "
                         f"{seconds}")
    return RooflinePoint(flops / nbytes, flops / seconds / 1e9)


@dataclass(frozen=True)
class Bound:
    """Which roof is lower at a point's intensity, its height there, the share of it attained,
    and the ridge (flops / byte where the two roofs meet)."""

    kind: str  # "compute" or "memory"
    roof_gflops: float
    share: float
    ridge: float


def bound(point: RooflinePoint, ceilings: Ceilings, level: str = "dram") -> Bound:
    """Compute- or memory-bound, against the compute roof (`Ceilings.compute_roof`: the larger
    of the best SGEMM and the measured FMA peak) and the bandwidth `level` (`dram`: beyond the
    cache, `cache`: within it)."""
    bandwidth = {"dram": ceilings.bandwidth_gbs_dram,
                 "cache": ceilings.bandwidth_gbs_cache}[level]
    if not bandwidth:
        raise ValueError(f"no {level} bandwidth measured on {ceilings.model}")
    compute, memory = ceilings.compute_roof[0], point.intensity * bandwidth
    kind, roof = ("memory", memory) if memory < compute else ("compute", compute)
    return Bound(kind, roof, point.gflops / roof, compute / bandwidth)
