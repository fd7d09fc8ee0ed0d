"""`gemm` through kernels/im2col.cu and kernels/gemm.cu: every pass and layout under the emulator
in CI against the float64 reference, and the SGEMM kernel itself against NumPy (every transpose
variant, both tile configurations, odd shapes, unaligned operands, several K-tiles, batches and
split reductions); `gemm-cublas`'s calls run in NumPy, and its bwd_filter lowering (every image
at once, dy copied) under the emulator with our SGEMM in cuBLAS's place; the same on a GPU
(`gpu` marker), there with `gemm-cublas` itself, AlexNet's layers and cuDNN too."""

import numpy as np
import pytest
from hypothesis import given, settings

from convbench import testing
from convbench.algos import gemm_kernels, kernel_base, reference, registry
from convbench.algos.gemm_kernels import Product, sgemm_geometry, sgemm_runner
from convbench.catalogs.layers import net_layers
from convbench.core.problem import LAYOUTS, PASSES, ConvProblem
from convbench.cuda import kernels
from convbench.measure import verify

#: `convbench gpu-first` runs this file's `gpu` tests after the pins (a suite).
pytestmark = pytest.mark.gpu_suites

#: Small problems that cross tile edges: GEMM sizes that are neither multiples of the 64- or
#: 128-wide tiles nor of 4 (7×13 and 9×11 pixels, 5, 7, 9 channels), strides 1 to 3, padding,
#: dilation 2, groups, reductions of many K-tiles (C·R·S = 360), and a bwd_filter reduction
#: split in two (N·P·Q = 512).
PROBLEMS = [
    ConvProblem(n=2, c=5, h=7, w=13, k=7, r=3, s=3, pad=1),
    ConvProblem(n=1, c=3, h=13, w=13, k=9, r=3, s=5, stride=2, pad=2, dilation=2),
    ConvProblem(n=2, c=3, h=13, w=7, k=5, r=3, s=2, stride=3, pad=1),
    ConvProblem(n=2, c=4, h=16, w=16, k=6, r=1, s=1),
    ConvProblem(n=2, c=6, h=9, w=11, k=4, r=3, s=3, pad=1, groups=2),
    ConvProblem(n=1, c=40, h=9, w=9, k=40, r=3, s=3, pad=1),
    ConvProblem(n=1, c=3, h=23, w=23, k=5, r=11, s=11, stride=4),
    *testing.PER_AXIS_PROBLEMS,  # stride, padding, dilation per axis: Inception's 1x7, 7x1
]
TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]


def _impl(algo: str, backend: str):
    return testing.runnable(algo, backend)


def _check(algo: str, backend: str, problem: ConvProblem, pass_: str, layout: str) -> None:
    impl = _impl(algo, backend)
    assert registry.supports(impl, problem, pass_, layout, "fp32") is None
    check = testing.run_and_check(impl, problem, pass_, layout, "fp32")
    assert check.ok, f"{algo}/{backend} {pass_} {layout} {problem}: {check.reason}"


# --- the convolution under the emulator ----------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("problem", PROBLEMS, ids=str)
def test_emu_matches_reference(problem, pass_, layout):
    _check("gemm", "emu", problem, pass_, layout)


@settings(max_examples=10, deadline=None)
@given(testing.problem_strategy(max_stride=3, max_dilation=2, max_groups=2,
                                per_axis=True))
def test_emu_matches_reference_on_random_problems(problem):
    for pass_ in PASSES:
        for layout in LAYOUTS:
            _check("gemm", "emu", problem, pass_, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
def test_emu_large_tiles(monkeypatch, pass_, layout):
    """Small problems get small tiles; forced large tiles must be right too."""
    monkeypatch.setattr(gemm_kernels, "LARGE_TILE_MIN_BLOCKS", 0)
    problem = PROBLEMS[0]
    assert "128×128 tiles" in registry.get("gemm", "emu").describe(problem, pass_, layout, "fp32")
    _check("gemm", "emu", problem, pass_, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_emu_split_reduction_is_right_and_deterministic(monkeypatch, layout):
    """bwd_filter in 5 slices: N·P·Q = 3 × 91 is 3 images × 12 K-tiles in nchw (images summed in
    the kernel, slices of 8 K-tiles straddling image boundaries) and 35 K-tiles in nhwc."""
    monkeypatch.setattr(gemm_kernels, "MIN_SPLIT_TILES", 7)
    impl = _impl("gemm", "emu")
    problem = ConvProblem(n=3, c=3, h=7, w=13, k=5, r=3, s=3, pad=1)
    assert impl.describe(problem, "bwd_filter", layout, "fp32").endswith("in 5 slices")
    product = gemm_kernels.conv_product(problem, "bwd_filter", layout)[0]
    assert impl.workspace_bytes(problem, "bwd_filter", layout, "fp32") == 4 * (
        gemm_kernels.col_elements(problem) + 5 * problem.k * problem.c * 9) > 0
    assert sgemm_geometry(product).partial_elements == 5 * product.c_extent
    _check("gemm", "emu", problem, "bwd_filter", layout)
    x, dy = reference.random_operands(problem, "bwd_filter", layout)
    run = impl.prepare(problem, "bwd_filter", layout, "fp32")
    first, second = (reference.nan_output(problem, "bwd_filter", layout) for _ in range(2))
    run(x, dy, first)
    run(x, dy, second)
    np.testing.assert_array_equal(first, second)


def _matrix(flat, offset, rows, cols, ld):
    return flat[offset + np.arange(rows)[:, None] * ld + np.arange(cols)[None, :]]


def _op(flat, offset, trans, rows, cols, ld):
    """op(X), rows × cols, of a row-major X stored transposed when `trans`."""
    return _matrix(flat, offset, cols, rows, ld).T if trans else _matrix(flat, offset, rows,
                                                                           cols, ld)


def _run_cublas_plan(p, a, b):
    """What `cublas_runner` makes cuBLAS do, in float64 NumPy: the calls in order (beta 0)."""
    out = np.full(_c_size(p), np.nan)
    for call in gemm_kernels.cublas_calls(p):
        for i in range(call.batch):
            c0 = call.c + i * call.strides[2]
            idx = c0 + np.arange(p.m)[:, None] * p.ldc + np.arange(p.n)[None, :]
            out[idx] = (_op(a, call.a + i * call.strides[0], p.trans_a, p.m, p.k, p.lda)
                        @ _op(b, call.b + i * call.strides[1], p.trans_b, p.k, p.n, p.ldb))
    return out


def _c_size(p):
    return p.c_extent + (0 if p.reduce else (p.images - 1) * p.c_image)


def _expected(p, a, b):
    out = np.full(_c_size(p), np.nan)
    for g in range(p.groups):
        for i in range(p.images):
            idx = (g * p.c_group + (0 if p.reduce else i * p.c_image)
                   + np.arange(p.m)[:, None] * p.ldc + np.arange(p.n)[None, :])
            prod = (_op(a, g * p.a_group + i * p.a_image, p.trans_a, p.m, p.k, p.lda)
                    @ _op(b, g * p.b_group + i * p.b_image, p.trans_b, p.k, p.n, p.ldb))
            out[idx] = (out[idx] if p.reduce and i else 0) + prod
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
def test_cublas_plan_computes_every_pass(pass_, layout):
    """The calls `cublas_runner` gives cuBLAS, run in NumPy on random operands, give each pass's
    product as cuBLAS is given it (`one_product`): separate per-image products, and nchw's
    bwd_filter as one product a group over the 7 images' pixels."""
    problem = ConvProblem(n=7, c=6, h=5, w=6, k=4, r=3, s=3, pad=1, groups=2)
    p = gemm_kernels.conv_product(problem, pass_, layout, one_product=True)[0]
    rng = np.random.default_rng(0)
    size = 4 * (problem.n * problem.c * problem.h * problem.w + problem.n * problem.k * 30
                + gemm_kernels.col_elements(problem) + problem.k * problem.c * 9) + 1000
    a, b = rng.standard_normal(size), rng.standard_normal(size)
    got, want = _run_cublas_plan(p, a, b), _expected(p, a, b)
    written = ~np.isnan(want)
    np.testing.assert_allclose(got[written], want[written], rtol=1e-12)
    assert np.isnan(got[~written]).all()  # nothing outside the products written


def test_cublas_bwd_filter_is_one_product_a_group_over_every_pixel():
    """cuBLAS sums only over k, so its bwd_filter is one product a group with k = N·P·Q, in nchw
    too (dy copied to [K][N·P·Q], the copy counted as workspace; with one image there is none),
    not slices of per-image products re-reading and re-writing partial results. AlexNet at
    batch 256, and one with groups."""
    impl = registry.get("gemm-cublas", "cuda")
    for layer in net_layers("alexnet"):
        problem = layer.problem
        npq = problem.n * problem.p * problem.q
        assert impl.workspace_bytes(problem, "bwd_filter", "nchw", "fp32") == 4 * (
            gemm_kernels.col_elements(problem) + problem.n * problem.k * problem.p * problem.q)
        assert impl.workspace_bytes(problem, "bwd_filter", "nhwc", "fp32") == (
            4 * gemm_kernels.col_elements(problem))
        note = impl.describe(problem, "bwd_filter", "nchw", "fp32")
        assert f"1 strided-batched call(s) of up to 1, each one product of k = N·P·Q = {npq}" \
            in note and "swap_nk" in note, layer.name
        for layout in LAYOUTS:
            product = gemm_kernels.conv_product(problem, "bwd_filter", layout,
                                                one_product=True)[0]
            assert (product.k, product.images, product.reduce) == (npq, 1, True)
            assert gemm_kernels.cublas_calls(product) == [
                gemm_kernels.CublasCall(0, 0, 0, 1, (0, 0, 0))]
    grouped = ConvProblem(n=4, c=6, h=9, w=9, k=8, r=3, s=3, pad=1, groups=2)
    for pass_, layout in ((q, lay) for q in PASSES for lay in LAYOUTS):
        product = gemm_kernels.conv_product(grouped, pass_, layout, one_product=True)[0]
        calls = gemm_kernels.cublas_calls(product)
        assert [(c.a, c.b, c.c) for c in calls] == [
            (g * product.a_group, g * product.b_group, g * product.c_group) for g in range(2)]
        assert {c.batch for c in calls} == {product.images}
        if pass_ == "bwd_filter":
            assert product.k == grouped.n * grouped.p * grouped.q and product.images == 1
    single = ConvProblem(n=1, c=6, h=9, w=9, k=8, r=3, s=3, pad=1, groups=2)
    assert impl.workspace_bytes(single, "bwd_filter", "nchw", "fp32") == (
        4 * gemm_kernels.col_elements(single))  # dy is [K][P·Q] already
    assert "swap_nk" not in impl.describe(single, "bwd_filter", "nchw", "fp32")
    ours = gemm_kernels.conv_product(grouped, "bwd_filter", "nchw")[0]  # summed over images
    with pytest.raises(ValueError, match="cuBLAS sums over k only"):
        gemm_kernels.cublas_calls(ours)


def _columns_of_every_image(problem: ConvProblem, layout: str, x: np.ndarray) -> np.ndarray:
    """im2col_images' matrix in NumPy: [G][taps in the layout's filter-row order][N·P·Q]."""
    p = problem
    xn = x if layout == "nchw" else x.transpose(0, 3, 1, 2)
    iy = p.stride_h * np.arange(p.p)[None, :] - p.pad_top + p.dil_h * np.arange(p.r)[:, None]
    ix = p.stride_w * np.arange(p.q)[None, :] - p.pad_left + p.dil_w * np.arange(p.s)[:, None]
    seen = xn[:, :, iy.clip(0, p.h - 1)[:, None, :, None], ix.clip(0, p.w - 1)[None, :, None, :]]
    inside = (((iy >= 0) & (iy < p.h))[:, None, :, None]
              & ((ix >= 0) & (ix < p.w))[None, :, None, :])
    col = (seen * inside).reshape(p.n, p.groups, p.cg, p.r, p.s, p.p, p.q)  # n g c r s p q
    order = (1, 2, 3, 4, 0, 5, 6) if layout == "nchw" else (1, 3, 4, 2, 0, 5, 6)
    return col.transpose(order).ravel()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("problem", PROBLEMS + list(testing.ASYMMETRIC_PROBLEMS), ids=str)
def test_emu_im2col_images_is_every_images_column_matrix(problem, layout):
    """im2col_images writes [G][taps][N·P·Q], the taps in the order of the layout's filter row:
    every element, exactly, padding included (groups, strides, dilation, padding per side)."""
    _impl("gemm", "emu")
    x = reference.random_operands(problem, "bwd_filter", layout)[0]
    col = np.full(gemm_kernels.col_elements(problem), np.nan, np.float32)
    launch = kernels.launcher("emu", "im2col", gemm_kernels.LOWERING[layout])
    p = problem
    launch.kernel("im2col_images")(
        kernel_base.ceil_div(col.size, gemm_kernels.LOWERING_THREADS),
        gemm_kernels.LOWERING_THREADS,
        (x, col, p.n, p.c, p.h, p.w, p.r, p.s, p.p, p.q, *kernel_base.axis_args(p), p.groups))
    np.testing.assert_array_equal(col, _columns_of_every_image(problem, layout, x))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_emu_swap_nk_puts_the_images_inside(layout):
    """swap_nk: out[k][n][l] = in[n][k][l], odd sizes, one thread per element past a block."""
    _impl("gemm", "emu")
    n, k, length = 3, 5, 37
    dy = np.random.default_rng(2).standard_normal((n, k, length)).astype(np.float32)
    out = np.full(dy.size, np.nan, np.float32)
    launch = kernels.launcher("emu", "im2col", gemm_kernels.LOWERING[layout])
    launch.kernel("swap_nk")(kernel_base.ceil_div(dy.size, gemm_kernels.LOWERING_THREADS),
                             gemm_kernels.LOWERING_THREADS, (dy, out, n, k, length))
    np.testing.assert_array_equal(out, dy.transpose(1, 0, 2).ravel())


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("problem", PROBLEMS + list(testing.ASYMMETRIC_PROBLEMS), ids=str)
def test_emu_cublas_lowering_matches_reference(monkeypatch, problem, layout):
    """gemm-cublas's bwd_filter as it runs on the GPU (im2col_images, swap_nk, one product a
    group over N·P·Q) with our SGEMM standing in for cuBLAS, under the emulator, against the
    float64 reference."""
    _impl("gemm", "emu")
    impl = gemm_kernels.GemmCublas()
    impl.algo, impl.backend = "gemm-cublas", "emu"
    monkeypatch.setattr(impl, "_multiplier",
                        lambda product: sgemm_runner("emu", sgemm_geometry(product)))
    check = testing.run_and_check(impl, problem, "bwd_filter", layout, "fp32")
    assert check.ok, f"bwd_filter {layout} {problem}: {check.reason}"


def test_workspace_is_the_column_matrix():
    problem = net_layers("alexnet")[1].problem  # conv2, batch 256: 96·5·5 × 256·27·27 floats
    for algo, backend in (("gemm", "emu"), ("gemm", "cuda"), ("gemm-cublas", "cuda")):
        impl = registry.get(algo, backend)
        assert impl.workspace_bytes(problem, "fwd", "nchw", "fp32") == 4 * 96 * 25 * 256 * 729


@pytest.mark.parametrize("backend, problem, pass_, precision, reason", [
    ("emu", net_layers("alexnet")[1].problem.with_batch(2), "fwd", "fp32", "emulator"),
    ("emu", PROBLEMS[0], "fwd", "fp64", "runs fp32"),
    ("cuda", net_layers("alexnet")[1].problem.with_batch(2048), "fwd", "fp32",
     "im2col workspace"),
    ("cuda", ConvProblem(n=70000, c=1, h=4, w=4, k=1, r=1, s=1), "fwd", "fp32", "grid"),
])
def test_unsupported_problems_say_why(backend, problem, pass_, precision, reason):
    impl = registry.get("gemm", backend)
    assert reason in registry.supports(impl, problem, pass_, "nchw", precision)


# --- the SGEMM kernel against NumPy --------------------------------------------------------------
def _operands(rng, ta: bool, tb: bool, m: int, n: int, k: int, pad: int = 0, offset: int = 0):
    """A (m×k, stored k×m when ta) and B (k×n, stored n×k when tb) with `pad` extra columns
    (leading dimension = row length + pad), each starting `offset` floats into its buffer."""
    def stored(rows, cols):
        buf = rng.standard_normal(offset + rows * (cols + pad)).astype(np.float32)
        return buf[offset:], buf[offset:].reshape(rows, cols + pad)[:, :cols], cols + pad

    a, a_view, lda = stored(*((k, m) if ta else (m, k)))
    b, b_view, ldb = stored(*((n, k) if tb else (k, n)))
    ref = (a_view.T if ta else a_view).astype(np.float64) @ (b_view.T if tb else b_view)
    return a, b, lda, ldb, ref


def _sgemm(backend, tiles, ta, tb, m, n, k, pad=0, offset=0, seed=0):
    """(C from gemm.cu, float64 reference) for one product; C is NaN where unwritten."""
    a, b, lda, ldb, ref = _operands(np.random.default_rng(seed), ta, tb, m, n, k, pad, offset)
    product = Product(ta, tb, m, n, k, lda, ldb, n)
    launch = sgemm_runner(backend, sgemm_geometry(product, tiles))
    if backend == "cuda":
        import cupy

        # Whole buffers to the device, sliced there: cupy.asarray of the host slice would start
        # a fresh, aligned allocation, and the unaligned cases would test nothing.
        a, b = (cupy.asarray(v.base)[offset:] for v in (a, b))
        assert a.data.ptr % 16 == 4 * offset % 16
        c = cupy.full((m, n), np.nan, np.float32)
        launch(a, b, c)
        return c.get(), ref
    c = np.full((m, n), np.nan, np.float32)
    launch(a, b, c)
    return c, ref


def _assert_close(c, ref, k):
    assert verify.errors(c, ref)[0] <= 1e-5 * max(1.0, np.sqrt(k / 4096)), verify.errors(c, ref)


#: (m, n, k, leading-dimension pad, base offset): odd sizes (no float4 anywhere); multiples of 4
#: (float4 loads and stores inside, edges where the tile overhangs); one element; padded leading
#: dimensions; operands 1 float past a 16-byte boundary (the scalar path at every tile).
SHAPES = [(70, 131, 43, 0, 0), (132, 68, 72, 0, 0), (1, 1, 1, 0, 0), (36, 40, 20, 4, 0),
          (36, 40, 20, 0, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("ta, tb", TRANSPOSES, ids=lambda t: "nt"[t])
@pytest.mark.parametrize("tiles", gemm_kernels.TILES)
def test_emu_sgemm_matches_numpy(tiles, ta, tb, shape):
    _impl("gemm", "emu")
    m, n, k, pad, offset = shape
    c, ref = _sgemm("emu", tiles, ta, tb, m, n, k, pad, offset)
    _assert_close(c, ref, k)


@pytest.mark.parametrize("k", [8, 9, 77, 259])
@pytest.mark.parametrize("tiles", gemm_kernels.TILES)
def test_emu_sgemm_double_buffering_over_many_k_tiles(tiles, k):
    """One K-tile, one and a bit, and many (10 and 33 of 8): every tile is staged into the
    buffer the previous one was not read from, behind one barrier per tile."""
    _impl("gemm", "emu")
    c, ref = _sgemm("emu", tiles, False, True, 67, 72, k)
    _assert_close(c, ref, k)


@pytest.mark.parametrize("reduce", [False, True])
def test_emu_sgemm_batches_groups_and_images(monkeypatch, reduce):
    """Two groups × three images with odd strides: separate products per (group, image), or per
    group summed over the images (3 × 3 K-tiles) in 2 slices that straddle an image boundary."""
    monkeypatch.setattr(gemm_kernels, "MIN_SPLIT_TILES", 4)
    _impl("gemm", "emu")
    rng = np.random.default_rng(1)
    groups, images, m, n, k = 2, 3, 9, 13, 21
    a = rng.standard_normal((groups, images, m, k)).astype(np.float32)
    b = rng.standard_normal((images, groups, n, k)).astype(np.float32)  # stored transposed
    c_shape = (groups, m, n) if reduce else (groups, images, m, n)
    c = np.full(c_shape, np.nan, np.float32)
    product = Product(False, True, m, n, k, k, k, n, groups, images, reduce,
                      a_group=images * m * k, a_image=m * k, b_group=n * k,
                      b_image=groups * n * k, c_group=c[0].size, c_image=0 if reduce else m * n)
    geo = sgemm_geometry(product, "small")
    assert geo.grid[2] == groups * (2 if reduce else images)
    sgemm_runner("emu", geo)(a, b, c)
    ref = np.einsum("gimk,ignk->gimn", a.astype(np.float64), b)
    _assert_close(c, ref.sum(axis=1) if reduce else ref, images * k)


# --- on a GPU ------------------------------------------------------------------------------------
CUDA_ALGOS = ["gemm", "gemm-cublas"]


@pytest.mark.gpu
@pytest.mark.parametrize("algo", CUDA_ALGOS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("problem", PROBLEMS, ids=str)
def test_cuda_matches_reference(problem, pass_, layout, algo):
    _check(algo, "cuda", problem, pass_, layout)


@pytest.mark.gpu
@pytest.mark.parametrize("algo", CUDA_ALGOS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("layer", net_layers("alexnet"), ids=lambda layer: layer.name)
def test_cuda_alexnet_batch2(layer, pass_, layout, algo):
    _check(algo, "cuda", layer.problem.with_batch(2), pass_, layout)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("layer", net_layers("alexnet"), ids=lambda layer: layer.name)
def test_cuda_agrees_with_cudnn(layer, pass_, layout):
    """Our GEMM and cuDNN (FP32, TF32 off) on the same operands agree to FP32 tolerance."""
    import cupy

    cudnn, ours = _impl("cudnn", "cuda"), _impl("gemm", "cuda")
    problem = layer.problem.with_batch(2)
    a, b = (cupy.asarray(v) for v in reference.random_operands(problem, pass_, layout))
    outs = []
    for impl in (cudnn, ours):
        out = reference.nan_output(problem, pass_, layout, xp=cupy)
        impl.prepare(problem, pass_, layout, "fp32")(a, b, out)
        outs.append(out.get())
    check = verify.check(outs[1], outs[0], "gemm", "fp32", problem, pass_)
    assert check.ok, check.reason


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES + [(1000, 777, 1029, 0, 0)], ids=str)
@pytest.mark.parametrize("ta, tb", TRANSPOSES, ids=lambda t: "nt"[t])
@pytest.mark.parametrize("tiles", gemm_kernels.TILES)
def test_cuda_sgemm_matches_numpy(tiles, ta, tb, shape):
    _impl("gemm", "cuda")
    m, n, k, pad, offset = shape
    c, ref = _sgemm("cuda", tiles, ta, tb, m, n, k, pad, offset)
    _assert_close(c, ref, k)
