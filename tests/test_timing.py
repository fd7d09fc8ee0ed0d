import gc
import random
import sys
import types

import pytest

from convbench.core import stats
from convbench.core.measurement import Measurement
from convbench.machine import contention, nvml
from convbench.measure import timing

#: `convbench gpu-first` runs this file's `gpu` tests first (a pin).
pytestmark = pytest.mark.gpu_pins


def test_statistics_from_raw_times():
    m = Measurement((5.0, 1.0, 3.0, 2.0, 4.0))
    assert (m.reps, m.median, m.q1, m.q3, m.iqr, m.min, m.mean) == (5, 3.0, 2.0, 4.0, 2.0, 1.0, 3.0)
    assert m.noisy  # IQR/median = 2/3
    assert not Measurement((10.0, 10.1, 10.2, 10.3)).noisy
    assert m.times_ms == (5.0, 1.0, 3.0, 2.0, 4.0)  # raw order kept


def test_times_text_round_trip():
    m = Measurement((1.5, 0.000123456789, 2000.25))
    back = Measurement.from_text(m.times_text())
    assert back.times_ms == pytest.approx(m.times_ms, rel=1e-5)


def test_empty_measurement_is_refused():
    with pytest.raises(ValueError):
        Measurement(())


class FakeClock:
    """A clock that only moves when the timed function runs: each call takes `dt` seconds, times
    (1 + `noise` × a seeded uniform draw in [-1, 1])."""

    def __init__(self, dt: float, noise: float = 0.0):
        self.t, self.dt, self.noise, self.calls = 0.0, dt, noise, 0
        self.rng = random.Random(1)

    def __call__(self) -> float:
        return self.t

    def fn(self) -> None:
        self.calls += 1
        self.t += self.dt * (1 + self.noise * self.rng.uniform(-1, 1))


def test_a_steady_call_stops_at_the_target_after_the_fewest_reps():
    """Equal times: the median's interval has no width at the first chance to judge it."""
    clock = FakeClock(0.5)
    (t,) = timing.rounds_cpu([timing.Contender.call(clock.fn)], budget_s=1.0, clock=clock)
    assert t.total.reps == timing.MIN_REPS == stats.MIN_REPS and t.stop == timing.STOP_TARGET
    assert clock.calls == 1 + timing.MIN_REPS  # the estimate doubles as the warm-up
    assert t.total.times_ms == pytest.approx((500.0,) * timing.MIN_REPS)


def test_a_noisy_call_goes_on_until_the_budget():
    clock = FakeClock(0.01, noise=0.3)  # a 30% spread never narrows to 2% in 0.1 s
    (t,) = timing.rounds_cpu([timing.Contender.call(clock.fn)], budget_s=0.1, clock=clock)
    assert t.stop == timing.STOP_BUDGET and 8 <= t.total.reps <= 12
    assert t.total.half_width > timing.TARGET_NOISE


def test_a_mildly_noisy_call_stops_once_its_median_is_known():
    clock = FakeClock(0.001, noise=0.02)
    (t,) = timing.rounds_cpu([timing.Contender.call(clock.fn)], budget_s=10.0, clock=clock)
    assert t.stop == timing.STOP_TARGET and t.total.half_width <= timing.TARGET_NOISE
    assert t.total.reps < timing.MAX_REPS_CPU


def test_fast_noisy_call_is_capped_and_warmed_up():
    clock = FakeClock(0.001, noise=0.3)
    m = timing.time_cpu(clock.fn, budget_s=1.0, max_reps=20, clock=clock)
    assert m.reps == 20
    assert clock.calls == 1 + 19 + 20  # estimate, warm-up up to max_reps calls, reps


def test_gc_is_restored_after_timing():
    assert gc.isenabled()
    timing.time_cpu(lambda: None, budget_s=0.001)
    assert gc.isenabled()
    with pytest.raises(ZeroDivisionError):
        timing.time_cpu(lambda: 1 / 0, budget_s=0.001)
    assert gc.isenabled()


def test_real_clock_times_something_and_reads_the_cores_it_got():
    m = timing.time_cpu(lambda: sum(range(20000)), budget_s=0.01)
    assert m.reps >= timing.MIN_REPS_ALONE and m.min > 0
    assert len(m.cpu_ms) == m.reps and all(c >= 0 for c in m.cpu_ms)
    if contention.available():
        assert len(m.cpu_share) == m.reps and 0 < m.share <= 1


def test_timer_for_backend():
    assert timing.timer_for("cuda") is timing.time_cuda
    assert timing.timer_for("numpy") is timing.time_cpu
    assert timing.timer_for("emu") is timing.time_cpu


class FakePhases:
    """Phases on a fake clock: phase i takes `dts[i]` seconds; every call is logged."""

    def __init__(self, *dts: float, name: str = "phase"):
        self.t, self.log = 0.0, []
        self.fns = {f"{name} {i}": self._phase(i, dt) for i, dt in enumerate(dts)}

    def __call__(self) -> float:
        return self.t

    def _phase(self, i: int, dt: float):
        def run() -> None:
            self.log.append(i)
            self.t += dt

        return run


def test_phases_are_timed_one_by_one_in_order():
    clock = FakePhases(0.01, 0.03, 0.06)  # a 0.1 s sequence
    (timed,) = timing.rounds_cpu([timing.Contender(clock.fns)], 1.0, clock=clock,
                                 min_reps=timing.MIN_REPS_ALONE)
    got = timed.steps
    assert list(got) == ["phase 0", "phase 1", "phase 2"]
    reps = timing.MIN_REPS_ALONE  # steady: the target is met as soon as it can be judged
    for m, ms in zip(got.values(), (10.0, 30.0, 60.0)):
        assert m.reps == reps and m.times_ms == pytest.approx((ms,) * reps)
    # whole sequences only, always in order: the estimate, one more warm-up (0.25 s with the
    # estimate), the repetitions
    assert clock.log == [0, 1, 2] * (1 + 1 + reps)


def test_an_excluded_step_is_timed_but_not_counted():
    clock = FakePhases(0.01, 0.002)
    (t,) = timing.rounds_cpu([timing.Contender(clock.fns, frozenset({"phase 1"}))], 0.1,
                             clock=clock)
    assert t.steps["phase 1"].median == pytest.approx(2.0)
    assert t.total.times_ms == pytest.approx((10.0,) * t.total.reps)


class SharedClock:
    """One fake clock for several contenders: contender i's call takes `dts[i]` seconds, times
    `1 + drift × (time so far) / horizon` (a machine slowing down), times a seeded 1% jitter;
    the order of calls is logged."""

    def __init__(self, dts, drift: float = 0.0, horizon: float = 1.0):
        self.t, self.dts, self.drift, self.horizon = 0.0, dts, drift, horizon
        self.rng, self.log = random.Random(2), []

    def __call__(self) -> float:
        return self.t

    def contender(self, i: int) -> timing.Contender:
        def call() -> None:
            self.log.append(i)
            self.t += (self.dts[i] * (1 + self.drift * self.t / self.horizon)
                       * (1 + 0.01 * self.rng.uniform(-1, 1)))

        return timing.Contender.call(call)


def test_rounds_interleave_every_contender_once_per_round_in_shuffled_orders():
    clock = SharedClock([0.01, 0.01, 0.01])
    timed = timing.rounds_cpu([clock.contender(i) for i in range(3)], 0.05, clock=clock,
                              probe=None)
    reps = timed[0].total.reps
    assert all(t.total.reps == reps for t in timed)
    rounds = [clock.log[-3 * reps:][3 * r:3 * r + 3] for r in range(reps)]
    assert all(sorted(r) == [0, 1, 2] for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # not the same order every round


def test_drift_is_a_tie_in_rounds_where_one_after_the_other_calls_it_a_win():
    """Two equally fast calls on a machine slowing down steadily (by 5% in the time one of them
    takes to be timed, 0.35 s: warm-up and repetitions): timed one after the other, the second
    looks slower beyond noise; timed in rounds, their paired ratio is a tie. A real 20% gap is
    a win either way."""
    def sequential(dts):
        clock = SharedClock(dts, drift=0.05, horizon=0.35)
        return [timing.rounds_cpu([clock.contender(i)], 1.0, clock=clock, probe=None)[0]
                for i in range(2)]

    def interleaved(dts):
        clock = SharedClock(dts, drift=0.05, horizon=0.35)
        return timing.rounds_cpu([clock.contender(i) for i in range(2)], 1.0, clock=clock,
                                 probe=None, target=0.001)

    a, b = sequential([0.01, 0.01])
    drifted = stats.ratio(b.total.times_ms, a.total.times_ms)
    assert drifted.decided and drifted.value > 1.03  # a "win" made of drift
    a, b = interleaved([0.01, 0.01])
    fair = stats.ratio(b.total.times_ms, a.total.times_ms, paired=True)
    assert not fair.decided and fair.low < 1 < fair.high
    for timed in (sequential([0.01, 0.012]), interleaved([0.01, 0.012])):
        gap = stats.ratio(timed[1].total.times_ms, timed[0].total.times_ms)
        assert gap.decided and gap.low > 1.1


def test_a_starved_repetition_is_read_as_contended():
    """The probe's readings become each repetition's CPU time and share of ready time on a
    core; a median share below CONTENDED_SHARE flags the measurement."""
    def probe_with(share: float):
        state = {"on": 0, "cpu": 0.0}

        def probe() -> contention.Sample:
            state["on"] += 1_000_000
            state["cpu"] += 0.001
            waiting = int(state["on"] * (1 - share) / share)
            return contention.Sample({1: (state["on"], waiting)}, state["cpu"], 0)

        return probe

    clock = FakeClock(0.01)
    for share, contended in ((0.5, True), (0.99, False)):
        (t,) = timing.rounds_cpu([timing.Contender.call(clock.fn)], 0.1, clock=clock,
                                 probe=probe_with(share))
        assert t.total.share == pytest.approx(share, rel=0.05)
        assert t.total.contended is contended
        assert t.total.cpu_ms == pytest.approx((1.0,) * t.total.reps)


def test_ticks_the_hypervisor_stole_over_the_repetitions_flag_the_measurement():
    """The machine's busy and stolen ticks read around each repetition are summed over the
    contender's repetitions (not the others'): their ratio is its `stolen`."""
    def probe_with(stolen_per_rep: int):
        state = {"n": 0, "busy": 0, "steal": 0, "on": 0}

        def probe() -> contention.Sample:
            state["n"] += 1
            if state["n"] % 2 == 0:  # after a repetition: 10 busy ticks, some stolen
                state["busy"] += 10
                state["steal"] += stolen_per_rep
            state["on"] += 1_000_000
            return contention.Sample({1: (state["on"], 0)}, 0.0, 0,
                                     (state["busy"], state["steal"]))

        return probe

    clock = FakeClock(0.01)
    for steal, contended in ((3, True), (0, False)):
        (t,) = timing.rounds_cpu([timing.Contender.call(clock.fn)], 0.1, clock=clock,
                                 probe=probe_with(steal))
        assert t.total.share == pytest.approx(1.0)
        assert t.total.stolen == pytest.approx(steal / 10)
        assert t.total.contended is contended


@pytest.mark.gpu
def test_cuda_timer_flushes_and_times():
    import cupy

    l2 = cupy.cuda.Device().attributes["L2CacheSize"]
    assert timing.l2_flush_buffer().nbytes >= 2 * l2
    a = cupy.ones((2048, 2048), dtype=cupy.float32)
    m = timing.time_cuda(lambda: a @ a, budget_s=0.05)
    assert timing.MIN_REPS <= m.reps <= timing.MAX_REPS_GPU
    assert m.min > 0
    # The same work timed by plain CUDA events around each call (no flush, no head start):
    # a compute-bound 17 GFLOP matmul takes the same time either way, within a quarter.
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    plain = []
    for _ in range(21):
        start.record()
        a @ a
        end.record()
        end.synchronize()
        plain.append(cupy.cuda.get_elapsed_time(start, end))
    assert m.median == pytest.approx(sorted(plain)[10], rel=0.25)
    # Twice the work timed is about twice the time: the events enclose the work, not its launch.
    twice = timing.time_cuda(lambda: (a @ a, a @ a), budget_s=0.05)
    assert 1.7 < twice.median / m.median < 2.3


@pytest.mark.gpu
def test_cuda_phases_are_timed_with_events():
    import cupy

    small = cupy.ones((256, 256), dtype=cupy.float32)
    large = cupy.ones((2048, 2048), dtype=cupy.float32)
    (timed,) = timing.rounds_cuda([timing.Contender({"small": lambda: small @ small,
                                                     "large": lambda: large @ large})], 0.05)
    got = timed.steps
    assert list(got) == ["small", "large"]
    assert all(timing.MIN_REPS <= m.reps <= timing.MAX_REPS_GPU and m.min > 0
               for m in got.values())
    assert got["large"].median > got["small"].median  # 512x the flops


@pytest.mark.gpu
def test_cuda_timer_times_a_tiny_call_on_the_device_not_the_host():
    """A call far shorter than the host's time to issue it (a 1 KiB fill): with its head start
    the GPU never waits between the events, so the time is the device's, below the host's."""
    import cupy

    a = cupy.empty(256, dtype=cupy.float32)
    m = timing.time_cuda(lambda: a.fill(1), budget_s=0.05)
    assert m.median < m.host_median and not m.host_bound


@pytest.mark.gpu
def test_cuda_whole_steps_read_the_host_s_time_beside_a_step_heavy_on_the_gpu():
    """On the real queue: a step the host takes 5 ms over (a sleep, then a tiny kernel) timed
    in rounds beside products that keep the GPU busy longer reads at least its host's time."""
    import time

    import cupy

    a, big = cupy.empty(256, dtype=cupy.float32), cupy.ones((4096, 4096), dtype=cupy.float32)

    def host_heavy():
        time.sleep(0.005)
        a.fill(1)

    def device_heavy():
        for _ in range(4):
            big @ big

    light, heavy = timing.time_steps([timing.Contender.call(host_heavy),
                                      timing.Contender.call(device_heavy)], 0.2, "cuda")
    assert light.total.min >= 5 and min(light.total.host_ms) >= 5
    assert heavy.total.median > heavy.total.host_median


class FakeDevice:
    """CuPy's events on a pretend GPU: each call of `fn` runs `device_ms` on the device and
    takes the host `host_ms` to issue; the two clocks only move then."""

    def __init__(self, device_ms: float, host_ms: float):
        self.device_ms, self.host_ms = device_ms, host_ms
        self.device_t = self.host_t = 0.0
        gpu = self
        uint8 = "uint8"

        class Event:
            def record(self):
                self.t = gpu.device_t

            def synchronize(self):
                pass

        class Buffer:
            nbytes = 1 << 26

            def fill(self, value):
                pass

        self.module = types.SimpleNamespace(
            uint8=uint8, empty=lambda n, dtype: Buffer(),
            cuda=types.SimpleNamespace(
                Event=Event, get_elapsed_time=lambda a, b: b.t - a.t,
                Device=lambda: types.SimpleNamespace(attributes={"L2CacheSize": 1 << 20})))

    def clock(self) -> float:
        return self.host_t / 1e3

    def fn(self) -> None:
        self.device_t += self.device_ms
        self.host_t += self.host_ms


def test_cuda_rounds_give_the_gpu_a_head_start_and_keep_the_host_s_time(monkeypatch):
    """Before each repetition the GPU gets a head start twice the host's measured time to issue
    it, so it never waits for the host between the events; each repetition keeps its host time
    and head start, and none is host-bound."""
    gpu = FakeDevice(device_ms=2.0, host_ms=0.05)
    monkeypatch.setitem(sys.modules, "cupy", gpu.module)
    given = []
    (t,) = timing.rounds_cuda([timing.Contender.call(gpu.fn)], 0.05, clock=gpu.clock,
                              head_start=given.append, gpu_probe=lambda: None)
    m = t.total
    assert m.times_ms == pytest.approx((2.0,) * m.reps)
    assert m.host_ms == pytest.approx((0.05,) * m.reps)
    assert m.slack_ms == pytest.approx((0.1,) * m.reps) and given == list(m.slack_ms)
    assert not m.host_bound and t.throttled == ()


def test_a_host_slower_than_its_head_start_is_flagged_and_the_head_start_grows(monkeypatch):
    gpu = FakeDevice(device_ms=0.5, host_ms=0.01)
    monkeypatch.setitem(sys.modules, "cupy", gpu.module)
    slow = {"on": False}
    real_fn = gpu.fn

    def fn():
        real_fn()
        if slow["on"]:
            gpu.host_t += 0.3  # the host issues slower once the rounds start

    def head_start(ms):
        slow["on"] = True

    (t,) = timing.rounds_cuda([timing.Contender.call(fn)], 0.05, clock=gpu.clock,
                              head_start=head_start, gpu_probe=lambda: None,
                              target=-1.0)  # never met: rounds go on to the budget
    m = t.total
    late = [h > s for h, s in zip(m.host_ms, m.slack_ms)]
    assert late[0] and not late[-1]  # the first chunk ran late; the head start then grew
    assert m.slack_ms[-1] == pytest.approx(2 * 0.31)
    assert m.host_bound is (m.host_gap_ms >= 0.05 * m.median)


def test_a_gpu_time_is_host_bound_by_the_share_the_host_may_have_held_it_idle():
    """With a head start, the flag weighs how long the GPU may have waited (the host's time
    beyond its head start, median over the repetitions) against the time: one late repetition
    of six, or a host a hair late on every one, leaves the median as it was and flags nothing;
    a host late by a tenth of the time on most repetitions does."""
    def m(hosts, slack=0.15, device_ms=10.0):
        return Measurement((device_ms,) * len(hosts), hosts, slack_ms=(slack,) * len(hosts))

    one_late = m((0.1,) * 5 + (3.0,))  # 2.85 ms late once: the old rule's 1 of 6 > 10%
    hair = m((0.154,) * 6)  # 0.004 ms late every time: 0.04% of the time
    held = m((1.15,) * 4 + (0.1,) * 2)  # 1 ms late on four of six: 10% of the time
    assert [one_late.host_bound, hair.host_bound, held.host_bound] == [False, False, True]
    assert not m((0.6,) * 6).host_bound and m((0.7,) * 6).host_bound  # 4.5% and 5.5%
    assert [x.host_gap_ms for x in (one_late, hair, held)] == pytest.approx([0, 0.004, 1])


def test_host_bound_rule_without_a_head_start():
    """Rows from before the head start: a host that took half the device's time is flagged."""
    assert Measurement((1.0,), (0.5,)).host_bound and not Measurement((1.0,), (0.4,)).host_bound
    assert Measurement((1.0,)).host_median is None and not Measurement((1.0,)).host_bound


def _violations(held_ms_per_chunk, reasons=0x4):
    """NVML samples whose power counter grows by each of `held_ms_per_chunk` in turn (then
    stays), with `reasons` set from the second sample on."""
    total, out = 0, [nvml.Sample(1980, 0, {"power": 0, "thermal": 0})]
    for ms in held_ms_per_chunk:
        total += int(ms * 1e6)
        out.append(nvml.Sample(1500, reasons, {"power": total, "thermal": 0}))
    return iter(out + [out[-1]] * 1000)


def test_a_row_is_flagged_by_the_share_of_its_own_time_held_down(monkeypatch):
    """5 ms of power capping over a 20 ms chunk: a quarter of the row's time, flagged with
    its share; the software power cap's bit alone says nothing more."""
    gpu = FakeDevice(device_ms=1.0, host_ms=0.01)
    monkeypatch.setitem(sys.modules, "cupy", gpu.module)
    samples = _violations([5.0])
    (t,) = timing.rounds_cuda([timing.Contender.call(gpu.fn)], 0.2, clock=gpu.clock,
                              gpu_probe=lambda: next(samples), target=-1.0, max_reps=20)
    assert t.total.reps == 20  # one chunk of 20 repetitions, 20 ms of GPU time
    assert t.throttled == ("power limit (25% of its time held down)",)


def test_a_power_cap_reached_now_and_then_flags_no_row(monkeypatch):
    """The old rule flagged every row of a group whose counter rose at all (a power cap under
    FP32 load is normal): 0.1 ms held down in a 20 ms chunk is 0.5% of each row's time."""
    gpu = FakeDevice(device_ms=1.0, host_ms=0.01)
    monkeypatch.setitem(sys.modules, "cupy", gpu.module)
    samples = _violations([0.1])
    rows = timing.rounds_cuda([timing.Contender.call(gpu.fn), timing.Contender.call(gpu.fn)],
                              0.1, clock=gpu.clock, gpu_probe=lambda: next(samples),
                              target=-1.0, max_reps=10)
    assert [t.throttled for t in rows] == [(), ()]
    samples = _violations([0.1], reasons=0x40)  # a hardware thermal slowdown flags them all
    rows = timing.rounds_cuda([timing.Contender.call(gpu.fn), timing.Contender.call(gpu.fn)],
                              0.1, clock=gpu.clock, gpu_probe=lambda: next(samples),
                              target=-1.0, max_reps=10)
    assert [t.throttled for t in rows] == [("hw thermal slowdown",)] * 2


def test_a_time_that_is_not_compared_needs_fewer_repetitions():
    clock = FakeClock(0.5)
    assert timing.time_cpu(clock.fn, budget_s=1.0, clock=clock).reps == timing.MIN_REPS_ALONE
    (t,) = timing.rounds_cpu([timing.Contender.call(clock.fn)], budget_s=1.0, clock=clock)
    assert t.total.reps == timing.MIN_REPS and t.total.interval is not None


def test_cold_caches_flush_before_every_timed_repetition(monkeypatch):
    """In `timing.cold_caches()` the host's caches are flushed before each timed repetition,
    outside the timed region (a flush inside would be timed); outside it, never."""
    from convbench.measure import timing

    flushes, calls = [], []
    with timing.cold_caches():
        real = timing._FLUSH[-1]
        timing._FLUSH[-1] = lambda: (flushes.append(len(calls)), real())
        (t,) = timing.rounds_cpu([timing.Contender.call(lambda: calls.append(1))], 0.01,
                                 probe=None)
    assert timing._FLUSH == []
    timed = t.total.reps
    assert len(flushes) == timed  # one before each timed repetition, none in the warm-up
    warmup = len(calls) - timed
    assert flushes == list(range(warmup, warmup + timed))
    before = len(calls)
    timing.rounds_cpu([timing.Contender.call(lambda: calls.append(1))], 0.01, probe=None)
    assert len(calls) > before and len(flushes) == timed


class PoolClock(SharedClock):
    """Contender 0's call takes 10 ms when another contender's ran last (its pool's workers
    fell asleep meanwhile) and 1 ms right after its own; contender 1's takes 2 ms."""

    def __init__(self):
        super().__init__([0.001, 0.002])
        self.last = None

    def contender(self, i: int) -> timing.Contender:
        def call():
            self.log.append(i)
            self.t += 0.010 if i == 0 and self.last != 0 else self.dts[i]
            self.last = i

        return timing.Contender.call(call)


def test_warm_times_each_repetition_right_after_a_call_of_its_own():
    """Interleaved, a contender whose pool sleeps between its calls is timed waking it (10 ms);
    with `warm` each timed repetition follows an untimed call of its own (1 ms), and the
    contenders still take turns in shuffled rounds; the rounds end on the same budget."""
    cold = PoolClock()
    a, _ = timing.rounds_cpu([cold.contender(i) for i in range(2)], 0.05, clock=cold,
                             probe=None)
    assert a.total.median == pytest.approx(10)
    clock = PoolClock()
    a, b = timing.rounds_cpu([clock.contender(i) for i in range(2)], 0.05, clock=clock,
                             probe=None, warm=True)
    assert a.total.median == pytest.approx(1) and b.total.median == pytest.approx(2)
    timed = clock.log[-4 * a.total.reps:]  # each repetition is a pair: the untimed call first
    assert all(timed[j] == timed[j + 1] for j in range(0, len(timed), 2))
    assert len({tuple(timed[j:j + 4:2]) for j in range(0, len(timed), 4)}) > 1  # shuffled


def test_warm_makes_no_call_between_a_flush_and_the_timed_repetition():
    """With cold caches the flush comes right before each timed repetition: a warm call after
    it would fill the caches again, so there is none."""
    calls, flushes = [], []
    with timing.cold_caches():
        timing._FLUSH[-1] = lambda: flushes.append(len(calls))
        (t,) = timing.rounds_cpu([timing.Contender.call(lambda: calls.append(1))], 0.01,
                                 probe=None, warm=True)
    warmup = len(calls) - t.total.reps
    assert flushes == list(range(warmup, warmup + t.total.reps))


def test_the_per_call_timer_gives_the_gpu_a_head_start(gpu_queue, monkeypatch):
    """A call the host takes 0.1 ms to issue and the GPU 0.05 ms to run: without a head start
    the GPU waits for the launch after the first event, and the time holds that wait (0.08 ms:
    the queue the flush leaves is shorter than the host's issue); with one (`gpu_head_start`,
    a spin queued before the first event) the call is queued before the GPU reaches it, and
    the time is the device's."""
    call = gpu_queue.step(1, host_ms=0.1, device_ms=0.05)
    (late,) = timing.rounds_cuda([timing.Contender.call(call)], 0.05, clock=gpu_queue.clock)
    assert late.total.median == pytest.approx(0.08)  # the trap the fake reproduces
    monkeypatch.setattr(timing, "gpu_head_start", lambda: gpu_queue.spin, raising=False)
    m = timing.time_cuda(call, budget_s=0.05, clock=gpu_queue.clock)
    assert m.times_ms == pytest.approx((0.05,) * m.reps)
    assert m.slack_ms == pytest.approx((0.2,) * m.reps)  # twice the host's time to issue it
    assert not m.host_bound


def test_whole_steps_start_from_an_idle_gpu_so_a_step_heavy_on_the_host_reads_its_host_time(
        gpu_queue):
    """A step the host takes 10 ms to issue (20 small launches, 2 ms of device work) timed in
    rounds beside one the device takes 8 ms to run (0.5 ms of host): queued behind the other's
    work, the light step's events start late and it reads its device's tail only (what
    `time_rounds` reads). Each whole step from an idle device (`time_steps`), it reads at least
    its host's 10 ms, which its host's time beside it says."""
    def contenders():
        return [timing.Contender.call(gpu_queue.step(20, host_ms=10.0, device_ms=2.0)),
                timing.Contender.call(gpu_queue.step(5, host_ms=0.5, device_ms=8.0))]

    hidden, _ = timing.time_rounds(contenders(), 0.2, "cuda", clock=gpu_queue.clock)
    assert hidden.total.min < 5  # the trap the fake reproduces
    host_heavy, device_heavy = timing.time_steps(contenders(), 0.2, "cuda",
                                                 clock=gpu_queue.clock)
    assert host_heavy.total.min >= 10 and host_heavy.total.host_ms == pytest.approx(
        (10.0,) * host_heavy.total.reps)
    assert device_heavy.total.median == pytest.approx(8.1)
    assert host_heavy.total.slack_ms == () and host_heavy.total.host_bound
    assert not device_heavy.total.host_bound
