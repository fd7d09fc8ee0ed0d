import pytest

from convbench import opcount
from convbench.layers import resolve
from convbench.problem import ConvProblem

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


def test_winograd_has_no_count_where_it_does_not_apply():
    assert opcount.op_count("winograd-2x2", CONV2, "fwd") is None  # 5x5
    strided = ConvProblem(n=1, c=1, h=8, w=8, k=1, r=3, s=3, stride=2)
    assert opcount.op_count("winograd-4x4", strided, "fwd") is None
    assert opcount.theoretical_workspace("winograd-4x4", strided, "fwd") is None


def test_fft_small_case_exactly():
    p = ConvProblem(n=1, c=1, h=4, w=4, k=1, r=1, s=1)
    ops = opcount.op_count("fft", p, "fwd")
    # three 4x4 planes (x, w, y), 2.5·16·log2(16) each; 4·3 spectrum bins, one complex MAC each
    assert ops.transforms == 3 * 2.5 * 16 * 4
    assert (ops.products, ops.multiplications) == (8 * 12, 4 * 12)
    assert opcount.theoretical_workspace("fft", p, "fwd", "fp32") == 3 * 12 * 2 * 4


def test_fft_cost_does_not_depend_on_the_filter_size():
    small = ConvProblem(n=2, c=3, h=20, w=20, k=4, r=3, s=3, pad=2)
    large = ConvProblem(n=2, c=3, h=20, w=20, k=4, r=5, s=5, pad=2)
    assert opcount.op_count("fft", small, "fwd") == opcount.op_count("fft", large, "fwd")
    assert opcount.op_count("direct", small, "fwd").total < opcount.op_count(
        "direct", large, "fwd").total


def test_fft_tiled_tiles_the_plane():
    p = ConvProblem(n=1, c=1, h=62, w=62, k=1, r=3, s=3)  # 60x60 out = 2x2 tiles of 30
    ops = opcount.op_count("fft-tiled", p, "fwd")
    points = opcount.FFT_TILE ** 2
    planes = 2 * 4 + 1  # x and y per tile, the filter once
    assert ops.transforms == round(planes * 2.5 * points * 10)


def test_library_algorithms_have_no_count():
    for algo in ("cudnn", "cudnn-autotune", "torch-cpu"):
        assert opcount.op_count(algo, CONV2, "fwd") is None
        assert opcount.theoretical_workspace(algo, CONV2, "fwd") is None
    assert opcount.theoretical_workspace("direct", CONV2, "fwd") == 0


def test_workspace_prefers_what_the_implementation_declares():
    class Declares:
        algo = "gemm"

        def workspace_bytes(self, problem, pass_, layout, precision):
            return 123

    class Silent:
        algo = "gemm"

    assert opcount.workspace_bytes(Declares(), CONV2, "fwd", "nchw", "fp32") == 123
    assert opcount.workspace_bytes(Silent(), CONV2, "fwd", "nchw", "fp32") == \
        opcount.theoretical_workspace("gemm", CONV2, "fwd", "fp32")
