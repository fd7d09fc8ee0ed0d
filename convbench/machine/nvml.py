"""The GPU's clocks, and whether they were held down while a measurement ran (NVML).

The GPU half of contention: a kernel timed while the GPU lowered its clocks (power cap, heat, a
hardware slowdown) is slower than the same kernel on the same GPU a minute later, and its
spread need not show it. NVML (`nvidia-ml-py`, imported as `pynvml`) says why clocks are held
down now (the clock-event reasons) and for how long they have been since the driver loaded (the
power and thermal violation counters). The timer reads both before and after the rounds of each
group of competing cases. A row is flagged `throttled` by the share of its own time held down
(`THROTTLED_SHARE`): a chunk's violation time is spread over the chunk's GPU time, and each row
takes the part that fell on its repetitions (`measure.timing`); a power cap reached now and then
under FP32 load flags no row, one that held a row down for a tenth of its time does. The
hardware's and the thermal slowdowns (`HARD_REASONS`) flag every row of the chunk they are seen
at; the software power cap's bit alone does not (its counter measures it).

`snapshot` is what env.json records of the GPU at the start and end of a run: SM and memory
clocks (current, application, maximum), power limit (set and enforced) and draw, temperature,
ECC, persistence mode, MIG mode (current and pending) and the processes on the GPU, the others
than this one named apart.

Everything is optional: without pynvml, or where NVML refuses a query (a MIG slice, an old
driver), the readings are None and nothing is flagged; env.json says why.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

#: NVML's clock-event reason bits that mean clocks were lowered by a limit, not by choice: the
#: GPU idling (0x1), application clocks (0x2), sync boost (0x10) and the display (0x100) are not
#: throttling a measurement.
THROTTLE_REASONS = {0x4: "sw power cap", 0x8: "hw slowdown", 0x20: "sw thermal slowdown",
                    0x40: "hw thermal slowdown", 0x80: "hw power brake"}
#: The reasons that flag a chunk's rows whatever their share: all but the software power cap,
#: which the power violation counter measures by time.
HARD_REASONS = {bit: name for bit, name in THROTTLE_REASONS.items() if bit != 0x4}
#: The share of a row's own time held down (by a violation counter) that flags it.
THROTTLED_SHARE = 0.1
#: NVML_PERF_POLICY_POWER and NVML_PERF_POLICY_THERMAL: the violation counters read.
_POLICIES = {"power": 0, "thermal": 1}
_CLOCK_SM, _CLOCK_MEM, _TEMPERATURE_GPU = 1, 2, 0


@functools.lru_cache(maxsize=1)
def _library():
    """pynvml, initialised once; or the reason it cannot be used (a str)."""
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001  (NVMLError and its many subclasses)
        return f"NVML did not start: {exc}"
    return pynvml


def unavailable() -> str | None:
    """Why NVML cannot be read here, or None."""
    lib = _library()
    return lib if isinstance(lib, str) else None


def _query(fn, *args):
    """An NVML query's answer, or None where NVML refuses it (not supported, no permission)."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001  (NVMLError_NotSupported, NoPermission, ...)
        return None


def _handle(nv):
    """The NVML handle of CuPy's current device, found by PCI bus id (NVML numbers devices in
    PCI order, CUDA by speed unless CUDA_DEVICE_ORDER says otherwise), else by index 0."""
    bus_id = _bus_id()
    if bus_id:
        handle = _query(nv.nvmlDeviceGetHandleByPciBusId, bus_id)
        if handle is not None:
            return handle
    return _query(nv.nvmlDeviceGetHandleByIndex, 0)


def _bus_id() -> str | None:
    """CuPy's current device's PCI bus id; None without CuPy or a device."""
    try:
        import cupy

        return cupy.cuda.Device().pci_bus_id
    except Exception:  # noqa: BLE001  (no CuPy, no device, no driver)
        return None


def _text(v):
    return v.decode() if isinstance(v, bytes) else v


@dataclass(frozen=True)
class Sample:
    """The GPU at one moment: its SM clock, the clock-event reason bits, and the power and
    thermal violation counters (ns), each None where NVML does not say."""

    sm_clock_mhz: int | None
    reasons: int | None
    violations: dict[str, int | None]


def _reasons(nv, handle) -> int | None:
    for name in ("nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fn = getattr(nv, name, None)
        if fn is not None:
            value = _query(fn, handle)
            if value is not None:
                return int(value)
    return None


def _violation(nv, handle, policy: int) -> int | None:
    status = _query(nv.nvmlDeviceGetViolationStatus, handle, policy)
    return None if status is None else int(status.violationTime)


def sample() -> Sample | None:
    """The current GPU's clock and throttling state; None without NVML."""
    nv = _library()
    if isinstance(nv, str):
        return None
    handle = _handle(nv)
    if handle is None:
        return None
    return Sample(_query(nv.nvmlDeviceGetClockInfo, handle, _CLOCK_SM), _reasons(nv, handle),
                  {k: _violation(nv, handle, p) for k, p in _POLICIES.items()})


def reason_names(bits: int | None) -> list[str]:
    """The throttling reasons among clock-event reason bits."""
    return [name for bit, name in THROTTLE_REASONS.items() if bits and bits & bit]


def throttled(before: Sample | None, after: Sample | None) -> list[str]:
    """Why clocks were held down between two samples: a violation counter that grew (power or
    thermal), or a throttling reason active at either end; [] where nothing says so."""
    if before is None or after is None:
        return []
    why = [f"{k} limit ({(after.violations[k] - before.violations[k]) / 1e6:.3g} ms held down)"
           for k in _POLICIES
           if None not in (before.violations.get(k), after.violations.get(k))
           and after.violations[k] > before.violations[k]]
    return why + [r for r in dict.fromkeys(reason_names(before.reasons)
                                           + reason_names(after.reasons)) if r not in why]


def held_down_ms(before: Sample | None, after: Sample | None) -> dict[str, float]:
    """Per violation counter (power, thermal) that grew between two samples, the ms it grew."""
    if before is None or after is None:
        return {}
    return {k: (after.violations[k] - before.violations[k]) / 1e6 for k in _POLICIES
            if None not in (before.violations.get(k), after.violations.get(k))
            and after.violations[k] > before.violations[k]}


def hard_reasons(before: Sample | None, after: Sample | None) -> list[str]:
    """The `HARD_REASONS` active at either sample."""
    bits = [s.reasons for s in (before, after) if s is not None]
    return [name for bit, name in HARD_REASONS.items() if any(b and b & bit for b in bits)]


def row_throttled(held_ms: dict[str, float], own_ms: float, reasons=()) -> list[str]:
    """Why a row's clocks were held down: each counter's share of its own time `own_ms` that
    reached `THROTTLED_SHARE`, then the hard reasons seen during its chunks; [] else."""
    why = [f"{k} limit ({held / own_ms:.0%} of its time held down)"
           for k, held in held_ms.items() if own_ms > 0 and held / own_ms >= THROTTLED_SHARE]
    return why + [r for r in dict.fromkeys(reasons)]


def snapshot() -> dict | None:
    """env.json's record of the current GPU: clocks, power, temperature, ECC, persistence,
    MIG, other processes; {"unavailable": why} without NVML; None off a GPU."""
    nv = _library()
    if isinstance(nv, str):
        return {"unavailable": nv}
    handle = _handle(nv)
    if handle is None:
        return {"unavailable": "NVML found no device"}
    q = _query
    ecc = q(nv.nvmlDeviceGetEccMode, handle)
    mig = q(nv.nvmlDeviceGetMigMode, handle)
    processes = [*(q(nv.nvmlDeviceGetComputeRunningProcesses, handle) or []),
                 *(q(nv.nvmlDeviceGetGraphicsRunningProcesses, handle) or [])]
    power_limit = q(nv.nvmlDeviceGetPowerManagementLimit, handle)
    power = q(nv.nvmlDeviceGetPowerUsage, handle)
    reasons = _reasons(nv, handle)
    return {
        "driver": _text(q(nv.nvmlSystemGetDriverVersion)),
        "name": _text(q(nv.nvmlDeviceGetName, handle)),
        "sm_clock_mhz": q(nv.nvmlDeviceGetClockInfo, handle, _CLOCK_SM),
        "memory_clock_mhz": q(nv.nvmlDeviceGetClockInfo, handle, _CLOCK_MEM),
        "max_sm_clock_mhz": q(nv.nvmlDeviceGetMaxClockInfo, handle, _CLOCK_SM),
        "max_memory_clock_mhz": q(nv.nvmlDeviceGetMaxClockInfo, handle, _CLOCK_MEM),
        "application_sm_clock_mhz": q(nv.nvmlDeviceGetApplicationsClock, handle, _CLOCK_SM),
        "application_memory_clock_mhz": q(nv.nvmlDeviceGetApplicationsClock, handle,
                                          _CLOCK_MEM),
        "power_limit_w": None if power_limit is None else power_limit / 1e3,
        "enforced_power_limit_w": _watts(q(nv.nvmlDeviceGetEnforcedPowerLimit, handle)),
        "power_w": None if power is None else power / 1e3,
        "temperature_c": q(nv.nvmlDeviceGetTemperature, handle, _TEMPERATURE_GPU),
        "ecc": None if ecc is None else bool(ecc[0]),
        "persistence_mode": None if (pm := q(nv.nvmlDeviceGetPersistenceMode, handle)) is None
        else bool(pm),
        "mig_mode": None if mig is None else bool(mig[0]),
        "mig_mode_pending": None if mig is None else bool(mig[1]),
        "clock_event_reasons": reasons,
        "throttled_now": reason_names(reasons),
        "violations_ns": {k: _violation(nv, handle, p) for k, p in _POLICIES.items()},
        "processes": [{"pid": p.pid, "used_bytes": getattr(p, "usedGpuMemory", None)}
                      for p in processes],
        # what else ran on the GPU (this process is one of `processes`): a shared GPU's
        # times are not this GPU's alone
        "other_processes": sorted({p.pid for p in processes} - {os.getpid()}),
    }


def _watts(milliwatts) -> float | None:
    return None if milliwatts is None else milliwatts / 1e3
