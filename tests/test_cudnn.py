"""cuDNN through torch: the kernel-name classifier everywhere, the passes where a GPU is."""

import sys

import numpy as np
import pytest

from convbench.algos import reference, registry
from convbench.algos.cudnn import classify_kernels
from convbench.core.problem import LAYOUTS, PASSES, ConvProblem
from convbench.measure import verify
from convbench.testing import PER_AXIS_PROBLEMS

CUDNN = ("cudnn", "cudnn-autotune")

# Kernel names as profilers print them (nvprof, Kineto), from public traces of cuDNN 7-9.
IMPLICIT = ("void cudnn::detail::implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, "
            "true, false, true>(int, int, int, float const*, int, float*, float const*, "
            "kernel_conv_params, unsigned long long, int, float, float, int, float const*, "
            "float const*, bool, int, int)")
IM2COL = ("void cudnn::cnn::im2col4d_kernel<float, long>(cudnn::cnn::im2col4d_params, "
          "cudnnConvolutionStruct, cudnnTensorStruct, float const*, float*)")
EXPLICIT = ("void explicit_convolve_sgemm<float, int, 1024, 5, 5, 3, 3, 3, 0, false>(int, int, "
            "int, float const*, int, float const*, int, float*, kernel_conv_params, unsigned "
            "long long, int, unsigned long long, int, float, float, int, float const*, "
            "float const*)")
FLIP = "void flip_filter<float, float>(float*, float const*, int, int, int, int)"
FFT_R2C = ("void fft2d_r2c_32x32<float, false, 1u, false>(float2*, float const*, int, int, int, "
           "int, int, int, int, int, int, cudnn::reduced_divisor, bool, int2, int, int)")
FFT_C2R = ("void fft2d_c2r_32x32<float, false, false, 1u, false, false>(float*, float2 const*, "
           "int, int, int, int, int, int, int, int, int, float, float, cudnn::reduced_divisor, "
           "bool, float*, float*, int2, int, int)")
GEMV = ("void gemv2N_kernel<int, int, float2, float2, float2, float2, 128, 8, 4, 4, 1, false, "
        "cublasGemvParams<cublasGemvTensorStridedBatched<float2 const>, "
        "cublasGemvTensorStridedBatched<float2 const>, cublasGemvTensorStridedBatched<float2>, "
        "float2> >(cublasGemvParams<cublasGemvTensorStridedBatched<float2 const>, "
        "cublasGemvTensorStridedBatched<float2 const>, cublasGemvTensorStridedBatched<float2>, "
        "float2>)")
WINO_TILES = ("void cudnn::winograd::generateWinogradTilesKernel<1, float, float>"
              "(cudnn::winograd::GenerateWinogradTilesParams<float, float>)")
WINO_FUSED = "maxwell_scudnn_winograd_128x128_ldg1_ldg4_mobile_relu_tile148t_nt_v0"
WINO_DATA = ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>"
             "(cudnn::winograd_nonfused::WinogradDataParams<float, float>)")
WINO_OUT = ("void cudnn::winograd_nonfused::winogradForwardOutput4x4<float, __half>"
            "(cudnn::winograd_nonfused::WinogradOutputParams<float, __half>)")
SCUDNN = "volta_scudnn_128x64_relu_interior_nn_v1"
OFFSETS = "void cask_cudnn::computeOffsetsKernel<false, false>(cask_cudnn::ComputeOffsetsParams)"
XMMA_INDEXED = ("sm80_xmma_fprop_implicit_gemm_indexed_f32f32_f32f32_f32_nchwkcrs_nchw_"
                "tilesize64x64x8_stage3_warpsize1x2x1_g1_ffma_aligna4_alignc4_execute_kernel_"
                "_5x_cudnn")
XMMA_TF32 = ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16_"
             "stage4_warpsize2x2x1_g1_tensor16x8x8_execute_kernel__5x_cudnn")
TO_NHWC = ("void nchwToNhwcKernel<float, float, float, true, false>(int, int, int, int, "
           "float const*, float*, float, float)")
TO_NCHW = ("void nhwcToNchwKernel<float, float, float, true, false>(int, int, int, int, "
           "float const*, float*, float, float)")
CUTLASS = ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_64x64_"
           "16x10_nhwc_align4>(cutlass_tensorop_s1688fprop_optimized_tf32_64x64_16x10_nhwc_"
           "align4::Params)")
DGRAD = ("void cudnn::detail::dgrad_engine<float, 128, 6, 7, 3, 3, 5, true>(int, int, int, "
         "float const*, int, float const*, int, float*, kernel_grad_params, int, int, float, "
         "int, int, int)")
WGRAD = ("void cudnn::detail::wgrad_alg0_engine<float, 512, 6, 5, 3, 3, 3, true, 512>(int, int, "
         "int, float const*, int, float*, float const*, kernel_grad_params, int, float, int, "
         "int, int, int)")
GROUPED = ("void conv2d_grouped_direct_kernel<__half, __half, __half, float, float, true, false, "
           "1, 0, 0>(cudnnTensorStruct, __half const*, cudnnFilterStruct, __half const*, "
           "cudnnConvolutionStruct, cudnnTensorStruct, __half*, float, float, "
           "cudnn::reduced_divisor, int, __half const*, float const*, cudnnActivationStruct)")
FILL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)")
COPY = ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::"
        "native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() "
        "const::{lambda(float)#1}> >(int, at::native::gpu_kernel_impl_nocast<...>)")
SGEMM = "ampere_sgemm_128x128_nn"
# Hopper (sm_90) families: cuDNN 9's xmma and CUTLASS 3 kernels, cuBLAS 12's nvjet GEMMs.
SM90_FPROP = ("sm90_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nhwckrsc_nhwc_tilesize128x128x16"
              "_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cudnn")
SM90_DGRAD = "sm90_xmma_dgrad_implicit_gemm_indexed_f32f32_f32f32_f32_nhwckrsc_nhwc_tilesize64x64"
SM90_WGRAD = ("sm90_xmma_wgrad_implicit_gemm_f32f32_f32f32_f32_nhwckrsc_nhwc_tilesize128x128x16"
              "_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cudnn")
CUTLASS3 = ("void cutlass::device_kernel<cutlass3x_sm90_tensorop_s64x128x8tf32fprop_optimized_"
            "f32_f32_f32_f32_f32_128x128x32_1x1x1_0_nhwc_align4_warpspecialized>(Params)")
NVJET = "nvjet_sm90_tst_128x128_64x4_1x2_h_bz_coopA_NNN"


@pytest.mark.parametrize(("names", "expected"), [
    ([IMPLICIT], "implicit GEMM (kernel: implicit_convolve_sgemm)"),
    ([IM2COL, EXPLICIT], "GEMM (explicit) (kernel: explicit_convolve_sgemm)"),
    ([IM2COL, SGEMM], "GEMM (explicit) (kernel: ampere_sgemm_128x128_nn)"),
    ([FLIP, FFT_R2C, FFT_R2C, GEMV, FFT_C2R], "FFT (kernel: fft2d_r2c_32x32)"),
    ([WINO_TILES, WINO_FUSED], f"Winograd (kernel: {WINO_FUSED})"),
    ([WINO_DATA, GEMV, WINO_OUT], "Winograd nonfused (kernel: winogradForwardData4x4)"),
    ([SCUDNN], f"implicit precomputed GEMM (kernel: {SCUDNN})"),
    ([OFFSETS, XMMA_INDEXED], f"implicit precomputed GEMM (kernel: {XMMA_INDEXED})"),
    ([TO_NHWC, XMMA_TF32, TO_NCHW],
     f"implicit GEMM (kernel: {XMMA_TF32}; with NCHW<->NHWC transposes)"),
    ([CUTLASS, COPY], ("implicit GEMM (kernel: "
                       "cutlass_tensorop_s1688fprop_optimized_tf32_64x64_16x10_nhwc_align4)")),
    ([FILL, DGRAD, COPY], "implicit GEMM (kernel: dgrad_engine)"),
    ([FILL, WGRAD], "implicit GEMM (kernel: wgrad_alg0_engine)"),
    ([GROUPED, COPY], "direct (kernel: conv2d_grouped_direct_kernel)"),
    ([FILL, SGEMM, COPY], f"GEMM (kernel: {SGEMM})"),
    ([SM90_FPROP], f"implicit GEMM (kernel: {SM90_FPROP})"),
    ([FILL, SM90_DGRAD, COPY], f"implicit precomputed GEMM (kernel: {SM90_DGRAD})"),
    ([SM90_WGRAD], f"implicit GEMM (kernel: {SM90_WGRAD})"),
    ([TO_NHWC, CUTLASS3, TO_NCHW], ("implicit GEMM (kernel: cutlass3x_sm90_tensorop_s64x128x8tf32"
                                    "fprop_optimized_f32_f32_f32_f32_f32_128x128x32_1x1x1_0_nhwc_"
                                    "align4_warpspecialized; with NCHW<->NHWC transposes)")),
    ([IM2COL, NVJET], f"GEMM (explicit) (kernel: {NVJET})"),
    ([FILL, NVJET], f"GEMM (kernel: {NVJET})"),
    ([FILL, "void mystery<float>(float*)"], "unknown (kernel: mystery)"),
    ([], "unknown (no CUDA kernel ran)"),
])
def test_classify_kernels(names, expected):
    assert classify_kernels(names) == expected


@pytest.mark.parametrize("algo", CUDNN)
def test_registered_on_cuda_with_gpu_precisions(algo):
    impl = registry.get(algo, "cuda")
    assert {"fp32", "tf32", "fp16"} <= set(impl.precisions)
    reason = registry.impl_available(impl)
    assert reason is None or (reason and "\n" not in reason)


def test_bf16_names_what_it_needs(monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import fails as if not installed
    problem = ConvProblem(n=1, c=4, h=8, w=8, k=4, r=3, s=3, pad=1)
    reason = registry.supports(registry.get("cudnn", "cuda"), problem, "fwd", "nhwc", "bf16")
    assert "ml-dtypes" in reason


# --- on a GPU --------------------------------------------------------------------------------

_GPU_PROBLEMS = [
    ConvProblem(n=2, c=8, h=13, w=11, k=16, r=3, s=3, pad=1),
    ConvProblem(n=1, c=3, h=23, w=19, k=8, r=5, s=3, stride=2, pad=2),
    ConvProblem(n=2, c=8, h=9, w=9, k=8, r=3, s=3, pad=1, groups=2),
    ConvProblem(n=2, c=4, h=12, w=12, k=6, r=3, s=3, pad=2, dilation=2),
]
_HOST_DTYPES = {"fp32": np.float32, "tf32": np.float32, "fp16": np.float16}


def _impl_or_skip(algo):
    impl = registry.get(algo, "cuda")
    reason = registry.impl_available(impl)
    if reason:
        pytest.skip(reason)
    return impl


def _check_on_gpu(impl, problem, pass_, layout, precision):
    """run_and_check on CuPy operands: the reference is taken from the operands as stored."""
    import cupy

    dtype = _HOST_DTYPES[precision]
    a, b = reference.random_operands(problem, pass_, layout, dtype)
    ref = reference.reference(problem, pass_, layout, a, b)
    out = reference.nan_output(problem, pass_, layout, dtype, xp=cupy)
    impl.prepare(problem, pass_, layout, precision)(cupy.asarray(a), cupy.asarray(b), out)
    cupy.cuda.get_current_stream().synchronize()
    return verify.check(out, ref, impl.algo, precision, problem, pass_)


def test_a_pass_is_judged_by_the_family_that_ran():
    """cuDNN's FFT and Winograd are judged like cuDNN's own algorithms of that family found one
    by one; its GEMMs keep the exact tolerance."""
    from convbench.algos.cudnn import judged_family

    assert judged_family("Winograd (kernel: sm80_xmma_winograd)") == "cudnn-find-winograd"
    assert judged_family("Winograd nonfused (kernel: winogradForwardData4x4)") == \
        "cudnn-find-winograd-nonfused"
    assert judged_family("FFT (kernel: fft2d_r2c_32x32)") == "cudnn-find-fft"
    assert judged_family("implicit GEMM (kernel: sm90_xmma_fprop_implicit_gemm)") is None
    assert judged_family("unknown (no CUDA kernel ran)") is None


@pytest.mark.gpu_suites
@pytest.mark.gpu
@pytest.mark.parametrize("problem", [*_GPU_PROBLEMS, *PER_AXIS_PROBLEMS], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("algo", CUDNN)
def test_fp32_matches_reference(algo, pass_, layout, problem):
    chk = _check_on_gpu(_impl_or_skip(algo), problem, pass_, layout, "fp32")
    assert chk.ok, chk.reason


@pytest.mark.gpu_suites
@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "fp16"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
def test_reduced_precisions_match_reference(pass_, layout, precision):
    impl = _impl_or_skip("cudnn")
    if registry.supports(impl, _GPU_PROBLEMS[0], pass_, layout, precision):
        pytest.skip(registry.supports(impl, _GPU_PROBLEMS[0], pass_, layout, precision))
    chk = _check_on_gpu(impl, _GPU_PROBLEMS[0], pass_, layout, precision)
    assert chk.ok, chk.reason


@pytest.mark.gpu_pins
@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_tf32_setting_does_not_leak(precision):
    import torch

    impl = _impl_or_skip("cudnn")
    before = precision == "fp32"  # the opposite of what the call sets
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = before
    try:
        assert _check_on_gpu(impl, _GPU_PROBLEMS[0], "fwd", "nhwc", precision).ok
        assert torch.backends.cudnn.allow_tf32 is before
        assert torch.backends.cuda.matmul.allow_tf32 is before
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, False


@pytest.mark.gpu_pins
@pytest.mark.gpu
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("algo", CUDNN)
def test_describe_names_the_fp32_kernel(algo, pass_):
    """A family the classifier does not know is a note ("unknown (kernel: ...)", the kernel
    named), never a failure: cuDNN's kernel names change with every architecture."""
    note = _impl_or_skip(algo).describe(_GPU_PROBLEMS[0], pass_, "nhwc", "fp32")
    assert "(kernel: " in note
    assert "tf32" not in note.lower(), f"fp32 ran a TF32 kernel: {note}"


@pytest.mark.gpu_pins
@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_row_says_whether_tensor_cores_ran(precision):
    """What ran, from the kernels' names (`kernelnames`): fp32 (TF32 off) never on tensor
    cores; bf16, on a GPU that has them for it (sm_80 on), on them for a layer of AlexNet's
    width. The prediction pinned: cuDNN's bf16 convolutions are tensor-core kernels."""
    from convbench.algos.kernelnames import tensor_cores

    impl = _impl_or_skip("cudnn")
    problem = ConvProblem(n=8, c=64, h=28, w=28, k=64, r=3, s=3, pad=1)
    reason = registry.supports(impl, problem, "fwd", "nhwc", precision)
    if reason:
        pytest.skip(reason)
    names = impl.kernels(problem, "fwd", "nhwc", precision)
    assert tensor_cores(names) is (precision == "bf16"), names


def test_a_case_is_profiled_once_for_its_row_its_note_and_its_judging(monkeypatch):
    """The kernels a case launched are profiled once in a process: the row's `kernels`, the
    note's family and the tolerance it is judged by all read that one profile (torch keeps the
    plan it made for the shape and settings, so a second would name the same kernels)."""
    from convbench.algos import cudnn

    profiled = []

    def profile(self, problem, pass_, layout, precision):
        profiled.append((self.algo, pass_, precision))
        return [FILL, FFT_R2C, GEMV, FFT_C2R]

    monkeypatch.setattr(cudnn.CuDNN, "_profiled", profile)
    monkeypatch.setattr(cudnn, "_KERNELS", {})
    impl = registry.get("cudnn", "cuda")
    problem = ConvProblem(n=1, c=4, h=8, w=8, k=4, r=3, s=3, pad=1)
    assert impl.kernels(problem, "fwd", "nhwc", "tf32") == [FILL, FFT_R2C, GEMV, FFT_C2R]
    assert impl.describe(problem, "fwd", "nhwc", "tf32").startswith("FFT (kernel: fft2d_r2c")
    assert impl.judged_as(problem, "fwd", "nhwc", "tf32") == "cudnn-find-fft"
    impl.kernels(problem, "fwd", "nhwc", "fp32")  # another precision: another case
    assert profiled == [("cudnn", "fwd", "tf32"), ("cudnn", "fwd", "fp32")]


def test_a_warm_up_leaves_nothing_alive():
    """cuDNN's prepare warms up on scratch operands, then drops their views and the replay's
    arrays, so the memory the prepared pass is seen to hold is its own, not a whole operand
    set. The same pieces on the CPU (torch-cpu's pass, NumPy scratch) show it."""
    import weakref

    from convbench.algos._aten import Views, aten_phased

    problem = ConvProblem(n=1, c=2, h=5, w=5, k=3, r=3, s=3, pad=1)
    views = Views("nhwc")
    run = aten_phased(problem, "fwd", views)
    scratch = [np.random.default_rng(0).standard_normal(s).astype(np.float32)
               for s in problem.operand_shapes("fwd", "nhwc")]
    run(*scratch)
    assert views(*scratch) is views(*scratch)  # the same arrays: views made once
    alive = [weakref.ref(a) for a in scratch]
    del scratch
    assert all(ref() is not None for ref in alive)  # held by the views and the replay
    views.clear()
    run.forget()
    assert all(ref() is None for ref in alive)


def test_autotune_tries_every_engine_and_says_so():
    """torch's cudnn.benchmark_limit (10: the heuristic's first ten engines) is 0 (all) inside
    cudnn-autotune's calls, untouched by cudnn's, and restored after; env.json records it."""
    import torch

    from convbench.algos.cudnn import AUTOTUNE_BENCHMARK_LIMIT, _math
    from convbench.measure import envinfo

    cudnn = torch.backends.cudnn
    before = cudnn.benchmark_limit
    with _math("fp32", autotune=False):
        assert cudnn.benchmark_limit == before
    with _math("fp32", autotune=True):
        assert cudnn.benchmark_limit == AUTOTUNE_BENCHMARK_LIMIT == 0
    assert cudnn.benchmark_limit == before
    assert envinfo.collect("numpy")["torch"]["cudnn_benchmark_limit"]["cudnn-autotune"] == 0


@pytest.mark.gpu_pins
@pytest.mark.gpu
def test_cudnn_peak_excludes_the_warm_up_operands():
    """A 1x1 convolution needs little workspace: its measured peak (torch's result and the
    workspace) must stay within one set of operands, which the warm-up's scratch added to it.
    Within: plus the rounding of torch's caching allocator, whose large blocks are multiples of
    2 MiB (an H200 with cuDNN 9.19 peaked at 50 MiB, two 24.5 MiB tensors in 25 MiB blocks,
    against 49 MiB of operands; the scratch would add 49 MiB more)."""
    from convbench.catalogs.layers import Layer
    from convbench.measure import memory, runner

    problem = ConvProblem(n=32, c=64, h=56, w=56, k=64, r=1, s=1)
    cases = runner.sweep([Layer("t", "t", problem)], CUDNN, "cuda", PASSES, ["nhwc"], ["fp32"])
    for r in runner.run(cases, 0.01):
        assert r["status"] == "ok", r["reason"]
        operands = memory.operand_bytes(problem, r["pass"], np.float32)
        assert r["peak_bytes"] < operands + (2 << 20), (r["algo"], r["pass"], r["peak_bytes"])


@pytest.mark.parametrize("setup", [
    {},
    {"legacy": False},
    {"conv": "ieee"},
    {"conv": "tf32", "rnn": "ieee"},  # the legacy getters raise on this mix (torch >= 2.9)
], ids=str)
def test_math_settings_never_raise_and_are_restored(setup):
    """`_math` only sets flags, so this runs without a GPU: whatever TF32 API the program used
    before, it sets cuDNN on, the mode's benchmark flag and IEEE fp32 (TF32 for tf32 alone: fp16
    and bf16 compute in their own type) inside, and leaves every flag as it found it."""
    import torch

    from convbench.algos.cudnn import _math

    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    if not hasattr(cudnn, "conv"):
        pytest.skip(f"torch {torch.__version__} has no per-operator fp32 precision")
    keep = (cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision, matmul.fp32_precision,
            cudnn.benchmark)

    def state():
        return (cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision, matmul.fp32_precision,
                cudnn.benchmark, cudnn.enabled)

    try:
        if "legacy" in setup:
            cudnn.allow_tf32 = matmul.allow_tf32 = setup["legacy"]
        for op in ("conv", "rnn"):
            if op in setup:
                getattr(cudnn, op).fp32_precision = setup[op]
        before = state()
        for precision, autotune in (("fp32", True), ("tf32", False), ("bf16", True),
                                    ("fp16", False)):
            with _math(precision, autotune):
                inside = state()
                assert inside[0] == inside[2] == ("tf32" if precision == "tf32" else "ieee")
                assert inside[3] is autotune and inside[4] is True
            assert state() == before
    finally:
        cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision, matmul.fp32_precision = keep[:3]
        cudnn.benchmark = keep[3]


@pytest.mark.gpu_pins
@pytest.mark.gpu
def test_the_first_call_is_timed_once_and_named_in_the_note():
    """The tuning cost: the first call of a case in each mode (the plan, and for autotune the
    search) is timed in `prepare`, once per process, and the row's note says it; a later
    prepare (the plan cached) leaves it as it was."""
    from convbench.algos import cudnn
    from convbench.analysis.summary import first_call

    p = ConvProblem(n=8, c=32, h=14, w=14, k=32, r=3, s=3, pad=1)
    for algo in CUDNN:
        impl = registry.get(algo, "cuda")
        impl.prepare(p, "fwd", "nchw", "fp32")
        first = cudnn.first_call_ms(algo, p, "fwd", "nchw", "fp32")
        assert first is not None and first > 0
        note = impl.describe(p, "fwd", "nchw", "fp32")
        assert first_call(note) == pytest.approx(first, rel=1e-3)
        assert cudnn.first_call_ms(algo, p, "fwd", "nchw", "fp32") == first
        # its worker was warmed on a tiny convolution before this first shape
        assert cudnn.WARM_UP_S[impl.autotune] > 0
