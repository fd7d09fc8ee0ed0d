"""Whether a pass ran on tensor cores, from the names of the kernels it launched: profilers'
names (Kineto, nvprof, Nsight) of cuDNN 7-9, cuBLAS and CUTLASS kernels on Volta to Hopper."""

import pytest
from test_cudnn import (
    CUTLASS,
    CUTLASS3,
    DGRAD,
    FFT_C2R,
    FFT_R2C,
    FILL,
    FLIP,
    GEMV,
    GROUPED,
    IMPLICIT,
    NVJET,
    SCUDNN,
    SGEMM,
    SM90_FPROP,
    SM90_WGRAD,
    TO_NCHW,
    TO_NHWC,
    WGRAD,
    WINO_DATA,
    WINO_FUSED,
    WINO_OUT,
    XMMA_INDEXED,
    XMMA_TF32,
)

from convbench.algos.kernelnames import kernels_text, on_tensor_cores, short_name, tensor_cores

# Tensor-core kernels beyond test_cudnn's TF32 ones: the SASS kernels by instruction shape
# (Volta's 884, Turing's and Ampere's 1688 and 16816), xmma's 16-bit kernels with and without
# a tile shape in the name (Hopper's say only their types), CUTLASS's WMMA tensor op.
VOLTA_FP16 = "volta_fp16_s884cudnn_fp16_256x128_ldg8_splitK_relu_f2f_exp_small_nhwc2nchw_tn_v1"
VOLTA_HGEMM = "volta_h884gemm_64x64_ldg8_nn"
TURING_FP16 = "turing_fp16_s1688cudnn_fp16_256x128_ldg8_relu_f2f_exp_interior_nhwc_tn_v1"
AMPERE_BF16_GEMM = "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn"
XMMA_BF16 = ("sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize256x128"
             "x32_stage3_warpsize4x2x1_g1_tensor16x8x16_kernel_cudnn")
SM90_F16 = ("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_"
            "warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cudnn")
SM90_BF16_DGRAD = ("sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize"
                   "128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cudnn")
WMMA = ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_h161616gemm_16x16_128x2_tn_align8>"
        "(cutlass_80_wmma_tensorop_h161616gemm_16x16_128x2_tn_align8::Params)")
# CUDA-core kernels beyond test_cudnn's: CUTLASS's SIMT SGEMM, Volta's fp16 FMA kernel (16-bit
# storage is not tensor cores), a transpose of bfloat16 data (its type is a template argument).
SIMT = ("void cutlass::Kernel<cutlass_80_simt_sgemm_128x128_8x4_nn_align1>"
        "(cutlass_80_simt_sgemm_128x128_8x4_nn_align1::Params)")
VOLTA_FP16_FMA = "volta_fp16_scudnn_fp16_128x128_stridedB_splitK_interior_nn_v1"
TO_NHWC_BF16 = ("void nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, true, false>"
                "(int, int, int, int, __nv_bfloat16 const*, __nv_bfloat16*, float, float)")
MYSTERY = "void mystery<float>(float*)"


@pytest.mark.parametrize("name", [XMMA_TF32, CUTLASS, CUTLASS3, VOLTA_FP16, VOLTA_HGEMM,
                                  TURING_FP16, AMPERE_BF16_GEMM, XMMA_BF16, SM90_F16,
                                  SM90_BF16_DGRAD, WMMA], ids=short_name)
def test_a_tensor_core_kernel_is_named_so(name):
    assert on_tensor_cores(name) is True


@pytest.mark.parametrize("name", [IMPLICIT, XMMA_INDEXED, SM90_FPROP, SM90_WGRAD, SCUDNN,
                                  WINO_FUSED, WINO_DATA, WINO_OUT, FFT_R2C, FFT_C2R, GEMV, DGRAD,
                                  WGRAD, SGEMM, GROUPED, SIMT, VOLTA_FP16_FMA], ids=short_name)
def test_a_cuda_core_kernel_is_named_so(name):
    assert on_tensor_cores(name) is False


@pytest.mark.parametrize("name", [NVJET, MYSTERY], ids=short_name)
def test_a_name_that_shows_neither_is_not_guessed(name):
    assert on_tensor_cores(name) is None


@pytest.mark.parametrize(("names", "expected"), [
    ([FILL, XMMA_TF32, TO_NCHW], True),
    ([TO_NHWC, CUTLASS, TO_NCHW], True),
    ([TO_NHWC_BF16, SM90_BF16_DGRAD], True),
    ([FILL, NVJET, XMMA_TF32], True),  # one tensor-core kernel is enough
    ([FLIP, FFT_R2C, GEMV, FFT_C2R], False),  # every kernel that computes is on CUDA cores
    ([WINO_DATA, SGEMM, WINO_OUT], False),
    ([FILL, XMMA_INDEXED, TO_NCHW], False),
    ([TO_NHWC_BF16, VOLTA_FP16_FMA], False),  # the helper's bf16 type says nothing
    ([FILL, NVJET], None),  # a kernel that shows neither cannot be ruled out
    ([IMPLICIT, MYSTERY], None),
    ([FILL, TO_NCHW], None),  # only helpers: nothing computed on the GPU
    ([], None),
], ids=str)
def test_a_pass_ran_tensor_cores_where_a_kernel_that_computes_did(names, expected):
    assert tensor_cores(names) is expected


def test_the_kernels_cell_holds_each_short_name_once_in_launch_order():
    assert kernels_text([FILL, XMMA_TF32, XMMA_TF32, CUTLASS, FILL]) == (
        f"vectorized_elementwise_kernel; {XMMA_TF32}; "
        "cutlass_tensorop_s1688fprop_optimized_tf32_64x64_16x10_nhwc_align4")
    assert kernels_text([]) == ""
