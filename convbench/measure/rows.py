"""A case's measurement as a results row, and the guard on it: whether its time is plausible.

The limit (docs/pages/design.md §5): given the device's ceilings (`ceilings.measure`, which a run
passes in: `runs.Run`), a timed fp32 or fp64 row faster than the device can go (`plausibility`: its
direct-convolution rate above the ceiling times its algorithm's arithmetic reduction and
`ceilings.MARGIN`) is not a result: its row is `failed`, with the guard's reason and the time it was
timed at, and no time of its own, so it never wins. Without ceilings (None) no row is guarded.
"""

from __future__ import annotations

import numpy as np

from ..algos import kernelnames, registry
from ..algos.phases import CROP, EXPLICIT_PAD, OUTPUT_COPY
from ..core import results
from ..core.measurement import Measurement
from . import ceilings as ceilings_
from . import opcount, verify
from .case import Case, Ready
from .ceilings import Ceilings
from .timing import Timed

#: Precisions the guard reads against the fp32 ceilings: fp64 goes no faster than fp32; TF32,
#: FP16 and BF16 run on tensor cores (or their CPU counterparts), above the fp32 roof.
GUARDED_PRECISIONS = ("fp32", "fp64")


def reduction(case: Case, algo_ops: float | None) -> float:
    """The arithmetic reduction the guard allows `case`'s row, as its algorithm declares
    (`traits.REDUCTIONS`): direct flops over its own op count (`counted`: FFT and Winograd), 1
    (`none`: the algorithms that do the direct flops), and for any other row (`any`: a
    library's choice of kernel, which may run a transform; a counted algorithm on a pass its
    count does not cover) the largest of the counted algorithms' on its problem and pass (at
    least 1)."""
    flops, declared = case.problem.flops, registry.algorithm(case.algo).reduction
    if declared == "counted" and algo_ops:
        return flops / algo_ops
    if declared == "none":
        return 1.0
    counts = (_op_total(a.name, case) for a in registry.algorithms() if a.reduction == "counted")
    return max([1.0, *(flops / ops for ops in counts if ops)])


def _op_total(algo: str, case: Case) -> float | None:
    """`algo`'s op count on `case`'s problem and pass, or None: none, or one that cannot be
    made (a count that cannot be made allows no reduction)."""
    try:
        ops = opcount.op_count(algo, case.problem, case.pass_, case.precision, case.backend)
    except Exception:  # noqa: BLE001
        return None
    return ops.total if ops else None


def plausibility(r: dict, case: Case, ceilings: Ceilings | None) -> str | None:
    """Why a timed row is faster than the device can go (`ceilings.implausible` with the row's
    GFLOP/s and its algorithm's `reduction`), or None: no ceilings, a precision the fp32
    ceilings do not bound (`GUARDED_PRECISIONS`), or a plausible rate."""
    if ceilings is None or case.precision not in GUARDED_PRECISIONS or r.get("gflops") is None:
        return None
    return ceilings_.implausible(r["gflops"], reduction(case, r.get("algo_ops")), ceilings)


def guarded_row(r: dict, case: Case, ready: Ready, ceilings: Ceilings | None) -> dict:
    """`r` as it is, or, where it is faster than the device can go (`plausibility`), its case's
    `failed` row: the guard's reason and the median it was timed at, no time of its own."""
    why = plausibility(r, case, ceilings)
    if why is None:
        return r
    return row(case, "failed", f"implausible: timed at {r['median_ms']:.4g} ms, {why}",
               ready.check, workspace=ready.workspace, peak_bytes=ready.peak_bytes,
               memory_method=ready.memory_method)


def median_repetition(t: Timed) -> dict[str, Measurement]:
    """Each step's time in the repetition whose total is `t`'s median (the mean of the two
    middle ones where the count is even): a phase table that adds up to the pass's median
    exactly. Each phase's own median would not: a pass's median repetition is not made of
    each phase's median one (docs/pages/measurement.md has a measured case)."""
    totals = np.asarray(t.total.times_ms)
    order = np.argsort(totals, kind="stable")
    n = len(order)
    middle = order[(n - 1) // 2: n // 2 + 1]
    return {name: Measurement((float(np.mean([m.times_ms[i] for i in middle])),))
            for name, m in t.steps.items()}


def timed_row(case: Case, ready: Ready, t: Timed, group: str, note: str,
              kernels: list[str] | None = None) -> dict:
    """`case`'s timed row: `ok`, or `inexact` with its check's error against the tolerance as
    the reason (a library's result beyond its tolerance, `verify.verdict`); its rounds' time
    `t`, its phases where it has them (timed as the pass, in the same repetitions:
    `median_repetition`'s, which add up to its time), `note` with what the time leaves out
    (an explicit pad, a crop, a library's copy), and the `kernels` a library's pass launched,
    where it says (`Implementation.kernels`)."""
    for step, what in ((EXPLICIT_PAD, "explicit pad of x"), (CROP, "crop of dx"),
                       (OUTPUT_COPY, "copy of the library's result into the output")):
        if step in t.steps:
            note += (f"{'; ' if note else ''}time without the {t.steps[step].median:.4g} "
                     f"ms {what}")
    status, reason = ("ok", "") if ready.check.ok else ("inexact", ready.check.reason)
    return row(case, status, reason, ready.check, t.total, note, ready.workspace,
               ready.peak_bytes, ready.memory_method,
               median_repetition(t) if ready.phase_fns else None, stop=t.stop,
               round_group=group, throttled="; ".join(t.throttled), kernels=kernels)


def row(case: Case, status: str, reason: str = "", check: verify.Check | None = None,
        m: Measurement | None = None, note: str = "", workspace: int | None = None,
        peak_bytes: int | None = None, memory_method: str | None = None,
        phases: dict[str, Measurement] | None = None, *, stop: str = "",
        round_group: str = "", throttled: str = "",
        kernels: list[str] | None = None) -> results.Row:
    """A results row (`results.Row`); columns that do not apply (a time for a failed case,
    phases for a pass without them) are None. `stop`: why its rounds ended; `round_group`: the
    id its rounds share with the cases timed beside it; `throttled`: why the GPU's clocks were
    held down while it was timed (empty: they were not); `kernels`: the GPU kernels its pass
    launched (None: not known), kept by name with whether one ran on tensor cores
    (`kernelnames.tensor_cores`)."""
    try:
        ops = opcount.op_count(case.algo, case.problem, case.pass_, case.precision,
                               case.backend)
    except ValueError:  # a row not timed is made whatever its count (the failure of a
        if status in results.TIMED:  # timed row's own count is that row's `failed`, made here)
            raise
        ops = None
    out = results.new_row(**case.fields(), status=status, reason=reason, note=note,
                          workspace_bytes=workspace, peak_bytes=peak_bytes,
                          memory_method=memory_method, algo_ops=ops.total if ops else None)
    if check is not None:
        out.update(rel_error=check.rel_error, max_abs_error=check.max_abs_error,
                   tolerance=check.tolerance)
    if m is not None:
        low, high = m.interval or (None, None)
        out.update(median_ms=m.median, iqr_ms=m.iqr, min_ms=m.min, reps=m.reps, noisy=m.noisy,
                   times_ms=m.times_text(), gflops=case.problem.flops / (m.median * 1e6),
                   host_ms=m.host_median, ci_low_ms=low, ci_high_ms=high, stop=stop,
                   round_group=round_group, cpu_ms=m.cpu_ms_median, cpu_share=m.share,
                   stolen=m.stolen,
                   contended=m.contended, throttled=throttled,
                   host_bound=m.host_bound if m.host_ms else None)
    if phases:
        out["phases_ms"] = results.phases_text(phases)
    if kernels is not None:
        out.update(kernels=kernelnames.kernels_text(kernels),
                   tensor_cores=kernelnames.tensor_cores(kernels))
    return out
