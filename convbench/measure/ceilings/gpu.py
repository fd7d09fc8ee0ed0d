"""The GPU's ceilings, measured now: the fastest fp32 product of cuBLAS (through CuPy and torch,
TF32 off), the theoretical peak at the clock that ran, and the copy bandwidth beyond and within
L2.

The peak is SMs x fp32 lanes x 2 x the SM clock NVML read while the products ran, so a row's
share is against the clock that ran, not the nominal one (docs/pages/design.md §5). The timers,
the clock reader and the device's facts are injectable, so tests run `measure_gpu` with fakes on
a machine without a GPU.
"""

from __future__ import annotations

import os
import statistics
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ...machine import nvml
from ...machine.threads import count as thread_count
from ..envinfo import FP32_LANES
from .record import GPU_PRODUCTS, REPS, Ceilings, Product, library_versions, now

#: The NVML sampling period while a GPU figure is timed.
CLOCK_PERIOD_S = 0.005


@dataclass(frozen=True)
class GpuInfo:
    """What the peak and the copy sizes need of a GPU."""

    name: str
    sm_count: int
    compute_capability: str
    l2_bytes: int
    max_clock_mhz: float | None


#: Times one product on the GPU: its best seconds over `reps` after a warm-up.
GemmTimer = Callable[[Product, int], float]
#: Times copying an array of this many bytes on the GPU: its best seconds over `reps`.
CopyTimer = Callable[[int, int], float]


def sampled(fn: Callable[[], object], clock: Callable[[], float | None],
            period_s: float = CLOCK_PERIOD_S) -> tuple[object, list[float]]:
    """`fn()`'s result and the clock readings taken every `period_s` while it ran (at least
    one): the clock that ran, not the idle clock before or after."""
    readings: list[float] = []
    stop = threading.Event()

    def loop():
        while True:
            value = clock()
            if value is not None:
                readings.append(float(value))
            if stop.wait(period_s):
                return

    sampler = threading.Thread(target=loop, daemon=True)
    sampler.start()
    try:
        result = fn()
    finally:
        stop.set()
        sampler.join()
    return result, readings


def gpu_info() -> GpuInfo:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    clock_khz = props.get("clockRate")  # absent from CUDA 13's properties: NVML's max then
    max_mhz = clock_khz / 1e3 if clock_khz else None
    if max_mhz is None and (snap := nvml.snapshot()) and snap.get("max_sm_clock_mhz"):
        max_mhz = float(snap["max_sm_clock_mhz"])
    return GpuInfo(name, props["multiProcessorCount"], f"{props['major']}{props['minor']}",
                   props["l2CacheSize"], max_mhz)


def _cupy_best(run: Callable[[], object], reps: int) -> float:
    """Best seconds of `run` over `reps` after a warm-up, by CUDA events on CuPy's stream."""
    import cupy

    run()
    start, end, best = cupy.cuda.Event(), cupy.cuda.Event(), float("inf")
    for _ in range(reps):
        start.record()
        run()
        end.record()
        end.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(start, end) * 1e-3)
    return best


def _cupy_gemm(p: Product, reps: int) -> float:
    import cupy

    rng = cupy.random.default_rng(0)
    lead = (p.batch,) if p.batch > 1 else ()
    a = rng.standard_normal((*lead, p.m, p.k), dtype=cupy.float32)
    b = rng.standard_normal((*lead, p.k, p.n), dtype=cupy.float32)
    c = cupy.empty((*lead, p.m, p.n), dtype=cupy.float32)
    return _cupy_best(lambda: cupy.matmul(a, b, out=c), reps)


def _torch_gemm_cuda(p: Product, reps: int) -> float:
    import torch

    lead = (p.batch,) if p.batch > 1 else ()
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn((*lead, p.m, p.k), device="cuda", generator=g)
    b = torch.randn((*lead, p.k, p.n), device="cuda", generator=g)
    c = torch.empty((*lead, p.m, p.n), device="cuda")
    was = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # FP32 means FP32 (docs/pages/design.md §5)
    try:
        torch.matmul(a, b, out=c)
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        best = float("inf")
        for _ in range(reps):
            start.record()
            torch.matmul(a, b, out=c)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) * 1e-3)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = was
    return best


def _cupy_copy(nbytes: int, reps: int) -> float:
    import cupy

    src = cupy.ones(nbytes // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    return _cupy_best(lambda: cupy.copyto(dst, src), reps)


def gpu_gemm_timers() -> dict[str, GemmTimer]:
    """The GPU GEMM libraries here: cuBLAS through CuPy (unless CUPY_TF32 turns TF32 on) and
    through torch (TF32 turned off while timed)."""
    out: dict[str, GemmTimer] = {}
    if os.environ.get("CUPY_TF32", "0") == "0":
        out["cupy"] = _cupy_gemm
    try:
        import torch

        if torch.cuda.is_available():
            out["torch"] = _torch_gemm_cuda
    except ImportError:
        pass
    return out


def _nvml_clock() -> float | None:
    s = nvml.sample()
    return None if s is None else s.sm_clock_mhz


def measure_gpu(threads: int | None = None, *, scale: float = 1.0, reps: int = REPS,
                products: Sequence[Product] = GPU_PRODUCTS,
                gemm_timers: Mapping[str, GemmTimer] | None = None,
                copy_timer: CopyTimer | None = None,
                clock: Callable[[], float | None] | None = None,
                info: GpuInfo | None = None) -> Ceilings:
    """The current GPU's ceilings, measured now. The timers, the clock reader (MHz, None where
    unreadable) and the device's facts are injectable: tests run this with fakes."""
    info = info or gpu_info()
    timers = dict(gemm_timers if gemm_timers is not None else gpu_gemm_timers())
    copy_timer = copy_timer or _cupy_copy
    clock = clock or _nvml_clock
    scaled = [p.scaled(scale) for p in products]
    rates: dict[str, dict[str, float]] = {name: {} for name in timers}
    clocks: list[float] = []
    for p in scaled:
        for name, timer in timers.items():
            seconds, readings = sampled(lambda timer=timer, p=p: timer(p, reps), clock)
            rates[name][p.name] = p.flops / seconds / 1e9
            clocks += readings
    backend, shape = max(((b, s) for b, by in rates.items() for s in by),
                         key=lambda bs: rates[bs[0]][bs[1]])
    clock_mhz = statistics.median(clocks) if clocks else None
    lanes = FP32_LANES.get(info.compute_capability)
    peak_clock = clock_mhz or info.max_clock_mhz
    if lanes and peak_clock:
        peak = info.sm_count * lanes * 2 * peak_clock / 1e3
        clock_note = ("the median NVML SM clock sampled while the products ran" if clock_mhz
                      else "the maximum SM clock (NVML could not be read while timing)")
        peak_method = (f"{info.sm_count} SMs x {lanes} fp32 lanes (sm_{info.compute_capability})"
                       f" x 2 flops x {peak_clock:.0f} MHz ({clock_note})")
    else:
        peak, peak_method = None, (f"fp32 lanes of sm_{info.compute_capability} unknown"
                                   if not lanes else "SM clock unreadable")
    dram_bytes = max(4 * info.l2_bytes, 256 << 20) * scale
    dram_bytes = max(1 << 20, int(dram_bytes) >> 20 << 20)
    cache_bytes = max(1 << 16, info.l2_bytes // 4)
    bandwidth = {"dram": {"cupy copy": 2 * dram_bytes / copy_timer(dram_bytes, reps) / 1e9},
                 "cache": {"cupy copy": 2 * cache_bytes / copy_timer(cache_bytes, reps) / 1e9}}
    methods = {
        "gflops": (f"best of {reps} after a warm-up, CUDA events, TF32 off; products: "
                   + "; ".join(f"{p.name} {p.describe()}" for p in scaled)),
        "backends": "; ".join(f"{b}: cuBLAS via {b}" for b in timers),
        "attainable": f"{backend} on {shape}",
        "bandwidth": ("cupy.copyto (2 arrays counted), best of "
                      f"{reps}; beyond cache: {dram_bytes >> 20} MiB arrays (>= 4x L2 of "
                      f"{info.l2_bytes >> 20} MiB); within: {cache_bytes >> 10} KiB "
                      "(a quarter of L2)"),
        "clock": f"{len(clocks)} NVML readings of the SM clock during the timed products",
    }
    if scale != 1.0:
        methods["scale"] = f"sizes scaled by {scale:g}: a test's figures, not the machine's"
    return Ceilings(
        device="cuda", model=info.name, threads=threads or thread_count(),
        gflops_attainable=rates[backend][shape], gemm_backend=backend, gflops_by_backend=rates,
        gflops_peak_theoretical=peak, peak_method=peak_method,
        bandwidth_gbs_dram=bandwidth["dram"]["cupy copy"],
        bandwidth_gbs_cache=bandwidth["cache"]["cupy copy"], bandwidth_by_kernel=bandwidth,
        clock_mhz=clock_mhz, openblas_coretype=None, openblas_faster_coretype=None,
        methods=methods, measured_at=now(), versions=versions())



def versions() -> dict[str, str | None]:
    """The library versions a GPU ceiling depends on (part of the cache key): NumPy's and
    torch's, CuPy's, the CUDA runtime's and the driver's (cupy None without CuPy or a driver)."""
    out = library_versions()
    try:
        import cupy

        out["cupy"] = cupy.__version__
        out["cuda_runtime"] = str(cupy.cuda.runtime.runtimeGetVersion())
        out["driver"] = str(cupy.cuda.runtime.driverGetVersion())
    except Exception:  # noqa: BLE001  (no CuPy, no driver)
        out["cupy"] = None
    return out
