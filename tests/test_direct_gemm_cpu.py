"""`direct` and `gemm` on the CPU against the float64 reference, and proof the checker bites."""

import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from convbench.algos import direct, gemm, grouped_jit, jit, reference, registry
from convbench.algos.phases import FUSED
from convbench.catalogs.layers import net_layers
from convbench.core.problem import LAYOUTS, PASSES, ConvProblem
from convbench.measure import memory
from convbench.testing import (
    PER_AXIS_PROBLEMS,
    assert_matches_reference,
    assert_phases_replay,
    matmul_dtypes,
    problem_strategy,
    run_and_check,
    small_catalog_problems,
)

ALGOS = ("direct", "gemm")
PRECISIONS = ("fp64", "fp32")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("algo", ALGOS)
def test_catalog_layers_match_reference(algo, pass_, layout, precision):
    for _, problem in small_catalog_problems():
        assert_matches_reference(algo, "numpy", problem, pass_, layout, precision)


@pytest.mark.parametrize("algo", ALGOS)
@settings(max_examples=50, deadline=None)
@given(problem=problem_strategy(max_stride=4, max_pad=3, max_dilation=2, max_groups=2,
                                per_axis=True),
       pass_=st.sampled_from(PASSES), layout=st.sampled_from(LAYOUTS),
       precision=st.sampled_from(PRECISIONS))
# one output element whose 40 random terms cancel to 0.0085 (a CI run failed it at 3e-5 > 1e-5
# before `verify.magnitude_floor`)
@example(problem=ConvProblem(n=1, c=4, h=5, w=5, k=1, r=5, s=2, stride=(1, 3),
                             dilation=(1, 2)), pass_="fwd", layout="nchw", precision="fp32")
def test_random_problems_match_reference(algo, problem, pass_, layout, precision):
    assert_matches_reference(algo, "numpy", problem, pass_, layout, precision)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("problem", PER_AXIS_PROBLEMS, ids=str)
@pytest.mark.parametrize("algo", ALGOS)
def test_per_axis_problems_match_reference(algo, problem, precision):
    """Stride, padding and dilation that differ between the axes (Inception's 1x7 and 7x1):
    every pass, both layouts."""
    for pass_ in PASSES:
        for layout in LAYOUTS:
            assert registry.supports(registry.get(algo, "numpy"), problem, pass_, layout,
                                     precision) is None
            assert_matches_reference(algo, "numpy", problem, pass_, layout, precision)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("algo", ALGOS)
def test_fp32_is_computed_in_fp32(algo, pass_, layout, monkeypatch):
    """Benchmarking fp32 means multiplying in fp32: every product gets float32 operands (direct
    on its products: its compiled grouped kernels are test_depthwise's)."""
    monkeypatch.setattr(jit, "available", lambda: "a test asks for the products")
    problem = ConvProblem(n=2, c=4, h=9, w=8, k=6, r=3, s=2, stride=2, pad=1, groups=2)
    seen = matmul_dtypes(registry.get(algo, "numpy"), problem, pass_, layout)
    assert seen and {d for ds in seen for d in ds} == {np.dtype(np.float32)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
def test_direct_blocks_cover_the_output(pass_, layout, monkeypatch):
    """Tiny accumulator blocks (one image in nchw, a few rows in nhwc, partial last blocks)
    give the reference result: the blocking of real layers is checked on small ones."""
    monkeypatch.setattr(direct, "_CHUNK_BYTES", 200)
    problem = ConvProblem(n=3, c=4, h=9, w=8, k=6, r=3, s=2, stride=2, pad=1, groups=2)
    assert run_and_check(registry.get("direct", "numpy"), problem, pass_, layout, "fp64").ok


def test_workspaces(monkeypatch):
    """gemm's is the im2col matrix (one image's where nhwc lowers an image at a time) and the
    zero-bordered input it is copied from; direct's (input planes, wide output) is
    activation-sized, and so are the blocked kernels' it probes beside them (nhwc: the
    operands in nchw and the threads' planes), both held until the probe keeps one."""
    conv2 = ConvProblem(n=8, c=96, h=27, w=27, k=256, r=5, s=5, pad=2)
    lowered = registry.get("gemm", "numpy").workspace_bytes(conv2, "fwd", "nchw", "fp32")
    monkeypatch.setattr(grouped_jit, "_KERNEL_CHOICE", {})
    probing = registry.get("direct", "numpy").workspace_bytes(conv2, "fwd", "nhwc", "fp32")
    monkeypatch.setattr(grouped_jit, "BLOCKED_MIN_FLOPS", conv2.flops + 1)
    direct = registry.get("direct", "numpy").workspace_bytes(conv2, "fwd", "nhwc", "fp32")
    assert direct < probing < direct + 2 * conv2.min_bytes("fp32")
    assert lowered == (8 * 27 * 27 * 5 * 5 * 96 + 8 * 31 * 31 * 96) * 4
    assert registry.get("gemm", "numpy").workspace_bytes(conv2, "fwd", "nhwc", "fp32") \
        == lowered
    conv1 = ConvProblem(n=8, c=3, h=227, w=227, k=96, r=11, s=11, stride=4)
    assert registry.get("gemm", "numpy").workspace_bytes(conv1, "fwd", "nhwc", "fp32") \
        == 55 * 55 * 11 * 11 * 3 * 4  # one image's columns
    assert registry.get("gemm", "numpy").workspace_bytes(conv2, "bwd_data", "nhwc", "fp32") \
        == 8 * 27 * 27 * 5 * 5 * 96 * 4
    assert direct < 2 * conv2.min_bytes("fp32") < lowered / 2


#: Strided and grouped, with a 576 KiB filter: a filter-sized buffer left undeclared (a packed
#: copy, a sum buffer) is far outside the slack, which is NumPy's ufunc buffers and Python
#: objects (about 100 KiB at most).
_TRACED = ConvProblem(n=3, c=128, h=15, w=15, k=256, r=3, s=3, stride=2, pad=1, groups=2)
#: The same, strided, padded and dilated per axis (direct's phase planes are sh x sw).
_TRACED_PER_AXIS = ConvProblem(n=3, c=128, h=15, w=17, k=256, r=3, s=3, stride=(2, 3),
                               pad=(1, 2), dilation=(1, 2), groups=2)


#: A filter wider than tall: `direct`'s blocked kernels run it with its axes swapped, its
#: operands and result copied (`grouped_jit.wide_filter`).
_TRACED_WIDE = ConvProblem(n=3, c=128, h=15, w=15, k=256, r=1, s=5, pad=(0, 2), groups=2)


@pytest.mark.parametrize("problem", [_TRACED, _TRACED_PER_AXIS, _TRACED_WIDE],
                         ids=["square", "per-axis", "wide"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("algo", ALGOS)
def test_workspace_is_what_the_pass_allocates(algo, pass_, layout, problem):
    """`workspace_bytes` (computed from the geometry) is every byte a prepared pass and one
    call allocate beyond the operands, as tracemalloc sees NumPy's buffers: asked before the
    first call (as the runner asks), which may probe ways that each hold their buffers. A pass
    run first, untraced, pays the process's one-time costs (torch imported by a transpose's
    probe, Numba's registries loaded: megabytes that depend on which tests ran before in this
    worker); its probes are then forgotten, so the traced call probes again."""
    impl = registry.get(algo, "numpy")
    a, b = (o.astype(np.float32) for o in reference.random_operands(problem, pass_, layout))
    out = reference.nan_output(problem, pass_, layout, np.float32)
    impl.prepare(problem, pass_, layout, "fp32")(a, b, out)
    grouped_jit._KERNEL_CHOICE.clear()  # not yet probed in this process
    grouped_jit._TRANSPOSE_CHOICE.clear()
    declared = impl.workspace_bytes(problem, pass_, layout, "fp32")
    with memory.Tracemalloc() as trace:
        run = impl.prepare(problem, pass_, layout, "fp32")
        trace.mark()
        run(a, b, out)
    assert memory.pass_peak(trace.points) == pytest.approx(declared, abs=192 << 10)
    # after the probe the pass holds the way it kept: never more
    assert impl.workspace_bytes(problem, pass_, layout, "fp32") <= declared


class _TapLoop(registry.Implementation):
    """A plain nchw forward tap loop, with an optional bug. Without the bug it passes (checked
    below), so each failure comes from the bug alone."""

    algo, backend, precisions = "direct", "numpy", PRECISIONS

    def __init__(self, bug: str | None = None):
        self.bug = bug

    def supports(self, problem, pass_, layout, precision):
        return None

    def prepare(self, problem, pass_, layout, precision):
        p = problem
        # "padding": all padding on the top/left side; the output shape stays right.
        before, after = (2 * p.pad, 0) if self.bug == "padding" else (p.pad, p.pad)
        # "last-column": the loop bound misses the filter's last column.
        columns = p.s - 1 if self.bug == "last-column" else p.s

        def run(x, w, out):
            xp = np.pad(x, ((0, 0), (0, 0), (before, after), (before, after)))
            out[...] = 0
            for r in range(p.r):
                for s in range(columns):
                    h0, w0 = r * p.dilation, s * p.dilation
                    win = xp[:, :, h0:h0 + (p.p - 1) * p.stride + 1:p.stride,
                             w0:w0 + (p.q - 1) * p.stride + 1:p.stride]
                    out += np.einsum("kc,ncpq->nkpq", w[:, :, r, s], win)

        return run


_BUG_PROBLEMS = [ConvProblem(n=2, c=3, h=9, w=11, k=4, r=3, s=3, pad=1),
                 ConvProblem(n=1, c=5, h=13, w=13, k=6, r=5, s=5, stride=2, pad=2)]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("problem", _BUG_PROBLEMS, ids=str)
def test_checker_passes_the_tap_loop(problem, precision):
    assert run_and_check(_TapLoop(), problem, "fwd", "nchw", precision).ok


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("problem", _BUG_PROBLEMS, ids=str)
@pytest.mark.parametrize("bug", ["padding", "last-column"])
def test_checker_catches_a_wrong_implementation(bug, problem, precision):
    chk = run_and_check(_TapLoop(bug), problem, "fwd", "nchw", precision)
    assert not chk.ok
    assert chk.rel_error > 100 * chk.tolerance, chk.reason


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
def test_gemm_phases_replay_the_pass(pass_, layout):
    """im2col (or col2im) and the product, run one by one, give the full call's bits."""
    problem = ConvProblem(n=2, c=4, h=9, w=8, k=6, r=3, s=2, stride=(2, 1), pad=(1, 0),
                          groups=2)
    assert_phases_replay(registry.get("gemm", "numpy"), problem, pass_, layout)


#: A problem that runs blocked once the thresholds are lowered: 5 images (blocks of 2, 2, 1),
#: padded unequally, strided and dilated per axis, grouped.
_BLOCKED = ConvProblem(n=5, c=6, h=11, w=9, k=8, r=3, s=2, stride=(2, 1), pad=((1, 2), 1),
                       dilation=(1, 2), groups=2)


def _block_of(monkeypatch, problem, images: int, precision: str = "fp32") -> None:
    """Make `gemm` lower `images` images at a time on `problem` in nhwc."""
    per_image = problem.p * problem.q * problem.r * problem.s * problem.c
    monkeypatch.setattr(gemm, "BLOCK_MIN_ROWS", 1)
    monkeypatch.setattr(gemm, "BLOCK_BYTES", images * per_image * (4 if precision == "fp32"
                                                                    else 8))


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("images", [1, 2, 4])
@pytest.mark.parametrize("pass_", ["fwd", "bwd_filter"])
def test_gemm_blocks_of_images_match_reference(pass_, images, precision, monkeypatch):
    """nhwc's blocked fwd and bwd_filter (im2col and product a block of images at a time, the
    last block partial, dw summed over the blocks) against float64; one phase, which
    replays; the note names the block; nchw and bwd_data never block."""
    _block_of(monkeypatch, _BLOCKED, images, precision)
    impl = registry.get("gemm", "numpy")
    assert gemm.images_per_block(_BLOCKED, pass_, "nhwc", precision) == images
    assert gemm.images_per_block(_BLOCKED, pass_, "nchw", precision) == _BLOCKED.n
    assert gemm.images_per_block(_BLOCKED, "bwd_data", "nhwc", precision) == _BLOCKED.n
    assert impl.phases(_BLOCKED, pass_, "nhwc", precision) == [FUSED]
    plural = "s" if images > 1 else ""
    assert f"in blocks of {images} image{plural} (" in impl.describe(_BLOCKED, pass_, "nhwc",
                                                                     precision)
    assert_matches_reference("gemm", "numpy", _BLOCKED, pass_, "nhwc", precision)
    if precision == "fp32":
        assert_phases_replay(impl, _BLOCKED, pass_, "nhwc")


def test_gemm_blocks_only_large_images_in_nhwc():
    """AlexNet at batch 8: conv1 (55x55 outputs) lowers one image at a time in nhwc's fwd and
    bwd_filter; conv2-conv5 (27x27, 13x13) and nchw lower the batch whole."""
    layers = {layer.name: layer.problem for layer in net_layers("alexnet")}
    for name, problem in layers.items():
        problem = dataclasses.replace(problem, n=8)
        blocks = {(pass_, layout): gemm.images_per_block(problem, pass_, layout, "fp32")
                  for pass_ in PASSES for layout in LAYOUTS}
        large = name == "conv1"
        assert blocks == {(pass_, layout): 1 if large and layout == "nhwc"
                          and pass_ != "bwd_data" else 8
                          for pass_ in PASSES for layout in LAYOUTS}, name


@pytest.mark.parametrize("pass_", ["fwd", "bwd_filter"])
def test_blocked_workspace_is_what_the_pass_allocates(pass_, monkeypatch):
    """A blocked pass holds one block of columns (and the padded input): `workspace_bytes`
    says so, and tracemalloc agrees."""
    impl = registry.get("gemm", "numpy")
    whole = impl.workspace_bytes(_TRACED, pass_, "nhwc", "fp32")
    _block_of(monkeypatch, _TRACED, 2)
    columns = gemm.nbytes(_TRACED.p * _TRACED.q * _TRACED.r * _TRACED.s * _TRACED.c, "fp32")
    assert impl.workspace_bytes(_TRACED, pass_, "nhwc", "fp32") == whole - columns  # 3 -> 2
    test_workspace_is_what_the_pass_allocates("gemm", pass_, "nhwc", _TRACED)
