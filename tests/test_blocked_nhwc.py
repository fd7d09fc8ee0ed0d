"""The nhwc register-blocked kernels (channels in the lanes): every geometry against the
float64 reference, the rules that shape them, and the hot loop's machine code."""

from __future__ import annotations

import numpy as np
import pytest

from convbench.algos import blocked_llvm, blocked_nhwc, grouped_jit, jit, reference
from convbench.core.problem import ConvProblem

pytestmark = pytest.mark.skipif(jit.available() is not None, reason="Numba/llvmlite not here")

BITS = blocked_llvm.vector_bits()


def _run(problem: ConvProblem, pass_: str, dtype=np.float32, threads: int = 2,
         cpu: str = "") -> None:
    """The pass on random nhwc operands, the filter as the krsc array's (G, kg, cg, R, S) view
    (bwd_data of stride 1: flipped and transposed, a view too), against the float64
    reference; dx/y start as NaN, so a pixel never written fails."""
    a, b = reference.random_operands(problem, pass_, "nhwc", dtype=dtype, seed=5)
    grouped = grouped_jit._group_filter(b, problem, "nhwc")
    flip = pass_ == "bwd_data" and not blocked_llvm.phased(problem, pass_)
    w = grouped[:, :, :, ::-1, ::-1].transpose(0, 2, 1, 3, 4) if flip else grouped
    out = reference.nan_output(problem, pass_, "nhwc", dtype)
    blocked_nhwc.make(problem, pass_, dtype, flipped=False, cpu=cpu, threads_=threads)(
        np.ascontiguousarray(a), w, out)
    want = reference.reference(problem, pass_, "nhwc", a, b)
    scale = reference.magnitudes(problem, pass_, "nhwc", a, b)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert np.all(np.isfinite(out)), "a pixel was never written"
    assert np.max(np.abs(out - want) / (scale + 1e-30)) < tol


#: Geometries, each compiled once (a kernel, or a strided bwd_data's per phase): vectors of
#: 16, 8 and 4 lanes, 1-4 of them a block, rows with and without a shorter last block,
#: strides, dilation, asymmetric pads, a group's output channels that need a filter's
#: transposed view.
CASES = [
    ("fwd", ConvProblem(n=2, c=32, h=9, w=17, k=32, r=3, s=3, pad=1, groups=2)),  # 9 + 8
    ("fwd", ConvProblem(n=1, c=12, h=11, w=13, k=96, r=3, s=2, stride=(2, 1),
                        pad=((1, 2), (0, 1)), groups=2)),  # kg 48: 3 (or 6) vectors
    ("fwd", ConvProblem(n=2, c=6, h=12, w=10, k=24, r=3, s=3, pad=2, dilation=2,
                        groups=3)),  # kg 8
    ("fwd", ConvProblem(n=1, c=10, h=7, w=30, k=8, r=1, s=5, stride=(1, 3), pad=(0, 2),
                        groups=2)),  # kg 4, stride 3 across
    ("fwd", ConvProblem(n=3, c=64, h=24, w=23, k=64, r=3, s=3, pad=1, groups=8)),  # images
    # outer, two blocks of 4 groups
    ("fwd", ConvProblem(n=3, c=64, h=6, w=6, k=32, r=2, s=3, pad=1, groups=8)),  # groups outer
    ("bwd_data", ConvProblem(n=2, c=32, h=7, w=7, k=32, r=3, s=3, pad=1, groups=2)),
    ("bwd_data", ConvProblem(n=1, c=24, h=9, w=10, k=12, r=3, s=3, stride=2, pad=1,
                             groups=3)),  # four phases of unequal counts, kg 8 of dx
    ("bwd_data", ConvProblem(n=1, c=16, h=7, w=8, k=8, r=1, s=1, stride=2, groups=2)),
]


@pytest.mark.parametrize("pass_, problem", CASES, ids=[f"{p}-{i}" for i, (p, _) in
                                                        enumerate(CASES)])
def test_the_kernels_match_the_reference(pass_, problem):
    assert blocked_nhwc.applies(problem, pass_)
    _run(problem, pass_, threads=3)  # 3 threads: a thread's groups change inside its range


def test_the_cases_order_their_tasks_both_ways():
    """Among CASES, tasks by block of groups and by image, each over several blocks."""
    gms = [blocked_nhwc.geometries(p, pass_, np.float32, BITS)[0] for pass_, p in CASES]
    assert any(gm.images_outer and gm.gb < gm.g for gm in gms)
    assert any(not gm.images_outer and gm.gb < gm.g for gm in gms)


def test_a_zero_phase_and_float64():
    """A 1x1 filter at stride 2 reaches one phase of dx: the other three are zeroed (over
    NaN); float64 on a second problem (vectors of half the lanes)."""
    p = CASES[-1][1]
    assert [gm is None for gm in blocked_nhwc.geometries(p, "bwd_data", np.float32, BITS)] \
        == [False, True, True, True]
    _run(ConvProblem(n=1, c=8, h=6, w=9, k=16, r=3, s=3, pad=1, groups=2), "fwd",
         np.float64, threads=1)


def test_bands_of_output_rows(monkeypatch):
    """A small BAND_BYTES cuts each image into bands (the last one short), each copying its
    own rows with the zero border where they pass the image's edge; two groups of 8 channels
    a task (`group_block`), side by side in its rows."""
    monkeypatch.setattr(blocked_nhwc, "BAND_BYTES", 4096)
    p = ConvProblem(n=1, c=16, h=13, w=9, k=16, r=3, s=3, stride=(2, 1), pad=1, groups=2)
    gm = blocked_nhwc.geometries(p, "fwd", np.float32, BITS)[0]
    assert 1 < gm.band < p.p and p.p % gm.band and gm.gb == 2 and gm.tasks == gm.bands
    _run(p, "fwd")


def test_bands_give_every_thread_work():
    """Fewer images x groups than two tasks a thread: the rows are split into bands."""
    p = ConvProblem(n=1, c=16, h=20, w=20, k=16, r=3, s=3, pad=1, groups=1)
    assert blocked_nhwc.geometries(p, "fwd", np.float32, BITS, threads_=1)[0].bands == 2
    assert blocked_nhwc.geometries(p, "fwd", np.float32, BITS, threads_=2)[0].bands == 4


def test_the_rules_of_lanes_and_blocks():
    """Lanes: the widest vector dividing a group's output channels, none under 4; a block:
    the most vectors (up to 4, 2 with 16 registers) dividing them, pixels as PIXELS allows,
    evened out over the row."""
    assert blocked_nhwc.lanes_for(16, 512, np.float32) == 16
    assert blocked_nhwc.lanes_for(24, 512, np.float32) == 8
    assert blocked_nhwc.lanes_for(16, 512, np.float64) == 8
    assert blocked_nhwc.lanes_for(6, 512, np.float32) == 0
    assert blocked_nhwc.block(16, 7, 16, 512) == (1, 7)
    assert blocked_nhwc.block(16, 28, 16, 512) == (1, 14)
    assert blocked_nhwc.block(16, 17, 16, 512) == (1, 9)  # 9 + 8, not 14 + 3
    assert blocked_nhwc.block(64, 14, 16, 512) == (4, 5)  # 5 + 5 + 4
    assert blocked_nhwc.block(48, 14, 16, 512) == (3, 5)  # 6 at most: 5 + 5 + 4
    assert blocked_nhwc.block(16, 14, 8, 256) == (2, 4)  # 16 registers: 4 + 4 + 4 + 2
    assert blocked_nhwc.block(32, 14, 8, 256) == (2, 4)  # 4 vectors, 2 a block
    assert not blocked_nhwc.applies(ConvProblem(n=1, c=12, h=8, w=8, k=12, r=3, s=3, pad=1,
                                                groups=2), "fwd")  # 6 a group
    assert not blocked_nhwc.applies(ConvProblem(n=1, c=16, h=8, w=8, k=16, r=3, s=3, pad=1,
                                                groups=2), "bwd_filter")


@pytest.mark.parametrize("kg", [16, 48, 64])
def test_the_hot_loop_keeps_its_sums_in_registers(kg):
    """Per input channel of a 3x3 filter: pb x kv x 9 FMAs on the widest vectors, no vector on
    the stack (a loop bound may be), at most (kv + pb) loads per kv·pb FMAs (a broadcast input
    shared by two taps is loaded once); 1, 3 and 4 vectors a block on AVX-512."""
    p = ConvProblem(n=1, c=32, h=8, w=44, k=2 * kg, r=3, s=3, pad=1, groups=2)
    gm = blocked_nhwc.geometries(p, "fwd", np.float32, BITS)[0]
    assert any(inside is None for *_, inside in blocked_nhwc.column_blocks(gm))  # a loop
    loop = blocked_llvm.hot_loop(blocked_llvm.assembly(gm))
    assert loop.fmas == gm.pb * gm.kv * 9 and loop.vector_stack_refs == 0
    assert loop.register == {512: "zmm", 256: "ymm", 128: "xmm"}[BITS]
    assert loop.loads_per_fma <= (gm.kv + gm.pb) / (gm.kv * gm.pb)


def _host_features() -> dict:
    import llvmlite.binding as llvm

    return dict(llvm.get_host_cpu_features())


@pytest.mark.skipif(BITS != 512 or not all(_host_features().get(f) for f in ("avx2", "fma")),
                    reason="AVX2 compiled and run beside the host's AVX-512 only")
def test_avx2_kernels_of_16_registers():
    """Compiled for Haswell (16 vector registers, 8 lanes): 2 vectors x 4 pixels a block on a
    group of 16, against the reference; the hot loop in ymm with no vector spilled."""
    p = ConvProblem(n=2, c=32, h=9, w=14, k=32, r=3, s=3, pad=1, groups=2)
    gm = blocked_nhwc.geometries(p, "fwd", np.float32, 256, cpu="haswell", threads_=2)[0]
    assert (gm.lanes, gm.kv, gm.pb) == (8, 2, 4)
    loop = blocked_llvm.hot_loop(blocked_llvm.assembly(gm))
    assert loop.register == "ymm" and loop.vector_stack_refs == 0
    a, b = reference.random_operands(p, "fwd", "nhwc", seed=5)
    out = reference.nan_output(p, "fwd", "nhwc")
    blocked_nhwc.Kernel(gm, 2)(np.ascontiguousarray(a),
                               grouped_jit._group_filter(b, p, "nhwc"), out)
    want = reference.reference(p, "fwd", "nhwc", a, b)
    scale = reference.magnitudes(p, "fwd", "nhwc", a, b)
    assert np.max(np.abs(out - want) / scale) < 1e-5
