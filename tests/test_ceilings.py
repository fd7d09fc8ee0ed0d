"""Ceilings: the peak read from /proc/cpuinfo text, the GPU path on a fake cuBLAS timer and a
fake clock, the cache (hit, refresh, a new key when a version changes), the plausibility guard
on a planted too-fast row, the roofline helpers, and one real small CPU measurement."""

import json
import os
import threading
import time

import pytest

from convbench.machine import host
from convbench.measure import ceilings as C
from convbench.measure.ceilings import cpu, gpu, roofline

# the real `measure` (every other test module gets conftest's fake)
pytestmark = pytest.mark.usefixtures("real_ceilings")

XEON_SPR = """processor	: 0
vendor_id	: GenuineIntel
cpu family	: 6
model		: 143
model name	: Intel(R) Xeon(R) Platinum 8480+
cpu MHz		: 2000.000
siblings	: 4
cpu cores	: 2
flags		: fpu sse sse2 avx fma avx2 avx512f avx512dq avx512bw avx512_bf16 avx512_fp16 amx_tile

processor	: 1
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Platinum 8480+
"""
ZEN5 = """processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 26
model		: 2
model name	: AMD EPYC 9755 128-Core Processor
cpu MHz		: 2700.000
flags		: fpu sse sse2 avx fma avx2 avx512f avx512dq avx512_bf16
"""
ZEN4 = ZEN5.replace("cpu family	: 26", "cpu family	: 25").replace("9755", "9654")
AVX2_ONLY = """processor	: 0
vendor_id	: GenuineIntel
cpu family	: 6
model		: 158
model name	: Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz
cpu MHz		: 3200.000
flags		: fpu sse sse2 avx fma avx2
"""


def test_peak_intel_avx512_reads_lanes_units_and_the_cpuinfo_clock():
    gflops, method = cpu.cpu_peak(XEON_SPR, cores=2)
    assert gflops == pytest.approx(2 * 16 * 2 * 2 * 2000 / 1e3)
    assert "AVX-512" in method and "cpu MHz" in method and "assumed" in method


def test_peak_zen5_full_width_and_zen4_double_pumped():
    gflops, method = cpu.cpu_peak(ZEN5, cores=4)
    assert gflops == pytest.approx(4 * 16 * 2 * 2 * 2700 / 1e3)
    assert "Zen 5" in method
    zen4, method4 = cpu.cpu_peak(ZEN4, cores=4)
    assert zen4 == pytest.approx(gflops / 2) and "Zen 4" in method4


def test_peak_avx2_only_prefers_the_cpufreq_maximum():
    gflops, method = cpu.cpu_peak(AVX2_ONLY, cores=6, max_freq_khz=4_600_000)
    assert gflops == pytest.approx(6 * 8 * 2 * 2 * 4600 / 1e3)
    assert "AVX/AVX2" in method and "cpuinfo_max_freq" in method


def test_peak_unknown_without_x86_flags_or_a_clock():
    assert cpu.cpu_peak("processor : 0\nFeatures : fp asimd\n", cores=4)[0] is None
    assert cpu.cpu_peak(AVX2_ONLY.replace("cpu MHz		: 3200.000\n", ""), cores=1)[0] is None


def test_openblas_fell_back_to_avx2_on_an_avx512_cpu():
    flags = set(host.parse_cpuinfo(XEON_SPR)["flags"].split())
    assert cpu.faster_coretype("Haswell", flags) == "Cooperlake"
    assert cpu.faster_coretype("SkylakeX", flags) is None
    avx2 = set(host.parse_cpuinfo(AVX2_ONLY)["flags"].split())
    assert cpu.faster_coretype("Haswell", avx2) is None
    assert cpu.coretype_candidates(flags) == ["Haswell", "SkylakeX", "Cooperlake", "SapphireRapids"]


def test_cache_sizes_from_sysfs(tmp_path):
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"),
                                              (2, "Unified", "2048K"), (3, "Unified", "480M")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (d / name).write_text(f"{value}\n")
    assert cpu.cache_sizes(tmp_path) == {1: 48 << 10, 2: 2 << 20, 3: 480 << 20}


# --- the GPU on fakes --------------------------------------------------------------------------
H100 = gpu.GpuInfo("Fake H100", sm_count=132, compute_capability="90", l2_bytes=50 << 20,
                 max_clock_mhz=1980.0)


def test_gpu_rates_peak_and_bandwidth_from_fake_timers():
    seen = []

    def cublas(p, reps):  # a fake cuBLAS at 50 TFLOP/s
        seen.append(p)
        return p.flops / 50e12

    c = gpu.measure_gpu(2, gemm_timers={"cupy": cublas}, copy_timer=lambda n, reps: 2 * n / 3e12,
                      clock=lambda: 1755, info=H100)
    assert [p.name for p in seen] == ["square", "im2col", "winograd"]
    assert c.gflops_attainable == pytest.approx(50e3) and c.gemm_backend == "cupy"
    assert c.clock_mhz == 1755
    assert c.gflops_peak_theoretical == pytest.approx(132 * 128 * 2 * 1755 / 1e3)
    assert "sampled while the products ran" in c.peak_method
    assert c.bandwidth_gbs_dram == pytest.approx(3e3)
    assert c.methods["bandwidth"].startswith("cupy.copyto")


def test_gpu_clock_is_the_one_sampled_while_the_products_ran():
    """The clock reader answers an idle clock outside the timed window and the boost clock
    inside it: the ceiling's clock is the boost one."""
    running = threading.Event()

    def cublas(p, reps):
        running.set()
        time.sleep(0.05)
        running.clear()
        return p.flops / 40e12

    c = gpu.measure_gpu(gemm_timers={"torch": cublas}, copy_timer=lambda n, reps: n / 1e12,
                      clock=lambda: 1980 if running.is_set() else 345, info=H100)
    assert c.clock_mhz == 1980


def test_gpu_without_nvml_falls_back_to_the_maximum_clock():
    c = gpu.measure_gpu(gemm_timers={"cupy": lambda p, reps: p.flops / 1e12},
                      copy_timer=lambda n, reps: n / 1e12, clock=lambda: None, info=H100)
    assert c.clock_mhz is None
    assert c.gflops_peak_theoretical == pytest.approx(132 * 128 * 2 * 1980 / 1e3)
    assert "maximum SM clock" in c.peak_method


@pytest.mark.gpu
def test_gpu_measured_for_real():
    c = gpu.measure_gpu(scale=0.25)
    assert c.gflops_attainable > 0 and c.bandwidth_gbs_dram > 0
    peak = c.gflops_peak_theoretical
    assert peak is None or c.gflops_attainable < roofline.MARGIN * peak


# --- the record and its cache ------------------------------------------------------------------
def fake_ceilings(gflops=100.0, peak=150.0, **kw) -> C.Ceilings:
    fields = dict(
        device="cpu", model="Fake CPU", threads=2, gflops_attainable=gflops,
        gemm_backend="torch", gflops_by_backend={"torch": {"square": gflops, "im2col": 60.0},
                                                 "numpy": {"square": 90.0, "im2col": 70.0}},
        gflops_peak_theoretical=peak, peak_method="fake", bandwidth_gbs_dram=10.0,
        bandwidth_gbs_cache=100.0, bandwidth_by_kernel={"dram": {"numpy copy": 10.0}},
        clock_mhz=None, openblas_coretype="Haswell", openblas_faster_coretype="SkylakeX",
        methods={}, measured_at="2026-01-01T00:00:00+00:00", versions={"numpy": "2"})
    return C.Ceilings(**{**fields, **kw})


def test_record_round_trips_through_json_and_refuses_another_schema():
    c = fake_ceilings()
    assert C.Ceilings.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    with pytest.raises(ValueError, match="schema"):
        C.Ceilings.from_dict({**c.to_dict(), "schema": C.SCHEMA + 1})


@pytest.fixture
def counted(tmp_path, monkeypatch):
    """The cache in a folder of the test's own, a fake measurement that counts its calls, and
    versions the test may change."""
    monkeypatch.setenv("CONVBENCH_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    monkeypatch.setattr(C, "measure_cpu", lambda threads, scale=1.0: calls.append(threads)
                        or fake_ceilings(threads=threads, gflops=100.0 + len(calls)))
    versions = {"numpy": "2.0", "torch": "2.5", "openblas": "0.3.28"}
    monkeypatch.setattr(C, "_versions", lambda device: dict(versions))
    return calls, versions, tmp_path / "cache"


def test_cache_hit_refresh_and_a_new_key_when_a_version_changes(counted):
    calls, versions, folder = counted
    env = {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    first = C.measure("cpu", 2)
    assert C.measure("cpu", 2) == first and len(calls) == 1  # hit
    assert len(list(folder.glob("ceilings-cpu-*.json"))) == 1
    again = C.measure("cpu", 2, refresh=True)
    assert len(calls) == 2 and again.gflops_attainable != first.gflops_attainable
    assert C.measure("cpu", 2) == again  # the refreshed figure is the cached one now
    C.measure("cpu", 1)  # another thread count, another key
    assert len(calls) == 3
    versions["openblas"] = "0.3.29"
    C.measure("cpu", 2)
    assert len(calls) == 4 and len(list(folder.glob("*.json"))) == 3
    assert {k: os.environ.get(k) for k in env} == env  # the machine's OpenBLAS settings stay


def test_a_torn_or_foreign_cache_file_is_measured_again(counted):
    calls, _, _ = counted
    key = C.cache_key("cpu", 2)
    path = C.cache_path(key)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    C.measure("cpu", 2)
    record = json.loads(path.read_text())
    record["ceilings"]["schema"] = 0
    path.write_text(json.dumps(record))
    C.measure("cpu", 2)
    assert len(calls) == 2


def test_a_contended_measurement_is_not_cached(counted, monkeypatch):
    calls, _, folder = counted
    monkeypatch.setattr(C, "measure_cpu", lambda threads, scale=1.0: calls.append(threads)
                        or fake_ceilings(methods={"contended": "torch square"}))
    assert C.measure("cpu", 2).contended
    C.measure("cpu", 2)
    assert len(calls) == 2 and not list(folder.glob("*.json"))


def test_cache_folder_follows_xdg_without_the_override(monkeypatch, tmp_path):
    monkeypatch.delenv("CONVBENCH_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert C.cache_dir() == tmp_path / "convbench"


# --- reading rows against them -----------------------------------------------------------------
def test_guard_catches_a_planted_too_fast_row_and_passes_a_plausible_one():
    c = fake_ceilings(gflops=100.0, peak=150.0)  # roof: 150
    assert roofline.implausible(120.0, 1.0, c) is None
    assert roofline.implausible(150 * 1.25 * 0.99, None, c) is None
    reason = roofline.implausible(10 * 150.0, 1.0, c)  # a GEMM row 10x above the peak: no sync
    assert reason and "synchronisation" in reason and "Fake CPU" in reason
    # Winograd F(4x4, 3x3) does 4x fewer multiplications: 4x the roof in direct flops is fine
    assert roofline.implausible(500.0, 4.0, c) is None
    assert roofline.implausible(800.0, 4.0, c) is not None
    assert roofline.implausible(float("inf"), 1.0, c) is not None
    assert roofline.implausible(float("nan"), 1.0, c) is None
    with pytest.raises(ValueError):
        roofline.implausible(1.0, 0.0, c)


def test_roofline_point_and_bound():
    c = fake_ceilings(gflops=100.0)  # ridge at 100 / 10 = 10 flop/byte
    low = roofline.roofline_point(flops=2e9, nbytes=1e9, seconds=0.2)  # 2 flop/byte, 10 GFLOP/s
    assert (low.intensity, low.gflops) == pytest.approx((2.0, 10.0))
    b = roofline.bound(low, c)
    assert (b.kind, b.roof_gflops, b.share, b.ridge) == ("memory", pytest.approx(20.0),
                                                         pytest.approx(0.5), pytest.approx(10.0))
    high = roofline.bound(roofline.roofline_point(1e11, 1e9, 2.0), c)  # 100 flop/byte, 50 GFLOP/s
    assert (high.kind, high.share) == ("compute", pytest.approx(0.5))
    assert roofline.bound(low, c, level="cache").kind == "compute"
    with pytest.raises(ValueError):
        roofline.roofline_point(1.0, 0, 1.0)


def test_fastest_gemm_per_shape():
    c = fake_ceilings()
    assert C.fastest_gemm("square", c) == ("torch", 100.0)
    assert C.fastest_gemm("im2col", c) == ("numpy", 70.0)
    with pytest.raises(ValueError, match="square"):
        C.fastest_gemm("fft", c)


# --- this machine, small -----------------------------------------------------------------------
def test_a_real_small_cpu_measurement_gives_positive_rates():
    c = cpu.measure_cpu(1, scale=1 / 16, reps=2)
    assert c.device == "cpu" and c.threads == 1
    assert c.gflops_attainable > 0 and c.bandwidth_gbs_dram > 0
    assert all(g > 0 for by in c.gflops_by_backend.values() for g in by.values())
    assert {"numpy"} <= set(c.gflops_by_backend)
    assert c.gflops_attainable == max(g for by in c.gflops_by_backend.values()
                                      for g in by.values())
    assert "scale" in c.methods
    assert C.fastest_gemm(C.Product("tiny", 1, 64, 64, 64), threads=1)[1] > 0
    assert C.Ceilings.from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_probe_of_the_current_openblas_coretype_takes():
    """Only the core type OpenBLAS already runs is probed: a test never puts this machine's
    OpenBLAS on another (a machine may pin OPENBLAS_CORETYPE because another crashes)."""
    current = cpu.numpy_blas().get("architecture")
    if not current:
        pytest.skip("NumPy's BLAS reports no core type (not OpenBLAS, or no threadpoolctl)")
    probe = C.probe_openblas_coretype([current], threads=1, n=128, reps=1)
    assert probe["current"] == current
    assert probe["results"][current]["took"] and probe["results"][current]["gflops"] > 0
    assert probe["fastest"] == current


def test_a_run_s_ceilings_come_back_from_its_env_json():
    c = fake_ceilings()
    assert C.from_env({"ceilings": json.loads(json.dumps(c.to_dict()))}) == c
    assert C.from_env({}) is None and C.from_env(None) is None  # a run from before them
    assert C.from_env({"ceilings": None, "ceilings_note": "not measured: no cupy"}) is None
    assert C.from_env({"ceilings": {**c.to_dict(), "schema": C.SCHEMA + 1}}) is None


def test_tests_measure_no_ceilings_unless_they_ask(real_ceilings):
    """conftest fakes `measure` for every test but those using `real_ceilings` (this module)."""
    assert C.measure is real_ceilings and real_ceilings.__module__ == C.__name__


# --- the measured compute roof -----------------------------------------------------------------
def test_the_compute_roof_is_the_larger_of_sgemm_and_the_measured_peak_and_says_which():
    below = fake_ceilings(gflops=100.0, gflops_peak_measured=90.0)
    assert below.compute_roof == (100.0, "the best library SGEMM (torch)")
    above = fake_ceilings(gflops=100.0, peak=80.0, gflops_peak_measured=130.0)
    assert above.compute_roof == (130.0, "the measured FMA peak")
    assert "compute roof: 130 GFLOP/s (the measured FMA peak)" in str(above)
    # a record from before the measured peak: the SGEMM, as it was read then
    old = {k: v for k, v in below.to_dict().items() if k != "gflops_peak_measured"}
    assert C.Ceilings.from_dict(old).compute_roof[0] == 100.0


def test_the_guard_and_the_roofline_read_the_measured_peak():
    c = fake_ceilings(gflops=100.0, peak=80.0, gflops_peak_measured=200.0)
    # 200 x 1.25 = 250: a kernel above the SGEMM but under the FMA units' rate is a result
    assert roofline.implausible(240.0, 1.0, c) is None
    assert roofline.implausible(260.0, 1.0, c) is not None
    b = roofline.bound(roofline.roofline_point(1e11, 1e9, 1.0), c)  # 100 flop/byte, 100 GFLOP/s
    assert (b.kind, b.roof_gflops, b.share) == ("compute", 200.0, pytest.approx(0.5))


def test_a_cache_from_before_the_measured_peak_is_measured_again(counted):
    calls, _, _ = counted
    C.measure("cpu", 2)
    key = C.cache_key("cpu", 2)
    path = C.cache_path(key)
    old_key = {k: v for k, v in key.items() if k != "peak"}
    path.rename(C.cache_path(old_key))  # what the code before the peak wrote
    C.measure("cpu", 2)
    assert len(calls) == 2


def test_the_fma_loop_compiles_to_vector_fmas_and_runs_on_every_thread():
    from concurrent.futures import ThreadPoolExecutor

    from convbench.measure.ceilings import fma as peak

    flags = set(host.cpuinfo().get("flags", "").split())
    k = peak.kernel(8)
    assert k.flops_per_trip == 2 * 8 * peak.ACCUMULATORS * peak.UNROLL
    if "fma" in flags:  # an x86 CPU with FMA runs it as fused multiply-adds on ymm (or wider)
        assert "fmadd" in k.instruction and k.instruction.split()[-1] in ("ymm", "zmm")
    with ThreadPoolExecutor(2) as pool:
        trips = peak.trips_for(k, 2, pool, seconds=0.005)
        call = peak.parallel_call(k, trips, 2, pool)
        start = time.perf_counter()
        call()
        assert time.perf_counter() - start > 0
    assert trips >= 1000


def test_a_real_small_measured_peak_is_above_a_single_vector_lane():
    gflops, method = cpu.measure_peak(1, reps=2, scale=1 / 16)
    assert gflops is not None and "independent fp32 FMA chains" in method
    # a scalar loop at 5 GHz does 10 GFLOP/s: the vectors must do more, even on a busy machine
    assert gflops > 10.0
