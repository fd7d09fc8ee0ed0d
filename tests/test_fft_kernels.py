"""`fft` and `fft-tiled` through cuFFT and kernels/fft.cu: every pass and layout under the
emulator in CI, checked against the float64 reference; on a GPU (`gpu` marker) the same,
AlexNet's and VGG-16's layers, and cuDNN for comparison. The phase functions must reproduce the
full pass."""

import functools
import itertools
from unittest import mock

import pytest
from hypothesis import given, settings

from convbench import testing
from convbench.algos import reference, registry
from convbench.catalogs.layers import net_layers
from convbench.core.problem import LAYOUTS, PASSES, ConvProblem
from convbench.measure import verify

ALGOS = ("fft", "fft-tiled")

#: Small problems that cross the kernels' tile edges: odd and rectangular sizes (7×13, 9×6,
#: 3×35: a grid 36 wide, two 32-column copy tiles), padding 0-2, filters 1×1, 3×3, 5×5, 3×2,
#: channels against 32-channel tiles (40 and 37: two copy and product tiles; reductions over 40
#: and 37 channels in several 8-deep steps), 60 frequencies against blocks of 8, and a
#: bwd_filter reduction over 9 images.
PROBLEMS = [
    ConvProblem(n=2, c=5, h=7, w=13, k=7, r=3, s=3, pad=1),
    ConvProblem(n=1, c=3, h=13, w=13, k=4, r=5, s=5, pad=2),
    ConvProblem(n=2, c=4, h=7, w=7, k=3, r=1, s=1),
    ConvProblem(n=3, c=40, h=9, w=6, k=37, r=3, s=2, pad=2),
    ConvProblem(n=1, c=2, h=3, w=35, k=3, r=3, s=2, pad=1),
    ConvProblem(n=9, c=3, h=5, w=6, k=2, r=3, s=3),
    # per-axis padding (zeros on the grid): Inception's 1x7 and 7x1, a 3x3 padded 1x0
    *(p for p in testing.PER_AXIS_PROBLEMS if p.stride == p.dilation == p.groups == 1),
]
#: `fft-tiled` beyond one 32×32 tile: 2×2 tiles with the last ones partly outside, 3×2 with a
#: 5×5 filter, padding larger than the filter (bwd_data's dy window starts before the tile), a
#: filter over half a tile (that axis stays untiled), one tile only, and tiles on one axis only.
TILED_PROBLEMS = [
    ConvProblem(n=1, c=3, h=40, w=37, k=4, r=3, s=2, pad=1),
    ConvProblem(n=2, c=2, h=70, w=35, k=3, r=5, s=5),
    ConvProblem(n=1, c=2, h=45, w=50, k=3, r=3, s=3, pad=5),
    ConvProblem(n=1, c=1, h=40, w=40, k=2, r=17, s=3),
    ConvProblem(n=1, c=2, h=37, w=40, k=3, r=1, s=7, pad=(0, 3)),  # per-axis padding, tiled
    PROBLEMS[0],
    PROBLEMS[4],
]
CASES = [("fft", p) for p in PROBLEMS] + [("fft-tiled", p) for p in TILED_PROBLEMS]


def _impl(backend: str, algo: str = "fft"):
    return testing.runnable(algo, backend)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("algo, problem", CASES, ids=[f"{a}-{p}" for a, p in CASES])
def test_emu_matches_reference(algo, problem, pass_, layout):
    impl = _impl("emu", algo)
    assert registry.supports(impl, problem, pass_, layout, "fp32") is None
    testing.assert_matches_reference(algo, "emu", problem, pass_, layout, "fp32")


@settings(max_examples=10, deadline=None)
@given(testing.problem_strategy(max_stride=1, per_axis=True))
def test_emu_matches_reference_on_random_problems(problem):
    _impl("emu")
    for pass_ in PASSES:
        testing.assert_matches_reference("fft", "emu", problem, pass_, "nhwc", "fp32")


@settings(max_examples=10, deadline=None)
@given(testing.problem_strategy(max_stride=1, max_pad=4, per_axis=True))
def test_emu_tiled_matches_reference_on_random_problems_with_8x8_tiles(problem):
    """Tiles of 8 (filters up to 4 wide) put many tiles, and partial ones, on small problems."""
    impl = _impl("emu", "fft-tiled")
    with mock.patch.object(impl, "tile", 8):
        for pass_ in PASSES:
            testing.assert_matches_reference("fft-tiled", "emu", problem, pass_, "nchw", "fp32")





@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("algo, problem", [("fft", PROBLEMS[0]), ("fft-tiled", TILED_PROBLEMS[0])],
                         ids=ALGOS)
def test_emu_phases_reproduce_the_pass(algo, problem, pass_):
    testing.assert_phases_replay(_impl("emu", algo), problem, pass_, "nhwc")


def test_phases_are_named_after_the_pass_tensors():
    impl = registry.get("fft", "emu")
    p = PROBLEMS[0]
    assert impl.phases(p, "fwd", "nchw", "fp32") == [
        "transform x", "transform w", "product", "inverse y"]
    assert impl.phases(p, "bwd_data", "nchw", "fp32") == [
        "transform dy", "transform w", "product", "inverse dx"]
    assert impl.phases(p, "bwd_filter", "nchw", "fp32") == [
        "transform x", "transform dy", "product", "inverse dw"]


def test_emu_phases_before_a_full_call_raise():
    run = _impl("emu").prepare(PROBLEMS[2], "fwd", "nchw", "fp32")
    with pytest.raises(RuntimeError, match="full call"):
        run.phase_fns["product"]()


def test_emu_buffers_are_reused_across_calls():
    """Nothing from the previous call may leak into the next: the grid is shared and rewritten."""
    impl, p = _impl("emu"), PROBLEMS[3]
    run = impl.prepare(p, "bwd_data", "nchw", "fp32")
    for seed in (0, 1):
        a, b = reference.random_operands(p, "bwd_data", "nchw", seed=seed)
        out = reference.nan_output(p, "bwd_data", "nchw")
        run(a, b, out)
    ref = reference.reference(p, "bwd_data", "nchw", a, b)
    assert verify.check(out, ref, "fft", "fp32", p, "bwd_data").ok


@pytest.mark.parametrize("backend, problem, precision, reason", [
    ("emu", ConvProblem(n=1, c=4, h=9, w=9, k=4, r=3, s=3, stride=2), "fp32", "stride 1 only"),
    ("cuda", ConvProblem(n=1, c=4, h=9, w=9, k=4, r=3, s=3, dilation=2), "fp32",
     "dilation 1 only"),
    ("cuda", ConvProblem(n=1, c=4, h=9, w=9, k=4, r=3, s=3, groups=2), "fp32", "groups 1 only"),
    ("emu", ConvProblem(n=1, c=4, h=9, w=9, k=4, r=3, s=3, stride=(2, 1)), "fp32",
     "stride 2x1: "),
    ("cuda", ConvProblem(n=1, c=4, h=9, w=9, k=4, r=3, s=3, stride=(1, 2)), "fp32",
     "stride 1x2: "),
    ("emu", ConvProblem(n=1, c=4, h=9, w=9, k=4, r=3, s=3, pad=(1, 2), dilation=(1, 2)), "fp32",
     "dilation 1x2: "),
    ("emu", PROBLEMS[0], "fp64", "runs fp32"),
    ("emu", net_layers("alexnet")[1].problem.with_batch(2), "fp32", "emulator"),
    ("cuda", net_layers("vgg16")[1].problem.with_batch(2048), "fp32", "32-bit"),
    ("cuda", ConvProblem(n=70000, c=1, h=4, w=4, k=1, r=1, s=1), "fp32", "grid"),
])
@pytest.mark.parametrize("algo", ALGOS)
def test_unsupported_problems_say_why(algo, backend, problem, precision, reason):
    impl = registry.get(algo, backend)
    for pass_ in PASSES:
        said = registry.supports(impl, problem, pass_, "nchw", precision)
        assert said and reason in said and "\n" not in said


def test_describe_names_the_transform_library_and_size():
    conv2 = net_layers("alexnet")[1].problem  # 27 + pad 2 = 29, rounded up to 2·3·5
    assert registry.get("fft", "emu").describe(conv2, "fwd", "nchw", "fp32") == (
        "numpy.fft (the emulator has no cuFFT), transform 30x30")
    assert registry.get("fft", "cuda").describe(conv2, "bwd_filter", "nhwc", "fp32") == (
        "cuFFT, transform 30x30")
    conv1_1 = net_layers("vgg16")[0].problem  # 224 rows in tiles of 32 - 3 + 1 = 30
    assert registry.get("fft-tiled", "cuda").describe(conv1_1, "fwd", "nchw", "fp32") == (
        "cuFFT, transform 32x32, 8x8 tiles")
    assert registry.get("fft-tiled", "cuda").describe(conv2, "fwd", "nchw", "fp32") == (
        "cuFFT, transform 30x30, 1x1 tiles")  # the whole image fits in one tile


def test_workspace_is_three_spectra_and_one_grid():
    p = ConvProblem(n=2, c=3, h=6, w=6, k=4, r=3, s=3, pad=1)  # grid 7×7, 7×4 frequencies
    x, w, y = p.n * p.c, p.k * p.c, p.n * p.k  # items of each tensor
    for pass_ in PASSES:
        for layout in LAYOUTS:
            assert registry.get("fft", "emu").workspace_bytes(p, pass_, layout, "fp32") == (
                8 * (x + w + y) * 7 * 4 + 4 * max(x, w, y) * 7 * 7)


def test_tiling_shrinks_the_workspace_of_large_images():
    conv1_2 = net_layers("vgg16")[1].problem.with_batch(8)  # 224×224: 225², or 8×8 tiles of 32²
    conv4_1 = net_layers("vgg16")[6].problem.with_batch(8)  # 28×28: a 30² grid, one tile
    for pass_ in PASSES:
        whole, tiled = (registry.get(algo, "cuda").workspace_bytes(conv1_2, pass_, "nhwc", "fp32")
                        for algo in ALGOS)
        assert tiled < whole / 3
        whole, tiled = (registry.get(algo, "cuda").workspace_bytes(conv4_1, pass_, "nhwc", "fp32")
                        for algo in ALGOS)
        assert tiled == whole


# --- on a GPU ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _operands_and_reference(problem: ConvProblem, pass_: str):
    """NCHW operands and their float64 reference: the tests below ask for each (problem, pass)
    with every layout and algorithm in a row, and the reference is the slow part."""
    a, b = reference.random_operands(problem, pass_)
    return a, b, reference.reference(problem, pass_, "nchw", a, b)


def _check_cuda(algo: str, problem: ConvProblem, pass_: str, layout: str) -> verify.Check:
    import cupy

    impl = _impl("cuda", algo)
    assert registry.supports(impl, problem, pass_, layout, "fp32") is None
    a, b, ref = (reference.to_layout(v, layout) for v in _operands_and_reference(problem, pass_))
    out = reference.nan_output(problem, pass_, layout, xp=cupy)
    impl.prepare(problem, pass_, layout, "fp32")(cupy.asarray(a), cupy.asarray(b), out)
    return verify.check(out, ref, algo, "fp32", problem, pass_)


def _grid(problems, ids):
    """(algo, problem, pass, layout) with the problem and pass varying slowest."""
    cases = list(itertools.product(problems, PASSES, LAYOUTS, ALGOS))
    return pytest.mark.parametrize("problem, pass_, layout, algo", [
        pytest.param(problem, pass_, layout, algo, id=f"{ids(problem)}-{pass_}-{layout}-{algo}")
        for problem, pass_, layout, algo in cases])


@pytest.mark.gpu
@_grid(PROBLEMS + TILED_PROBLEMS[:4], ids=str)
def test_cuda_matches_reference(problem, pass_, layout, algo):
    check = _check_cuda(algo, problem, pass_, layout)
    assert check.ok, check.reason


#: Every AlexNet and VGG-16 layer fft supports (stride 1: all but AlexNet's conv1), at batch 2.
NET_LAYERS = {f"{layer.net}:{layer.name}": layer.problem.with_batch(2)
              for net in ("alexnet", "vgg16") for layer in net_layers(net)
              if layer.problem.stride == 1}


@pytest.mark.gpu
@_grid(NET_LAYERS.values(), ids={p: name for name, p in NET_LAYERS.items()}.get)
def test_cuda_net_layers_batch2(problem, pass_, layout, algo):
    check = _check_cuda(algo, problem, pass_, layout)
    assert check.ok, check.reason


@pytest.mark.gpu
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("algo", ALGOS)
def test_cuda_phases_reproduce_the_pass(algo, pass_):
    import cupy

    testing.assert_phases_replay(_impl("cuda", algo), NET_LAYERS["vgg16:conv3_1"], pass_, "nchw", xp=cupy)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("layer", ["alexnet:conv2", "vgg16:conv3_1"])
def test_cuda_agrees_with_cudnn(layer, algo, pass_, layout):
    """Ours and cuDNN's on the same operands, within the FFT tolerance of each other."""
    import cupy

    ours, cudnn = _impl("cuda", algo), _impl("cuda", "cudnn")
    problem = NET_LAYERS[layer].with_batch(4)
    a, b = (cupy.asarray(v) for v in reference.random_operands(problem, pass_, layout))
    outs = []
    for impl in (ours, cudnn):
        out = reference.nan_output(problem, pass_, layout, xp=cupy)
        impl.prepare(problem, pass_, layout, "fp32")(a, b, out)
        outs.append(out.get())
    rel, _ = verify.errors(*outs)
    assert rel <= verify.tolerance(algo, "fp32", problem, pass_)
