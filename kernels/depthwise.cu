// Depthwise convolution (groups = C, K = C·m output channels, m the channel multiplier):
// forward, backward-data and backward-filter, one input channel per filter, no reduction over
// channels. `direct` runs these where groups = C > 1 (convbench/algos/direct_kernels.py); the
// dense kernels of direct.cu would stage a one-channel patch per output tile and use 1/32 of
// their threads' filter registers.
//
// Compiled once per layout: -DNHWC=0 (x, y NCHW; w K×1×R×S) or -DNHWC=1 (NHWC; w K×R×S×1; the
// two filter layouts hold the same order, (k, r, s)). Tile sizes are -D defines set in
// direct_kernels.py, which also derives the grids and shared memory from them. Any stride,
// padding, dilation (per axis) and multiplier; FP32.
//
// depthwise_fwd: a block owns DW_TILE_C output channels × DW_PIX consecutive output pixels (of
//   the P·Q of one image) and stages the tile's filters, DW_TILE_C × R × S floats, in shared
//   memory once; each thread then computes outputs (one channel, one pixel) with the taps
//   innermost, reading x through the cache (neighbouring pixels share most of their taps'
//   inputs). Threads run along the layout's contiguous axis: channels in NHWC, pixels in NCHW,
//   so every tap's loads are coalesced.
// depthwise_bwd_data: the same gather with the relation turned around, per input channel and dx
//   pixel: dx(c, h, w) sums dy(c·m + j, p, q)·w(c·m + j, r, s) over the multiplier and the taps
//   whose p = (h + pad_h − r·dil_h) / stride_h divides exactly (columns likewise); the tile's
//   filters, DW_TILE_C × m × R × S floats, in shared memory. Every dx element is written by one
//   thread, no atomics.
// depthwise_bwd_filter: a block owns DW_TILE_C channels of one tap (r, s) and one slice of the
//   N·P·Q reduction (gridDim.z slices): each thread sums dy·x over every (THREADS / DW_TILE_C)th
//   pixel of the slice for one channel, then the block adds its lanes in lane order through
//   shared memory. With more than one slice each writes a partial dw and
//   depthwise_sum_splits adds them in slice order.
//
// Every sum runs in a fixed order: results are deterministic, run to run.
#include "common.cuh"

#if !defined(NHWC) || !defined(THREADS) || !defined(DW_TILE_C) || !defined(DW_PIX)
#error "depthwise.cu needs -D NHWC THREADS DW_TILE_C DW_PIX"
#endif

static_assert(THREADS % DW_TILE_C == 0, "a block's threads split evenly over its channels");
constexpr int kLanes = THREADS / DW_TILE_C;  // threads per channel

// Channel (within the tile) and pixel (within the tile) of the e-th output of a tile, counted
// along the layout's contiguous axis.
__device__ __forceinline__ void tile_box(int e, int& c, int& pix) {
#if NHWC
  c = e % DW_TILE_C; pix = e / DW_TILE_C;
#else
  pix = e % DW_PIX; c = e / DW_PIX;
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS)
    depthwise_fwd(const float* __restrict__ x, const float* __restrict__ w,
                  float* __restrict__ y, int N, int C, int H, int W, int K, int R, int S, int P,
                  int Q, int stride_h, int stride_w, int pad_h, int pad_w, int dil_h,
                  int dil_w) {
  extern __shared__ float filt[];  // [DW_TILE_C][R][S]
  const int mult = K / C, taps = R * S;
  const int k0 = blockIdx.y * DW_TILE_C, pix0 = blockIdx.x * DW_PIX, n = blockIdx.z;
  for (int e = threadIdx.x; e < DW_TILE_C * taps; e += THREADS) {
    const int k = k0 + e / taps;
    filt[e] = k < K ? w[k * taps + e % taps] : 0.f;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < DW_TILE_C * DW_PIX; e += THREADS) {
    int kl, pl;
    tile_box(e, kl, pl);
    const int k = k0 + kl, pix = pix0 + pl;
    if (k >= K || pix >= P * Q) continue;
    const int p = pix / Q, q = pix % Q, c = k / mult;
    const int iy0 = p * stride_h - pad_h, ix0 = q * stride_w - pad_w;
    const float* f = filt + kl * taps;
    float acc = 0.f;
    for (int r = 0; r < R; ++r) {
      const int iy = iy0 + r * dil_h;
      if (iy < 0 || iy >= H) continue;
      for (int s = 0; s < S; ++s) {
        const int ix = ix0 + s * dil_w;
        if (ix >= 0 && ix < W) acc += x[act_offset(n, c, iy, ix, C, H, W)] * f[r * S + s];
      }
    }
    y[act_offset(n, k, p, q, K, P, Q)] = acc;
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
    depthwise_bwd_data(const float* __restrict__ dy, const float* __restrict__ w,
                       float* __restrict__ dx, int N, int C, int H, int W, int K, int R, int S,
                       int P, int Q, int stride_h, int stride_w, int pad_h, int pad_w,
                       int dil_h, int dil_w) {
  extern __shared__ float filt[];  // [DW_TILE_C][m][R][S]: the tile's input channels' filters
  const int mult = K / C, taps = R * S, per_c = mult * taps;
  const int c0 = blockIdx.y * DW_TILE_C, pix0 = blockIdx.x * DW_PIX, n = blockIdx.z;
  for (int e = threadIdx.x; e < DW_TILE_C * per_c; e += THREADS) {
    const int k = c0 * mult + e / taps;
    filt[e] = k < K ? w[k * taps + e % taps] : 0.f;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < DW_TILE_C * DW_PIX; e += THREADS) {
    int cl, pl;
    tile_box(e, cl, pl);
    const int c = c0 + cl, pix = pix0 + pl;
    if (c >= C || pix >= H * W) continue;
    const int h = pix / W, x = pix % W;
    float acc = 0.f;
    for (int r = 0; r < R; ++r) {
      const int ny = h + pad_h - r * dil_h;
      if (ny < 0 || ny % stride_h) continue;
      const int p = ny / stride_h;
      if (p >= P) continue;
      for (int s = 0; s < S; ++s) {
        const int nx = x + pad_w - s * dil_w;
        if (nx < 0 || nx % stride_w) continue;
        const int q = nx / stride_w;
        if (q >= Q) continue;
        for (int j = 0; j < mult; ++j)
          acc += dy[act_offset(n, c * mult + j, p, q, K, P, Q)] *
                 filt[(cl * mult + j) * taps + r * S + s];
      }
    }
    dx[act_offset(n, c, h, x, C, H, W)] = acc;
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
    depthwise_bwd_filter(const float* __restrict__ x, const float* __restrict__ dy,
                         float* __restrict__ dw_part, int N, int C, int H, int W, int K, int R,
                         int S, int P, int Q, int stride_h, int stride_w, int pad_h, int pad_w,
                         int dil_h, int dil_w, int splits) {
  __shared__ float lanes[kLanes][DW_TILE_C + 1];
  const int mult = K / C, taps = R * S, npq = N * P * Q;
  const int r = blockIdx.y / S, s = blockIdx.y % S;
#if NHWC
  const int kl = threadIdx.x % DW_TILE_C, lane = threadIdx.x / DW_TILE_C;
#else
  const int lane = threadIdx.x % kLanes, kl = threadIdx.x / kLanes;
#endif
  const int k = blockIdx.x * DW_TILE_C + kl, c = k / mult;
  const int per_split = ceil_div(npq, splits);
  const int begin = blockIdx.z * per_split, end = min(npq, begin + per_split);
  float acc = 0.f;
  if (k < K)
    for (int pix = begin + lane; pix < end; pix += kLanes) {
      const int q = pix % Q, p = pix / Q % P, n = pix / (P * Q);
      const int iy = p * stride_h - pad_h + r * dil_h, ix = q * stride_w - pad_w + s * dil_w;
      if (iy >= 0 && iy < H && ix >= 0 && ix < W)
        acc += dy[act_offset(n, k, p, q, K, P, Q)] * x[act_offset(n, c, iy, ix, C, H, W)];
    }
  lanes[lane][kl] = acc;
  __syncthreads();
  if (lane == 0 && k < K) {
    float sum = 0.f;
    for (int l = 0; l < kLanes; ++l) sum += lanes[l][kl];
    dw_part[static_cast<size_t>(blockIdx.z) * K * taps + k * taps + r * S + s] = sum;
  }
}

// dw = the sum of the `splits` partial dw of depthwise_bwd_filter, in slice order.
extern "C" __global__ void __launch_bounds__(THREADS)
    depthwise_sum_splits(const float* __restrict__ part, float* __restrict__ dw, int count,
                         int splits) {
  const int i = blockIdx.x * THREADS + threadIdx.x;
  if (i < count) dw[i] = sum_splits(part, count, splits, i);
}
