"""A device's ceilings: the fastest fp32 product it attains, its theoretical peak, its memory
bandwidth beyond and within cache, and on a GPU the clock that ran; measured once per machine
and library versions, and cached.

A row's rate means something only against what the device can do, and a row faster than the
device can go is a timing bug, never a win (docs/pages/design.md §5). So:

- **Attainable compute** is the best SGEMM rate of the GEMM libraries here (CPU: `torch.matmul`
  on MKL/oneDNN and NumPy's `@` on OpenBLAS; GPU: cuBLAS through CuPy and torch, TF32 off), on
  a square product and on the shapes our algorithms' products have, with the run's thread
  count, best of a few repetitions after a warm-up: a ceiling is the fastest the library gets,
  not its typical time. The libraries are timed interleaved in rounds (`timing.rounds_cpu`), so
  the per-shape winner (`fastest_gemm`) is not an artefact of drift.
- **Theoretical peak** is cores x SIMD fp32 lanes x FMA units x 2 x clock, each factor read
  where the machine says it (/proc/cpuinfo, sysfs; the SM count and NVML's SM clock on a GPU)
  and said to be an assumption where not (the FMA-unit count, by CPU family). On a GPU the clock
  is the one NVML read while the products ran, so the share is against the clock that ran.
- **Bandwidth** is STREAM's copy and triad (bytes counted as STREAM counts them: 2 and 3 arrays,
  write-allocate not counted), beyond the last-level cache and within half of L2.

`measure` caches by CPU or GPU model, cores, threads and library versions (the OpenBLAS core
type included), so a machine measures once and a changed library measures again; a figure
timed while other work took the cores is reported as contended and not cached. The guard
`implausible` and the roofline helpers (`roofline_point`, `bound`) read a `Ceilings`.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np

from ..core.fmt import fmt_mib
from ..machine import nvml
from ..machine.threads import available_cores
from ..machine.threads import count as thread_count
from . import timing
from .envinfo import FP32_LANES

#: The record's schema: a cached or stored `Ceilings` of another schema is refused (measured
#: again by `measure`).
SCHEMA = 1
#: How far above its ceiling (times its arithmetic reduction) a row may be before it is not a
#: result (`implausible`). The attainable is a library SGEMM at 80-95% of the hardware and the
#: theoretical peak assumes a clock and an FMA count; a real row beats them by what its shape
#: or a turbo bin favours (a few to ~15%), while a missed synchronisation or a timer around the
#: wrong call is 2x to 1000x out: 1.25 sits between.
MARGIN = 1.25
#: All the DRAM bandwidth arrays together at most: beyond any one VM's share of a real L3, and
#: within the few seconds `measure` may take (a VM can report its host's whole L3, 480 MiB,
#: as its own; four times that in three arrays is more than a probe should allocate).
DRAM_CAP_BYTES = 512 << 20
#: Bytes a within-cache call moves at least (the kernel repeated to amortise the call's cost).
CACHE_CALL_BYTES = 64 << 20
#: Timed repetitions per figure, after one warm-up call.
REPS = 3
#: The NVML sampling period while a GPU figure is timed.
CLOCK_PERIOD_S = 0.005
#: OpenBLAS core types whose SGEMM kernel is AVX-512.
AVX512_CORETYPES = ("skylakex", "cooperlake", "sapphirerapids")


@dataclass(frozen=True)
class Product:
    """A (batched) fp32 product `batch x (m x k) @ (k x n)` a ceiling is measured on."""

    name: str
    batch: int
    m: int
    k: int
    n: int

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.k * self.n

    def scaled(self, scale: float) -> Product:
        """The same product with m, k, n times `scale` (tests measure small ones)."""
        return replace(self, **{d: max(1, round(getattr(self, d) * scale)) for d in "mkn"})

    def describe(self) -> str:
        batch = f"{self.batch} x " if self.batch > 1 else ""
        return f"{batch}({self.m}x{self.k})@({self.k}x{self.n})"


#: A square product (~0.1-0.3 s on a few cores) and two of our algorithms' products at the CPU's
#: default batch 8 (AlexNet conv3-like: K = 256, C·R·S = 2304, N·P·Q = 1352): an im2col GEMM
#: and the 36 batched products of Winograd F(4x4, 3x3).
CPU_PRODUCTS = (Product("square", 1, 2048, 2048, 2048), Product("im2col", 1, 256, 2304, 1352),
                Product("winograd", 36, 256, 384, 1352))
#: The same on a GPU: a square large enough to fill it, the products at batch 128.
GPU_PRODUCTS = (Product("square", 1, 8192, 8192, 8192), Product("im2col", 1, 256, 2304, 21632),
                Product("winograd", 36, 256, 384, 21632))


@dataclass(frozen=True)
class Ceilings:
    """A device's ceilings (see the module's docstring); rates in GFLOP/s, bandwidths in GB/s
    (1e9 bytes), `methods` saying how each figure was obtained. env.json stores `to_dict()`."""

    device: str
    model: str
    threads: int
    gflops_attainable: float
    gemm_backend: str
    gflops_by_backend: dict[str, dict[str, float]]
    gflops_peak_theoretical: float | None
    peak_method: str
    bandwidth_gbs_dram: float | None
    bandwidth_gbs_cache: float | None
    bandwidth_by_kernel: dict[str, dict[str, float]]
    clock_mhz: float | None
    openblas_coretype: str | None
    openblas_faster_coretype: str | None
    methods: dict[str, str]
    measured_at: str
    versions: dict[str, str | None]
    schema: int = SCHEMA

    @property
    def contended(self) -> bool:
        """Whether other work took the cores while some figure was timed (`methods` names
        which): those figures are low, and `measure` does not cache them."""
        return "contended" in self.methods

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> Ceilings:
        """The record back; ValueError for another schema or a record missing a field."""
        if d.get("schema") != SCHEMA:
            raise ValueError(f"ceilings of schema {d.get('schema')!r}; this is schema {SCHEMA}")
        missing = [f.name for f in fields(cls) if f.name not in d]
        if missing:
            raise ValueError(f"ceilings record lacks {', '.join(missing)}")
        return cls(**{f.name: d[f.name] for f in fields(cls)})

    def __str__(self) -> str:
        def rate(x):
            return "n/a" if x is None else f"{x:.4g}"

        lines = [f"{self.device} ({self.model}), {self.threads} threads, {self.measured_at}",
                 (f"  attainable fp32: {rate(self.gflops_attainable)} GFLOP/s "
                  f"({self.gemm_backend})"),
                 *(f"    {b}: " + ", ".join(f"{s} {rate(g)}" for s, g in by.items())
                   for b, by in self.gflops_by_backend.items()),
                 (f"  theoretical peak: {rate(self.gflops_peak_theoretical)} GFLOP/s "
                  f"({self.peak_method})"),
                 (f"  bandwidth: {rate(self.bandwidth_gbs_dram)} GB/s beyond cache, "
                  f"{rate(self.bandwidth_gbs_cache)} GB/s within"),
                 *(f"    {level}: " + ", ".join(f"{k} {rate(v)}" for k, v in by.items())
                   for level, by in self.bandwidth_by_kernel.items())]
        if self.clock_mhz is not None:
            lines.append(f"  SM clock while timed: {self.clock_mhz:.0f} MHz")
        if self.openblas_coretype:
            faster = (f"; {self.openblas_faster_coretype} may be faster "
                      f"(probe_openblas_coretype)" if self.openblas_faster_coretype else "")
            lines.append(f"  OpenBLAS core type: {self.openblas_coretype}{faster}")
        if self.contended:
            lines.append(f"  contended, so low: {self.methods['contended']}")
        return "\n".join(lines)


# --- what the machine says ---------------------------------------------------------------------
def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def parse_cpuinfo(text: str) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo text (x86's spelling)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if out:
                break
            continue
        key, _, value = line.partition(":")
        out.setdefault(key.strip(), value.strip())
    return out


def cpu_model(info: Mapping[str, str] | None = None) -> str:
    info = parse_cpuinfo(_read("/proc/cpuinfo") or "") if info is None else info
    return info.get("model name") or platform.processor() or platform.machine()


def cache_sizes(root: str | Path = "/sys/devices/system/cpu/cpu0/cache") -> dict[int, int]:
    """Bytes of cpu0's data (or unified) cache per level, from sysfs; {} where unreadable."""
    sizes: dict[int, int] = {}
    for index in sorted(Path(root).glob("index*")):
        level, kind, size = (_read(index / f) for f in ("level", "type", "size"))
        if None in (level, kind, size) or kind.strip() == "Instruction":
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", size.strip())
        if m:
            sizes[int(level)] = int(m[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[m[2]]
    return sizes


def _simd(info: Mapping[str, str]) -> tuple[int, int, str] | None:
    """(fp32 lanes per vector, FMA units per core, how the units were decided) from a CPU's
    vendor, family and flags; None where the flags name no x86 vector unit. The unit count is
    not in /proc/cpuinfo: it is an assumption by CPU family, and said so."""
    flags = set(info.get("flags", "").split())
    vendor, name = info.get("vendor_id", ""), info.get("model name", "")
    family = int(info.get("cpu family", "0") or 0)
    model = int(info.get("model", "0") or 0)
    if vendor == "AuthenticAMD":
        if "avx512f" in flags and family >= 0x1A:
            return 16, 2, ("2 FMA units of 512 bits assumed (Zen 5 desktop and server; "
                           "mobile Zen 5 has 256-bit units and half this)")
        if "avx512f" in flags:
            return 16, 1, "Zen 4 runs 512-bit FMAs as two 256-bit halves: 1 unit assumed"
        if "fma" in flags and family == 0x17 and model < 0x30:
            return 8, 1, "Zen/Zen+ split 256-bit FMAs into 128-bit halves: 1 unit assumed"
        if "fma" in flags:
            return 8, 2, "2 FMA units of 256 bits assumed (Zen 2/3)"
    elif "avx512f" in flags:
        if "Xeon" in name:
            return 16, 2, ("2 AVX-512 FMA units assumed (Xeon Gold/Platinum and later; some "
                           "Xeon Silver/Bronze have 1)")
        return 16, 1, "1 AVX-512 FMA unit assumed (client Intel parts fuse ports 0 and 1)"
    elif "fma" in flags and "avx2" in flags:
        return 8, 2, "2 FMA units of 256 bits assumed (Intel since Haswell)"
    if "avx" in flags:
        return 8, 1, "no FMA: 1 add and 1 multiply per cycle assumed, counted as 1 unit"
    if "sse" in flags:
        return 4, 1, "SSE only: 1 add and 1 multiply per cycle assumed, counted as 1 unit"
    return None


def cpu_peak(cpuinfo: str, cores: int, max_freq_khz: int | None = None) -> tuple[float | None, str]:
    """The fp32 peak (GFLOP/s) of `cores` cores: lanes x FMA units x 2 x clock per core, and how
    it was read. The clock is sysfs's `cpuinfo_max_freq` (`max_freq_khz`) where readable, else
    /proc/cpuinfo's `cpu MHz` (the clock when read: on a VM the host's nominal one). (None, why)
    where the vector unit or the clock is not known."""
    info = parse_cpuinfo(cpuinfo)
    simd = _simd(info)
    if simd is None:
        return None, "no x86 SIMD flags in /proc/cpuinfo: peak unknown"
    lanes, units, units_note = simd
    if max_freq_khz:
        mhz, clock_note = max_freq_khz / 1e3, "cpufreq cpuinfo_max_freq"
    elif info.get("cpu MHz"):
        mhz = float(info["cpu MHz"])
        clock_note = "/proc/cpuinfo 'cpu MHz' (the clock when read; no cpufreq here)"
    else:
        return None, "no clock in sysfs or /proc/cpuinfo: peak unknown"
    isa = "AVX-512" if lanes == 16 else "AVX/AVX2" if lanes == 8 else "SSE"
    gflops = cores * lanes * units * 2 * mhz / 1e3
    return gflops, (f"{cores} cores x {lanes} fp32 lanes ({isa}) x {units} FMA units x 2 flops x "
                    f"{mhz:.0f} MHz ({clock_note}); {units_note}; AVX-512 clock offsets "
                    f"not applied")


def _physical_cores(info: Mapping[str, str]) -> int:
    """The cores this process may run on, counting a core's hyperthreads once."""
    try:
        per_core = max(1, int(info["siblings"]) // int(info["cpu cores"]))
    except (KeyError, ValueError, ZeroDivisionError):
        per_core = 1
    return max(1, available_cores() // per_core)


def _max_freq_khz() -> int | None:
    text = _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    return int(text) if text and text.strip().isdigit() else None


def numpy_blas() -> dict:
    """NumPy's BLAS pool as threadpoolctl reports it (internal_api, version, architecture: the
    core type OpenBLAS chose, threading layer); {} without threadpoolctl."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return {}
    pools = sorted((p for p in threadpool_info() if p.get("user_api") == "blas"),
                   key=lambda p: "numpy" not in p.get("filepath", ""))
    if not pools:
        return {}
    return {k: pools[0].get(k) for k in ("internal_api", "version", "architecture",
                                        "threading_layer")}


def faster_coretype(architecture: str | None, flags: set[str]) -> str | None:
    """An OpenBLAS core type with AVX-512 kernels the CPU's flags allow, where OpenBLAS chose
    one without (an AVX-512 CPU it did not recognise, or OPENBLAS_CORETYPE set to a safe one);
    None where it already runs AVX-512 or the CPU has none. Unmeasured:
    `probe_openblas_coretype` measures it."""
    if not architecture or "avx512f" not in flags:
        return None
    if architecture.lower() in AVX512_CORETYPES:
        return None
    return "Cooperlake" if "avx512_bf16" in flags else "SkylakeX"


def coretype_candidates(flags: set[str]) -> list[str]:
    """The OpenBLAS core types worth probing on a CPU with these flags."""
    out = ["Haswell"] if "avx2" in flags else []
    if "avx512f" in flags:
        out.append("SkylakeX")
    if "avx512_bf16" in flags:
        out.append("Cooperlake")
    if {"amx_tile", "avx512_fp16"} <= flags:
        out.append("SapphireRapids")
    return out


def _torch_blas() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    m = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return m[1] if m else None


def _versions(device: str) -> dict[str, str | None]:
    """The library versions a ceiling depends on (part of the cache key)."""
    out: dict[str, str | None] = {"numpy": np.__version__}
    try:
        import torch

        out["torch"] = torch.__version__
    except ImportError:
        out["torch"] = None
    if device == "cpu":
        blas = numpy_blas()
        out["torch_blas"] = _torch_blas()
        out["openblas"] = blas.get("version")
        out["openblas_coretype"] = blas.get("architecture")
    else:
        try:
            import cupy

            out["cupy"] = cupy.__version__
            out["cuda_runtime"] = str(cupy.cuda.runtime.runtimeGetVersion())
            out["driver"] = str(cupy.cuda.runtime.driverGetVersion())
        except Exception:  # noqa: BLE001  (no CuPy, no driver)
            out["cupy"] = None
    return out


# --- the CPU -----------------------------------------------------------------------------------
@contextmanager
def _thread_limit(n: int):
    """`n` threads in every BLAS/OpenMP pool and torch's, restored after: the run's policy
    (`threads.use`) for the measurement, without changing the process's own."""
    from threadpoolctl import threadpool_limits

    try:
        import torch
    except ImportError:
        torch = None
    before = torch.get_num_threads() if torch else None
    with threadpool_limits(limits=n):
        if torch:
            torch.set_num_threads(n)
        try:
            yield
        finally:
            if torch:
                torch.set_num_threads(before)


def _operands(p: Product, rng: np.random.Generator):
    lead = (p.batch,) if p.batch > 1 else ()
    a = rng.standard_normal((*lead, p.m, p.k), dtype=np.float32)
    b = rng.standard_normal((*lead, p.k, p.n), dtype=np.float32)
    return a, b, np.empty((*lead, p.m, p.n), dtype=np.float32)


def _numpy_gemm(p: Product) -> Callable[[], object]:
    a, b, c = _operands(p, np.random.default_rng(0))
    return lambda: np.matmul(a, b, out=c)


def _torch_gemm(p: Product) -> Callable[[], object]:
    import torch

    a, b, c = (torch.from_numpy(x) for x in _operands(p, np.random.default_rng(0)))
    return lambda: torch.matmul(a, b, out=c)


def cpu_gemm_backends() -> dict[str, Callable[[Product], Callable[[], object]]]:
    """The CPU GEMM libraries here: name -> a maker of a call computing a product."""
    out = {"numpy": _numpy_gemm}
    try:
        import torch  # noqa: F401

        out = {"torch": _torch_gemm, **out}
    except ImportError:
        pass
    return out


def _best_seconds(calls: Sequence[Callable[[], object]], reps: int,
                  starved: list[bool] | None = None) -> list[float]:
    """Each call's best time (s) over `reps` interleaved rounds after one warm-up call;
    `starved` gets, per call, whether its repetitions were contended (`Measurement.contended`:
    the machine gave the process less than its cores, so the figure is low)."""
    timed = timing.rounds_cpu([timing.Contender.call(c) for c in calls], 0.0, target=0.0,
                              max_reps=reps, min_reps=reps)
    if starved is not None:
        starved += [t.total.contended for t in timed]
    return [t.total.min * 1e-3 for t in timed]


def gemm_rates(products: Sequence[Product], threads: int | None = None, reps: int = REPS,
               starved: list[str] | None = None) -> dict[str, dict[str, float]]:
    """GFLOP/s per CPU GEMM library per product, the libraries interleaved per product;
    `starved` gets the figures whose repetitions were contended."""
    backends = cpu_gemm_backends()
    out: dict[str, dict[str, float]] = {name: {} for name in backends}
    with _thread_limit(threads or thread_count()):
        for p in products:
            calls, flags = [make(p) for make in backends.values()], []
            for name, s, flag in zip(backends, _best_seconds(calls, reps, flags), flags):
                out[name][p.name] = p.flops / s / 1e9
                if flag and starved is not None:
                    starved.append(f"{name} {p.name}")
    return out


def _stream_kernels(n: int) -> dict[str, tuple[Callable[[], object], int]]:
    """STREAM's copy (a = b) and triad (a = b + s*c) on float32 arrays of `n` elements, with
    NumPy and torch: name -> (call, bytes counted)."""
    a, b, c = np.empty(n, np.float32), np.full(n, 1.0, np.float32), np.full(n, 2.0, np.float32)
    s = np.float32(3.0)

    def np_triad():
        np.multiply(c, s, out=a)
        np.add(a, b, out=a)

    out = {"numpy copy": (lambda: np.copyto(a, b), 2 * a.nbytes),
           "numpy triad": (np_triad, 3 * a.nbytes)}
    try:
        import torch
    except ImportError:
        return out
    ta, tb, tc = (torch.from_numpy(x) for x in (a, b, c))
    out["torch copy"] = (lambda: ta.copy_(tb), 2 * a.nbytes)
    out["torch triad"] = (lambda: torch.add(tb, tc, alpha=3.0, out=ta), 3 * a.nbytes)
    return out


def stream(array_bytes: int, threads: int | None = None, reps: int = REPS,
           starved: list[str] | None = None) -> dict[str, float]:
    """GB/s of each STREAM kernel on arrays of `array_bytes` each (`_stream_kernels`), each call
    repeated to move at least `CACHE_CALL_BYTES`, so small in-cache arrays are not timed as the
    cost of a Python call; `starved` gets the kernels whose repetitions were contended."""
    kernels = _stream_kernels(max(1024, array_bytes // 4))
    calls, moved = [], []
    for fn, nbytes in kernels.values():
        inner = max(1, CACHE_CALL_BYTES // nbytes)
        calls.append(fn if inner == 1 else (lambda fn=fn, inner=inner: [fn() for _ in
                                                                          range(inner)]))
        moved.append(nbytes * inner)
    flags: list[bool] = []
    with _thread_limit(threads or thread_count()):
        seconds = _best_seconds(calls, reps, flags)
    if starved is not None:
        starved += [f"{name} ({fmt_mib(array_bytes)} MiB arrays)"
                    for name, flag in zip(kernels, flags) if flag]
    return {name: b / s / 1e9 for name, b, s in zip(kernels, moved, seconds)}


def _dram_array_bytes(llc: int | None, scale: float) -> tuple[int, str]:
    """Bytes per STREAM array beyond the LLC: 4x the LLC, three arrays within `DRAM_CAP_BYTES`
    and a quarter of the memory available; and what bounded it."""
    want = 4 * llc if llc else DRAM_CAP_BYTES
    cap = DRAM_CAP_BYTES // 3
    meminfo = _read("/proc/meminfo") or ""
    if m := re.search(r"MemAvailable:\s+(\d+) kB", meminfo):
        cap = min(cap, int(m[1]) * 1024 // 4 // 3)
    size = int(min(want, cap) * scale) >> 20 << 20 or 1 << 20
    llc_note = f"LLC {llc >> 20} MiB" if llc else "LLC size unreadable"
    capped = f", capped at {DRAM_CAP_BYTES >> 20} MiB for all three arrays" if size < want else ""
    note = f"arrays of {size >> 20} MiB each ({llc_note}; 4x the LLC wanted{capped})"
    if llc and size < llc:
        note += "; smaller than the LLC reported, so part may be cache hits (a VM may report " \
                "its host's LLC)"
    return size, note


def measure_cpu(threads: int | None = None, *, scale: float = 1.0, reps: int = REPS,
                products: Sequence[Product] = CPU_PRODUCTS) -> Ceilings:
    """The CPU's ceilings, measured now (a few seconds at `scale` 1; tests use less)."""
    n = threads or thread_count()
    text = _read("/proc/cpuinfo") or ""
    info = parse_cpuinfo(text)
    flags = set(info.get("flags", "").split())
    scaled = [p.scaled(scale) for p in products]
    starved: list[str] = []
    rates = gemm_rates(scaled, n, reps, starved)
    backend, shape = max(((b, s) for b, by in rates.items() for s in by),
                         key=lambda bs: rates[bs[0]][bs[1]])
    cores = min(n, _physical_cores(info))
    peak, peak_method = cpu_peak(text, cores, _max_freq_khz())
    caches = cache_sizes()
    llc = caches[max(caches)] if caches else None
    dram_bytes, dram_note = _dram_array_bytes(llc, scale)
    dram = stream(dram_bytes, n, reps, starved)
    l2 = caches.get(2)
    cache = stream(l2 // 2 // 3, n, reps, starved) if l2 else {}
    blas = numpy_blas()
    torch_blas = _torch_blas()
    methods = {
        "gflops": (f"best of {reps} after a warm-up, libraries interleaved, {n} threads "
                   f"(threadpoolctl limits and torch.set_num_threads); products: "
                   + "; ".join(f"{p.name} {p.describe()}" for p in scaled)),
        "backends": "; ".join(
            [f"torch: torch.matmul (BLAS_INFO={torch_blas})"] * ("torch" in rates)
            + [(f"numpy: numpy @ ({blas.get('internal_api')} {blas.get('version')}, core "
                f"type {blas.get('architecture')}, {blas.get('threading_layer')})")]),
        "attainable": f"{backend} on {shape}",
        "bandwidth": ("STREAM copy a = b (2 arrays counted) and triad a = b + s*c (3 arrays "
                      "counted), write-allocate not counted; numpy's triad is two in-place "
                      "passes (multiply, then add), so it moves 5 arrays and its figure "
                      "understates; torch's is one fused pass (torch.add alpha) on torch's "
                      f"threads, numpy's one thread; best of {reps}"),
        "bandwidth_dram": dram_note,
        "bandwidth_cache": (f"arrays of {l2 // 2 // 3 >> 10} KiB each (three within half of "
                            f"L2 = {l2 >> 10} KiB), each call repeated to move "
                            f"{CACHE_CALL_BYTES >> 20} MiB" if l2 else "L2 size unreadable"),
    }
    if starved:
        methods["contended"] = ("the machine gave these less than their cores (other work "
                                "ran), so they are low: " + "; ".join(starved)
                                + "; measure(refresh=True) on a quiet machine")
    if scale != 1.0:
        methods["scale"] = f"sizes scaled by {scale:g}: a test's figures, not the machine's"
    return Ceilings(
        device="cpu", model=cpu_model(info), threads=n,
        gflops_attainable=rates[backend][shape], gemm_backend=backend,
        gflops_by_backend=rates, gflops_peak_theoretical=peak, peak_method=peak_method,
        bandwidth_gbs_dram=max(dram.values()), bandwidth_gbs_cache=max(cache.values(),
                                                                      default=None),
        bandwidth_by_kernel={"dram": dram, **({"cache": cache} if cache else {})},
        clock_mhz=None, openblas_coretype=blas.get("architecture"),
        openblas_faster_coretype=faster_coretype(blas.get("architecture"), flags),
        methods=methods, measured_at=_now(), versions=_versions("cpu"))


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# --- the OpenBLAS core type --------------------------------------------------------------------
_PROBE = r"""
import json, sys, time
import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits
n, threads, reps = map(int, sys.argv[1:4])
pools = sorted((p for p in threadpool_info() if p.get("user_api") == "blas"),
               key=lambda p: "numpy" not in p.get("filepath", ""))
rng = np.random.default_rng(0)
a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
c = np.empty_like(a)
with threadpool_limits(limits=threads, user_api="blas"):
    np.matmul(a, b, out=c)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        np.matmul(a, b, out=c)
        best = min(best, time.perf_counter() - t)
print(json.dumps({"architecture": pools[0].get("architecture") if pools else None,
                  "seconds": best}))
"""


def probe_openblas_coretype(candidates: Sequence[str] | None = None, threads: int | None = None,
                            n: int = 2048, reps: int = REPS, timeout_s: float = 60.0) -> dict:
    """NumPy's n^3 SGEMM rate under each OpenBLAS core type in `candidates` (default: those the
    CPU's flags allow, `coretype_candidates`), each in a fresh interpreter with
    OPENBLAS_CORETYPE set (OpenBLAS reads it once, when it loads); threadpoolctl in the child
    says whether the core type took. This process's environment is left as it is: a core type
    that crashes this OpenBLAS (why a machine may pin OPENBLAS_CORETYPE) crashes a child only.

    Returns {"current", "n", "threads", "results": {core type: {"gflops", "reported", "took"}
    or {"error"}}, "fastest": the fastest core type that took (None if none did)}."""
    flags = set(parse_cpuinfo(_read("/proc/cpuinfo") or "").get("flags", "").split())
    candidates = list(candidates) if candidates is not None else coretype_candidates(flags)
    threads = threads or thread_count()
    results: dict[str, dict] = {}
    for coretype in candidates:
        env = {**os.environ, "OPENBLAS_CORETYPE": coretype}
        try:
            done = subprocess.run([sys.executable, "-c", _PROBE, str(n), str(threads), str(reps)],
                                  env=env, capture_output=True, text=True, timeout=timeout_s,
                                  check=False)
        except subprocess.TimeoutExpired:
            results[coretype] = {"error": f"no answer within {timeout_s:g} s"}
            continue
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or [""])[-1]
            results[coretype] = {"error": f"exit status {done.returncode}: {tail}"}
            continue
        got = json.loads(done.stdout.strip().splitlines()[-1])
        reported = got["architecture"]
        results[coretype] = {"gflops": 2 * n ** 3 / got["seconds"] / 1e9, "reported": reported,
                             "took": (reported or "").lower() == coretype.lower()}
    took = {c: r["gflops"] for c, r in results.items() if r.get("took")}
    return {"current": numpy_blas().get("architecture"), "n": n, "threads": threads,
            "results": results, "fastest": max(took, key=took.get) if took else None}


# --- the GPU -----------------------------------------------------------------------------------
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


def _gpu_info() -> GpuInfo:
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
    info = info or _gpu_info()
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
        methods=methods, measured_at=_now(), versions=_versions("cuda"))


# --- measured once, cached ---------------------------------------------------------------------
def cache_dir() -> Path:
    """$CONVBENCH_CACHE_DIR, else $XDG_CACHE_HOME/convbench, else ~/.cache/convbench."""
    if os.environ.get("CONVBENCH_CACHE_DIR"):
        return Path(os.environ["CONVBENCH_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "convbench"


def _device(device: str) -> str:
    """`cpu` for the host's names (`cpu`, `numpy`, `emu`: emulated kernels run on the host)."""
    if device in ("cpu", "numpy", "emu"):
        return "cpu"
    if device.startswith("cuda"):
        return "cuda"
    raise ValueError(f"ceilings of device {device!r}: valid: cpu, cuda")


def cache_key(device: str, threads: int, scale: float = 1.0) -> dict:
    """What a cached ceiling must match: the schema, the device's model and cores, the thread
    count, the sizes' scale and the library versions (`_versions`)."""
    device = _device(device)
    model = cpu_model() if device == "cpu" else _gpu_info().name
    return {"schema": SCHEMA, "device": device, "model": model, "cores": available_cores(),
            "threads": threads, "scale": scale, **_versions(device)}


def cache_path(key: Mapping) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"ceilings-{key['device']}-{digest}.json"


def _load(path: Path, key: Mapping) -> Ceilings | None:
    try:
        record = json.loads(path.read_text())
        if record.get("key") != dict(key):
            return None
        return Ceilings.from_dict(record["ceilings"])
    except (OSError, ValueError, KeyError, TypeError):  # absent, torn, another schema
        return None


def _store(path: Path, key: Mapping, ceilings: Ceilings) -> None:
    """Written whole or not at all (a temporary file renamed), so a reader never sees half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": dict(key), "ceilings": ceilings.to_dict()}, indent=1))
    os.replace(tmp, path)


def measure(device: str = "cpu", threads: int | None = None, *, refresh: bool = False,
            scale: float = 1.0) -> Ceilings:
    """The device's ceilings for `threads` threads (None: `threads.count()`): from the cache
    where one matches `cache_key`, else measured (a few seconds) and cached; `refresh`
    measures again. A measurement that other work contended is returned but not cached: a
    ceiling measured low would stand for the machine's until refreshed."""
    device = _device(device)
    threads = threads or thread_count()
    key = cache_key(device, threads, scale)
    path = cache_path(key)
    if not refresh and (cached := _load(path, key)) is not None:
        return cached
    if device == "cpu":
        ceilings = measure_cpu(threads, scale=scale)
    else:
        ceilings = measure_gpu(threads, scale=scale)
    if not ceilings.contended:
        _store(path, key, ceilings)
    return ceilings


def fastest_gemm(shape: str | Product = "square", ceilings: Ceilings | None = None,
                 threads: int | None = None) -> tuple[str, float]:
    """The fastest GEMM library for a product and its GFLOP/s: a product's name (`square`,
    `im2col`, `winograd`) read from `ceilings` (None: `measure("cpu", threads)`), or a
    `Product` measured now on the CPU."""
    if isinstance(shape, Product):
        rates = {b: by[shape.name] for b, by in gemm_rates([shape], threads).items()}
    else:
        c = ceilings or measure("cpu", threads)
        rates = {b: by[shape] for b, by in c.gflops_by_backend.items() if shape in by}
        if not rates:
            known = sorted({s for by in c.gflops_by_backend.values() for s in by})
            raise ValueError(f"no GEMM rate for {shape!r}; measured: {', '.join(known)}")
    name = max(rates, key=rates.get)
    return name, rates[name]


def from_env(env: Mapping | None) -> Ceilings | None:
    """The ceilings a run's env.json carries (`env["ceilings"]`, `runs.environment`), or None:
    not measured there (a run folder from before them, a device without them) or a record of
    another schema."""
    record = (env or {}).get("ceilings")
    if not isinstance(record, Mapping):
        return None
    try:
        return Ceilings.from_dict(record)
    except (ValueError, TypeError):
        return None


# --- reading rows against the ceilings ---------------------------------------------------------
def implausible(gflops_direct: float | None, algo_ops_ratio: float | None,
                ceilings: Ceilings, margin: float = MARGIN) -> str | None:
    """Why a row's rate is not a result, or None. The rate (direct-convolution flops over its
    time) may exceed the device's ceiling (the higher of attainable and theoretical peak) only
    by the algorithm's arithmetic reduction (`algo_ops_ratio`: direct flops over the
    algorithm's own op count, Winograd's and FFT's; None or 1 for direct and GEMM) and
    `margin` (`MARGIN`); beyond that the timer missed work: a timing or synchronisation bug."""
    if gflops_direct is None or np.isnan(gflops_direct):
        return None
    ratio = 1.0 if algo_ops_ratio is None else float(algo_ops_ratio)
    if ratio <= 0:
        raise ValueError(f"algo_ops_ratio {ratio}: direct flops over an algorithm's op count "
                         "is positive")
    roof = max(ceilings.gflops_attainable, ceilings.gflops_peak_theoretical or 0.0)
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
    """Compute- or memory-bound, against the attainable compute roof (the rate a real product
    reaches) and the bandwidth `level` (`dram`: beyond the cache, `cache`: within it)."""
    bandwidth = {"dram": ceilings.bandwidth_gbs_dram,
                 "cache": ceilings.bandwidth_gbs_cache}[level]
    if not bandwidth:
        raise ValueError(f"no {level} bandwidth measured on {ceilings.model}")
    compute, memory = ceilings.gflops_attainable, point.intensity * bandwidth
    kind, roof = ("memory", memory) if memory < compute else ("compute", compute)
    return Bound(kind, roof, point.gflops / roof, compute / bandwidth)
