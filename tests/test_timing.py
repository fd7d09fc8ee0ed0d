import gc
import sys
import types

import pytest

from convbench import timing
from convbench.measurement import Measurement


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
    """A clock that only moves when the timed function runs: each call takes `dt` seconds."""

    def __init__(self, dt: float):
        self.t, self.dt, self.calls = 0.0, dt, 0

    def __call__(self) -> float:
        return self.t

    def fn(self) -> None:
        self.calls += 1
        self.t += self.dt


def test_slow_call_gets_the_minimum_reps_and_no_extra_warmup():
    clock = FakeClock(0.5)
    m = timing.time_cpu(clock.fn, budget_s=1.0, clock=clock)
    assert m.reps == timing.MIN_REPS
    assert clock.calls == 1 + timing.MIN_REPS  # the estimate doubles as the warm-up
    assert m.times_ms == pytest.approx((500.0,) * timing.MIN_REPS)


def test_fast_call_is_capped_and_warmed_up():
    clock = FakeClock(0.001)
    m = timing.time_cpu(clock.fn, budget_s=1.0, max_reps=20, clock=clock)
    assert m.reps == 20
    assert clock.calls == 1 + 19 + 20  # estimate, warm-up up to max_reps calls, reps


def test_reps_follow_the_budget():
    clock = FakeClock(0.01)
    assert timing.time_cpu(clock.fn, budget_s=0.1, clock=clock).reps == 10


def test_gc_is_restored_after_timing():
    assert gc.isenabled()
    timing.time_cpu(lambda: None, budget_s=0.001)
    assert gc.isenabled()
    with pytest.raises(ZeroDivisionError):
        timing.time_cpu(lambda: 1 / 0, budget_s=0.001)
    assert gc.isenabled()


def test_real_clock_times_something():
    m = timing.time_cpu(lambda: sum(range(1000)), budget_s=0.01)
    assert m.reps >= timing.MIN_REPS and m.min > 0


def test_timer_for_backend():
    assert timing.timer_for("cuda") is timing.time_cuda
    assert timing.timer_for("numpy") is timing.time_cpu
    assert timing.timer_for("emu") is timing.time_cpu
    assert timing.phase_timer_for("cuda") is timing.time_cuda_phases
    assert timing.phase_timer_for("numpy") is timing.time_cpu_phases
    assert timing.phase_timer_for("emu") is timing.time_cpu_phases


class FakePhases:
    """Phases on a fake clock: phase i takes `dts[i]` seconds; every call is logged."""

    def __init__(self, *dts: float):
        self.t, self.log = 0.0, []
        self.fns = {f"phase {i}": self._phase(i, dt) for i, dt in enumerate(dts)}

    def __call__(self) -> float:
        return self.t

    def _phase(self, i: int, dt: float):
        def run() -> None:
            self.log.append(i)
            self.t += dt

        return run


def test_phases_are_timed_one_by_one_in_order():
    clock = FakePhases(0.01, 0.03, 0.06)  # a 0.1 s sequence
    got = timing.time_cpu_phases(clock.fns, budget_s=1.0, clock=clock)
    assert list(got) == ["phase 0", "phase 1", "phase 2"]
    reps = 10  # sized by the whole sequence, as a plain call would be
    for m, ms in zip(got.values(), (10.0, 30.0, 60.0)):
        assert m.reps == reps and m.times_ms == pytest.approx((ms,) * reps)
    # whole sequences only, always in order: the estimate, one more warm-up (0.25 s with the
    # estimate), the repetitions
    assert clock.log == [0, 1, 2] * (1 + 1 + reps)


def test_phase_sequence_and_a_plain_call_get_the_same_repetitions():
    phases = FakePhases(0.02, 0.03)
    whole = FakeClock(0.05)
    assert timing.time_cpu(whole.fn, budget_s=0.5, clock=whole).reps == \
        next(iter(timing.time_cpu_phases(phases.fns, budget_s=0.5, clock=phases).values())).reps


def test_real_clock_times_each_phase():
    got = timing.time_cpu_phases({"a": lambda: sum(range(1000)), "b": lambda: sorted(range(500))},
                                 budget_s=0.01)
    assert all(m.reps >= timing.MIN_REPS and m.min > 0 for m in got.values())


@pytest.mark.gpu
def test_cuda_timer_flushes_and_times():
    import cupy

    l2 = cupy.cuda.Device().attributes["L2CacheSize"]
    assert timing.l2_flush_buffer().nbytes >= 2 * l2
    a = cupy.ones((2048, 2048), dtype=cupy.float32)
    m = timing.time_cuda(lambda: a @ a, budget_s=0.05)
    assert timing.MIN_REPS <= m.reps <= timing.MAX_REPS_GPU
    assert m.min > 0
    # A 2048³ matmul is 17 GFLOP: well over a microsecond, well under a second on any GPU.
    assert 1e-3 < m.median < 1e3


@pytest.mark.gpu
def test_cuda_phases_are_timed_with_events():
    import cupy

    small = cupy.ones((256, 256), dtype=cupy.float32)
    large = cupy.ones((2048, 2048), dtype=cupy.float32)
    got = timing.time_cuda_phases({"small": lambda: small @ small, "large": lambda: large @ large},
                                  budget_s=0.05)
    assert list(got) == ["small", "large"]
    assert all(timing.MIN_REPS <= m.reps <= timing.MAX_REPS_GPU and m.min > 0
               for m in got.values())
    assert got["large"].median > got["small"].median  # 512x the flops


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


@pytest.mark.parametrize("device_ms, host_ms, bound", [(2.0, 0.05, False), (0.02, 0.04, True)])
def test_cuda_times_keep_the_host_s_time_to_issue_each_call(monkeypatch, device_ms, host_ms,
                                                            bound):
    """Beside the device's time, each repetition records how long the host took to issue the
    call: where that is as long as the device's, the host may have set the pace."""
    gpu = FakeDevice(device_ms, host_ms)
    monkeypatch.setitem(sys.modules, "cupy", gpu.module)
    (m,) = timing._sequence_cuda([gpu.fn], 0.05, 100, clock=gpu.clock)
    assert m.times_ms == pytest.approx((device_ms,) * m.reps)
    assert m.host_ms == pytest.approx((host_ms,) * m.reps)
    assert m.host_median == pytest.approx(host_ms) and m.host_bound is bound
    assert Measurement((1.0,)).host_median is None and not Measurement((1.0,)).host_bound
