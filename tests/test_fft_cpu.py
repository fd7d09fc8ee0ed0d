"""`fft` on `numpy`: every pass, layout and precision against the float64 reference.

The grid placements wrap around the transform's edges (the grid is only H + pad wide), so the
shapes that matter are the awkward ones: padding larger than the filter, filters as large as the
padded input, 1-wide inputs, odd and rectangular sizes. Hypothesis draws those; the catalog
problems cover the shapes the benchmark runs.
"""

from __future__ import annotations

import dataclasses
import sys
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings

import convbench
from convbench import testing
from convbench.algos import fft, reference, registry
from convbench.catalogs.layers import net_layers
from convbench.core.problem import LAYOUTS, PASSES, ConvProblem
from convbench.machine import threads
from convbench.measure import verify

PRECISIONS = ("fp64", "fp32")
IMPL = registry.get("fft", "numpy")


def _distinct_stride_1(named):
    """The small catalog problems fft runs, each shape once, under its first layer's name."""
    seen = {}
    for name, p in named:
        if p.stride == 1:
            seen.setdefault(p, name)
    return list(seen.items())


CATALOG = _distinct_stride_1(testing.small_catalog_problems())


@pytest.mark.parametrize("problem", [p for p, _ in CATALOG], ids=[n for _, n in CATALOG])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_catalog_problems_match_reference(problem, layout):
    for pass_ in PASSES:
        for precision in PRECISIONS:
            testing.assert_matches_reference("fft", "numpy", problem, pass_, layout, precision)


@settings(max_examples=60, deadline=None)
@given(problem=testing.problem_strategy(max_stride=1, per_axis=True))
def test_drawn_problems_match_reference(problem):
    for pass_ in PASSES:
        for layout in LAYOUTS:
            for precision in PRECISIONS:
                testing.assert_matches_reference("fft", "numpy", problem, pass_, layout,
                                                 precision)


@pytest.mark.parametrize("problem", [
    ConvProblem(n=1, c=2, h=1, w=3, k=2, r=3, s=1, pad=1),  # filter covers all of the padded input
    ConvProblem(n=2, c=3, h=4, w=5, k=2, r=2, s=3, pad=3),  # padding larger than the filter
    ConvProblem(n=1, c=1, h=6, w=1, k=1, r=2, s=1),  # single channel, 1-wide
])
def test_edge_shapes_match_reference(problem):
    for pass_ in PASSES:
        for layout in LAYOUTS:
            testing.assert_matches_reference("fft", "numpy", problem, pass_, layout, "fp64")


@pytest.mark.parametrize("problem", [
    ConvProblem(n=3, c=3, h=7, w=6, k=5, r=3, s=2, pad=1),
    ConvProblem(n=5, c=1, h=9, w=4, k=3, r=4, s=1, pad=2),
])
@pytest.mark.parametrize("workers", [1, 3])
def test_many_chunks_on_every_worker_match_reference(problem, workers, monkeypatch):
    """One image or filter per chunk: several chunks per worker, plans reused across chunks
    that start off SIMD boundaries (odd sizes; one worker takes consecutive chunks)."""
    monkeypatch.setattr(fft, "CHUNK_BYTES", 1)
    monkeypatch.setattr(threads, "_count", workers)
    for pass_ in PASSES:
        for layout in LAYOUTS:
            for precision in PRECISIONS:
                testing.assert_matches_reference("fft", "numpy", problem, pass_, layout,
                                                 precision)


@pytest.mark.parametrize("pass_", PASSES)
def test_buffers_are_reused_across_calls(pass_):
    """The zero borders written in prepare must survive a call: run twice, check the second."""
    p = ConvProblem(n=2, c=3, h=9, w=8, k=4, r=3, s=4, pad=2)
    run = IMPL.prepare(p, pass_, "nhwc", "fp64")
    for seed in (0, 1):
        a, b = reference.random_operands(p, pass_, "nhwc", np.float64, seed)
        out = reference.nan_output(p, pass_, "nhwc", np.float64)
        run(a, b, out)
    ref = reference.reference(p, pass_, "nhwc", a, b)
    assert verify.check(out, ref, "fft", "fp64", p, pass_).ok


def test_a_1x1_filter_is_refused_with_its_reason():
    p = ConvProblem(n=1, c=8, h=7, w=7, k=8, r=1, s=1)
    for pass_ in PASSES:
        assert registry.supports(IMPL, p, pass_, "nhwc", "fp32") == (
            "1x1 filter: fft would repeat the GEMM's product at every frequency (the filter's "
            "spectrum is constant) after transforming K·C whole planes")
    wide = dataclasses.replace(p, s=2)  # a filter of two taps on one axis runs
    assert registry.supports(IMPL, wide, "fwd", "nhwc", "fp32") is None


@pytest.mark.parametrize("field", ["stride", "groups"])  # dilation: tests/test_dilation.py
def test_unsupported_combinations_give_a_reason(field):
    p = ConvProblem(n=1, c=4, h=9, w=9, k=4, r=3, s=3, **{field: 2})
    reason = registry.supports(IMPL, p, "fwd", "nchw", "fp32")
    assert reason and field in reason and "\n" not in reason
    testing.assert_matches_reference("fft", "numpy", p, "fwd", "nchw")  # skips, never raises


#: Per-axis padding is zeros on the grid, so FFT runs it; per-axis stride it refuses (dilation
#: runs as undilated phases, tests/test_dilation.py).
PER_AXIS_PAD = [p for p in testing.PER_AXIS_PROBLEMS if p.stride == p.dilation == p.groups == 1]


@pytest.mark.parametrize("problem", PER_AXIS_PAD, ids=str)
def test_per_axis_padding_matches_reference(problem):
    assert isinstance(problem.pad, tuple)
    for pass_ in PASSES:
        for layout in LAYOUTS:
            assert registry.supports(IMPL, problem, pass_, layout, "fp32") is None
            testing.assert_matches_reference("fft", "numpy", problem, pass_, layout, "fp32")


@pytest.mark.parametrize("change, reason", [
    ({"stride": (2, 1)}, "stride 2x1: fft supports stride 1 only, like cuDNN's FFT"),
    ({"stride": (1, 3)}, "stride 1x3: fft supports stride 1 only, like cuDNN's FFT"),
    # a dilation whose stride does not divide it has no undilated phases
    ({"dilation": (1, 3), "stride": (1, 2), "pad": (1, 2)},
     "stride 1x2: fft supports stride 1 only, like cuDNN's FFT"),
])
def test_per_axis_stride_is_refused(change, reason):
    p = dataclasses.replace(ConvProblem(n=1, c=4, h=9, w=9, k=4, r=3, s=3, pad=1), **change)
    for pass_ in PASSES:
        assert registry.supports(IMPL, p, pass_, "nhwc", "fp32") == reason


def test_functional_api_runs_fft_and_refuses_stride_2():
    p = ConvProblem(n=2, c=3, h=8, w=9, k=4, r=3, s=3, pad=1)
    x, w = reference.random_operands(p, "fwd", "nhwc", np.float32)
    y = convbench.conv2d(x, w, padding=1, algo="fft", layout="nhwc")
    assert verify.check(y, reference.reference(p, "fwd", "nhwc", x, w), "fft", "fp32", p).ok
    with pytest.raises(convbench.UnsupportedError, match="stride"):
        convbench.conv2d(x, w, stride=2, padding=1, algo="fft", layout="nhwc")


def test_unsupported_precision_gives_a_reason():
    p = ConvProblem(n=1, c=2, h=5, w=5, k=2, r=3, s=3)
    assert "fp16" in registry.supports(IMPL, p, "fwd", "nhwc", "fp16")


def test_fp32_runs_in_single_precision():
    p = ConvProblem(n=1, c=2, h=6, w=6, k=3, r=3, s=3, pad=1)
    geom = fft._geometry(p, "fwd", "nchw", "fp32")
    assert (geom.real, geom.cplx) == (np.float32, np.complex64)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_numpy_fallback_gives_the_same_answer(layout, monkeypatch):
    p = ConvProblem(n=2, c=3, h=10, w=7, k=4, r=3, s=2, pad=1)
    for pass_ in PASSES:
        for precision in PRECISIONS:
            dtype = np.float64 if precision == "fp64" else np.float32
            a, b = reference.random_operands(p, pass_, layout, dtype)
            want = reference.nan_output(p, pass_, layout, dtype)
            IMPL.prepare(p, pass_, layout, precision)(a, b, want)
            with monkeypatch.context() as m:
                m.setitem(sys.modules, "pyfftw", None)  # `import pyfftw` now fails
                assert IMPL.describe(p, pass_, layout, precision).startswith(
                    "numpy.fft (pyFFTW missing)")
                got = reference.nan_output(p, pass_, layout, dtype)
                IMPL.prepare(p, pass_, layout, precision)(a, b, got)
            ref = reference.reference(p, pass_, layout, a, b)
            assert verify.check(got, ref, "fft", precision, p, pass_).ok
            np.testing.assert_allclose(got, want, rtol=0, atol=50 * np.finfo(dtype).eps)


def test_describe_names_library_threads_and_transform():
    pyfftw = pytest.importorskip("pyfftw")
    conv2 = {layer.name: layer.problem for layer in net_layers("alexnet")}["conv2"]
    text = IMPL.describe(conv2, "fwd", "nchw", "fp32")
    assert text.startswith(f"pyFFTW {pyfftw.__version__}, ") and "threads" in text
    assert ", transform 30x30; " in text  # 27 + pad 2 = 29, rounded up to 2·3·5


def test_transform_sizes_are_fast_and_minimal():
    def smooth(m):
        for q in (2, 3, 5, 7):
            while m % q == 0:
                m //= q
        return m in (1, 11, 13)

    for n in range(1, 300):
        size = fft._fast_len(n)
        assert size >= n and smooth(size)
        assert not any(smooth(m) for m in range(n, size))


def test_workspace_scales_with_precision_and_holds_the_filter_spectrum():
    p = ConvProblem(n=2, c=16, h=13, w=13, k=32, r=3, s=3, pad=1)
    for pass_ in PASSES:
        for layout in LAYOUTS:
            fp32 = IMPL.workspace_bytes(p, pass_, layout, "fp32")
            assert IMPL.workspace_bytes(p, pass_, layout, "fp64") == 2 * fp32
            filter_spectrum = p.k * p.c * 14 * (14 // 2 + 1) * 8  # 13 + pad 1 = 14, complex64
            assert filter_spectrum < fp32 < 10 * filter_spectrum


@pytest.mark.parametrize("pass_", PASSES)
def test_workspace_is_what_prepare_allocates(pass_):
    """NumPy reports its allocations to tracemalloc; beyond the stated workspace, prepare may
    only add alignment slack and small Python objects."""
    p = ConvProblem(n=3, c=5, h=9, w=8, k=7, r=5, s=4, pad=3)
    IMPL.prepare(p, pass_, "nchw", "fp32")  # imports, thread pool and FFTW wisdom up front
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run = IMPL.prepare(p, pass_, "nchw", "fp32")
        allocated = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert run is not None
    workspace = IMPL.workspace_bytes(p, pass_, "nchw", "fp32")
    assert workspace <= allocated < workspace + (64 << 10)


@pytest.mark.parametrize("pass_", PASSES)
def test_fp32_error_on_alexnet_conv2_is_within_tolerance(pass_):
    conv2 = {layer.name: layer.problem for layer in net_layers("alexnet")}["conv2"]
    p = conv2.with_batch(1)
    chk = testing.run_and_check(IMPL, p, pass_, "nhwc", "fp32")
    assert chk.ok, chk.reason
    assert chk.tolerance == verify.tolerance("fft", "fp32", p, pass_)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
def test_phases_replay_the_pass(pass_, layout):
    """Both forward transforms, the product and the inverse, run one by one, give the full
    call's bits (padding per axis: the operands wrap around the grid)."""
    problem = ConvProblem(n=2, c=3, h=11, w=9, k=4, r=3, s=5, pad=(1, 2))
    testing.assert_phases_replay(registry.get("fft", "numpy"), problem, pass_, layout)


@pytest.mark.parametrize("workers", [1, 2, 5])
def test_transform_threads_follow_the_policy_and_the_chunks(workers, monkeypatch):
    """The workers are the run's thread policy, read when a pass is prepared (not a count frozen
    at import), at most one per chunk; the note says each operand's and the product's."""
    monkeypatch.setattr(fft, "CHUNK_BYTES", 1)  # one item per chunk
    monkeypatch.setattr(threads, "_count", workers)
    p = ConvProblem(n=2, c=3, h=9, w=8, k=4, r=3, s=3, pad=1)
    note = IMPL.describe(p, "fwd", "nchw", "fp32")
    lanes = f"{min(workers, 2)}/{min(workers, 4)}/{min(workers, 2)}"
    assert f"transform threads {lanes} (x/w/y" in note and f"{workers} threads" in note
    testing.assert_matches_reference("fft", "numpy", p, "fwd", "nchw", "fp32")
