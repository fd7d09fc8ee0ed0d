"""The nhwc register-blocked kernels (channels in the lanes): every geometry against the
float64 reference, the rules that shape them, and the hot loop's machine code; fwd and
bwd_data (`Geometry`), then bwd_filter (`Gradient`)."""

from __future__ import annotations

import numpy as np
import pytest

from convbench import testing
from convbench.algos import blocked_llvm, blocked_nhwc, grouped_jit, jit, reference, registry
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
    assert blocked_nhwc.applies(ConvProblem(n=1, c=16, h=8, w=8, k=16, r=3, s=3, pad=1,
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


# --- bwd_filter ----------------------------------------------------------------------------------

def _run_gradient(problem: ConvProblem, dtype=np.float32, threads: int = 2, cpu: str = "",
                  bits: int = BITS, layout: str = "nhwc") -> None:
    """bwd_filter on random nhwc x and dy, dw written through the (G, kg, cg, R, S) view of
    `layout`'s filter (krsc or kcrs: other strides), against the float64 reference; dw starts
    as NaN, so a tap never written fails."""
    x, dy = reference.random_operands(problem, "bwd_filter", "nhwc", dtype=dtype, seed=7)
    out = np.full(problem.w_shape(layout), np.nan, dtype)
    gm = blocked_nhwc.gradient_geometry(problem, dtype, bits, cpu)
    blocked_nhwc.GradientKernel(gm, threads)(np.ascontiguousarray(x), np.ascontiguousarray(dy),
                                             grouped_jit._group_filter(out, problem, layout))
    if layout == "nchw":  # kcrs -> krsc, the reference's nhwc filter
        out = out.transpose(0, 2, 3, 1)
    want = reference.reference(problem, "bwd_filter", "nhwc", x, dy)
    scale = reference.magnitudes(problem, "bwd_filter", "nhwc", x, dy)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert np.all(np.isfinite(out)), "a tap was never written"
    assert np.max(np.abs(out - want) / (scale + 1e-30)) < tol


#: bwd_filter's geometries: 16 channels a group (one vector, 16 inputs a block), 48 output
#: channels (3 vectors, one a block) of 6 inputs, 8 and 4 lanes, a dense layer (4 vectors a
#: block), strides, dilation, asymmetric pads, and taps that reach no pixel (their dw zero).
GRADIENT_CASES = [
    ConvProblem(n=2, c=32, h=9, w=17, k=32, r=3, s=3, pad=1, groups=2),
    ConvProblem(n=1, c=12, h=11, w=13, k=96, r=3, s=2, stride=(2, 1), pad=((1, 2), (0, 1)),
                groups=2),
    ConvProblem(n=2, c=6, h=12, w=10, k=24, r=3, s=3, pad=2, dilation=2, groups=3),
    ConvProblem(n=3, c=64, h=6, w=6, k=32, r=2, s=3, pad=1, groups=8),
    ConvProblem(n=2, c=16, h=8, w=9, k=128, r=3, s=3, stride=2, pad=1),
    ConvProblem(n=1, c=16, h=2, w=2, k=16, r=3, s=3, pad=((2, 0), (2, 0))),
]


@pytest.mark.parametrize("problem", GRADIENT_CASES, ids=[str(i) for i in range(len(GRADIENT_CASES))])
def test_the_gradient_kernels_match_the_reference(problem):
    assert blocked_nhwc.applies(problem, "bwd_filter")
    _run_gradient(problem, threads=3)  # tasks split unevenly: a thread's groups change


def test_the_gradient_writes_through_any_strides_and_in_float64():
    """dw through the kcrs filter's view (nchw's: the taps contiguous, not the channels), and
    float64 (vectors of half the lanes), a thread alone."""
    _run_gradient(GRADIENT_CASES[0], layout="nchw")
    _run_gradient(ConvProblem(n=1, c=8, h=6, w=9, k=16, r=3, s=3, pad=1, groups=2), np.float64,
                  threads=1)


def test_a_tap_that_reaches_no_pixel_sums_nothing():
    """With two rows and columns of top-left padding, tap row 0 and column 0 of a 3x3 filter
    read only the border (`blocked_llvm.reach` is empty): their dw is written as zero."""
    gm = blocked_nhwc.gradient_geometry(GRADIENT_CASES[-1], np.float32, BITS)
    assert blocked_llvm.reach(0 * gm.dh, gm.sh, gm.pt, gm.h, gm.p) == (2, 2)
    assert blocked_llvm.reach(1 * gm.dh, gm.sh, gm.pt, gm.h, gm.p) == (1, 2)


def test_the_rules_of_gradient_blocks():
    """The most sums (kv·pb) that CHANNELS allows with kv dividing the group's vectors and pb
    its input channels; of equal sums, the most vectors (the fewest loads a multiply-add)."""
    assert blocked_nhwc.gradient_block(16, 16, 16, 512) == (1, 16)
    assert blocked_nhwc.gradient_block(16, 64, 16, 512) == (4, 4)  # 16 sums, 4 vectors
    assert blocked_nhwc.gradient_block(384, 256, 16, 512) == (4, 6)  # 24 sums
    assert blocked_nhwc.gradient_block(6, 48, 16, 512) == (1, 6)  # 3 vectors: one a block
    assert blocked_nhwc.gradient_block(16, 16, 8, 256) == (2, 4)  # 16 registers
    gm = blocked_nhwc.gradient_geometry(GRADIENT_CASES[0], np.float32, 512)
    assert gm.tasks == 2 * 1 * 3  # groups x blocks of vectors x rows of taps


@pytest.mark.parametrize("cg, kg", [(16, 16), (8, 8), (64, 64)])
def test_the_gradient_hot_loop_keeps_its_sums_in_registers(cg, kg):
    """Per output pixel: kv vectors of dy loaded, pb inputs broadcast, kv·pb FMAs (LLVM may
    unroll the loop), no vector on the stack."""
    p = ConvProblem(n=2, c=2 * cg, h=14, w=14, k=2 * kg, r=3, s=3, pad=1, groups=2)
    gm = blocked_nhwc.gradient_geometry(p, np.float32, BITS)
    loop = blocked_llvm.hot_loop(blocked_llvm.assembly(gm))
    assert loop.fmas % (gm.kv * gm.pb) == 0 and loop.fmas > 0 and loop.vector_stack_refs == 0
    assert loop.register == {512: "zmm", 256: "ymm", 128: "xmm"}[gm.lanes * 32]
    assert loop.loads_per_fma <= (gm.kv + gm.pb) / (gm.kv * gm.pb) + 1e-9


@pytest.mark.skipif(BITS != 512 or not all(_host_features().get(f) for f in ("avx2", "fma")),
                    reason="AVX2 compiled and run beside the host's AVX-512 only")
def test_avx2_gradient_kernels():
    """bwd_filter compiled for Haswell: 2 vectors x 4 inputs on a group of 16, against the
    reference."""
    p = ConvProblem(n=2, c=32, h=9, w=14, k=32, r=3, s=3, pad=1, groups=2)
    gm = blocked_nhwc.gradient_geometry(p, np.float32, 256, "haswell")
    assert (gm.lanes, gm.kv, gm.pb) == (8, 2, 4)
    assert blocked_llvm.hot_loop(blocked_llvm.assembly(gm)).vector_stack_refs == 0
    _run_gradient(p, cpu="haswell", bits=256)


def test_direct_probes_the_gradient_kernel(monkeypatch):
    """A grouped nhwc bwd_filter probes the kernel beside the nchw ways (which copy x and dy to
    nchw): whichever it keeps, dw matches the reference and the note names it; kept, the pass
    holds its scratch alone."""
    problem = ConvProblem(n=2, c=64, h=7, w=7, k=64, r=3, s=3, pad=1, groups=4)
    assert grouped_jit.applies(problem)
    assert grouped_jit.nhwc_blocked(problem, "bwd_filter", "nhwc", np.float32)
    direct = registry.get("direct", "numpy")
    monkeypatch.setattr(grouped_jit, "_KERNEL_CHOICE", {})
    probing = direct.workspace_bytes(problem, "bwd_filter", "nhwc", "fp32")
    for name in ("numba", blocked_nhwc.NAME):
        monkeypatch.setattr(grouped_jit, "probe_kernels",
                            lambda ways, a, w, out, name=name: name)
        monkeypatch.setattr(grouped_jit, "_KERNEL_CHOICE", {})
        testing.assert_matches_reference("direct", "numpy", problem, "bwd_filter", "nhwc", "fp32")
        note = direct.describe(problem, "bwd_filter", "nhwc", "fp32")
        assert f"[probed: {name}]" in note
    assert "16 input channels x 1 vectors of 16" in note or BITS != 512
    assert direct.workspace_bytes(problem, "bwd_filter", "nhwc", "fp32") < probing
