"""`cudnn-find-*` on the CPU, through a fake libcudnn (tests/fake_libcudnn.c, built here with
gcc): the ctypes signatures, descriptors and strides of both layouts, the find's entries and
their names, the math types a precision may run, status handling; the fake computes every pass
naively from the descriptors it was given, so a marshalling mistake shows as a wrong answer
against the float64 reference. The real library is checked by the `gpu` test at the end."""

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from convbench.algos import cudnn_find as cf
from convbench.algos import reference, registry
from convbench.core.problem import ConvProblem
from convbench.measure import runner

#: `convbench gpu-first` runs this file's `gpu` tests first (a pin).
pytestmark = pytest.mark.gpu_pins

SOURCE = Path(__file__).with_name("fake_libcudnn.c")
PROBLEM = ConvProblem(n=2, c=4, h=7, w=6, k=6, r=3, s=2, stride=(2, 1), pad=(1, 0),
                      dilation=(1, 2), groups=2)


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler for the fake libcudnn")
    lib = tmp_path_factory.mktemp("fake") / "libcudnn.so.9"
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(lib), str(SOURCE)], check=True)
    return cf.Binding.load(str(lib))


def pointer(a: np.ndarray) -> int:
    return a.ctypes.data


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("pass_", ["fwd", "bwd_data", "bwd_filter"])
def test_each_found_algorithm_runs_the_pass_it_was_described(fake, pass_, layout):
    a, b = reference.random_operands(PROBLEM, pass_, layout, np.float32, 0)
    want = reference.reference(PROBLEM, pass_, layout, a, b)
    out = np.full(PROBLEM.operand_shapes(pass_, layout)[2], np.nan, np.float32)
    handle = fake.handle()
    with cf.Descriptors(fake, PROBLEM, pass_, layout, "fp32") as desc:
        perfs = cf.find(fake, handle, desc, pointer(a), pointer(b), pointer(out), 0, 1 << 21)
        ran = [p for p in perfs if p.ok]
        # the descriptor's math type came back (the fake's one tensor-op entry apart)
        assert [p.math for p in ran].count("FMA_MATH") == len(ran) - (pass_ == "fwd")
        for enum in dict.fromkeys(p.algo for p in ran):
            chosen = cf.choose(perfs, enum, "fp32")
            if pass_ == "fwd" and enum == "WINOGRAD_NONFUSED":
                continue  # the fake's faulting algorithm (below)
            out[...] = np.nan
            cf.run(fake, handle, desc, chosen.enum, pointer(a), pointer(b), pointer(out), 0,
                   chosen.workspace)
            err = np.linalg.norm(out - want) / np.linalg.norm(want)
            assert err < 1e-5, (enum, err)
    assert fake.lib.fake_live_descriptors() == 0


def test_the_find_s_entries_are_named_and_chosen_by_precision(fake):
    a, b = reference.random_operands(PROBLEM, "fwd", "nchw", np.float32, 0)
    out = np.empty(PROBLEM.operand_shapes("fwd", "nchw")[2], np.float32)
    with cf.Descriptors(fake, PROBLEM, "fwd", "nchw", "fp32") as desc:
        perfs = cf.find(fake, fake.handle(), desc, pointer(a), pointer(b), pointer(out), 0, 0)
    assert [(p.algo, p.status) for p in perfs] == [
        ("IMPLICIT_PRECOMP_GEMM", "CUDNN_STATUS_SUCCESS"),
        ("IMPLICIT_PRECOMP_GEMM", "CUDNN_STATUS_SUCCESS"),
        ("IMPLICIT_GEMM", "CUDNN_STATUS_SUCCESS"), ("FFT", "CUDNN_STATUS_SUCCESS"),
        ("WINOGRAD_NONFUSED", "CUDNN_STATUS_SUCCESS"), ("WINOGRAD", "CUDNN_STATUS_NOT_SUPPORTED")]
    assert perfs[1].math == "TENSOR_OP_MATH" and perfs[2].workspace == 1024
    # fp32 never runs a tensor-op entry (TF32); tf32 takes the faster one
    assert cf.choose(perfs, "IMPLICIT_PRECOMP_GEMM", "fp32").time_ms == pytest.approx(0.5)
    assert cf.choose(perfs, "IMPLICIT_PRECOMP_GEMM", "tf32").time_ms == pytest.approx(0.1)
    assert not cf.choose(perfs, "WINOGRAD", "fp32").ok
    assert cf.choose(perfs, "DIRECT", "fp32") is None
    assert cf.note(perfs, cf.choose(perfs, "FFT", "fp32"), "fp32") == (
        "cuDNN find: 0.6 ms (rank 2 of 4), workspace 1048576 B, deterministic, FMA_MATH")


def test_a_failing_call_raises_with_cudnn_s_status_and_a_fault_is_sticky(fake):
    with pytest.raises(cf.CudnnError, match="cudnnSetConvolutionGroupCount: "
                       "CUDNN_STATUS_BAD_PARAM"):
        _bad_groups(fake)
    a, b = reference.random_operands(PROBLEM, "fwd", "nhwc", np.float32, 0)
    out = np.empty(PROBLEM.operand_shapes("fwd", "nhwc")[2], np.float32)
    with (cf.Descriptors(fake, PROBLEM, "fwd", "nhwc", "fp32") as desc,
          pytest.raises(cf.CudnnError) as exc):
        cf.run(fake, fake.handle(), desc, cf.ALGO_ENUMS["fwd"].index("WINOGRAD_NONFUSED"),
               pointer(a), pointer(b), pointer(out), 0, 4096)
    assert str(exc.value) == "cudnnConvolutionForward: CUDNN_STATUS_EXECUTION_FAILED"
    assert runner.is_sticky_fault(exc.value)
    assert fake.lib.fake_live_descriptors() == 0


def test_the_find_and_the_runner_agree_on_what_ends_a_run(monkeypatch):
    """An error the find re-raises as sticky is one the runner stops the run on, and one it
    answers as `unsupported` is not: a mapping error by its words; an INTERNAL_ERROR (also
    cuDNN's answer to a configuration it cannot run) by whether the device still runs a
    kernel."""
    from convbench.machine import faults

    mapping = cf.CudnnError("cudnnConvolutionForward: CUDNN_STATUS_MAPPING_ERROR")
    assert cf._sticky(mapping) and runner._not_measured(mapping).fatal
    internal = cf.CudnnError("cudnnFindConvolutionForwardAlgorithmEx: "
                             "CUDNN_STATUS_INTERNAL_ERROR")
    monkeypatch.setattr(faults, "device_usable", lambda: None)
    assert not cf._sticky(internal) and not runner._not_measured(internal).fatal
    monkeypatch.setattr(faults, "device_usable", lambda: "CUDARuntimeError: illegal address")
    assert cf._sticky(internal)
    assert runner._not_measured(faults.DeviceUnusable(f"cuDNN's find: {internal}")).fatal


def _bad_groups(fake):
    """A group count cuDNN refuses, through the descriptor calls."""
    desc = fake._create("ConvolutionDescriptor")
    try:
        fake.call("cudnnSetConvolutionGroupCount", desc, 0)
    finally:
        fake.lib.cudnnDestroyConvolutionDescriptor(ctypes.c_void_p(desc))


def test_every_cudnn_algorithm_is_an_algo_of_its_own():
    registry.load()
    assert registry.expand_algos("cudnn-find", "cuda") == list(cf.ALGO_NAMES)
    assert len(cf.ALGO_NAMES) == 11 and "cudnn-find-implicit-precomp-gemm" in cf.ALGO_NAMES
    assert not set(cf.ALGO_NAMES) & set(registry.expand_algos("all", "cuda"))
    impl = registry.get("cudnn-find-fft-tiling", "cuda")
    assert impl.supports(PROBLEM, "bwd_filter", "nchw", "fp32") is None
    assert "no ALGO_3 algorithm for fwd" in registry.get("cudnn-find-algo-3", "cuda").supports(
        PROBLEM, "fwd", "nchw", "fp32")
    # cuDNN documents these as nondeterministic (atomics in the backward passes)
    assert not any(registry.algorithm(a).deterministic
                   for a in ("cudnn-find-algo-0", "cudnn-find-algo-3"))
    assert registry.algorithm("cudnn-find-implicit-precomp-gemm").deterministic


@pytest.mark.gpu
def test_cudnn_find_on_the_real_library():
    from convbench.catalogs.layers import Layer

    p = ConvProblem(n=4, c=16, h=14, w=14, k=32, r=3, s=3, pad=1)
    cases = runner.sweep([Layer("custom", "c", p)], list(cf.ALGO_NAMES), "cuda",
                         ["fwd", "bwd_data", "bwd_filter"], ["nchw", "nhwc"], ["fp32"])
    rows = runner.run(cases, 0.01)
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) >= 6 and all(r["note"].startswith("cuDNN find: ") for r in ok)
    assert not [r for r in rows if r["status"] == "failed"]


def test_cudnn_s_fft_and_winograd_are_judged_with_their_own_tolerances():
    """Not the exact column (1e-5, 2.5x our own 4x4 Winograd's measured error): cuDNN's
    transforms round like ours."""
    from convbench.measure import verify

    p = ConvProblem(n=8, c=64, h=27, w=27, k=192, r=5, s=5, pad=2)
    exact = verify.tolerance("cudnn-find-gemm", "fp32", p, "fwd")
    assert verify.tolerance("cudnn-find-fft", "fp32", p, "fwd") == \
        verify.tolerance("fft", "fp32", p, "fwd") > exact
    assert verify.tolerance("cudnn-find-fft-tiling", "fp32", p) == verify.tolerance("fft", "fp32", p)
    for algo in ("cudnn-find-winograd", "cudnn-find-winograd-nonfused"):
        assert verify.tolerance(algo, "fp32", p, "bwd_data") == \
            verify.tolerance("winograd-4x4", "fp32", None) * max(
                1.0, (verify.reduction_length(p, "bwd_data") / 4096) ** 0.5)


class _Spoilt(registry.Implementation):
    """torch's CPU convolution with every output element off by `scale` - 1 (relative), standing
    in for a cuDNN algorithm that rounds more than it is allowed."""

    backend = "numpy"
    precisions = ("fp32",)

    def __init__(self, algo: str, scale: float):
        self.algo, self.scale, self.inner = algo, scale, registry.get("torch-cpu", "numpy")

    def supports(self, problem, pass_, layout, precision):
        return None

    def prepare(self, problem, pass_, layout, precision):
        fn = self.inner.prepare(problem, pass_, layout, precision)

        def run(a, b, out):
            fn(a, b, out)
            out *= self.scale

        return run


def test_cudnn_s_winograd_on_a_5x5_filter_past_its_tolerance_is_inexact_not_excused():
    """On an H200, torch's fp32 weight gradient of AlexNet's conv2 (batch 256, 5x5) ran cuDNN's
    Winograd-nonfused with 5.1e-3 relative error, about 7x the alpha-6 column cuDNN's Winograd
    is judged by. No looser column excuses it: the row is `inexact`, timed, its error said."""
    from convbench.catalogs.layers import Layer, resolve
    from convbench.measure import verify

    algo = "cudnn-find-winograd-nonfused"
    conv2 = resolve("conv2").problem.with_batch(256)
    assert verify.tolerance(algo, "fp32", conv2, "bwd_filter") < 5.1e-3 / 5
    small = ConvProblem(n=2, c=3, h=9, w=9, k=4, r=5, s=5, pad=2)
    cases = runner.sweep([Layer("alexnet", "conv2", small)], [algo], "numpy", ["bwd_filter"],
                         ["nchw"], ["fp32"])
    (row,) = runner.run(cases, 0.002, {algo: _Spoilt(algo, 1 + 5.1e-3)})
    assert row["status"] == "inexact" and row["median_ms"] > 0
    assert row["tolerance"] == verify.tolerance(algo, "fp32", small, "bwd_filter")
    assert f"> tolerance {row['tolerance']:.3g}" in row["reason"]


def test_the_find_s_workspace_cap_and_what_alloc_failed_means():
    """The cap fits cuDNN's explicit GEMM at batch 256 (the im2col matrix: 1.2 GB on AlexNet's
    conv2) within half the free memory; an algorithm still shut out says it is the cap."""
    col = 256 * 64 * 25 * 27 * 27 * 4  # AlexNet conv2's im2col matrix, bytes
    assert cf.find_workspace_bytes(70 << 30) >= col > 1 << 30
    assert cf.find_workspace_bytes(2 << 30) == 1 << 30
    perf = cf.Perf("GEMM", cf.ALLOC_FAILED, -1.0, 0, True, "FMA_MATH", 2, 3)
    why = cf.reason(perf, 1 << 30)
    assert "more workspace than the 1 GiB the find was given" in why
    assert "not the GPU out of memory" in why
    # the row is `unsupported` with that reason, never read as an out-of-memory
    assert runner._not_measured(registry.UnsupportedError(why)).status == "unsupported"
    assert cf.reason(cf.Perf("FFT", "CUDNN_STATUS_NOT_SUPPORTED", -1.0, 0, True, "FMA_MATH",
                             4, 3), 0) == "cuDNN's find: CUDNN_STATUS_NOT_SUPPORTED"


def test_a_library_that_cannot_load_is_one_reason_for_every_algorithm(monkeypatch, tmp_path):
    """Every cudnn-find algorithm is unavailable with the same one-line reason (not a failed
    row per case), asked of the library once."""
    import sys
    import types

    broken = tmp_path / "libcudnn.so.9"
    broken.write_text("not a library")
    monkeypatch.setenv("CONVBENCH_CUDNN_LIBRARY", str(broken))
    fake_torch = types.SimpleNamespace(backends=types.SimpleNamespace(
        cudnn=types.SimpleNamespace(version=lambda: 91000)))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    cf._binding.cache_clear()
    try:
        why = cf.unavailable()
        assert why.startswith(f"cannot bind {broken}: OSError") and "\n" not in why
        with pytest.raises(RuntimeError, match="cannot bind"):
            cf.binding()
    finally:
        cf._binding.cache_clear()


@pytest.mark.gpu
def test_cudnn_s_gemm_is_not_shut_out_at_batch_256():
    """The review's prediction: with a 1 GiB find workspace, cuDNN's GEMM on AlexNet's conv2
    at batch 256 was `CUDNN_STATUS_ALLOC_FAILED`; within half the free memory it runs."""
    from convbench.catalogs.layers import net_layers

    conv2 = next(la for la in net_layers("alexnet") if la.name == "conv2")
    rows = runner.run(runner.sweep([conv2], ["cudnn-find-gemm"], "cuda", ["fwd"], ["nchw"],
                                   ["fp32"]), 0.01)
    # what the fix is about: the find's workspace cap no longer shuts cuDNN's GEMM out (cuDNN 9
    # on sm_90 may still answer NOT_SUPPORTED, for reasons of its own)
    assert cf.ALLOC_FAILED not in (rows[0]["reason"] or ""), rows[0]["reason"]
    assert rows[0]["status"] in ("ok", "unsupported"), rows[0]["reason"]
