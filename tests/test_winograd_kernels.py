"""`winograd-2x2` and `winograd-4x4` through kernels/winograd.cu, and their fused forward form
`winograd-fused-2x2` and `winograd-fused-4x4`: every pass and layout under the emulator in CI,
checked against the float64 reference; their accuracy, refusals, workspace and phase breakdown;
the same on a GPU (`gpu` marker), there on AlexNet's and VGG-16's layers too and against
cuDNN."""

import dataclasses
import re

import numpy as np
import pytest

from convbench import testing
from convbench.algos import reference, registry, winograd_kernels
from convbench.algos.transforms import WinogradTransform, winograd_matrices
from convbench.catalogs.layers import net_layers
from convbench.core.problem import LAYOUTS, PASSES, ConvProblem
from convbench.cuda import kernels
from convbench.measure import verify

ALGOS = ("winograd-2x2", "winograd-4x4")
FUSED_ALGOS = ("winograd-fused-2x2", "winograd-fused-4x4")
FUSED_PASSES = ("fwd", "bwd_data")  # the forward form: no fused weight gradient
#: (algo, pass) of every kernel path: the non-fused algos in every pass, the fused in theirs.
ALGO_PASSES = [(a, p) for a in ALGOS for p in PASSES] + \
    [(a, p) for a in FUSED_ALGOS for p in FUSED_PASSES]

#: Small 3x3 problems whose tiles cross the image edge (5, 7, 13 pixels, rectangular, against
#: tiles of 2 and 4), padding 0-3 (3 makes bwd_data crop dy rather than pad it), channels that
#: are not multiples of the GEMM's 64 and cross it (67, 70), and reductions long enough to be
#: cut into slices: fwd over 512 channels, bwd_data over 512 filters, bwd_filter over 1920
#: (2x2: 7 slices, the last one short) and 512 (4x4: 2) tiles. They cross the fused kernel's
#: block edges too: 67 output channels against blocks of 32 (2x2) and 16 (4x4), 70 and 5 input
#: channels against chunks of 8 and 4, 56 tiles against blocks of 32.
PROBLEMS = [
    ConvProblem(n=2, c=5, h=7, w=13, k=7, r=3, s=3, pad=1),
    ConvProblem(n=1, c=3, h=5, w=5, k=4, r=3, s=3),
    ConvProblem(n=1, c=6, h=13, w=7, k=5, r=3, s=3, pad=2),
    ConvProblem(n=1, c=2, h=6, w=5, k=3, r=3, s=3, pad=3),
    ConvProblem(n=1, c=70, h=5, w=7, k=67, r=3, s=3, pad=1),
    ConvProblem(n=1, c=512, h=4, w=5, k=3, r=3, s=3, pad=1),
    ConvProblem(n=1, c=3, h=5, w=4, k=512, r=3, s=3, pad=1),
    ConvProblem(n=8, c=2, h=30, w=31, k=3, r=3, s=3, pad=1),
]


def _impl(algo: str, backend: str):
    return testing.runnable(algo, backend)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("algo, pass_", ALGO_PASSES)
@pytest.mark.parametrize("problem", PROBLEMS, ids=str)
def test_emu_matches_reference(problem, algo, pass_, layout):
    impl = _impl(algo, "emu")
    assert registry.supports(impl, problem, pass_, layout, "fp32") is None
    testing.assert_matches_reference(algo, "emu", problem, pass_, layout, "fp32")


@pytest.mark.parametrize("problem, pass_, slices", [
    (PROBLEMS[5], "fwd", {"winograd-2x2": 2, "winograd-4x4": 2}),
    (PROBLEMS[6], "bwd_data", {"winograd-2x2": 2, "winograd-4x4": 2}),
    (PROBLEMS[7], "bwd_filter", {"winograd-2x2": 7, "winograd-4x4": 2}),
], ids=str)
def test_long_reductions_are_sliced(problem, pass_, slices):
    """The test problems above do reach the sliced GEMM and the summing output transforms."""
    for algo, count in slices.items():
        note = registry.get(algo, "emu").describe(problem, pass_, "nchw", "fp32")
        assert note.endswith(f"reduction in {count} slices"), note


@pytest.mark.parametrize("pass_", PASSES)
def test_fp32_error_of_4x4_above_2x2(pass_):
    """F(4x4, 3x3)'s larger coefficients (up to 8 in Aᵀ, 5 in Bᵀ, 1/6 in G) amplify rounding
    over F(2x2, 3x3)'s (all 1 or 1/2): on the same data, measurably (~5x) worse. Both stay far
    inside their tolerances, and far above float64 rounding, so the kernels really run fp32."""
    problem = ConvProblem(n=1, c=32, h=13, w=13, k=32, r=3, s=3, pad=1)
    two, four = (testing.run_and_check(_impl(a, "emu"), problem, pass_, "nchw", "fp32", seed=1)
                 for a in ALGOS)
    assert two.ok and four.ok, (two.reason, four.reason)
    assert four.rel_error > 3 * two.rel_error, (four.rel_error, two.rel_error)
    assert two.rel_error > 1e-8


@pytest.mark.parametrize("change, reason", [
    ({"r": 5, "s": 5, "pad": 2}, "needs 3x3 filters (got 5x5)"),
    ({"stride": 2}, "needs stride 1 (got 2)"),
    ({"dilation": 2, "pad": 2}, "needs dilation 1 (got 2)"),
    ({"stride": (2, 1)}, "needs stride 1 (got 2x1)"),
    ({"dilation": (1, 2), "pad": (1, 2)}, "needs dilation 1 (got 1x2)"),
    ({"pad": (1, 0)}, "needs one padding for both axes (got pad 1x0)"),
    ({"pad": (0, 1)}, "needs one padding for both axes (got pad 0x1)"),
    ({"groups": 2}, "needs groups 1 (got 2)"),
])
@pytest.mark.parametrize("backend", ("cuda", "emu"))
@pytest.mark.parametrize("algo", ALGOS)
def test_unsupported_problems_say_why(algo, backend, change, reason):
    problem = dataclasses.replace(ConvProblem(n=1, c=4, h=9, w=9, k=4, r=3, s=3, pad=1), **change)
    for pass_ in PASSES:
        assert registry.supports(registry.get(algo, backend), problem, pass_, "nhwc",
                                 "fp32") == f"{algo} {reason}"


@pytest.mark.parametrize("backend, problem, precision, reason", [
    ("emu", PROBLEMS[0], "fp64", "runs fp32, not fp64"),
    ("emu", net_layers("alexnet")[2].problem.with_batch(2), "fp32", "too much for the emulator"),
    ("cuda", net_layers("vgg16")[1].problem.with_batch(512), "fp32", "32-bit ints"),
])
@pytest.mark.parametrize("algo", ALGOS)
def test_limits_say_why(algo, backend, problem, precision, reason):
    assert reason in registry.supports(registry.get(algo, backend), problem, "fwd", "nchw",
                                       precision)





@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("algo, pass_", ALGO_PASSES)
def test_emu_phases_repeat_the_pass(algo, pass_, layout):
    testing.assert_phases_replay(_impl(algo, "emu"), PROBLEMS[0], pass_, layout)


@pytest.mark.parametrize("algo", ALGOS)
def test_phases_are_named_like_the_fft_kernels(algo):
    """Transforms of both inputs, the product, the inverse (output) transform: the names the FFT
    kernels use, so a report lines the two algorithms' phases up."""
    impl, problem = registry.get(algo, "emu"), PROBLEMS[0]
    fft = registry.get("fft", "emu")
    for pass_ in PASSES:
        assert impl.phases(problem, pass_, "nchw", "fp32") == \
            fft.phases(problem, pass_, "nchw", "fp32")
    assert impl.phases(problem, "bwd_filter", "nhwc", "fp32") == [
        "transform x", "transform dy", "product", "inverse dw"]


def test_emu_phases_before_a_full_call_raise():
    run = _impl("winograd-2x2", "emu").prepare(PROBLEMS[0], "fwd", "nchw", "fp32")
    with pytest.raises(RuntimeError, match="full call"):
        run.phase_fns["product"]()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("algo", ALGOS)
def test_workspace_is_the_transformed_operands_and_products(algo, pass_, layout):
    """alpha² × (the first input's tiles + the filters or dy's tiles + the products), float32;
    AlexNet conv3 at batch 8: no reduction is sliced."""
    problem = net_layers("alexnet")[2].problem.with_batch(8)
    m = int(algo[-1])
    tiles, alpha2 = 8 * (-(-13 // m)) ** 2, (m + 2) ** 2
    cin, cout = {"fwd": (256, 384), "bwd_data": (384, 256), "bwd_filter": (256, 384)}[pass_]
    second, product = ((cout * tiles, cout * cin) if pass_ == "bwd_filter" else
                       (cout * cin, cout * tiles))
    expected = 4 * alpha2 * (cin * tiles + second + product)
    assert registry.get(algo, "cuda").workspace_bytes(problem, pass_, layout, "fp32") == expected


def _initializer(text: str) -> np.ndarray:
    return np.array([float(v.rstrip("f")) for v in text.strip("{}").split(",")], np.float32)


def test_baked_matrices_are_transforms_output():
    """Every table the kernels are compiled with is `winograd_matrices` rounded to float32,
    exactly, and every configuration carries the same tables."""
    tables = {k: v for k, v in winograd_kernels.CONFIGURATIONS[2, "nchw"].items()
              if k.startswith("WINO_F")}
    expected = {(m, r) for m in (2, 4) for r in (3,)} | {(3, m) for m in (2, 4)}
    assert {tuple(map(int, re.findall(r"\d+", k))) for k in tables} == expected
    for name, text in tables.items():
        m, r, label = re.fullmatch(r"WINO_F(\d)X(\d)_(\w+)", name).groups()
        exact = getattr(winograd_matrices(int(m), int(r)).astype(np.float32), label)
        np.testing.assert_array_equal(_initializer(text), exact.ravel())
    for defines in winograd_kernels.CONFIGURATIONS.values():
        assert {k: v for k, v in defines.items() if k.startswith("WINO_F")} == tables


@pytest.mark.parametrize("algo, pass_", [("winograd-2x2", p) for p in PASSES]
                         + [("winograd-fused-2x2", p) for p in FUSED_PASSES])
def test_checker_bites_on_a_sign_error_in_bt(algo, pass_, monkeypatch):
    """The kernels compiled with Bᵀ's row at infinity negated (uncompensated, the slip typing
    matrices in invites) fail the reference check in every pass, fused or not."""
    _impl("winograd-2x2", "emu")

    def wrong(m, r):
        t = winograd_matrices(m, r).astype(np.float32)
        return WinogradTransform(t.AT, t.G, np.concatenate([t.BT[:-1], -t.BT[-1:]]))

    defines = dict(winograd_kernels.CONFIGURATIONS[2, "nchw"])
    for m, r in ((2, 3), (3, 2)):
        defines[f"WINO_F{m}X{r}_BT"] = winograd_kernels._c_initializer(wrong(m, r).BT)
    monkeypatch.setattr(kernels, "launcher", lambda backend, name, _: kernels.load(
        backend, kernels.kernel_dir() / f"{name}.cu", defines))
    impl = registry.get(algo, "emu")
    assert not testing.run_and_check(impl, PROBLEMS[0], pass_, "nchw", "fp32").ok


# --- fused (every pass and layout of theirs against the reference: test_emu_matches_reference) ---
@pytest.mark.parametrize("backend", ("cuda", "emu"))
@pytest.mark.parametrize("algo", FUSED_ALGOS)
def test_fused_refuses_the_weight_gradient(algo, backend):
    reason = registry.supports(registry.get(algo, backend), PROBLEMS[0], "bwd_filter", "nchw",
                               "fp32")
    assert reason.startswith(f"{algo} fuses the forward form (fwd, bwd_data) only")
    assert f"winograd-{algo[-3:]}" in reason


@pytest.mark.parametrize("change, reason", [
    ({"r": 5, "s": 5, "pad": 2}, "needs 3x3 filters (got 5x5)"),
    ({"stride": 2}, "needs stride 1 (got 2)"),
    ({"stride": (1, 2)}, "needs stride 1 (got 1x2)"),
    ({"pad": (1, 0)}, "needs one padding for both axes (got pad 1x0)"),
    ({"groups": 2}, "needs groups 1 (got 2)"),
])
@pytest.mark.parametrize("algo", FUSED_ALGOS)
def test_fused_unsupported_problems_say_why(algo, change, reason):
    problem = dataclasses.replace(ConvProblem(n=1, c=4, h=9, w=9, k=4, r=3, s=3, pad=1), **change)
    for pass_ in FUSED_PASSES:
        assert registry.supports(registry.get(algo, "cuda"), problem, pass_, "nhwc",
                                 "fp32") == f"{algo} {reason}"
    assert "too much for the emulator" in registry.supports(
        registry.get(algo, "emu"), net_layers("alexnet")[2].problem.with_batch(2), "fwd",
        "nchw", "fp32")


@pytest.mark.parametrize("algo", FUSED_ALGOS)
def test_fused_is_one_kernel_after_the_filter_transform(algo, monkeypatch):
    """Only the transformed filters are a workspace (no transformed tiles, no products in global
    memory), and a pass launches the filter transform and the fused kernel, nothing else."""
    problem = net_layers("alexnet")[2].problem.with_batch(8)
    m = int(algo[-1])
    for pass_ in FUSED_PASSES:
        assert registry.get(algo, "cuda").workspace_bytes(problem, pass_, "nchw", "fp32") == \
            4 * (m + 2) ** 2 * 384 * 256
    asked = []
    real = kernels.Launcher.kernel

    def spy(self, name):
        asked.append(name)
        return real(self, name)

    monkeypatch.setattr(kernels.Launcher, "kernel", spy)
    impl = _impl(algo, "emu")
    for pass_ in FUSED_PASSES:
        asked.clear()
        run = impl.prepare(PROBLEMS[0], pass_, "nhwc", "fp32")
        assert sorted(asked) == ["wino_filter_transform", "wino_fused"]
        assert list(run.phase_fns) == ["transform w", "fused"]


@pytest.mark.parametrize("pass_", FUSED_PASSES)
def test_fused_error_of_4x4_above_2x2_and_near_the_unfused(pass_):
    """The fused kernels multiply by the same matrices as the non-fused ones, summing in another
    order: the same accuracy class (within 2x of their non-fused twin), and 4x4 worse than 2x2
    as there."""
    problem = ConvProblem(n=1, c=32, h=13, w=13, k=32, r=3, s=3, pad=1)
    err = {a: testing.run_and_check(_impl(a, "emu"), problem, pass_, "nchw", "fp32",
                                    seed=1).rel_error for a in ALGOS + FUSED_ALGOS}
    assert err["winograd-fused-4x4"] > 3 * err["winograd-fused-2x2"] > 3e-8, err
    for m in (2, 4):
        fused, unfused = err[f"winograd-fused-{m}x{m}"], err[f"winograd-{m}x{m}"]
        assert unfused / 2 < fused < 2 * unfused, err


@pytest.mark.parametrize("pass_", FUSED_PASSES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fused_missing_barrier_is_caught(pass_, layout, tmp_path):
    """wino_fused without the barrier after its multiply-adds (the next chunk's transforms then
    overwrite tiles other threads still read) fails the reference check: the emulated blocks'
    threads really interleave at the barriers that remain."""
    source = (kernels.kernel_dir() / "winograd.cu").read_text()
    body = source[source.index("wino_fused("):]
    barrier = "          for (int j = 0; j < FUSED_MT; ++j) acc[xi][i][j] += ro[i] * rt[j];\n" \
              "      }\n    __syncthreads();\n"
    assert body.count(barrier) == 1
    broken = tmp_path / "winograd.cu"
    broken.write_text(source.replace(barrier, barrier.replace("__syncthreads();", "")))
    (tmp_path / "common.cuh").write_text((kernels.kernel_dir() / "common.cuh").read_text())
    defines = winograd_kernels.CONFIGURATIONS[2, layout]
    good = testing.run_and_check(_impl("winograd-fused-2x2", "emu"), PROBLEMS[4], pass_, layout,
                                 "fp32")
    assert good.ok, good.reason

    class Broken(winograd_kernels.FusedWinogradKernels2x2):
        pass

    impl = Broken()
    impl.algo, impl.backend = "winograd-fused-2x2", "emu"
    from unittest import mock
    with mock.patch.object(kernels, "launcher",
                           lambda backend, name, _: kernels.load(backend, broken, defines)):
        assert not testing.run_and_check(impl, PROBLEMS[4], pass_, layout, "fp32").ok


# --- on a GPU ------------------------------------------------------------------------------------
def _run_cuda(algo: str, problem: ConvProblem, pass_: str, layout: str, a, b):
    import cupy

    impl = _impl(algo, "cuda")
    assert registry.supports(impl, problem, pass_, layout, "fp32") is None
    out = reference.nan_output(problem, pass_, layout, xp=cupy)
    impl.prepare(problem, pass_, layout, "fp32")(cupy.asarray(a), cupy.asarray(b), out)
    return out


def _check_cuda(algo: str, problem: ConvProblem, pass_: str, layout: str) -> verify.Check:
    a, b = reference.random_operands(problem, pass_, layout)
    out = _run_cuda(algo, problem, pass_, layout, a, b)
    ref = reference.reference(problem, pass_, layout, a, b)
    return verify.check(out, ref, algo, "fp32", problem, pass_)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("algo, pass_", ALGO_PASSES)
@pytest.mark.parametrize("problem", PROBLEMS, ids=str)
def test_cuda_matches_reference(problem, algo, pass_, layout):
    check = _check_cuda(algo, problem, pass_, layout)
    assert check.ok, check.reason


#: Every 3x3 stride-1 layer of the two networks: AlexNet's conv3-5 and all of VGG-16's.
_LAYERS = [layer for net in ("alexnet", "vgg16") for layer in net_layers(net)
           if (layer.problem.r, layer.problem.stride) == (3, 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("algo, pass_", ALGO_PASSES)
@pytest.mark.parametrize("layer", _LAYERS, ids=lambda layer: f"{layer.net}:{layer.name}")
def test_cuda_catalog_layers_batch2(layer, algo, pass_, layout):
    check = _check_cuda(algo, layer.problem.with_batch(2), pass_, layout)
    assert check.ok, check.reason


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("algo, pass_", ALGO_PASSES)
def test_cuda_phases_repeat_the_pass(algo, pass_, layout):
    import cupy

    problem = net_layers("alexnet")[3].problem.with_batch(2)
    testing.assert_phases_replay(_impl(algo, "cuda"), problem, pass_, layout, xp=cupy)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("algo, pass_", ALGO_PASSES)
@pytest.mark.parametrize("layer", ["conv3", "conv5"])
def test_cuda_agrees_with_cudnn(layer, algo, pass_, layout):
    """Within Winograd's tolerance of cuDNN (fp32, TF32 off) on AlexNet's 3x3 layers."""
    cudnn = registry.get("cudnn", "cuda")
    if reason := registry.impl_available(cudnn):
        pytest.skip(reason)
    import cupy

    problem = next(x.problem for x in net_layers("alexnet") if x.name == layer).with_batch(4)
    a, b = reference.random_operands(problem, pass_, layout)
    ours = _run_cuda(algo, problem, pass_, layout, a, b)
    theirs = reference.nan_output(problem, pass_, layout, xp=cupy)
    cudnn.prepare(problem, pass_, layout, "fp32")(cupy.asarray(a), cupy.asarray(b), theirs)
    check = verify.check(ours, cupy.asnumpy(theirs), algo, "fp32", problem, pass_)
    assert check.ok, check.reason
