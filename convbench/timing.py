"""Timers: how long does one call of a prepared pass take, and each of its phases? They never
know what they time.

Both timers follow `triton.testing.do_bench`: estimate the call's time first, then size the
warm-up and the number of repetitions by a time budget, so a 20 µs kernel and a 2 s NumPy pass
both get a measurement worth having without the sweep taking hours. Each repetition is timed on
its own and every raw time is kept (`Measurement`).

A pass with phases (`convbench.phases`) is timed the same way as a *sequence* of calls: each
repetition calls every phase once, in order, with a timestamp before the first and after each,
so phase i's time is the gap between stamps i and i + 1; the estimate, warm-up and repetitions
are those of the whole sequence. A plain call is the one-phase sequence, so both share one
loop per backend style:

- CPU (`numpy`, `emu`): `time.perf_counter` stamps, the garbage collector off while timing (as
  `timeit` does).
- GPU (`cuda`): CUDA events recorded on the current stream as the stamps, and before each
  repetition (never between its phases, which hand each other their data through the cache as
  the full pass does) the L2 cache is flushed by zeroing a buffer twice its size, outside the
  timed region, so no repetition finds the previous one's data in cache. The host's time to
  issue each call is kept too (`Measurement.host_ms`): a pass whose launches take the host as
  long as the GPU takes to run them is timed partly on the host, and is flagged so.
"""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Callable, Mapping, Sequence

from .measurement import Measurement

#: Fewest repetitions a measurement gets, however slow the call (enough for a median and IQR).
MIN_REPS = 3
#: Most repetitions on the CPU, however fast the call.
MAX_REPS_CPU = 50
#: Most repetitions on the GPU, however fast the kernel.
MAX_REPS_GPU = 1000
#: Fraction of the budget spent on warm-up, on top of the budget.
WARMUP_FRACTION = 0.25

Fn = Callable[[], object]


def _reps(estimate_s: float, budget_s: float, max_reps: int) -> int:
    return max(MIN_REPS, min(max_reps, int(budget_s / max(estimate_s, 1e-9))))


def _warmup(estimate_s: float, budget_s: float) -> int:
    return int(WARMUP_FRACTION * budget_s / max(estimate_s, 1e-9))


def _by_step(reps: Sequence[Sequence[float]],
             hosts: Sequence[Sequence[float]] = ()) -> list[Measurement]:
    """Per repetition, the ms of each step (and the host's ms to issue it, on a GPU) -> one
    Measurement per step."""
    steps = list(zip(*reps))
    host_steps = list(zip(*hosts)) if hosts else [()] * len(steps)
    return [Measurement(step, host) for step, host in zip(steps, host_steps)]


def _sequence_cpu(fns: Sequence[Fn], budget_s: float, max_reps: int,
                  clock: Callable[[], float]) -> list[Measurement]:
    """Time `fns` called in order, per call, on the host. The first sequence is the estimate
    (and the first warm-up)."""
    def once() -> list[float]:
        """One sequence: the ms of each call."""
        stamps = [clock()]
        for fn in fns:
            fn()
            stamps.append(clock())
        return [(b - a) * 1e3 for a, b in itertools.pairwise(stamps)]

    estimate = sum(once()) * 1e-3
    for _ in range(min(max_reps, _warmup(estimate, budget_s)) - 1):
        once()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _by_step([once() for _ in range(_reps(estimate, budget_s, max_reps))])
    finally:
        if gc_was_enabled:
            gc.enable()


def time_cpu(fn: Fn, budget_s: float, max_reps: int = MAX_REPS_CPU,
             clock: Callable[[], float] = time.perf_counter) -> Measurement:
    """Time `fn()` on the host."""
    (m,) = _sequence_cpu([fn], budget_s, max_reps, clock)
    return m


def time_cpu_phases(phase_fns: Mapping[str, Fn], budget_s: float,
                    max_reps: int = MAX_REPS_CPU,
                    clock: Callable[[], float] = time.perf_counter) -> dict[str, Measurement]:
    """Time each phase of a sequence on the host: name -> Measurement, in the given order."""
    return dict(zip(phase_fns, _sequence_cpu(list(phase_fns.values()), budget_s, max_reps,
                                             clock)))


def l2_flush_buffer():
    """A device buffer twice the size of the current GPU's L2 cache (at least 64 MiB when the
    driver does not say), whose zeroing evicts everything a previous repetition left in L2."""
    import cupy

    l2 = cupy.cuda.Device().attributes.get("L2CacheSize", 0)
    return cupy.empty(max(2 * l2, 64 << 20), dtype=cupy.uint8)


def _sequence_cuda(fns: Sequence[Fn], budget_s: float, max_reps: int,
                   clock: Callable[[], float] = time.perf_counter) -> list[Measurement]:
    """Time `fns` called in order, per call, with CUDA events, flushing L2 before each
    repetition; and, with `clock`, how long the host took to issue each call."""
    import cupy

    def call_all() -> None:
        for fn in fns:
            fn()

    flush = l2_flush_buffer()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    # Estimate over five flushed sequences, the way do_bench does.
    start.record()
    for _ in range(5):
        flush.fill(0)
        call_all()
    end.record()
    end.synchronize()
    estimate = cupy.cuda.get_elapsed_time(start, end) / 5 * 1e-3
    for _ in range(max(1, _warmup(estimate, budget_s))):
        call_all()
    reps = [[cupy.cuda.Event() for _ in range(len(fns) + 1)]
            for _ in range(_reps(estimate, budget_s, max_reps))]
    hosts = []
    for events in reps:
        flush.fill(0)  # before the first event is recorded: not timed
        events[0].record()
        issued = []
        for fn, event in zip(fns, events[1:]):
            before = clock()
            fn()
            issued.append((clock() - before) * 1e3)
            event.record()
        hosts.append(issued)
    reps[-1][-1].synchronize()
    return _by_step([[cupy.cuda.get_elapsed_time(a, b) for a, b in itertools.pairwise(ev)]
                     for ev in reps], hosts)


def time_cuda(fn: Fn, budget_s: float, max_reps: int = MAX_REPS_GPU) -> Measurement:
    """Time `fn()` on the GPU with CUDA events, flushing L2 before each repetition."""
    (m,) = _sequence_cuda([fn], budget_s, max_reps)
    return m


def time_cuda_phases(phase_fns: Mapping[str, Fn], budget_s: float,
                     max_reps: int = MAX_REPS_GPU) -> dict[str, Measurement]:
    """Time each phase of a sequence on the GPU: name -> Measurement, in the given order."""
    return dict(zip(phase_fns, _sequence_cuda(list(phase_fns.values()), budget_s, max_reps)))


def timer_for(backend: str) -> Callable[[Fn, float], Measurement]:
    """The timer that fits where `backend` runs: CUDA events on `cuda`, the host clock else."""
    return time_cuda if backend == "cuda" else time_cpu


def phase_timer_for(backend: str) -> Callable[[Mapping[str, Fn], float],
                                                dict[str, Measurement]]:
    """The phase-sequence timer that fits where `backend` runs, as `timer_for` chooses."""
    return time_cuda_phases if backend == "cuda" else time_cpu_phases
