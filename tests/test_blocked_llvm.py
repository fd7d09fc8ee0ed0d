"""The register-blocked kernels (`blocked_llvm`): every geometry against the float64
reference, on the host's vectors and on AVX2's, each block shape and its tails; the pass keeps
the kernel it probed and its output is that kernel's; the hot loop is what the module promises."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convbench import testing
from convbench.algos import blocked_llvm, blocked_nhwc, grouped_jit, jit, reference, registry
from convbench.core.problem import ConvProblem

pytestmark = pytest.mark.skipif(jit.available() is not None, reason="Numba/llvmlite not here")


def _host_features() -> dict:
    import llvmlite.binding as llvm

    return dict(llvm.get_host_cpu_features())


#: (vector bits, cpu name) the kernels are checked on: the host's, and AVX2's where it runs here.
TARGETS = [(blocked_llvm.vector_bits(), "")]
if blocked_llvm.vector_bits() == 512 and all(_host_features().get(f) for f in ("avx2", "fma")):
    TARGETS.append((256, "haswell"))


def _run(problem: ConvProblem, pass_: str, dtype, block, bits, cpu, threads=2) -> None:
    """The kernel's output of pass_ on random operands against the float64 reference."""
    a, b = reference.random_operands(problem, pass_, "nchw", dtype=dtype, seed=3)
    g = problem.groups
    if pass_ == "bwd_filter":  # (x, dy) -> float64 sums, added into
        w = np.ascontiguousarray(b)
        out = np.zeros((g, problem.k // g, problem.c // g, problem.r, problem.s), np.float64)
    elif pass_ == "fwd":
        w = np.ascontiguousarray(b)
        out = np.full(problem.y_shape("nchw"), np.nan, dtype)
    else:  # the forward kernel on dy: the filter flipped and transposed (G, C/G, K/G, R, S)
        grouped = b.reshape(g, problem.k // g, problem.c // g, problem.r, problem.s)
        w = np.ascontiguousarray(grouped[:, :, :, ::-1, ::-1].transpose(0, 2, 1, 3, 4))
        out = np.full(problem.x_shape("nchw"), np.nan, dtype)
    blocked_llvm.make(problem, pass_, dtype, block, bits, cpu, threads)(
        np.ascontiguousarray(a), w, out)
    out = out.reshape(problem.w_shape("nchw")) if pass_ == "bwd_filter" else out
    want = reference.reference(problem, pass_, "nchw", a, b)
    scale = reference.magnitudes(problem, pass_, "nchw", a, b)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert np.all(np.isfinite(out)), "a pixel was never written"
    assert np.max(np.abs(out - want) / (scale + 1e-30)) < tol


@settings(max_examples=30, deadline=None)
@given(groups=st.integers(2, 3), cg=st.integers(1, 9), kg=st.integers(1, 11),
       n=st.integers(1, 2), h=st.integers(3, 21), w=st.integers(3, 40), r=st.integers(1, 4),
       s=st.integers(1, 4), stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       pad=st.tuples(st.integers(0, 2), st.integers(0, 2)),
       pass_=st.sampled_from(["fwd", "bwd_data", "bwd_filter"]), fp64=st.booleans(),
       block=st.integers(0, 2), target=st.sampled_from(TARGETS), threads=st.integers(1, 4))
def test_blocked_kernels_match_reference(groups, cg, kg, n, h, w, r, s, stride, dilation, pad,
                                         pass_, fp64, block, target, threads):
    """Any geometry: strides 1-3 (2 across: the shuffled fill), dilation, pads, every kb tail
    (kg up to 11), planes narrower and wider than a register block, filters of more taps than a
    bwd_filter block sums at once, both precisions, up to 4 threads (an image and group split
    into parts of its output channels)."""
    if (h + 2 * pad[0] - (r - 1) * dilation[0]) < 1 or (w + 2 * pad[1] - (s - 1) * dilation[1]) < 1:
        return
    problem = ConvProblem(n=n, c=groups * cg, h=h, w=w, k=groups * kg, r=r, s=s, stride=stride,
                          pad=pad, dilation=dilation, groups=groups)
    if not blocked_llvm.applies(problem, pass_):
        pass_ = "fwd"
    bits, cpu = target
    shapes = blocked_llvm.blocks(pass_, bits)
    _run(problem, pass_, np.float64 if fp64 else np.float32, shapes[block % len(shapes)],
         bits, cpu, threads)


@pytest.mark.parametrize("bits, cpu", TARGETS)
def test_wide_rows_past_a_vector_and_the_shuffled_fill(bits, cpu):
    """Rows of 70 columns at stride 2 (the fill's vector loop and its scalar tail) and a plane
    of several register blocks, both block shapes."""
    for problem in (ConvProblem(n=2, c=16, h=33, w=70, k=24, r=3, s=3, stride=2, pad=1, groups=2),
                    ConvProblem(n=1, c=12, h=20, w=45, k=30, r=3, s=5, pad=(1, 2), groups=3)):
        for pass_ in ("fwd", "bwd_data", "bwd_filter"):
            if blocked_llvm.applies(problem, pass_):
                for block in blocked_llvm.blocks(pass_, bits):
                    _run(problem, pass_, np.float32, block, bits, cpu)


def test_which_passes_the_blocked_kernels_take():
    """fwd and bwd_filter at any stride; bwd_data where the flipped pads are not negative: at
    stride 1, and per phase at strides of at most 4 phases, of dilation 1."""
    p = ConvProblem(n=1, c=8, h=8, w=8, k=8, r=3, s=3, pad=1, groups=2)
    assert all(blocked_llvm.applies(p, pass_) for pass_ in ("fwd", "bwd_data", "bwd_filter"))
    strided = ConvProblem(n=1, c=8, h=8, w=8, k=8, r=3, s=3, stride=2, pad=1, groups=2)
    assert blocked_llvm.applies(strided, "bwd_data")
    assert not blocked_llvm.applies(ConvProblem(n=1, c=8, h=8, w=8, k=8, r=3, s=3, stride=2,
                                                pad=1, dilation=2, groups=2), "bwd_data")
    assert not blocked_llvm.applies(ConvProblem(n=1, c=8, h=9, w=9, k=8, r=3, s=3, stride=3,
                                                pad=1, groups=2), "bwd_data")  # 9 phases
    assert not blocked_llvm.applies(ConvProblem(n=1, c=8, h=8, w=8, k=8, r=3, s=3, pad=3,
                                                groups=2), "bwd_data")
    assert not blocked_llvm.applies(ConvProblem(n=1, c=8, h=8, w=8, k=8, r=3, s=3, stride=2,
                                                pad=3, groups=2), "bwd_data")
    patchify = ConvProblem(n=1, c=3, h=64, w=64, k=8, r=32, s=32, stride=32)  # 1,024 taps
    assert not any(blocked_llvm.applies(patchify, pass_)
                   for pass_ in ("fwd", "bwd_data", "bwd_filter"))


PROBLEM = ConvProblem(n=2, c=32, h=9, w=10, k=48, r=3, s=3, stride=(2, 1), pad=1, groups=8)


def test_strided_bwd_data_runs_as_its_phases():
    """3x3 at stride 2 padded 1: four phases of 1x1, 1x2, 2x1 and 2x2 taps, each writing its
    pixels of dx (odd and even sizes: phases of unequal counts); a 1x1 filter at stride 2
    reaches one phase, the other three are zeroed (over the NaN dx starts as)."""
    p = ConvProblem(n=2, c=12, h=9, w=10, k=8, r=3, s=3, stride=2, pad=1, groups=4)
    bits = blocked_llvm.vector_bits()
    gms = blocked_llvm.geometries(p, "bwd_data", np.float32, (8, 3), bits)
    assert [(gm.r, gm.s, gm.p, gm.q, gm.oa, gm.ob) for gm in gms] == [
        (1, 1, 5, 5, 0, 0), (1, 2, 5, 5, 0, 1), (2, 1, 4, 5, 1, 0), (2, 2, 4, 5, 1, 1)]
    for problem in (p, ConvProblem(n=1, c=6, h=7, w=8, k=4, r=1, s=1, stride=2, groups=2)):
        for block in blocked_llvm.blocks("bwd_data", bits):
            _run(problem, "bwd_data", np.float32, block, bits, "")
    ones = blocked_llvm.geometries(ConvProblem(n=1, c=6, h=7, w=8, k=4, r=1, s=1, stride=2,
                                               groups=2), "bwd_data", np.float32, (8, 3), bits)
    assert [gm is None for gm in ones] == [False, True, True, True]


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("pass_", ["fwd", "bwd_data", "bwd_filter"])
def test_the_pass_runs_the_kernel_it_probed(pass_, layout, monkeypatch):
    """Whichever kernel the probe keeps, the pass's output is that kernel's and matches the
    reference, and the row's note names it."""
    problem = PROBLEM if pass_ != "bwd_data" else ConvProblem(n=2, c=32, h=9, w=10, k=48, r=3,
                                                              s=3, pad=1, groups=8)
    direct = registry.get("direct", "numpy")
    names = ["numba"] + list(grouped_jit.blocked_kernels(problem, pass_, np.float32))
    assert len(names) == 1 + len(blocked_llvm.blocks(pass_, blocked_llvm.vector_bits()))
    if grouped_jit.nhwc_blocked(problem, pass_, layout, np.float32):
        names.append(blocked_nhwc.NAME)  # bwd_data: 4 channels of dx a group, vectors of 4
    assert (blocked_nhwc.NAME in names) == ((layout, pass_) == ("nhwc", "bwd_data"))
    for name in names:
        calls = []

        def fixed(ways, a, w, out, name=name, calls=calls):
            calls.append(sorted(ways))
            return name
        monkeypatch.setattr(grouped_jit, "probe_kernels", fixed)
        monkeypatch.setattr(grouped_jit, "_KERNEL_CHOICE", {})  # probed afresh
        testing.assert_matches_reference("direct", "numpy", problem, pass_, layout, "fp32")
        assert calls and calls[0] == sorted(names)
        assert f"[probed: {name}]" in direct.describe(problem, pass_, layout, "fp32")


@pytest.mark.parametrize("bits, cpu", TARGETS)
def test_the_hot_loop_keeps_its_sums_in_registers(bits, cpu):
    """Per input channel: kb x pb x taps FMAs on full-width vectors, nothing on the stack, a
    broadcast of each weight and a load of each distinct input vector, no more: (kb + pb) loads
    per kb·pb FMAs at most."""
    problem = ConvProblem(n=1, c=64, h=28, w=28, k=64, r=3, s=3, pad=1, groups=2)  # kg 32
    register = {512: "zmm", 256: "ymm", 128: "xmm"}[bits]
    for kb, pb in blocked_llvm.BLOCKS[bits]:
        gm = blocked_llvm.geometry(problem, "fwd", np.float32, (kb, pb), bits, cpu)
        loop = blocked_llvm.hot_loop(blocked_llvm.assembly(gm))
        assert loop.fmas == kb * pb * 9 and loop.register == register
        assert loop.stack_refs == 0
        inputs = {gm.offset(r, s) + i * gm.lanes for r in range(3) for s in range(3)
                  for i in range(pb)}  # a load each, shared where two taps' vectors coincide
        assert loop.broadcasts == kb * 9 and loop.vector_loads == len(inputs)
        assert loop.loads_per_fma <= (kb + pb) / (kb * pb)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("pass_", ["fwd", "bwd_data", "bwd_filter"])
@pytest.mark.parametrize("problem", [
    ConvProblem(n=2, c=6, h=13, w=11, k=40, r=3, s=3, stride=(1, 2), pad=1),  # dense
    ConvProblem(n=1, c=80, h=9, w=12, k=12, r=3, s=1, pad=(1, 0), groups=2),  # 40 a group
    ConvProblem(n=2, c=6, h=11, w=13, k=40, r=1, s=5, stride=(1, 2), pad=((0, 0), (2, 1))),
], ids=["dense", "grouped-40", "wide"])
def test_the_dense_path_runs_the_kernel_it_probed(problem, pass_, layout, monkeypatch):
    """direct's dense path (dense layers; groups beyond MAX_GROUP_CHANNELS) probes the blocked
    kernels beside its tap products above BLOCKED_MIN_FLOPS (set to 0 here): whichever it
    keeps, the pass matches the reference and its note names it (bwd_data of stride (1, 2)
    too: the blocked kernels run it as two phases; a filter wider than tall, with its axes
    swapped, each axis's stride and padding its own)."""
    monkeypatch.setattr(grouped_jit, "BLOCKED_MIN_FLOPS", 0)
    direct = registry.get("direct", "numpy")
    kernels_run = grouped_jit.kernel_problem(problem)
    assert (kernels_run != problem) == (problem.s == 5)  # 2 of 8 columns wasted as it is
    blocked = blocked_llvm.applies(kernels_run, pass_)
    names = ["products"] + (list(grouped_jit.blocked_kernels(kernels_run, pass_, np.float32))
                            if blocked else [])
    assert len(names) == (1 + len(blocked_llvm.blocks(pass_, blocked_llvm.vector_bits()))
                          if blocked else 1)
    assert blocked  # bwd_data of stride (1, 2) too, as its two phases
    if grouped_jit.nhwc_blocked(problem, pass_, layout, np.float32):
        names.append(blocked_nhwc.NAME)  # nhwc: 40 output channels, vectors of 8 (or 4)
    for name in names:
        def fixed(ways, a, w, out, name=name):
            assert sorted(ways) == sorted(names)
            return name
        monkeypatch.setattr(grouped_jit, "probe_kernels", fixed)
        monkeypatch.setattr(grouped_jit, "_KERNEL_CHOICE", {})  # probed afresh
        testing.assert_matches_reference("direct", "numpy", problem, pass_, layout, "fp32")
        note = direct.describe(problem, pass_, layout, "fp32")
        assert (f"[probed: {name}]" in note) if blocked else note == ""
        assert ("on planes transposed" in note) == (kernels_run != problem
                                                    and name != blocked_nhwc.NAME)


def test_small_dense_passes_do_not_compile_the_blocked_kernels():
    """Below BLOCKED_MIN_FLOPS the dense path is its products alone, nothing compiled."""
    small = ConvProblem(n=1, c=8, h=8, w=8, k=8, r=3, s=3, pad=1)
    assert small.flops < grouped_jit.BLOCKED_MIN_FLOPS
    assert not grouped_jit.blocks_dense(small, "fwd")
    assert registry.get("direct", "numpy").describe(small, "fwd", "nchw", "fp32") == ""


def test_a_later_prepare_of_a_probed_pass_builds_its_way_alone(monkeypatch):
    """The probe's choice is kept for the process: a pass prepared again runs that way without
    probing and holds that way's buffers alone (its workspace says so)."""
    problem = ConvProblem(n=2, c=6, h=13, w=11, k=40, r=3, s=3, pad=1)
    monkeypatch.setattr(grouped_jit, "BLOCKED_MIN_FLOPS", 0)
    monkeypatch.setattr(grouped_jit, "_KERNEL_CHOICE", {})
    direct = registry.get("direct", "numpy")
    probing = direct.workspace_bytes(problem, "fwd", "nhwc", "fp32")
    kept = blocked_llvm.name(blocked_llvm.BLOCKS[blocked_llvm.vector_bits()][1])
    monkeypatch.setattr(grouped_jit, "probe_kernels", lambda ways, a, w, out: kept)
    testing.assert_matches_reference("direct", "numpy", problem, "fwd", "nhwc", "fp32")

    def never(*args):
        raise AssertionError("probed again")
    monkeypatch.setattr(grouped_jit, "probe_kernels", never)
    testing.assert_matches_reference("direct", "numpy", problem, "fwd", "nhwc", "fp32")
    assert f"[probed: {kept}]" in direct.describe(problem, "fwd", "nhwc", "fp32")
    assert direct.workspace_bytes(problem, "fwd", "nhwc", "fp32") < probing


@pytest.mark.parametrize("bits, cpu", TARGETS)
def test_the_filter_gradients_hot_loop_keeps_its_sums_in_registers(bits, cpu):
    """bwd_filter, per vector of pixels: kb x taps FMAs (LLVM may unroll the loop a few times),
    nothing on the stack, kb dy loads and an input vector a tap at most."""
    problem = ConvProblem(n=1, c=64, h=28, w=28, k=64, r=3, s=3, pad=1, groups=2)
    register = {512: "zmm", 256: "ymm", 128: "xmm"}[bits]
    for kb, taps in blocked_llvm.FILTER_BLOCKS[bits]:
        gm = blocked_llvm.geometry(problem, "bwd_filter", np.float32, (kb, taps), bits, cpu)
        loop = blocked_llvm.hot_loop(blocked_llvm.assembly(gm))
        per_vector = kb * min(taps, 9)
        unrolled = loop.fmas // per_vector
        assert loop.fmas == unrolled * per_vector and unrolled >= 1
        assert loop.register == register and loop.stack_refs == 0
        assert loop.vector_loads <= unrolled * (kb + min(taps, 9))


def test_machine_code_is_cached_on_disk_and_loaded_back(tmp_path, monkeypatch):
    """A kernel compiled once is written under the user cache; a fresh process (the lru cache
    cleared) loads it instead of compiling, and the loaded kernel is still right."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    problem = ConvProblem(n=1, c=6, h=9, w=9, k=10, r=3, s=3, pad=1, groups=2)
    bits = blocked_llvm.vector_bits()
    block = blocked_llvm.BLOCKS[bits][0]
    gm = blocked_llvm.geometry(problem, "fwd", np.float32, block, bits, threads_=1)
    blocked_llvm.compiled.cache_clear()
    blocked_llvm.compiled(gm)
    path = blocked_llvm.object_path(gm, blocked_llvm.kernel_ir(gm))
    assert path.parent == tmp_path / "convbench" / "llvm" and path.stat().st_size > 0
    blocked_llvm.compiled.cache_clear()
    monkeypatch.setattr(blocked_llvm, "_optimised", _never_optimised(blocked_llvm._optimised))
    _run(problem, "fwd", np.float32, block, bits, "", threads=1)
    blocked_llvm.compiled.cache_clear()


def _never_optimised(real):
    def parse_only(gm, text=None, optimise=True):
        assert not optimise, "compiled again, the cache not read"
        return real(gm, text, optimise)
    return parse_only


@pytest.mark.parametrize("pass_", ["fwd", "bwd_filter"])
def test_many_stride_phases_fill_by_scatter(pass_):
    """Past MAX_UNROLLED_PHASES the planes are filled by one scatter loop: patchify layers
    (stride = filter, 8x8 and 5x6 across 4x7 phases) and a strided 1x1, against the reference."""
    for problem in (ConvProblem(n=1, c=3, h=32, w=40, k=20, r=8, s=8, stride=8),
                    ConvProblem(n=2, c=4, h=23, w=30, k=6, r=5, s=6, stride=(4, 7), pad=(1, 2),
                                groups=2),
                    ConvProblem(n=1, c=5, h=17, w=17, k=7, r=1, s=1, stride=5)):
        gm = blocked_llvm.geometry(problem, pass_, np.float32, (5, 4), 512)
        assert gm.sh * gm.sw > blocked_llvm.MAX_UNROLLED_PHASES
        bits = blocked_llvm.vector_bits()
        _run(problem, pass_, np.float32, blocked_llvm.blocks(pass_, bits)[0], bits, "")
