// Direct convolution: forward, backward-data and backward-filter, tiled through shared memory.
//
// Compiled once per layout: -DNHWC=0 (x, y NCHW; w KCRS) or -DNHWC=1 (NHWC; KRSC). The tile
// sizes are -D defines too, set in convbench/algos/direct_kernels.py, the one place that also
// derives the launch grids and shared-memory sizes from them. Any stride, padding, dilation (each
// per spatial axis: _h along the height, _w along the width) and group count; FP32.
//
// direct_fwd, direct_bwd_data (one body, direct_gather): a block computes a TILE_H × TILE_W tile
//   of output pixels of one image × TILE_O output channels of one group, and reduces over the
//   input channels `chunk` at a time. For each chunk it stages in dynamic shared memory the
//   input patch the tile's taps touch and the filter slice of those channels; each thread then
//   accumulates one pixel × kOutPerThread channels in registers, tap by tap with the channels
//   innermost, so a tap's patch offset is worked out once per chunk, not once per channel. Each
//   staged filter tap holds TILE_O channels and then FILT_PAD floats of padding: the staging
//   writes one tap after another down a warp, which TILE_O (32) floats apart would all hit one
//   shared-memory bank; 36 floats apart they spread over eight, and the float4 reads stay
//   aligned. In the forward pass output row oy reads input row oy·stride_h − pad_h + r·dil_h
//   (columns likewise with the _w values). The backward-data pass is the same gather with the
//   relation turned around: dx row oy sums dy row (oy + pad_h − r·dil_h) / stride_h wherever
//   that divides exactly, so every dx element is
//   written by one thread, with no atomics.
// direct_bwd_filter: a block owns a BF_TILE_K × BF_TILE_CRS tile of dw (output channels × the
//   flattened (c, r, s) of a filter row, in the layout's order, so writes are contiguous) and
//   reduces over the N·P·Q output pixels BF_CHUNK at a time, staging x at the taps' positions
//   and dy in shared memory; each thread accumulates kBfK × kBfCrs products in registers. (The
//   (c, r, s) of the x elements a thread stages are the same in every chunk; kept in registers
//   they make ptxas spill at this kernel's 64-register cap, so they are worked out per chunk.)
//   When dw has too few tiles to fill the GPU the reduction is split into gridDim.z slices of
//   N·P·Q; each slice writes its own partial dw and direct_sum_splits adds them in slice order.
//
// Every sum runs in a fixed order: results are deterministic, run to run.
//
// Entry points carry __launch_bounds__(THREADS, 4): at most 64 registers, so four blocks share
// an SM. (Given only THREADS, ptxas picked 48 registers for direct_fwd on sm_80 and spilled.)
#include "common.cuh"

#if !defined(NHWC) || !defined(THREADS) || !defined(TILE_H) || !defined(TILE_W) || \
    !defined(TILE_O) || !defined(FILT_PAD) || !defined(BF_TILE_K) || !defined(BF_TILE_CRS) || \
    !defined(BF_CHUNK)
#error "direct.cu needs -D NHWC THREADS TILE_H TILE_W TILE_O FILT_PAD BF_TILE_K BF_TILE_CRS BF_CHUNK"
#endif

constexpr int kFiltRow = TILE_O + FILT_PAD;  // floats from one staged filter tap to the next
static_assert(FILT_PAD % 4 == 0, "staged filter rows stay 16-byte aligned for float4 reads");

constexpr int kTilePixels = TILE_H * TILE_W;
constexpr int kOutPerThread = TILE_O * kTilePixels / THREADS;  // a thread's channels, one pixel
static_assert(THREADS % kTilePixels == 0 && kOutPerThread * THREADS == TILE_O * kTilePixels &&
                  kOutPerThread % 4 == 0,
              "a thread computes one pixel and a multiple of 4 channels (float4 filter reads)");

constexpr int kBfCols = 16;                 // threads across a dw tile's (c, r, s)
constexpr int kBfRows = THREADS / kBfCols;  // threads across its output channels
constexpr int kBfK = BF_TILE_K / kBfRows, kBfCrs = BF_TILE_CRS / kBfCols;  // a thread's share
static_assert(THREADS % kBfCols == 0 && kBfK * kBfRows == BF_TILE_K &&
                  kBfCrs * kBfCols == BF_TILE_CRS,
              "the dw tile divides evenly among the threads");

// First input row (or column) of the patch of a tile whose outputs start at o0, for a filter of
// `taps` rows (or columns).
template <bool BWD_DATA>
__device__ __forceinline__ int patch_start(int o0, int taps, int stride, int pad, int dil) {
  return BWD_DATA ? ceil_div_signed(o0 + pad - (taps - 1) * dil, stride) : o0 * stride - pad;
}

// Patch row (or column) that output coordinate o reads through tap t, for a tile starting at o0
// whose patch starts at i0; -1 where a backward-data tap touches no dy element.
template <bool BWD_DATA>
__device__ __forceinline__ int patch_index(int o, int o0, int i0, int t, int stride, int pad,
                                           int dil) {
  if (!BWD_DATA) return (o - o0) * stride + t * dil;
  const int num = o + pad - t * dil;
  if (stride == 1) return num - i0;  // the common case needs no division
  return num % stride == 0 ? num / stride - i0 : -1;
}

// Forward: in = x, out = y. Backward-data: in = dy, out = dx. The problem is always named by
// its forward shape: x is N×C×H×W, w is K×(C/groups)×R×S, y is N×K×P×Q.
template <bool BWD_DATA>
__device__ __forceinline__ void direct_gather(const float* __restrict__ in,
                                              const float* __restrict__ w,
                                              float* __restrict__ out, int N, int C, int H, int W,
                                              int K, int R, int S, int P, int Q,
                                              int stride_h, int stride_w, int pad_h, int pad_w,
                                              int dil_h, int dil_w, int groups, int patch_h,
                                              int patch_w, int chunk) {
  extern __shared__ __align__(16) float smem[];
  const int in_c = BWD_DATA ? K : C, in_h = BWD_DATA ? P : H, in_w = BWD_DATA ? Q : W;
  const int out_c = BWD_DATA ? C : K, out_h = BWD_DATA ? H : P, out_w = BWD_DATA ? W : Q;
  const int in_g = in_c / groups, out_g = out_c / groups;

  const int tiles_w = ceil_div(out_w, TILE_W), o_tiles = ceil_div(out_g, TILE_O);
  const int oy0 = blockIdx.x / tiles_w * TILE_H, ox0 = blockIdx.x % tiles_w * TILE_W;
  const int g = blockIdx.y / o_tiles, o0 = blockIdx.y % o_tiles * TILE_O;
  const int n = blockIdx.z;
  const int iy0 = patch_start<BWD_DATA>(oy0, R, stride_h, pad_h, dil_h);
  const int ix0 = patch_start<BWD_DATA>(ox0, S, stride_w, pad_w, dil_w);

  float* patch = smem;                                          // [chunk][patch_h][patch_w]
  float* filt = smem + (chunk * patch_h * patch_w + 3) / 4 * 4;  // [chunk][R][S][kFiltRow]

  const int pixel = threadIdx.x % kTilePixels;
  const int oy = oy0 + pixel / TILE_W, ox = ox0 + pixel % TILE_W;
  const int oc = threadIdx.x / kTilePixels * kOutPerThread;  // first channel, within the tile
  float acc[kOutPerThread];
#pragma unroll
  for (int j = 0; j < kOutPerThread; ++j) acc[j] = 0.f;

  for (int i0 = 0; i0 < in_g; i0 += chunk) {
    const int ni = min(chunk, in_g - i0);
    for (int e = threadIdx.x; e < ni * patch_h * patch_w; e += THREADS) {
      int i, py, px;
      act_box(e, ni, patch_h, patch_w, i, py, px);
      const int iy = iy0 + py, ix = ix0 + px;
      const bool inside = iy >= 0 && iy < in_h && ix >= 0 && ix < in_w;
      patch[(i * patch_h + py) * patch_w + px] =
          inside ? in[act_offset(n, g * in_g + i0 + i, iy, ix, in_c, in_h, in_w)] : 0.f;
    }
    // w is read as (k, c) = (o, i) forward and (i, o) backward; staged as [i][r][s][o].
    for (int e = threadIdx.x; e < ni * R * S * TILE_O; e += THREADS) {
      int kk, cc, r, s;
      filter_box(e, BWD_DATA ? TILE_O : ni, R, S, kk, cc, r, s);
      const int o = BWD_DATA ? cc : kk, i = BWD_DATA ? kk : cc;
      const int k = g * (K / groups) + (BWD_DATA ? i0 + i : o0 + o);
      const int c = BWD_DATA ? o0 + o : i0 + i;
      filt[((i * R + r) * S + s) * kFiltRow + o] =
          o0 + o < out_g ? w[filter_offset(k, c, r, s, C / groups, R, S)] : 0.f;
    }
    __syncthreads();
    const int patch_plane = patch_h * patch_w, filt_plane = R * S * kFiltRow;
    for (int r = 0; r < R; ++r) {
      const int py = patch_index<BWD_DATA>(oy, oy0, iy0, r, stride_h, pad_h, dil_h);
      if (py < 0) continue;
      for (int s = 0; s < S; ++s) {
        const int px = patch_index<BWD_DATA>(ox, ox0, ix0, s, stride_w, pad_w, dil_w);
        if (px < 0) continue;
        const float* a = patch + py * patch_w + px;
        const float* f = filt + (r * S + s) * kFiltRow + oc;
        for (int i = 0; i < ni; ++i, a += patch_plane, f += filt_plane) {
          const float4* f4 = reinterpret_cast<const float4*>(f);
#pragma unroll
          for (int j = 0; j < kOutPerThread / 4; ++j) {
            const float4 v = f4[j];
            acc[4 * j + 0] += *a * v.x;
            acc[4 * j + 1] += *a * v.y;
            acc[4 * j + 2] += *a * v.z;
            acc[4 * j + 3] += *a * v.w;
          }
        }
      }
    }
    __syncthreads();
  }
  if (oy < out_h && ox < out_w)
#pragma unroll
    for (int j = 0; j < kOutPerThread; ++j)
      if (o0 + oc + j < out_g)
        out[act_offset(n, g * out_g + o0 + oc + j, oy, ox, out_c, out_h, out_w)] = acc[j];
}

extern "C" __global__ void __launch_bounds__(THREADS, 4)
    direct_fwd(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
               int N, int C, int H, int W, int K, int R, int S, int P, int Q, int stride_h,
               int stride_w, int pad_h, int pad_w, int dil_h, int dil_w, int groups,
               int patch_h, int patch_w, int chunk) {
  direct_gather<false>(x, w, y, N, C, H, W, K, R, S, P, Q, stride_h, stride_w, pad_h, pad_w,
                       dil_h, dil_w, groups, patch_h, patch_w, chunk);
}

extern "C" __global__ void __launch_bounds__(THREADS, 4)
    direct_bwd_data(const float* __restrict__ dy, const float* __restrict__ w,
                    float* __restrict__ dx, int N, int C, int H, int W, int K, int R, int S, int P,
                    int Q, int stride_h, int stride_w, int pad_h, int pad_w, int dil_h,
                    int dil_w, int groups, int patch_h, int patch_w, int chunk) {
  direct_gather<true>(dy, w, dx, N, C, H, W, K, R, S, P, Q, stride_h, stride_w, pad_h, pad_w,
                      dil_h, dil_w, groups, patch_h, patch_w, chunk);
}

// Position (pixel j, column u) of the e-th element of a BF_CHUNK × width staging tile, counted
// in the order the tensor is stored: columns (channels) fastest in NHWC, pixels in NCHW.
__device__ __forceinline__ void chunk_box(int e, int width, int& j, int& u) {
#if NHWC
  j = e / width; u = e % width;
#else
  j = e % BF_CHUNK; u = e / BF_CHUNK;
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS, 4)
    direct_bwd_filter(const float* __restrict__ x, const float* __restrict__ dy,
                      float* __restrict__ dw_part, int N, int C, int H, int W, int K, int R,
                      int S, int P, int Q, int stride_h, int stride_w, int pad_h, int pad_w,
                      int dil_h, int dil_w, int groups, int splits) {
  // One padding column: in NCHW order consecutive threads write down a column.
  __shared__ float xs[BF_CHUNK][BF_TILE_CRS + 1];
  __shared__ float ds[BF_CHUNK][BF_TILE_K + 1];
  const int kg = K / groups, cg = C / groups, crs_n = cg * R * S, npq = N * P * Q;
  const int k_tiles = ceil_div(kg, BF_TILE_K);
  const int g = blockIdx.y / k_tiles, k0 = blockIdx.y % k_tiles * BF_TILE_K;
  const int crs0 = blockIdx.x * BF_TILE_CRS;
  const int per_split = ceil_div(ceil_div(npq, splits), BF_CHUNK) * BF_CHUNK;
  const int begin = blockIdx.z * per_split, end = min(npq, begin + per_split);
  const int tk = threadIdx.x / kBfCols, tc = threadIdx.x % kBfCols;
  float acc[kBfK][kBfCrs] = {};

  for (int pix0 = begin; pix0 < end; pix0 += BF_CHUNK) {
    for (int e = threadIdx.x; e < BF_CHUNK * BF_TILE_CRS; e += THREADS) {
      int j, u;
      chunk_box(e, BF_TILE_CRS, j, u);
      const int pix = pix0 + j, crs = crs0 + u;
      float v = 0.f;
      if (pix < end && crs < crs_n) {
        const int q = pix % Q, p = pix / Q % P, n = pix / (P * Q);
        int k, c, r, s;
        filter_box(crs, cg, R, S, k, c, r, s);
        const int iy = p * stride_h - pad_h + r * dil_h, ix = q * stride_w - pad_w + s * dil_w;
        if (iy >= 0 && iy < H && ix >= 0 && ix < W)
          v = x[act_offset(n, g * cg + c, iy, ix, C, H, W)];
      }
      xs[j][u] = v;
    }
    for (int e = threadIdx.x; e < BF_CHUNK * BF_TILE_K; e += THREADS) {
      int j, u;
      chunk_box(e, BF_TILE_K, j, u);
      const int pix = pix0 + j, k = k0 + u;
      ds[j][u] = pix < end && k < kg
                     ? dy[act_offset(pix / (P * Q), g * kg + k, pix / Q % P, pix % Q, K, P, Q)]
                     : 0.f;
    }
    __syncthreads();
    for (int j = 0; j < BF_CHUNK; ++j) {
      float a[kBfCrs], b[kBfK];
#pragma unroll
      for (int u = 0; u < kBfCrs; ++u) a[u] = xs[j][tc + u * kBfCols];
#pragma unroll
      for (int v = 0; v < kBfK; ++v) b[v] = ds[j][tk + v * kBfRows];
#pragma unroll
      for (int v = 0; v < kBfK; ++v)
#pragma unroll
        for (int u = 0; u < kBfCrs; ++u) acc[v][u] += b[v] * a[u];
    }
    __syncthreads();
  }
  float* part = dw_part + static_cast<size_t>(blockIdx.z) * K * crs_n;
#pragma unroll
  for (int v = 0; v < kBfK; ++v)
#pragma unroll
    for (int u = 0; u < kBfCrs; ++u) {
      const int k = k0 + tk + v * kBfRows, crs = crs0 + tc + u * kBfCols;
      if (k < kg && crs < crs_n) part[static_cast<size_t>(g * kg + k) * crs_n + crs] = acc[v][u];
    }
}

// dw = the sum of the `splits` partial dw of direct_bwd_filter, in slice order.
extern "C" __global__ void __launch_bounds__(THREADS, 4)
    direct_sum_splits(const float* __restrict__ part, float* __restrict__ dw, int count,
                      int splits) {
  const int i = blockIdx.x * THREADS + threadIdx.x;
  if (i < count) dw[i] = sum_splits(part, count, splits, i);
}
