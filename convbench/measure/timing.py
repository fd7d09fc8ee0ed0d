"""Timers: how long does each of several competing calls take, measured side by side? They never
know what they time.

**Rounds.** Cases that compete (the same problem and pass, every algorithm and layout) are timed
together, one repetition each per round, in a shuffled order per round (`time_rounds`): drift
(another job starting, the clock changing) then falls on all of them alike instead of on
whichever happened to run at that moment, and each repetition keeps its round, so two cases'
times can be compared round by round (`stats.ratio`, paired). One case alone is the one-contender
case of the same loop (`time_cpu`, `time_cuda`).

**How many rounds.** Like `triton.testing.do_bench`, each contender's time is estimated first
and it is warmed up for a share of the budget. Rounds then go on until every contender's median
is known to within `target` (the half-width of its order-statistic interval relative to the
median, nvbench's relative-noise criterion: `stats.half_width`), or the budget is spent — `budget_s`
per contender, so a group of 12 cases gets 12 budgets — or a contender has `max_reps`
repetitions; never fewer than `stats.MIN_REPS` (a time that is compared needs an interval;
one that is not, a phase breakdown or a study's step, `MIN_REPS_ALONE`, and its spread judged by
its IQR instead). `Timed.stop` says which ended it.

**A contender** is a sequence of steps called in order each repetition with a timestamp between
them (`Contender`): one step for a plain call, or a pass's phases (`convbench.algos.phases`); a step
may be timed but left out of the contender's time (`excluded`: the copy of a library's result).

- CPU (`numpy`, `emu`): `time.perf_counter` stamps, the garbage collector off while timing (as
  `timeit` does); with `warm`, each timed repetition right after an untimed call of its own
  (`WARM_POOLS`); and around each repetition (outside its stamps) a reading of the process
  (`contention.sample`): its CPU time and the share of its threads' ready time they spent on a
  core, so a repetition the machine starved says so (`Measurement.contended`); and the
  machine's busy and stolen ticks, summed over the contender's repetitions, for the share of
  its cores' time a hypervisor gave to other machines (`Measurement.stolen`).
- GPU (`cuda`): CUDA events recorded on the current stream as the stamps. Before each repetition,
  outside the timed region: the L2 cache flushed (a buffer twice its size zeroed), then a head
  start (`head_start`: a spin kernel the caller supplies, sized from the host's measured issue
  time) that keeps the GPU busy while the host issues the repetition's calls, so the GPU never
  waits for the host between the first and the last event. The host's time to issue each call is
  kept (`Measurement.host_ms`) with the head start it had (`slack_ms`): a repetition whose host
  took longer than its head start may hold idle time (`Measurement.host_bound`), and the next
  head start grows. Rounds are synchronised in chunks; NVML is read before and after each chunk,
  and each contender is flagged by the share of its own time held down (`nvml.row_throttled`):
  a chunk's violation time, spread over the chunk's GPU time from its first event to its last,
  falls on each contender in proportion to its time in the chunk. The head start is the one
  `gpu_head_start` gives wherever kernels compile, for one call (`time_cuda`) as for rounds, as
  nvbench holds the stream with a blocking kernel until its launches are queued: without it a
  repetition whose host is slower than its GPU times the host's issue gap as well.
- Whole steps (`time_steps`, `time_step`: a model's training or inference step) on the GPU: each
  repetition starts from an idle device (synchronised after the flush, before its first event)
  and gets no head start, so its events span from the host's first launch to the device's last
  work: a step heavy on the host reads at least the host's time, as it takes in training, where
  a head start (or the previous repetition's queued work) would hide it behind the device's.
  The host's time to issue each step is kept beside the device's (`Measurement.host_ms`).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..core import stats
from ..core.measurement import Measurement
from ..machine import contention, nvml

#: Fewest repetitions a row's measurement gets, however slow the call: enough for an interval.
MIN_REPS = stats.MIN_REPS
#: Fewest repetitions of a time that is not compared (a phase breakdown, a study's step): a
#: median and an IQR, as before rows had intervals.
MIN_REPS_ALONE = 3
#: Most repetitions on the CPU, however fast the call.
MAX_REPS_CPU = 50
#: Most repetitions on the GPU, however fast the kernel.
MAX_REPS_GPU = 1000
#: Fraction of the budget spent on warm-up, on top of the budget.
WARMUP_FRACTION = 0.25
#: The relative half-width of a median's interval at which repetitions stop (`--target-noise`).
TARGET_NOISE = 0.02
#: Why rounds ended.
STOP_TARGET, STOP_BUDGET, STOP_MAX_REPS = "target", "budget", "max reps"
#: The GPU's head start per repetition: this many times the host's measured time to issue it,
#: within these bounds (ms).
SLACK_FACTOR, MIN_SLACK_MS, MAX_SLACK_MS = 2.0, 0.02, 20.0

Fn = Callable[[], object]

#: What `warm` does, as a run records it. Why: interleaved, each contender follows another's
#: repetition, and its thread pool's workers have gone to sleep; waking them can cost more than
#: a small layer's pass, where in a model one library's operations follow one another and keep
#: its pool awake (measured: docs/pages/measurement.md, competitors side by side).
WARM_POOLS = ("each repetition right after an untimed call of its own, its thread pool's "
              "workers awake (more than one thread)")


@dataclass(frozen=True)
class Contender:
    """What one case runs per repetition: `steps` called in order, each timed; the contender's
    time is their sum less the `excluded` ones."""

    steps: Mapping[str, Fn]
    excluded: frozenset[str] = frozenset()

    @classmethod
    def call(cls, fn: Fn) -> Contender:
        return cls({"call": fn})


@dataclass(frozen=True)
class Timed:
    """A contender's measurements: each step's, and the contender's own (`total`: per
    repetition, its counted steps' sum, with the host readings); why its rounds stopped; and on
    a GPU why clocks were held down while it was timed (empty: they were not, or nobody says)."""

    steps: dict[str, Measurement]
    total: Measurement
    stop: str
    throttled: tuple[str, ...] = field(default=())


def _warmup(estimate_s: float, budget_s: float) -> int:
    return int(WARMUP_FRACTION * budget_s / max(estimate_s, 1e-9))


def _stop(rounds: int, elapsed_s: float, budget_s: float, max_reps: int,
          totals: Sequence[Sequence[float]], target: float, min_reps: int) -> str | None:
    """Why rounds end now, or None to go on."""
    if rounds >= max_reps:
        return STOP_MAX_REPS
    if rounds < min_reps:
        return None
    if all((hw := _half_width(t)) is not None and hw <= target for t in totals):
        return STOP_TARGET
    return STOP_BUDGET if elapsed_s >= budget_s else None


def _half_width(times: Sequence[float]) -> float | None:
    """`stats.half_width`; below `stats.MIN_REPS`, half the IQR over the median (a time that is
    not compared needs no interval, only to be steady)."""
    if len(times) >= stats.MIN_REPS:
        return stats.half_width(times)
    q1, median, q3 = np.quantile(times, (0.25, 0.5, 0.75))
    return (q3 - q1) / 2 / median if median > 0 else None


def _counted(c: Contender, step_ms: Sequence[float]) -> float:
    return sum(ms for name, ms in zip(c.steps, step_ms) if name not in c.excluded)


def _timed(c: Contender, reps: list[list[float]], stop: str, *, hosts=(), cpu=(), shares=(),
           slacks=(), throttled=(), stolen: float | None = None) -> Timed:
    steps = {name: Measurement(times, tuple(h[i] for h in hosts) if hosts else ())
             for i, (name, times) in enumerate(zip(c.steps, zip(*reps)))}
    host_totals = tuple(_counted(c, h) for h in hosts)
    total = Measurement(tuple(_counted(c, r) for r in reps), host_totals, tuple(cpu),
                        tuple(shares), tuple(slacks), stolen)
    return Timed(steps, total, stop, tuple(throttled))


# --- the host ----------------------------------------------------------------------------------
#: The host's caches flushed before each timed repetition (`cold_caches`), or None: warm.
_FLUSH: list[Callable[[], None]] = []


@contextlib.contextmanager
def cold_caches():
    """Time every CPU repetition in the block from cold caches: a buffer twice the last-level
    cache (`host.last_level_cache_bytes`) is rewritten before each, outside the timed region,
    as Triton's `do_bench` and benchdnn flush between repetitions (the GPU's timer always
    flushes its L2). In a model a layer finds its caches full of its neighbours' data, not of
    its own last repetition's: cold isolated times are the closer prediction there."""
    import numpy as np

    from ..machine.host import last_level_cache_bytes

    buf = np.zeros(2 * last_level_cache_bytes() // 8, dtype=np.float64)

    def flush() -> None:
        np.add(buf, 1.0, out=buf)

    _FLUSH.append(flush)
    try:
        yield
    finally:
        _FLUSH.pop()


def rounds_cpu(contenders: Sequence[Contender], budget_s: float, *,
               target: float = TARGET_NOISE, max_reps: int = MAX_REPS_CPU,
               min_reps: int = MIN_REPS, clock: Callable[[], float] = time.perf_counter,
               seed: int = 0,
               probe: Callable[[], contention.Sample] | None = contention.sample,
               warm: bool = False) -> list[Timed]:
    """Time `contenders` in shuffled rounds on the host (see the module's docstring); `probe`
    reads the process around each repetition (None: no contention readings). `warm`: each
    timed repetition right after an untimed call of the same contender (`WARM_POOLS`), unless
    caches are flushed (`cold_caches`), whose flush before each repetition both the warm
    call would undo and takes long enough for any pool to fall asleep."""
    def once(c: Contender) -> list[float]:
        stamps = [clock()]
        for fn in c.steps.values():
            fn()
            stamps.append(clock())
        return [(b - a) * 1e3 for a, b in itertools.pairwise(stamps)]

    for c in contenders:  # the estimate is the first warm-up call
        estimate = sum(once(c)) * 1e-3
        for _ in range(min(max_reps, _warmup(estimate, budget_s)) - 1):
            once(c)
    order, rng = list(range(len(contenders))), random.Random(seed)
    reps: list[list[list[float]]] = [[] for _ in contenders]
    cpu: list[list[float]] = [[] for _ in contenders]
    shares: list[list[float]] = [[] for _ in contenders]
    ticks = [[0, 0] for _ in contenders]  # (busy, stolen) machine ticks over its repetitions
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start, rounds, stop = clock(), 0, None
        while stop is None:
            rng.shuffle(order)
            for i in order:
                if _FLUSH:
                    _FLUSH[-1]()
                elif warm:
                    once(contenders[i])
                before = probe() if probe else None
                reps[i].append(once(contenders[i]))
                if before is not None:
                    after = probe()
                    cpu[i].append(contention.cpu_ms(before, after))
                    if (s := contention.share(before, after)) is not None:
                        shares[i].append(s)
                    busy, steal = contention.ticks_between(before, after)
                    ticks[i][0] += busy
                    ticks[i][1] += steal
            rounds += 1
            stop = _stop(rounds, clock() - start, budget_s * len(contenders), max_reps,
                         [[_counted(c, r) for r in rs] for c, rs in zip(contenders, reps)],
                         target, min_reps)
    finally:
        if gc_was_enabled:
            gc.enable()
    return [_timed(c, r, stop, cpu=cp, shares=sh if len(sh) == len(r) else (),
                   stolen=contention.stolen(*t))
            for c, r, cp, sh, t in zip(contenders, reps, cpu, shares, ticks)]


def time_cpu(fn: Fn, budget_s: float, max_reps: int = MAX_REPS_CPU,
             clock: Callable[[], float] = time.perf_counter,
             target: float = TARGET_NOISE, min_reps: int = MIN_REPS_ALONE) -> Measurement:
    """Time `fn()` alone on the host."""
    (timed,) = rounds_cpu([Contender.call(fn)], budget_s, target=target, max_reps=max_reps,
                          min_reps=min_reps, clock=clock)
    return timed.total


# --- the GPU -----------------------------------------------------------------------------------
def l2_flush_buffer():
    """A device buffer twice the size of the current GPU's L2 cache (at least 64 MiB when the
    driver does not say), whose zeroing evicts everything a previous repetition left in L2."""
    import cupy

    l2 = cupy.cuda.Device().attributes.get("L2CacheSize", 0)
    return cupy.empty(max(2 * l2, 64 << 20), dtype=cupy.uint8)


def _no_head_start(ms: float) -> None:
    """The GPU gets no head start (what a caller without a spin kernel gives)."""


def gpu_head_start() -> Callable[[float], None]:
    """The GPU timer's head start (`kernels.head_start`) where kernels compile here; else
    none, and a repetition whose host outruns the GPU says so (`Measurement.host_bound`)."""
    from ..cuda import kernels

    return _no_head_start if kernels.available("cuda") else kernels.head_start("cuda")


def rounds_cuda(contenders: Sequence[Contender], budget_s: float, *,
                target: float = TARGET_NOISE, max_reps: int = MAX_REPS_GPU,
                min_reps: int = MIN_REPS, clock: Callable[[], float] = time.perf_counter,
                seed: int = 0,
                head_start: Callable[[float], None] = _no_head_start,
                gpu_probe: Callable[[], nvml.Sample | None] = nvml.sample,
                idle: bool = False) -> list[Timed]:
    """Time `contenders` in shuffled rounds on the GPU with CUDA events (see the module's
    docstring). `head_start(ms)` queues work that keeps the GPU busy for about `ms`
    (`kernels.head_start`); `gpu_probe` reads the clocks (NVML) between chunks of rounds.
    `idle`: each repetition starts from an idle device and gets no head start (whole steps,
    whose time is the host's where it is the longer)."""
    import cupy

    if idle:
        head_start = _no_head_start
    flush = l2_flush_buffer()
    estimates, slack = _cuda_warmup(contenders, budget_s, flush, clock)
    # Synchronise about ten times over the budget: often enough to stop near the target.
    chunk = max(1, int(0.1 * budget_s * len(contenders) / max(sum(estimates), 1e-9)))
    order, rng = list(range(len(contenders))), random.Random(seed)
    reps: list[list[list[float]]] = [[] for _ in contenders]
    hosts: list[list[list[float]]] = [[] for _ in contenders]
    slacks: list[list[float]] = [[] for _ in contenders]
    held: list[dict[str, float]] = [{} for _ in contenders]  # ms held down, per counter
    hard: list[list[str]] = [[] for _ in contenders]
    started, rounds, stop = clock(), 0, None
    before = gpu_probe()
    while stop is None:
        count = min(chunk, max_reps - rounds)
        pending = _issue_rounds(contenders, count, order, rng, flush, head_start, slack, clock,
                                idle)
        rounds += count
        pending[-1][1][-1].synchronize()
        in_chunk = [0.0] * len(contenders)
        for i, events, issued, given in pending:
            reps[i].append([cupy.cuda.get_elapsed_time(a, b)
                            for a, b in itertools.pairwise(events)])
            in_chunk[i] += _counted(contenders[i], reps[i][-1])
            hosts[i].append(issued)
            if idle:
                continue
            slacks[i].append(given)
            if sum(issued) > given:  # the GPU may have waited: a longer head start next time
                slack[i] = min(MAX_SLACK_MS, SLACK_FACTOR * sum(issued))
        after = gpu_probe()
        _attribute(nvml.held_down_ms(before, after), nvml.hard_reasons(before, after),
                   cupy.cuda.get_elapsed_time(pending[0][1][0], pending[-1][1][-1]),
                   in_chunk, held, hard)
        before = after
        stop = _stop(rounds, clock() - started, budget_s * len(contenders), max_reps,
                     [[_counted(c, r) for r in rs] for c, rs in zip(contenders, reps)], target,
                     min_reps)
    return [_timed(c, r, stop, hosts=h, slacks=s,
                   throttled=nvml.row_throttled(held[i], sum(_counted(c, x) for x in r), hard[i]))
            for i, (c, r, h, s) in enumerate(zip(contenders, reps, hosts, slacks))]


def _cuda_warmup(contenders: Sequence[Contender], budget_s: float, flush,
                 clock: Callable[[], float]) -> tuple[list[float], list[float]]:
    """Per contender, its estimated seconds a repetition (five flushed sequences, the way
    do_bench estimates) and the head start (ms) its first timed repetition gets, from the host's
    time to issue them; each then warmed up for its share of `budget_s`."""
    import cupy

    estimates, slack = [], []
    for c in contenders:
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        issued = clock()
        for _ in range(5):
            flush.fill(0)
            for fn in c.steps.values():
                fn()
        issued = (clock() - issued) / 5 * 1e3
        end.record()
        end.synchronize()
        estimate = cupy.cuda.get_elapsed_time(start, end) / 5 * 1e-3
        for _ in range(max(1, _warmup(estimate, budget_s))):
            for fn in c.steps.values():
                fn()
        estimates.append(estimate)
        slack.append(min(MAX_SLACK_MS, max(MIN_SLACK_MS, SLACK_FACTOR * issued)))
    return estimates, slack


def _issue_rounds(contenders: Sequence[Contender], count: int, order: list[int],
                  rng: random.Random, flush, head_start: Callable[[float], None],
                  slack: list[float], clock: Callable[[], float],
                  idle: bool = False) -> list[tuple]:
    """Queue `count` shuffled rounds without waiting for the GPU (`idle`: waiting for it before
    each repetition's first event): per repetition (contender i, its events around each step,
    the host's ms issuing each step, the head start given)."""
    import cupy

    pending = []
    for _ in range(count):
        rng.shuffle(order)
        for i in order:
            c = contenders[i]
            events = [cupy.cuda.Event() for _ in range(len(c.steps) + 1)]
            flush.fill(0)  # before the head start and the first event: not timed
            if idle:
                cupy.cuda.Device().synchronize()
            head_start(slack[i])
            events[0].record()
            issued = []
            for fn, event in zip(c.steps.values(), events[1:]):
                t = clock()
                fn()
                issued.append((clock() - t) * 1e3)
                event.record()
            pending.append((i, events, issued, slack[i]))
    return pending


def _attribute(held_ms: dict[str, float], reasons: list[str], span_ms: float,
               in_chunk: list[float], held: list[dict[str, float]],
               hard: list[list[str]]) -> None:
    """Spread a chunk's held-down ms (per counter) over its GPU time `span_ms`: contender i,
    `in_chunk[i]` ms of it, takes that share (at most all of its time); the chunk's hard
    reasons go to every contender that ran in it."""
    for i, own in enumerate(in_chunk):
        if own <= 0:
            continue
        for k, ms in held_ms.items():
            fraction = min(1.0, ms / span_ms) if span_ms > 0 else 1.0
            held[i][k] = held[i].get(k, 0.0) + fraction * own
        hard[i] += [r for r in reasons if r not in hard[i]]


def time_cuda(fn: Fn, budget_s: float, max_reps: int = MAX_REPS_GPU,
              target: float = TARGET_NOISE, min_reps: int = MIN_REPS_ALONE,
              clock: Callable[[], float] = time.perf_counter) -> Measurement:
    """Time `fn()` alone on the GPU with CUDA events, flushing L2 and giving the GPU its head
    start (`gpu_head_start`) before each repetition: the device's time, not the host's."""
    (timed,) = rounds_cuda([Contender.call(fn)], budget_s, target=target, max_reps=max_reps,
                           min_reps=min_reps, clock=clock, head_start=gpu_head_start())
    return timed.total


def time_rounds(contenders: Sequence[Contender], budget_s: float, backend: str,
                **options) -> list[Timed]:
    """`rounds_cuda` on `cuda`, `rounds_cpu` elsewhere (options: theirs)."""
    return (rounds_cuda if backend == "cuda" else rounds_cpu)(contenders, budget_s, **options)


def time_steps(contenders: Sequence[Contender], budget_s: float, backend: str,
               **options) -> list[Timed]:
    """Whole steps of a model timed in rounds: on `cuda` each repetition from an idle device
    (see the module's docstring), so a step reads at least the host's time to issue it."""
    if backend == "cuda":
        options["idle"] = True
    return time_rounds(contenders, budget_s, backend, **options)


def time_step(fn: Fn, budget_s: float, backend: str) -> Measurement:
    """One whole step timed alone (`time_steps`), its spread judged by its IQR."""
    (timed,) = time_steps([Contender.call(fn)], budget_s, backend, min_reps=MIN_REPS_ALONE)
    return timed.total


def timer_for(backend: str) -> Callable[[Fn, float], Measurement]:
    """The timer that fits where `backend` runs: CUDA events on `cuda`, the host clock else."""
    return time_cuda if backend == "cuda" else time_cpu

