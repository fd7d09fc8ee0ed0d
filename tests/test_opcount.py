import math
import re

import pytest

from convbench.algos import counts, fft_kernels, registry
from convbench.catalogs.layers import net_layers, resolve
from convbench.core.problem import ConvProblem
from convbench.measure import opcount

CONV2 = resolve("alexnet:conv2").problem  # batch 256, the study's


def test_alexnet_conv2_direct_is_the_studys_229_gflop():
    # 96·27·27·5·5·256·256·2 (Kim et al., ISPASS 2017)
    for pass_ in ("fwd", "bwd_data", "bwd_filter"):
        ops = opcount.op_count("direct", CONV2, pass_)
        assert ops.total == 229_323_571_200
        assert ops.multiplications == 229_323_571_200 // 2


def test_gemm_is_direct_arithmetic_plus_the_column_matrix():
    cols = 256 * 27 * 27 * 96 * 5 * 5  # one row of C·R·S per output pixel
    fwd = opcount.op_count("gemm", CONV2, "fwd", "fp32")
    assert (fwd.products, fwd.transforms, fwd.lowering_bytes) == (229_323_571_200, 0, 2 * cols * 4)
    assert opcount.op_count("gemm", CONV2, "bwd_data").transforms == cols  # col2im adds
    assert opcount.theoretical_workspace("gemm", CONV2, "fwd", "fp64") == cols * 8


@pytest.mark.parametrize("algo, ratio", [("winograd-2x2", 9 / (16 / 4)),   # 2.25x fewer
                                         ("winograd-4x4", 9 / (36 / 16))])  # 4x fewer
def test_winograd_elementwise_multiplications(algo, ratio):
    p = ConvProblem(n=2, c=8, h=16, w=16, k=4, r=3, s=3, pad=1)  # 16x16 out: whole tiles
    for pass_ in ("fwd", "bwd_data", "bwd_filter"):
        direct = opcount.op_count("direct", p, pass_).multiplications
        assert direct / opcount.op_count(algo, p, pass_).multiplications == ratio


def test_winograd_transforms_f2x2():
    p = ConvProblem(n=1, c=1, h=2, w=2, k=1, r=3, s=3, pad=1)  # one tile, one plane each
    ops = opcount.op_count("winograd-2x2", p, "fwd")
    # input 4x4: 2·(4·4·4)·2 = 256; filter 3x3 -> 4x4: 2·4·9 + 2·16·3 = 168;
    # output 4x4 -> 2x2: 2·2·16 + 2·4·4 = 96
    assert ops.transforms == 256 + 168 + 96
    assert ops.products == 2 * 16


def test_winograd_counts_5x5_filters():
    """F(4x4, 5x5) on whole tiles: 64 products per 16 outputs where direct does 16·25."""
    p = ConvProblem(n=1, c=2, h=16, w=16, k=3, r=5, s=5, pad=2)
    direct = opcount.op_count("direct", p, "fwd").multiplications
    assert direct / opcount.op_count("winograd-4x4", p, "fwd").multiplications == 25 / 4


def test_winograd_has_no_count_where_it_does_not_apply():
    seven = ConvProblem(n=1, c=1, h=9, w=9, k=1, r=7, s=7, pad=3)
    assert opcount.op_count("winograd-2x2", seven, "fwd") is None
    strided = ConvProblem(n=1, c=1, h=8, w=8, k=1, r=3, s=3, stride=2)  # 2x2 per phase
    assert opcount.op_count("winograd-4x4", strided, "fwd") is None
    assert opcount.theoretical_workspace("winograd-4x4", strided, "fwd") is None
    grouped = ConvProblem(n=1, c=4, h=8, w=8, k=4, r=3, s=3, pad=1, groups=2)
    # a dilation its stride does not divide: no undilated phases (those are counted as the
    # phases' problem, tests/test_dilation.py)
    dilated = ConvProblem(n=1, c=1, h=9, w=9, k=1, r=3, s=3, pad=3, stride=2, dilation=3)
    for p in (grouped, dilated):
        for algo in ("winograd-2x2", "winograd-4x4"):
            # the implementations refuse these, so there is nothing to count
            assert registry.supports(registry.get(algo, "numpy"), p, "fwd", "nchw", "fp32")
            assert opcount.op_count(algo, p, "fwd") is None
            assert opcount.theoretical_workspace(algo, p, "fwd") is None


def test_fft_small_case_exactly():
    p = ConvProblem(n=1, c=1, h=4, w=4, k=1, r=1, s=1)
    for backend in ("numpy", "emu", "cuda"):  # 4 is a fast size for FFTW and cuFFT alike
        ops = opcount.op_count("fft", p, "fwd", backend=backend)
        # three 4x4 planes (x, w, y), 2.5·16·log2(16) each; 4·3 spectrum bins, one complex MAC
        assert ops.transforms == 3 * 2.5 * 16 * 4
        assert (ops.products, ops.multiplications) == (8 * 12, 4 * 12)
        assert opcount.theoretical_workspace("fft", p, "fwd", "fp32", backend) == 3 * 12 * 2 * 4


def test_fft_grid_is_the_implementations_per_backend():
    p = ConvProblem(n=1, c=1, h=22, w=22, k=1, r=1, s=1)
    # FFTW transforms 22 = 2·11 directly; cuFFT's radices are 2, 3, 5, 7, so the kernels use 24.
    cpu = opcount.op_count("fft", p, "fwd", backend="numpy")
    assert cpu.transforms == round(3 * 2.5 * 22 * 22 * math.log2(22 * 22)) == 32375
    assert cpu.products == 8 * 22 * 12
    gpu = opcount.op_count("fft", p, "fwd", backend="emu")
    assert gpu.transforms == round(3 * 2.5 * 24 * 24 * math.log2(24 * 24)) == 39614
    assert gpu.products == 8 * 24 * 13
    assert opcount.op_count("fft", p, "fwd", backend="cuda") == gpu


def test_alexnet_conv2_fft_grid_is_30_not_the_padded_31():
    # 27 + pad 2 = 29 cells suffice (one zero gap serves both sides): fast(29) = 30 = 2·3·5.
    planes = 256 * 96 + 256 * 96 + 256 * 256  # x, y per image; w per filter
    bins = 30 * 16
    for backend in ("numpy", "cuda"):
        ops = opcount.op_count("fft", CONV2, "fwd", backend=backend)
        assert ops.transforms == round(planes * 2.5 * 900 * math.log2(900)) == 2_532_426_609
        assert ops.products == 8 * 256 * 256 * 96 * bins == 24_159_191_040
        assert opcount.theoretical_workspace("fft", CONV2, "fwd", "fp32", backend) == \
            planes * bins * 8


@pytest.mark.parametrize("backend, algo", [("numpy", "fft"), ("emu", "fft"), ("emu", "fft-tiled")])
@pytest.mark.parametrize("spec", ["n=1,c=1,h=22,w=22,k=1,r=1,s=1",
                                  "n=1,c=1,h=27,w=27,k=1,r=5,s=5,pad=2",
                                  "n=1,c=1,h=62,w=40,k=1,r=3,s=3,pad=1",
                                  "n=1,c=1,h=64,w=64,k=1,r=17,s=17"])
def test_fft_grid_is_the_one_the_implementation_says_it_runs(backend, algo, spec):
    p = resolve(spec).problem
    impl = registry.get(algo, backend)
    for pass_ in ("fwd", "bwd_data", "bwd_filter"):
        note = impl.describe(p, pass_, "nchw", "fp32")  # "..., transform 32x32, 3x2 tiles"
        th, tw = map(int, re.search(r"transform (\d+)x(\d+)", note).groups())
        tiles = math.prod(map(int, re.search(r"(\d+)x(\d+) tiles", note).groups())) \
            if "tiles" in note else 1
        ops = opcount.op_count(algo, p, pass_, backend=backend)
        assert ops.multiplications == 4 * tiles * th * (tw // 2 + 1), note  # n = c = k = 1


def test_fft_cost_does_not_depend_on_the_filter_size():
    small = ConvProblem(n=2, c=3, h=20, w=20, k=4, r=3, s=3, pad=2)
    large = ConvProblem(n=2, c=3, h=20, w=20, k=4, r=5, s=5, pad=2)
    assert opcount.op_count("fft", small, "fwd") == opcount.op_count("fft", large, "fwd")
    assert opcount.op_count("direct", small, "fwd").total < opcount.op_count(
        "direct", large, "fwd").total


def test_fft_tiled_tiles_the_plane():
    p = ConvProblem(n=1, c=1, h=62, w=62, k=1, r=3, s=3)  # whole grid fast(62) = 63 > 32
    points = fft_kernels.TILE ** 2
    bins = 32 * 17
    # fwd and bwd_filter tile the 60x60 output, 30 rows a tile: 2x2 tiles; bwd_data tiles
    # the 62x62 dx: 3x3 tiles. x and y per tile, the filter once.
    for pass_, tiles in (("fwd", 4), ("bwd_data", 9), ("bwd_filter", 4)):
        ops = opcount.op_count("fft-tiled", p, pass_, backend="emu")
        assert ops.transforms == round((2 * tiles + 1) * 2.5 * points * 10)
        assert ops.products == 8 * tiles * bins
    assert opcount.op_count("fft-tiled", p, "fwd", backend="emu").transforms == 230_400


def test_fft_tiled_keeps_the_whole_grid_where_tiles_do_not_pay():
    fits = ConvProblem(n=1, c=2, h=13, w=13, k=2, r=3, s=3, pad=1)  # grid 14 <= 32
    wide = ConvProblem(n=1, c=1, h=64, w=64, k=1, r=17, s=17)  # 2·17 > 32
    for p in (fits, wide):
        assert opcount.op_count("fft-tiled", p, "fwd", backend="cuda") == \
            opcount.op_count("fft", p, "fwd", backend="cuda")


def test_fft_tiled_has_no_cpu_implementation_to_count():
    with pytest.raises(ValueError, match="no numpy implementation"):
        opcount.op_count("fft-tiled", CONV2, "fwd", backend="numpy")


class _StandIn(registry.Implementation):
    """An implementation (of `gemm` on numpy) that keeps the contract and runs nothing."""

    algo, backend, precisions = "gemm", "numpy", ("fp32",)

    def supports(self, problem, pass_, layout, precision):
        return None

    def prepare(self, problem, pass_, layout, precision):
        raise NotImplementedError


def test_fft_grid_comes_from_the_implementation():
    for algo in ("fft", "fft-tiled"):
        for impl in registry.implementations():
            if impl.algo == algo:
                assert isinstance(impl, registry.TransformGrid)


def test_an_fft_implementation_without_its_grid_cannot_be_counted(monkeypatch):
    registry.load()
    monkeypatch.setitem(registry._IMPLS, ("fft", "numpy"), _StandIn())
    with pytest.raises(ValueError, match="fft on numpy does not give its transform grid"):
        opcount.op_count("fft", CONV2, "fwd")


def test_library_algorithms_have_no_count():
    for algo in ("cudnn", "cudnn-autotune", "torch-cpu"):
        assert opcount.op_count(algo, CONV2, "fwd") is None
        assert opcount.theoretical_workspace(algo, CONV2, "fwd") is None
    assert opcount.theoretical_workspace("direct", CONV2, "fwd") == 0


def test_workspace_prefers_what_the_implementation_declares():
    class Declares(_StandIn):
        def workspace_bytes(self, problem, pass_, layout, precision):
            return 123

    class Silent(_StandIn):
        pass

    assert opcount.workspace_bytes(Declares(), CONV2, "fwd", "nchw", "fp32") == 123
    assert opcount.workspace_bytes(Silent(), CONV2, "fwd", "nchw", "fp32") == \
        opcount.theoretical_workspace("gemm", CONV2, "fwd", "fp32")


def test_fused_winograd_counts_like_its_twin_and_keeps_only_the_filters():
    """The fused kernels do the non-fused ones' arithmetic; on paper their only workspace is the
    transformed filters (α²·K·C), and they have no weight gradient to count."""
    p = ConvProblem(n=2, c=8, h=16, w=16, k=4, r=3, s=3, pad=1)
    for m in (2, 4):
        fused, twin = f"winograd-fused-{m}x{m}", f"winograd-{m}x{m}"
        for pass_ in ("fwd", "bwd_data"):
            assert opcount.op_count(fused, p, pass_) == opcount.op_count(twin, p, pass_)
            assert opcount.theoretical_workspace(fused, p, pass_) == (m + 2) ** 2 * 4 * 8 * 4
        assert opcount.op_count(fused, p, "bwd_filter") is None
        assert opcount.theoretical_workspace(fused, p, "bwd_filter") is None
        assert registry.get(fused, "emu").workspace_bytes(p, "fwd", "nchw", "fp32") == \
            opcount.theoretical_workspace(fused, p, "fwd")


#: Inception-v3's 1x7 at 17x17 (pad 0x3) and a 3x3 strided 2x1, dilated 1x2.
INCEPTION_1X7 = ConvProblem(n=1, c=128, h=17, w=17, k=128, r=1, s=7, pad=(0, 3))
STRIDED = ConvProblem(n=1, c=8, h=17, w=20, k=16, r=3, s=3, stride=(2, 1), pad=(1, 2),
                      dilation=(1, 2))


def test_per_axis_counts_and_workspace_follow_each_axis():
    for p, (out_h, out_w) in ((INCEPTION_1X7, (17, 17)), (STRIDED, (9, 20))):
        assert (p.p, p.q) == (out_h, out_w)
        direct = opcount.op_count("direct", p, "fwd")
        assert direct.products == 2 * p.n * p.k * out_h * out_w * p.c * p.r * p.s
        cols = p.n * out_h * out_w * p.c * p.r * p.s
        assert opcount.op_count("gemm", p, "bwd_data").transforms == cols
        assert opcount.theoretical_workspace("gemm", p, "fwd", "fp32") == cols * 4
        # the CPU gemm also holds the zero-bordered input its one strided im2col copy reads
        padded = p.n * (p.h + 2 * p.pad_h) * (p.w + 2 * p.pad_w) * p.c
        assert registry.get("gemm", "numpy").workspace_bytes(p, "fwd", "nhwc", "fp32") == \
            (cols + padded) * 4


def test_per_axis_fft_grid_pads_each_axis_and_winograd_has_no_count():
    # 17 + 0 rows and 17 + 3 columns, each on FFTW's fast sizes
    th, tw, _ = counts.fft_grid(INCEPTION_1X7, "fwd", "fft", "numpy")
    assert (th, tw) == (18, 20)
    assert opcount.op_count("fft", INCEPTION_1X7, "fwd") is not None
    padded_3x3 = ConvProblem(n=1, c=4, h=8, w=8, k=4, r=3, s=3, pad=(1, 0))
    for p in (padded_3x3, ConvProblem(n=1, c=4, h=8, w=8, k=4, r=3, s=3, stride=(1, 2))):
        for algo in ("winograd-2x2", "winograd-fused-4x4"):
            assert registry.supports(registry.get(algo, "numpy" if "fused" not in algo
                                                  else "emu"), p, "fwd", "nchw", "fp32")
            assert opcount.op_count(algo, p, "fwd") is None
            assert opcount.theoretical_workspace(algo, p, "fwd") is None


@pytest.mark.parametrize("pass_", ["fwd", "bwd_data", "bwd_filter"])
def test_strided_winograd_on_the_cpu_counts_its_phase_split(pass_):
    """AlexNet's conv1 (11x11, stride 4) runs on the CPU as 48 channels of 3x3 filters: counted
    as that problem; the GPU kernels take stride 1 only, so there it has no count."""
    conv1 = next(x.problem for x in net_layers("alexnet") if x.name == "conv1")
    split = ConvProblem(n=conv1.n, c=48, h=57, w=57, k=conv1.k, r=3, s=3)
    assert split.p == conv1.p == 55
    for algo in ("winograd-4x4", "winograd-5x5"):
        assert opcount.op_count(algo, conv1, pass_) == opcount.op_count(algo, split, pass_)
        assert opcount.theoretical_workspace(algo, conv1, pass_) == \
            opcount.theoretical_workspace(algo, split, pass_)
        assert opcount.op_count(algo, conv1, pass_, backend="cuda") is None
    # 144/121 zero taps, yet F(5x5, 3x3) does 3.2-3.9x fewer multiplications than direct
    direct = opcount.op_count("direct", conv1, pass_).multiplications
    assert 3 < direct / opcount.op_count("winograd-5x5", conv1, pass_).multiplications < 4
