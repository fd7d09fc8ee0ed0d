"""The CPU's ceilings, measured now: the fastest fp32 product of its GEMM libraries, its
theoretical peak, its STREAM bandwidth beyond and within cache; and the OpenBLAS core types worth
trying.

- **Attainable compute** is the best SGEMM rate of the GEMM libraries here (`torch.matmul` on
  MKL/oneDNN and NumPy's `@` on OpenBLAS) on a square product and on the shapes our algorithms'
  products have, with the run's thread count, best of a few repetitions after a warm-up: a
  ceiling is the fastest the library gets, not its typical time. The libraries are timed
  interleaved in rounds (`timing.rounds_cpu`), so the per-shape winner is not drift's artefact.
- **Measured peak** is what the FMA units do at the clock that runs: a compiled loop of
  independent vector FMAs on every thread at once (`ceilings.fma`). It is the compute roof where
  it is above the best SGEMM (a library's product loads and packs; a convolution library's own
  kernels can beat it).
- **Theoretical peak** is cores x SIMD fp32 lanes x FMA units x 2 x clock, each factor read
  where the machine says it (/proc/cpuinfo, sysfs) and said to be an assumption where not (the
  FMA-unit count, by CPU family).
- **Bandwidth** is STREAM's copy and triad (bytes counted as STREAM counts them: 2 and 3 arrays,
  write-allocate not counted), beyond the last-level cache and within half of L2.

A figure timed while other work took the cores is marked contended (`methods`): it is low.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ...core.fmt import fmt_mib
from ...machine.host import cpu_model, cpuinfo, parse_cpuinfo, read
from ...machine.threads import available_cores, numpy_blas_pool
from ...machine.threads import count as thread_count
from .. import timing
from . import fma
from .record import CPU_PRODUCTS, REPS, Ceilings, Product, library_versions, now

#: All the DRAM bandwidth arrays together at most: beyond any one VM's share of a real L3, and
#: within the few seconds `measure` may take (a VM can report its host's whole L3, 480 MiB,
#: as its own; four times that in three arrays is more than a probe should allocate).
DRAM_CAP_BYTES = 512 << 20
#: Bytes a within-cache call moves at least (the kernel repeated to amortise the call's cost).
CACHE_CALL_BYTES = 64 << 20
#: OpenBLAS core types whose SGEMM kernel is AVX-512.
AVX512_CORETYPES = ("skylakex", "cooperlake", "sapphirerapids")


# --- what the machine says ---------------------------------------------------------------------
def cache_sizes(root: str | Path = "/sys/devices/system/cpu/cpu0/cache") -> dict[int, int]:
    """Bytes of cpu0's data (or unified) cache per level, from sysfs; {} where unreadable."""
    sizes: dict[int, int] = {}
    for index in sorted(Path(root).glob("index*")):
        level, kind, size = (read(index / f) for f in ("level", "type", "size"))
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
    text = read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    return int(text) if text and text.strip().isdigit() else None


def numpy_blas() -> dict:
    """NumPy's BLAS pool as threadpoolctl reports it (internal_api, version, architecture: the
    core type OpenBLAS chose, threading layer); {} without threadpoolctl."""
    pool = numpy_blas_pool()
    return {k: pool.get(k) for k in ("internal_api", "version", "architecture",
                                     "threading_layer")} if pool else {}


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



def versions() -> dict[str, str | None]:
    """The library versions a CPU ceiling depends on (part of the cache key): NumPy's and
    torch's, torch's BLAS, OpenBLAS's version and the core type it chose."""
    blas = numpy_blas()
    return {**library_versions(), "torch_blas": _torch_blas(), "openblas": blas.get("version"),
            "openblas_coretype": blas.get("architecture")}


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
    meminfo = read("/proc/meminfo") or ""
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


def measure_peak(threads: int, reps: int = REPS, scale: float = 1.0,
                 starved: list[str] | None = None) -> tuple[float | None, str]:
    """GFLOP/s of the compiled FMA loop (`ceilings.fma`) on `threads` threads, the best vector
    width of those tried (interleaved in rounds, as the GEMM libraries are), and how it was
    measured; (None, why) where it cannot be compiled here. `starved` gets it if contended."""
    from concurrent.futures import ThreadPoolExecutor

    seconds = fma.CALL_SECONDS * min(1.0, scale)
    try:
        kernels = [fma.kernel(w) for w in fma.WIDTHS]
    except Exception as exc:  # noqa: BLE001 - no llvmlite, or LLVM refuses this CPU
        return None, f"not measured: the FMA loop could not be compiled here ({exc})"
    with ThreadPoolExecutor(threads) as pool:
        trips = [fma.trips_for(k, threads, pool, seconds) for k in kernels]
        calls = [fma.parallel_call(k, t, threads, pool)
                 for k, t in zip(kernels, trips)]
        flags: list[bool] = []
        best = _best_seconds(calls, reps, flags)
    rates = {k.width: k.flops_per_trip * t * threads / s / 1e9
             for k, t, s in zip(kernels, trips, best)}
    fastest = max(kernels, key=lambda k: rates[k.width])
    if starved is not None and any(flags):
        starved.append("the FMA peak")
    return rates[fastest.width], fma.describe(fastest, threads, rates, reps, seconds)


def _methods(reps: int, n: int, products: Sequence[Product], rates: Mapping,
             blas: Mapping) -> dict[str, str]:
    """How the GEMM rates and the bandwidths were measured, for the record's `methods`."""
    return {
        "gflops": (f"best of {reps} after a warm-up, libraries interleaved, {n} threads "
                   f"(threadpoolctl limits and torch.set_num_threads); products: "
                   + "; ".join(f"{p.name} {p.describe()}" for p in products)),
        "backends": "; ".join(
            [f"torch: torch.matmul (BLAS_INFO={_torch_blas()})"] * ("torch" in rates)
            + [(f"numpy: numpy @ ({blas.get('internal_api')} {blas.get('version')}, core "
                f"type {blas.get('architecture')}, {blas.get('threading_layer')})")]),
        "bandwidth": ("STREAM copy a = b (2 arrays counted) and triad a = b + s*c (3 arrays "
                      "counted), write-allocate not counted; numpy's triad is two in-place "
                      "passes (multiply, then add), so it moves 5 arrays and its figure "
                      "understates; torch's is one fused pass (torch.add alpha) on torch's "
                      f"threads, numpy's one thread; best of {reps}"),
    }


def measure_cpu(threads: int | None = None, *, scale: float = 1.0, reps: int = REPS,
                products: Sequence[Product] = CPU_PRODUCTS) -> Ceilings:
    """The CPU's ceilings, measured now (a few seconds at `scale` 1; tests use less)."""
    n = threads or thread_count()
    text = read("/proc/cpuinfo") or ""
    info = parse_cpuinfo(text)
    flags = set(info.get("flags", "").split())
    scaled = [p.scaled(scale) for p in products]
    starved: list[str] = []
    rates = gemm_rates(scaled, n, reps, starved)
    backend, shape = max(((b, s) for b, by in rates.items() for s in by),
                         key=lambda bs: rates[bs[0]][bs[1]])
    cores = min(n, _physical_cores(info))
    peak, peak_method = cpu_peak(text, cores, _max_freq_khz())
    measured_peak, measured_method = measure_peak(n, reps, scale, starved)
    if measured_peak and peak:
        measured_method += (f"; {measured_peak / peak:.2f}x the theoretical peak (where above "
                            "it, the clock that ran is higher than the one read, or the CPU "
                            "has more FMA units than assumed)")
    caches = cache_sizes()
    llc = caches[max(caches)] if caches else None
    dram_bytes, dram_note = _dram_array_bytes(llc, scale)
    dram = stream(dram_bytes, n, reps, starved)
    l2 = caches.get(2)
    cache = stream(l2 // 2 // 3, n, reps, starved) if l2 else {}
    blas = numpy_blas()
    methods = {**_methods(reps, n, scaled, rates, blas), "attainable": f"{backend} on {shape}",
               "peak_measured": measured_method, "bandwidth_dram": dram_note,
               "bandwidth_cache": (f"arrays of {l2 // 2 // 3 >> 10} KiB each (three within half "
                                   f"of L2 = {l2 >> 10} KiB), each call repeated to move "
                                   f"{CACHE_CALL_BYTES >> 20} MiB" if l2 else
                                   "L2 size unreadable")}
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
        gflops_peak_measured=measured_peak,
        bandwidth_gbs_dram=max(dram.values()), bandwidth_gbs_cache=max(cache.values(),
                                                                      default=None),
        bandwidth_by_kernel={"dram": dram, **({"cache": cache} if cache else {})},
        clock_mhz=None, openblas_coretype=blas.get("architecture"),
        openblas_faster_coretype=faster_coretype(blas.get("architecture"), flags),
        methods=methods, measured_at=now(), versions=versions())



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
    flags = set(cpuinfo().get("flags", "").split())
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
