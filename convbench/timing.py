"""Timers: how long does one call of a prepared pass take? They never know what they time.

Both timers follow `triton.testing.do_bench`: estimate the call's time first, then size the
warm-up and the number of repetitions by a time budget, so a 20 µs kernel and a 2 s NumPy pass
both get a measurement worth having without the sweep taking hours. Each repetition is timed on
its own and every raw time is kept (`Measurement`).

- CPU (`numpy`, `emu`): `time.perf_counter` around each call, the garbage collector off while
  timing (as `timeit` does).
- GPU (`cuda`): a pair of CUDA events around each call, and before each call the L2 cache is
  flushed by zeroing a buffer twice its size, outside the timed region, so no repetition finds
  the previous one's data in cache.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

from .measurement import Measurement

#: Fewest repetitions a measurement gets, however slow the call (enough for a median and IQR).
MIN_REPS = 3
#: Most repetitions on the CPU, however fast the call.
MAX_REPS_CPU = 50
#: Most repetitions on the GPU, however fast the kernel.
MAX_REPS_GPU = 1000
#: Fraction of the budget spent on warm-up, on top of the budget.
WARMUP_FRACTION = 0.25


def _reps(estimate_s: float, budget_s: float, max_reps: int) -> int:
    return max(MIN_REPS, min(max_reps, int(budget_s / max(estimate_s, 1e-9))))


def time_cpu(fn: Callable[[], object], budget_s: float, max_reps: int = MAX_REPS_CPU,
             clock: Callable[[], float] = time.perf_counter) -> Measurement:
    """Time `fn()` on the host. The first call is the estimate (and the first warm-up)."""
    t0 = clock()
    fn()
    estimate = clock() - t0
    warmup = min(max_reps, int(WARMUP_FRACTION * budget_s / max(estimate, 1e-9))) - 1
    for _ in range(warmup):
        fn()
    times = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(_reps(estimate, budget_s, max_reps)):
            t0 = clock()
            fn()
            times.append((clock() - t0) * 1e3)
    finally:
        if gc_was_enabled:
            gc.enable()
    return Measurement(tuple(times))


def l2_flush_buffer():
    """A device buffer twice the size of the current GPU's L2 cache (at least 64 MiB when the
    driver does not say), whose zeroing evicts everything a previous repetition left in L2."""
    import cupy

    l2 = cupy.cuda.Device().attributes.get("L2CacheSize", 0)
    return cupy.empty(max(2 * l2, 64 << 20), dtype=cupy.uint8)


def time_cuda(fn: Callable[[], object], budget_s: float,
              max_reps: int = MAX_REPS_GPU) -> Measurement:
    """Time `fn()` on the GPU with CUDA events, flushing L2 before each repetition."""
    import cupy

    flush = l2_flush_buffer()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    # Estimate over five flushed calls, the way do_bench does.
    start.record()
    for _ in range(5):
        flush.fill(0)
        fn()
    end.record()
    end.synchronize()
    estimate = cupy.cuda.get_elapsed_time(start, end) / 5 * 1e-3
    for _ in range(max(1, int(WARMUP_FRACTION * budget_s / max(estimate, 1e-9)))):
        fn()
    reps = _reps(estimate, budget_s, max_reps)
    starts = [cupy.cuda.Event() for _ in range(reps)]
    ends = [cupy.cuda.Event() for _ in range(reps)]
    for s, e in zip(starts, ends):
        flush.fill(0)  # before `s` is recorded: not timed
        s.record()
        fn()
        e.record()
    ends[-1].synchronize()
    return Measurement(tuple(cupy.cuda.get_elapsed_time(s, e) for s, e in zip(starts, ends)))


def timer_for(backend: str) -> Callable[[Callable[[], object], float], Measurement]:
    """The timer that fits where `backend` runs: CUDA events on `cuda`, the host clock else."""
    return time_cuda if backend == "cuda" else time_cpu
