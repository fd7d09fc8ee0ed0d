import numpy as np
import pytest
from test_runner import BUDGET, Fake, fakes_declared

from convbench.algos import registry
from convbench.catalogs.layers import Layer
from convbench.core import results
from convbench.core.problem import LAYOUTS, ConvProblem
from convbench.measure import memory, runner

#: `convbench gpu-first` runs this file's `gpu` tests first (a pin).
pytestmark = pytest.mark.gpu_pins

MiB = 1 << 20
#: Large enough that every workspace is megabytes (the traces' own noise is kilobytes), small
#: enough that all algorithms and passes are verified and traced in about a second.
P = ConvProblem(n=4, c=64, h=13, w=13, k=64, r=3, s=3, pad=1)
NUMPY_ALGOS = ("direct", "gemm", "fft", "winograd-2x2", "winograd-4x4")


#: Filter-heavy (a 2.25 MiB filter, activations of a few hundred KiB): a filter-sized buffer
#: left undeclared — a packed copy, a sum buffer — is far outside SLACK here.
WIDE = ConvProblem(n=2, c=256, h=8, w=8, k=256, r=3, s=3, pad=1)


def traced_rows(algos, passes=("fwd", "bwd_data", "bwd_filter"), problem=P, backend="numpy",
                layouts=("nchw",)):
    cases = runner.sweep([Layer("t", "t", problem)], algos, backend, passes, layouts, ["fp32"])
    return runner.run(cases, BUDGET)


# --- sizes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("text, nbytes", [("4096", 4096), ("2GiB", 2 << 30),
                                          ("256 MiB", 256 << 20), ("1.5GB", 1_500_000_000),
                                          ("3k", 3000)])
def test_parse_size(text, nbytes):
    assert memory.parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "lots", "2XB", "-1GiB", "0"])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError, match="not a positive size"):
        memory.parse_size(text)


def test_format_size():
    assert memory.format_size(3 * 2**30 / 2) == "1.5 GiB"
    assert memory.format_size(512) == "512 B"
    assert memory.format_size(1020.4 * 2**20) == "1020 MiB"  # no 1.02e+03


# --- traces ---------------------------------------------------------------------------------
def test_tracemalloc_sees_numpy_buffers_between_marks():
    with memory.Tracemalloc() as trace:
        a = np.ones(MiB, np.uint8)
        trace.mark()
        b = np.ones(2 * MiB, np.uint8)
        del b
        trace.mark()
        del a
    (p0, p1, p2) = trace.points
    assert p0.allocated == pytest.approx(MiB, abs=16 << 10)
    assert p1.peak == pytest.approx(3 * MiB, abs=16 << 10)  # b came and went
    assert p1.allocated == pytest.approx(MiB, abs=16 << 10)
    assert p2.allocated == pytest.approx(0, abs=16 << 10) and p2.peak <= p1.allocated + (16 << 10)


def test_torch_profiler_sees_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    with memory.TorchHostAllocator() as trace:
        a = torch.empty(MiB, dtype=torch.uint8)
        trace.mark()
        b = torch.empty(3 * MiB, dtype=torch.uint8)
        del b
        trace.mark()
        del a
    assert [(p.allocated, p.peak) for p in trace.points] == [(MiB, MiB), (MiB, 4 * MiB),
                                                             (0, MiB)]


def test_host_trace_adds_numpy_and_torch():
    torch = pytest.importorskip("torch")
    with memory.trace("numpy") as trace:
        a, t = np.ones(MiB, np.uint8), torch.ones(MiB, dtype=torch.uint8)
        trace.mark()
        del a, t
    assert trace.method in memory.METHODS
    assert trace.points[0].allocated == pytest.approx(2 * MiB, abs=32 << 10)
    assert memory.pass_peak(trace.points) == pytest.approx(2 * MiB, abs=32 << 10)


def test_pass_peak_counts_held_buffers_and_the_call():
    held, call = memory.Point(5, 5), memory.Point(5, 12)
    assert memory.pass_peak([held, call]) == 12
    assert memory.pass_peak([held, memory.Point(0, 3)]) == 5  # freed its buffers in the call
    assert memory.pass_peak([memory.Point(-4, 0), memory.Point(-4, -2)]) == 0


# --- the results columns --------------------------------------------------------------------
def test_rows_carry_peak_bytes_and_method_beside_workspace():
    rows = {(r["algo"], r["pass"]): r for r in traced_rows(NUMPY_ALGOS + ("torch-cpu",))}
    for r in rows.values():
        assert r["status"] == "ok", r["reason"]
        assert r["peak_bytes"] >= 0 and r["memory_method"] == "torch-profiler+tracemalloc"
    cols = list(results.COLUMNS)
    assert cols.index("peak_bytes") == cols.index("workspace_bytes") + 1
    for pass_ in ("fwd", "bwd_data", "bwd_filter"):
        least = rows["direct", pass_]["peak_bytes"]
        for algo in ("gemm", "fft", "winograd-2x2", "winograd-4x4"):
            assert rows[algo, pass_]["peak_bytes"] > least, (algo, pass_)
    # torch-cpu declares nothing; its result tensor (y-sized at least) is measured.
    y_bytes = 4 * P.n * P.k * P.p * P.q
    assert rows["torch-cpu", "fwd"]["workspace_bytes"] is None
    assert rows["torch-cpu", "fwd"]["peak_bytes"] >= y_bytes


#: What tracemalloc counts besides the pass's buffers: Python objects, NumPy's ufunc buffers
#: (up to ~100 KiB per call where gemm's col2im and direct's bwd_data add through strided
#: views), and on first use the FFT's worker pool.
SLACK = 512 << 10


def test_prediction_and_measurement_agree_for_the_numpy_algorithms():
    """Every NumPy buffer is seen by tracemalloc and numpy.fft/pyFFTW buffers are NumPy
    arrays, so on the host measured = declared, within SLACK: in both layouts, whose buffers
    differ (direct packs kcrs filters, gemm sums nchw images through a buffer). torch is
    loaded first, as in every run (`threads.use` sets its threads): an nhwc pass's probe may
    try torch's transpose, and its import is not the pass's memory."""
    import torch  # noqa: F401
    rows = traced_rows(NUMPY_ALGOS, layouts=LAYOUTS)
    rows += traced_rows(("direct", "gemm"), problem=WIDE, layouts=LAYOUTS)
    for r in rows:
        declared, measured = r["workspace_bytes"], r["peak_bytes"]
        assert r["status"] == "ok", r["reason"]
        assert declared - SLACK <= measured <= declared + SLACK, \
            (r["algo"], r["pass"], r["layout"], r["n"], declared, measured)


# --- limits ---------------------------------------------------------------------------------
class Hog(Fake):
    """Declares no workspace but allocates `extra` bytes of NumPy scratch in every call."""

    def __init__(self, algo, extra):
        super().__init__(algo)
        self.extra = extra

    def prepare(self, *args):
        fn = super().prepare(*args)

        def run(a, b, out):
            scratch = np.ones(self.extra, np.uint8)
            fn(a, b, out)
            del scratch

        return run


def test_limit_checks_prediction_before_running_and_measurement_before_timing():
    operands = memory.operand_bytes(P, "fwd", np.float32)
    limit = memory.MemoryLimit(operands + 4 * MiB)
    cases = runner.sweep([Layer("t", "t", P)], ["gemm", "fft", "hog", "good"], "numpy",
                         ["fwd"], ["nchw"], ["fp32"])
    hog, good = Hog("hog", 8 * MiB), Fake("good")
    with fakes_declared(("hog", "good")):
        rows = {r["algo"]: r for r in runner.run(cases, BUDGET, {"hog": hog, "good": good},
                                                 limit=limit)}
    assert rows["gemm"]["status"] == "ok"  # 1.5 MiB of columns fit
    assert rows["fft"]["status"] == "oom"
    assert rows["fft"]["reason"].startswith("OverLimit: predicted footprint")
    assert rows["hog"]["status"] == "oom" and hog.calls == 1  # traced, never timed
    assert rows["hog"]["reason"].startswith("OverLimit: measured footprint")
    assert rows["good"]["status"] == "ok" and good.calls > 1


def test_the_limit_holds_for_both_gpu_pools_together():
    """On the GPU each allocator is held to the limit for real (`enforce`), but each alone: the
    footprint the two were seen to hold together is checked as on the host."""
    limit = memory.MemoryLimit(1)
    for backend in ("cuda", "numpy"):
        with pytest.raises(memory.OverLimit, match="needed 2 B exceeds the memory limit 1 B"):
            limit.check(backend, 2, "needed")
        limit.check(backend, 1, "needed")
    with limit.enforce("numpy"):
        pass


def test_both_gpu_pools_give_their_free_blocks_back(monkeypatch):
    """CuPy's pool and torch's cache never lend each other a block: before each GPU case both
    return theirs to the device, and the implementations' device caches are dropped."""
    import sys
    import types

    freed, cleared = [], []
    pool = types.SimpleNamespace(free_all_blocks=lambda: freed.append("cupy"))
    fake_cupy = types.SimpleNamespace(get_default_memory_pool=lambda: pool)
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        is_initialized=lambda: True, empty_cache=lambda: freed.append("torch")))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setattr(registry, "_DEVICE_CACHES", [lambda: cleared.append(1)])
    memory.release_device_memory("numpy")
    assert freed == [] and cleared == []
    memory.release_device_memory("cuda")
    assert freed == ["cupy", "torch"] and cleared == [1]


# --- the GPU --------------------------------------------------------------------------------
@pytest.mark.gpu
def test_cuda_trace_reads_cupy_pool_high_water_and_torch_allocator():
    import cupy
    import torch

    with memory.CudaPools() as trace:
        a = cupy.ones(MiB, cupy.uint8)
        trace.mark()
        b = cupy.ones(3 * MiB, cupy.uint8)
        del b
        t = torch.ones(2 * MiB, dtype=torch.uint8, device="cuda")
        del t
        trace.mark()
        del a
    p0, p1, _ = trace.points
    assert p0.allocated == MiB
    assert p1.allocated == MiB
    assert p1.peak >= 4 * MiB  # CuPy's 4 MiB high-water, plus torch's 2 MiB between the marks


@pytest.mark.gpu
def test_prediction_and_measurement_agree_for_the_cuda_algorithms():
    """Every buffer the kernels declare comes from CuPy's pool; undeclared on purpose or not
    yet: cuFFT's work areas (fft, fft-tiled), cuBLAS's own workspace (outside the pool). Those
    get the lower bound only."""
    gaps = {("fft", p) for p in ("fwd", "bwd_data", "bwd_filter")}
    gaps |= {("fft-tiled", p) for p in ("fwd", "bwd_data", "bwd_filter")}
    algos = [a for a in registry.algos_for("cuda") if not a.startswith("cudnn")]
    for r in traced_rows(algos, backend="cuda"):
        if r["status"] != "ok" or r["workspace_bytes"] is None:
            continue
        declared, measured = r["workspace_bytes"], r["peak_bytes"]
        assert measured >= declared - MiB, (r["algo"], r["pass"], declared, measured)
        if (r["algo"], r["pass"]) not in gaps:
            assert measured <= 1.01 * declared + MiB, (r["algo"], r["pass"], declared, measured)


@pytest.mark.gpu
def test_cudnn_rows_count_cudnns_memory_not_torchs_result():
    """A cudnn row's peak is what cuDNN takes beyond the operands and the result (its
    workspace), as for our kernels: checked against torch's own peak counter around the same
    prepared pass, less the one output torch allocates. Counting torch's result as workspace
    (a 6.1 MiB output here) fails it; so does a trace that misses cuDNN's workspace."""
    import cupy
    import torch

    from convbench.algos import reference

    problem = ConvProblem(n=8, c=64, h=56, w=56, k=64, r=3, s=3, pad=1)
    impl = registry.get("cudnn", "cuda")
    rows = traced_rows(["cudnn"], problem=problem, backend="cuda", layouts=LAYOUTS)
    assert len(rows) == 6
    for r in rows:
        assert r["status"] == "ok" and r["memory_method"] == "cupy-pool+torch-cuda", r["reason"]
        a, b = (cupy.asarray(v) for v in reference.random_operands(problem, r["pass"],
                                                                    r["layout"]))
        out = cupy.asarray(reference.nan_output(problem, r["pass"], r["layout"]))
        fn = impl.prepare(problem, r["pass"], r["layout"], "fp32")
        fn(a, b, out)  # cuDNN's plan and torch's cache made before the count
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn(a, b, out)
        torch.cuda.synchronize()
        cudnns = max(0, torch.cuda.max_memory_allocated() - base - out.nbytes)
        if r["pass"] != "bwd_filter":  # dw (147 KiB) is within the slack: the activations
            assert out.nbytes > 4 * MiB  # show the result is not counted (an H200 ran it)
        assert abs(r["peak_bytes"] - cudnns) <= MiB, (r["pass"], r["layout"], r["peak_bytes"],
                                                     cudnns)
        del fn, a, b, out


@pytest.mark.gpu
def test_cuda_limit_is_a_real_out_of_memory():
    import cupy

    pool = cupy.get_default_memory_pool()
    before = pool.get_limit()
    with memory.MemoryLimit(64 * MiB).enforce("cuda"), \
            pytest.raises(cupy.cuda.memory.OutOfMemoryError):
        cupy.empty(128 * MiB, cupy.uint8)
    assert pool.get_limit() == before


@pytest.mark.gpu
def test_memory_torch_keeps_is_given_back_for_cupy():
    """torch's cache holding most of the device (blocks freed but kept) would make a CuPy
    allocation fail; after `release_device_memory` it fits, as each GPU case now starts."""
    import cupy
    import torch

    free = cupy.cuda.Device().mem_info[0]
    hog = torch.empty(int(free * 0.9), dtype=torch.uint8, device="cuda")
    del hog  # freed, but torch keeps the block
    memory.release_device_memory("cuda")
    assert cupy.empty(int(free * 0.5), cupy.uint8).nbytes == int(free * 0.5)
