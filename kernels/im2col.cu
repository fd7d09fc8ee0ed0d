// im2col and col2im: the lowering of the GEMM convolution (convbench/algos/gemm_kernels.py).
//
// Compiled once per layout, -DNHWC=0 or -DNHWC=1, so that the column matrix has the layout the
// products of that layout need with no transpose anywhere:
//   NCHW: col is [N][G][C/g·R·S][P·Q]: per image and group, rows (c, r, s) with s fastest -- the
//         order of a KCRS filter row -- and columns (p, q): y[n] = W · col[n] lands in NKPQ.
//   NHWC: col is [G][N·P·Q][R·S·C/g]: per group, rows (n, p, q) and columns (r, s, c) with c
//         fastest -- the order of a KRSC filter row, as in implicit-GEMM NHWC kernels: y = col·Wᵀ
//         lands in NPQK, and the copies move contiguous channel vectors.
// Any stride, padding, dilation (each per spatial axis: _h along the height, _w along the
// width) and group count.
//
// im2col: one thread per column-matrix element, in the order col is stored (coalesced writes),
//   reading the input pixel its tap sees, or writing 0 in the padding: every element is written,
//   so the workspace needs no clearing.
// im2col_images: the column matrix of every image at once, [G][taps][N·P·Q]: per group, rows the
//   filter taps in the order of the layout's filter row ((c, r, s) in NCHW, (r, s, c) in NHWC)
//   and columns (n, p, q), written like im2col. It is for a library GEMM that sums only over its
//   k: cuBLAS's NCHW bwd_filter is then one product a group, dw = dy · colᵀ with k = N·P·Q (dy
//   as [K][N·P·Q], by swap_nk), where the NCHW col above needs a sum over images outside the
//   product. In NCHW consecutive threads read consecutive pixels of a row; NHWC's col is this
//   matrix transposed already, so only NCHW uses it.
// swap_nk: out[k][n][l] = in[n][k][l], NCHW dy (NKPQ, L = P·Q) as [K][N·P·Q] for that product.
//   One thread per output element in the order out is stored: reads and writes in runs of L.
// col2im: one thread per dx element, in the order dx is stored. It gathers: it sums the column
//   entries of the taps (r, s) whose window covers it, output position
//   p = (y + pad_h - r·dil_h) / stride_h wherever that divides exactly and lies in [0, P) (and q
//   likewise with the _w values), in a fixed order.
//   No atomics: the result is deterministic, run to run.
//
// Offsets are 32-bit: the wrapper refuses tensors and workspaces of 2^31 elements or more.
#include "common.cuh"

#if !defined(NHWC) || !defined(THREADS)
#error "im2col.cu needs -D NHWC and THREADS"
#endif

// The convolution's geometry, as the kernels receive it.
struct Conv {
  int N, C, H, W, R, S, P, Q, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups;
};

// A column-matrix element: image n, group g, channel c within the group, tap (r, s), output
// position (p, q).
struct ColIndex {
  int n, g, c, r, s, p, q;
};

// Offset of a column-matrix element in the layout's col.
__device__ __forceinline__ int col_offset(const ColIndex& i, const Conv& v) {
  const int cg = v.C / v.groups;
#if NHWC
  return ((((((i.g * v.N + i.n) * v.P + i.p) * v.Q + i.q) * v.R + i.r) * v.S + i.s) * cg + i.c);
#else
  return ((((((i.n * v.groups + i.g) * cg + i.c) * v.R + i.r) * v.S + i.s) * v.P + i.p) * v.Q +
          i.q);
#endif
}

// The element at offset e of the layout's col (the inverse of col_offset).
__device__ __forceinline__ ColIndex col_index(int e, const Conv& v) {
  const int cg = v.C / v.groups;
  ColIndex i;
#if NHWC
  i.c = e % cg; e /= cg;
  i.s = e % v.S; e /= v.S;
  i.r = e % v.R; e /= v.R;
  i.q = e % v.Q; e /= v.Q;
  i.p = e % v.P; e /= v.P;
  i.n = e % v.N; i.g = e / v.N;
#else
  i.q = e % v.Q; e /= v.Q;
  i.p = e % v.P; e /= v.P;
  i.s = e % v.S; e /= v.S;
  i.r = e % v.R; e /= v.R;
  i.c = e % cg; e /= cg;
  i.g = e % v.groups; i.n = e / v.groups;
#endif
  return i;
}

// The input element column-matrix element i copies: the pixel its tap sees, or 0 in the padding.
__device__ __forceinline__ float tap_value(const float* __restrict__ x, const ColIndex& i,
                                           const Conv& v) {
  const int iy = i.p * v.stride_h - v.pad_h + i.r * v.dil_h;
  const int ix = i.q * v.stride_w - v.pad_w + i.s * v.dil_w;
  const bool inside = iy >= 0 && iy < v.H && ix >= 0 && ix < v.W;
  return inside ? x[act_offset(i.n, i.g * (v.C / v.groups) + i.c, iy, ix, v.C, v.H, v.W)] : 0.f;
}

// Output position along one axis (of that axis's stride, pad and dilation) whose tap t reads
// input coordinate i, or -1 when none does.
__device__ __forceinline__ int reading_output(int i, int t, int out_size, int stride, int pad,
                                              int dil) {
  const int num = i + pad - t * dil;
  if (num < 0) return -1;
  if (stride == 1) return num < out_size ? num : -1;  // the common case needs no division
  if (num % stride) return -1;
  const int o = num / stride;
  return o < out_size ? o : -1;
}

extern "C" __global__ void __launch_bounds__(THREADS)
    im2col(const float* __restrict__ x, float* __restrict__ col, int N, int C, int H, int W,
           int R, int S, int P, int Q, int stride_h, int stride_w, int pad_h, int pad_w,
           int dil_h, int dil_w, int groups) {
  const Conv v{N, C, H, W, R, S, P, Q, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups};
  const int total = N * C * R * S * P * Q;
  const int e = blockIdx.x * THREADS + threadIdx.x;
  if (e >= total) return;
  col[e] = tap_value(x, col_index(e, v), v);
}

extern "C" __global__ void __launch_bounds__(THREADS)
    im2col_images(const float* __restrict__ x, float* __restrict__ col, int N, int C, int H,
                  int W, int R, int S, int P, int Q, int stride_h, int stride_w, int pad_h,
                  int pad_w, int dil_h, int dil_w, int groups) {
  const Conv v{N, C, H, W, R, S, P, Q, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups};
  const int pixels = N * P * Q;
  const int e = blockIdx.x * THREADS + threadIdx.x;
  if (e >= C * R * S * pixels) return;
  ColIndex i;
  const int pixel = e % pixels;
  i.q = pixel % Q;
  i.p = pixel / Q % P;
  i.n = pixel / (P * Q);
  filter_box(e / pixels, C / groups, R, S, i.g, i.c, i.r, i.s);  // its "k" is the group
  col[e] = tap_value(x, i, v);
}

extern "C" __global__ void __launch_bounds__(THREADS)
    swap_nk(const float* __restrict__ in, float* __restrict__ out, int N, int K, int L) {
  const int e = blockIdx.x * THREADS + threadIdx.x;
  if (e >= N * K * L) return;
  const int l = e % L, n = e / L % N, k = e / (L * N);
  out[e] = in[(n * K + k) * L + l];
}

extern "C" __global__ void __launch_bounds__(THREADS)
    col2im(const float* __restrict__ col, float* __restrict__ dx, int N, int C, int H, int W,
           int R, int S, int P, int Q, int stride_h, int stride_w, int pad_h, int pad_w,
           int dil_h, int dil_w, int groups) {
  const Conv v{N, C, H, W, R, S, P, Q, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups};
  const int per_image = C * H * W;
  const int e = blockIdx.x * THREADS + threadIdx.x;
  if (e >= N * per_image) return;
  int ch, iy, ix;
  act_box(e % per_image, C, H, W, ch, iy, ix);
  const int cg = C / groups;
  ColIndex i{e / per_image, ch / cg, ch % cg, 0, 0, 0, 0};
  float sum = 0.f;
  for (i.r = 0; i.r < R; ++i.r) {
    i.p = reading_output(iy, i.r, P, stride_h, pad_h, dil_h);
    if (i.p < 0) continue;
    for (i.s = 0; i.s < S; ++i.s) {
      i.q = reading_output(ix, i.s, Q, stride_w, pad_w, dil_w);
      if (i.q >= 0) sum += col[col_offset(i, v)];
    }
  }
  dx[e] = sum;
}
