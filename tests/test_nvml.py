"""NVML readings through a fake pynvml: clocks, throttling reasons and violation counters, the
env.json snapshot, and graceful absence."""

import os
import sys
import types

import pytest

from convbench.machine import nvml


class FakeNvml(types.SimpleNamespace):
    """pynvml's calls as convbench uses them, on one pretend GPU whose state tests set."""

    def __init__(self, reasons=0, power_ns=0, thermal_ns=0, refuse=()):
        super().__init__()
        self.state = {"reasons": reasons, "power": power_ns, "thermal": thermal_ns}
        self.refuse = set(refuse)

        class NVMLError(Exception):
            pass

        def call(name, value):
            def fn(*args):
                if name in self.refuse:
                    raise NVMLError(f"{name}: Not Supported")
                return value(*args) if callable(value) else value
            return fn

        handle = object()
        violation = lambda h, policy: types.SimpleNamespace(
            referenceTime=0, violationTime=self.state["power" if policy == 0 else "thermal"])
        for name, value in {
                "nvmlInit": None, "nvmlDeviceGetHandleByPciBusId": handle,
                "nvmlDeviceGetHandleByIndex": handle,
                "nvmlDeviceGetClockInfo": lambda h, clock: 1755 if clock == 1 else 2619,
                "nvmlDeviceGetMaxClockInfo": lambda h, clock: 1980 if clock == 1 else 2619,
                "nvmlDeviceGetApplicationsClock": lambda h, clock: 1755 if clock == 1 else 2619,
                "nvmlDeviceGetCurrentClocksEventReasons": lambda h: self.state["reasons"],
                "nvmlDeviceGetViolationStatus": violation,
                "nvmlDeviceGetPowerManagementLimit": 700000, "nvmlDeviceGetPowerUsage": 312000,
                "nvmlDeviceGetTemperature": 41, "nvmlDeviceGetEccMode": (1, 1),
                "nvmlDeviceGetPersistenceMode": 1, "nvmlDeviceGetMigMode": (0, 0),
                "nvmlDeviceGetComputeRunningProcesses": [types.SimpleNamespace(
                    pid=4242, usedGpuMemory=1 << 30), types.SimpleNamespace(
                    pid=os.getpid(), usedGpuMemory=1 << 20)],
                "nvmlDeviceGetGraphicsRunningProcesses": [],
                "nvmlDeviceGetEnforcedPowerLimit": 650000,
                "nvmlSystemGetDriverVersion": b"580.65", "nvmlDeviceGetName": "NVIDIA H100"}.items():
            setattr(self, name, call(name, value))


@pytest.fixture
def fake(monkeypatch):
    def install(**state) -> FakeNvml:
        lib = FakeNvml(**state)
        monkeypatch.setitem(sys.modules, "pynvml", lib)
        monkeypatch.setitem(sys.modules, "cupy", None)  # no device to ask for its bus id
        nvml._library.cache_clear()
        return lib

    yield install
    nvml._library.cache_clear()


def test_a_quiet_gpu_is_not_throttled(fake):
    fake()
    before, after = nvml.sample(), nvml.sample()
    assert before.sm_clock_mhz == 1755 and before.violations == {"power": 0, "thermal": 0}
    assert nvml.throttled(before, after) == []


def test_violation_counters_and_reasons_say_why_clocks_were_held_down(fake):
    lib = fake()
    before = nvml.sample()
    lib.state.update(power=2_500_000, reasons=0x4 | 0x1)  # power cap; idle is no throttle
    assert nvml.throttled(before, nvml.sample()) == ["power limit (2.5 ms held down)",
                                                    "sw power cap"]
    lib.state.update(reasons=0x40)
    assert "hw thermal slowdown" in nvml.throttled(nvml.sample(), nvml.sample())


def test_the_snapshot_for_env_json(fake):
    fake(reasons=0x1)
    snap = nvml.snapshot()
    assert snap["driver"] == "580.65" and snap["name"] == "NVIDIA H100"
    assert (snap["sm_clock_mhz"], snap["max_sm_clock_mhz"], snap["memory_clock_mhz"]) == \
        (1755, 1980, 2619)
    assert snap["power_limit_w"] == 700 and snap["ecc"] is True and snap["mig_mode"] is False
    assert snap["persistence_mode"] is True and snap["throttled_now"] == []
    assert snap["processes"] == [{"pid": 4242, "used_bytes": 1 << 30},
                                 {"pid": os.getpid(), "used_bytes": 1 << 20}]
    assert snap["other_processes"] == [4242]  # this process is not another
    assert (snap["application_sm_clock_mhz"], snap["application_memory_clock_mhz"],
            snap["max_memory_clock_mhz"]) == (1755, 2619, 2619)
    assert snap["enforced_power_limit_w"] == 650 and snap["mig_mode_pending"] is False
    assert snap["temperature_c"] == 41


def test_refused_queries_are_none_not_errors(fake):
    fake(refuse={"nvmlDeviceGetViolationStatus", "nvmlDeviceGetEccMode",
                 "nvmlDeviceGetCurrentClocksEventReasons"})
    sample = nvml.sample()
    assert sample.violations == {"power": None, "thermal": None} and sample.reasons is None
    assert nvml.throttled(sample, sample) == [] and nvml.snapshot()["ecc"] is None


def test_without_pynvml_nothing_is_read(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    nvml._library.cache_clear()
    try:
        assert nvml.sample() is None and nvml.throttled(None, None) == []
        assert "nvidia-ml-py is not installed" in nvml.snapshot()["unavailable"]
        assert nvml.unavailable()
    finally:
        nvml._library.cache_clear()


def test_a_gpu_run_records_the_gpu_at_its_start_and_end(fake, tmp_path):
    """env.json's `load` readings carry the NVML snapshot on a GPU run (its start, in
    `runs.environment`, and its end, in `Run.note_load`), and none on the host."""
    from convbench import runs
    from convbench.core import results
    from convbench.core.runspec import RunSpec
    from convbench.runs.run import load_reading

    fake()
    reading = load_reading("start", "cuda")
    assert reading["when"] == "start" and reading["gpu"]["other_processes"] == [4242]
    assert "gpu" not in load_reading("start", "numpy")
    folder = results.RunFolder.open(tmp_path / "run", {"backend": "cuda", "load": [reading]})
    spec = RunSpec(device="cuda", algos=("cudnn",), passes=("fwd",), layouts=("nchw",),
                   precisions=("fp32",), budget_s=1.0, target_noise=0.02)
    runs.Run(spec, [], folder).note_load("end")
    saved = results.load_run(tmp_path / "run")[1]["load"]
    assert [r["when"] for r in saved] == ["start", "end"]
    assert saved[1]["gpu"]["sm_clock_mhz"] == 1755


def test_a_row_s_share_of_time_held_down_flags_it():
    assert nvml.row_throttled({"power": 0.5}, 10.0) == []  # 5%: the cap reached now and then
    assert nvml.row_throttled({"power": 2.0}, 10.0) == ["power limit (20% of its time held down)"]
    assert nvml.row_throttled({}, 10.0, ["hw slowdown"]) == ["hw slowdown"]
    s0 = nvml.Sample(1980, 0x4, {"power": 0, "thermal": 0})
    s1 = nvml.Sample(1500, 0x4 | 0x40, {"power": 3_000_000, "thermal": None})
    assert nvml.held_down_ms(s0, s1) == {"power": 3.0}
    assert nvml.hard_reasons(s0, s1) == ["hw thermal slowdown"]  # not the sw power cap
