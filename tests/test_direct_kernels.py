"""`direct` through kernels/direct.cu: every pass and layout under the emulator in CI, checked
against the float64 reference; the same on a GPU (`gpu` marker), there on AlexNet's layers too."""

import numpy as np
import pytest
from hypothesis import given, settings

import convbench
from convbench import testing
from convbench.algos import reference, registry
from convbench.catalogs.layers import net_layers
from convbench.core.problem import LAYOUTS, PASSES, ConvProblem
from convbench.measure import memory, verify

#: Small problems that cross tile edges (7, 13, 9×11 pixels; 5, 7, 9 channels against tiles of
#: 8×8 pixels and 32 channels), strides, padding, dilation 2, groups, several channel steps
#: (c = k = 40 > 16), and a bwd_filter reduction split in two (N·P·Q = 512).
PROBLEMS = [
    ConvProblem(n=2, c=5, h=7, w=13, k=7, r=3, s=3, pad=1),
    ConvProblem(n=1, c=3, h=13, w=13, k=9, r=3, s=5, stride=2, pad=2, dilation=2),
    ConvProblem(n=2, c=4, h=16, w=16, k=6, r=1, s=1),
    ConvProblem(n=2, c=6, h=9, w=11, k=4, r=3, s=3, pad=1, groups=2),
    ConvProblem(n=1, c=40, h=9, w=9, k=40, r=3, s=3, pad=1),
    ConvProblem(n=1, c=3, h=23, w=23, k=5, r=11, s=11, stride=4),
    *testing.PER_AXIS_PROBLEMS,  # stride, padding, dilation per axis: Inception's 1x7, 7x1
]


def _impl(backend: str):
    return testing.runnable("direct", backend)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("problem", PROBLEMS, ids=str)
def test_emu_matches_reference(problem, pass_, layout):
    _impl("emu")
    assert registry.supports(registry.get("direct", "emu"), problem, pass_, layout, "fp32") is None
    testing.assert_matches_reference("direct", "emu", problem, pass_, layout, "fp32")


@settings(max_examples=12, deadline=None)
@given(testing.problem_strategy(max_stride=3, max_dilation=2, max_groups=2,
                                per_axis=True))
def test_emu_matches_reference_on_random_problems(problem):
    _impl("emu")
    for pass_ in PASSES:
        testing.assert_matches_reference("direct", "emu", problem, pass_, "nhwc", "fp32")


def test_emu_bwd_filter_split_is_deterministic():
    impl, problem = _impl("emu"), PROBLEMS[2]
    assert impl.describe(problem, "bwd_filter", "nchw", "fp32").startswith("N·P·Q reduction in 2")
    x, dy = reference.random_operands(problem, "bwd_filter", "nchw")
    run = impl.prepare(problem, "bwd_filter", "nchw", "fp32")
    first, second = (reference.nan_output(problem, "bwd_filter", "nchw") for _ in range(2))
    run(x, dy, first)
    run(x, dy, second)
    np.testing.assert_array_equal(first, second)


#: bwd_filter splits this problem's N·P·Q = 2048 reduction in 8 slices: 8 partial dw of
#: 64 × 144 floats, 288 KiB, far above the few KiB of Python objects a prepare() makes.
SPLIT = ConvProblem(n=2, c=16, h=32, w=32, k=64, r=3, s=3, pad=1)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("problem, pass_, partial_sums", [
    (SPLIT, "bwd_filter", 8 * 64 * 16 * 3 * 3),
    (PROBLEMS[0], "bwd_filter", 0),  # N·P·Q = 182: one slice, written straight into dw
    (SPLIT, "fwd", 0),
    (SPLIT, "bwd_data", 0),
], ids=str)
def test_emu_workspace_is_what_the_pass_allocates(problem, pass_, partial_sums, layout):
    """The declared workspace is the partial sums, and the emulated pass (whose buffers are
    NumPy arrays, all seen by tracemalloc; shared memory is the emulator's) allocates it and
    nothing more: within a few KiB of Python objects, read the way the runner reads it."""
    impl = _impl("emu")
    declared = impl.workspace_bytes(problem, pass_, layout, "fp32")
    assert declared == 4 * partial_sums
    a, b = reference.random_operands(problem, pass_, layout)
    out = reference.nan_output(problem, pass_, layout)
    impl.prepare(problem, pass_, layout, "fp32")  # builds and loads the kernels beforehand
    with memory.Tracemalloc() as trace:
        run = impl.prepare(problem, pass_, layout, "fp32")
        trace.mark()
        run(a, b, out)
    assert memory.pass_peak(trace.points) == pytest.approx(declared, abs=16 << 10)


def test_emu_through_the_functional_api():
    _impl("emu")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 9, 11, 3)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    y = convbench.conv2d(x, w, stride=2, padding=1, algo="direct", backend="emu", layout="nhwc")
    problem = ConvProblem(n=2, c=3, h=9, w=11, k=4, r=3, s=3, stride=2, pad=1)
    assert verify.check(y, reference.reference(problem, "fwd", "nhwc", x, w), "direct",
                        "fp32").ok


@pytest.mark.parametrize("backend, problem, pass_, precision, reason", [
    ("emu", net_layers("alexnet")[1].problem.with_batch(2), "fwd", "fp32", "emulator"),
    ("emu", PROBLEMS[0], "fwd", "fp64", "runs fp32"),
    ("cuda", ConvProblem(n=1, c=1, h=200, w=200, k=1, r=9, s=9, dilation=20), "fwd", "fp32",
     "shared memory"),
    ("cuda", ConvProblem(n=70000, c=1, h=4, w=4, k=1, r=1, s=1), "bwd_data", "fp32", "grid"),
])
def test_unsupported_problems_say_why(backend, problem, pass_, precision, reason):
    impl = registry.get("direct", backend)
    assert reason in registry.supports(impl, problem, pass_, "nchw", precision)


# --- on a GPU ------------------------------------------------------------------------------------
def _check_cuda(problem: ConvProblem, pass_: str, layout: str) -> verify.Check:
    import cupy

    impl = _impl("cuda")
    assert registry.supports(impl, problem, pass_, layout, "fp32") is None
    a, b = reference.random_operands(problem, pass_, layout)
    ref = reference.reference(problem, pass_, layout, a, b)
    out = reference.nan_output(problem, pass_, layout, xp=cupy)
    impl.prepare(problem, pass_, layout, "fp32")(cupy.asarray(a), cupy.asarray(b), out)
    return verify.check(out, ref, "direct", "fp32", problem, pass_)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("problem", PROBLEMS, ids=str)
def test_cuda_matches_reference(problem, pass_, layout):
    check = _check_cuda(problem, pass_, layout)
    assert check.ok, check.reason


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("layer", net_layers("alexnet"), ids=lambda layer: layer.name)
def test_cuda_alexnet_batch2(layer, pass_, layout):
    check = _check_cuda(layer.problem.with_batch(2), pass_, layout)
    assert check.ok, check.reason
