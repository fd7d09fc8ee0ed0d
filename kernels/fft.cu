// FFT convolution: everything around the transforms. The 2-D real transforms are cuFFT's (in the
// emulator numpy.fft's), run between these kernels by convbench/algos/fft_kernels.py, which also
// explains the math (where each tensor sits on the grid, which factor is conjugated per pass).
//
// Compiled once per layout: -DNHWC=0 (NCHW activations, KCRS filters) or -DNHWC=1 (NHWC, KRSC);
// the tile sizes are -D defines set in fft_kernels.py. Buffers, per tensor of shape A×B×H×W in
// the layout's order (n×c, k×c or n×k as A×B), cut into tiles_y × tiles_x overlapping tiles
// (`fft-tiled`; one tile for `fft`), with items i = ((a·tiles_y + ty)·tiles_x + tx)·B + b:
//   grid      float  [i][Th][Tw]           each tile on the zero-padded transform grid
//   spectrum  float2 [i][Th][Tf]           Tf = Tw/2 + 1: cuFFT's batched R2C output, F = Th·Tf
//
// fft_pack, fft_crop: grids <- tensor as `Placement` says, zeros elsewhere (every grid element is
//   written, so no state survives between calls); tensor <- scale · its cells of the grids.
//   A block moves one row × COPY_TILE columns × COPY_TILE channels b through a shared tile,
//   reading and writing both sides in their storage order (columns fastest on the grid and in
//   NCHW, channels fastest in NHWC): the layout change happens in the tile, both sides coalesced.
// fft_product: out[f][m][n] = Σ_l lhs[f][m][l] · rhs[f][l][n] for every frequency f, either
//   factor optionally conjugated: a batched complex GEMM over the frequencies. The operands are
//   spectra, so element (m, l) of frequency f is lhs[(m·lhs_m + l·lhs_l)·F + f]: the strides say
//   which of m, l is a spectrum's outer or inner item index (transposes cost nothing). A block
//   computes PROD_TF frequencies × a PROD_TM × PROD_TN tile, staging PROD_TL steps of l of both
//   factors in shared memory as [l][m or n][f], f fastest: global reads are PROD_TF consecutive
//   frequencies, writes too. A thread owns one frequency and a PROD_MM × PROD_MN micro-tile.
//
// Every sum runs in a fixed order: results are deterministic, run to run.
#include "common.cuh"

#if !defined(NHWC) || !defined(COPY_TILE) || !defined(COPY_THREADS) || !defined(PROD_TF) || \
    !defined(PROD_TM) || !defined(PROD_TN) || !defined(PROD_TL) || !defined(PROD_MM) ||      \
    !defined(PROD_MN) || !defined(PROD_MIN_BLOCKS)
#error "fft.cu needs -D NHWC, COPY_TILE, COPY_THREADS, PROD_TF, PROD_TM, PROD_TN, PROD_TL, PROD_MM, PROD_MN, PROD_MIN_BLOCKS"
#endif

static_assert(COPY_TILE * COPY_TILE % COPY_THREADS == 0, "the copy tile divides among threads");

constexpr int kGroupsM = PROD_TM / PROD_MM, kGroupsN = PROD_TN / PROD_MN;  // threads per axis
constexpr int kProdThreads = PROD_TF * kGroupsM * kGroupsN;
static_assert(kGroupsM * PROD_MM == PROD_TM && kGroupsN * PROD_MN == PROD_TN,
              "micro-tiles cover the product tile");

// Tile position (channel u, column v) of the e-th element of a COPY_TILE² tile in the order a
// side stores it: columns fastest, or channels fastest.
__device__ __forceinline__ void tile_box(int e, bool channels_fastest, int& u, int& v) {
  if (channels_fastest) {
    u = e % COPY_TILE; v = e / COPY_TILE;
  } else {
    v = e % COPY_TILE; u = e / COPY_TILE;
  }
}

// Where a tensor sits on the grids, per axis: tile t's grid cell g holds tensor index
// t·step + g − start, for cells g < extent (fft_pack; beyond, and outside the tensor, zeros).
// Untiled, there is one tile and step is the grid size.
struct Placement {
  int start_y, start_x, step_y, step_x, tiles_y, tiles_x, extent_y, extent_x;
};

// TO_GRID: src is the tensor, dst the grids (fft_pack); else src is the grids, dst the tensor
// (fft_crop), each tensor element read from the tile whose step it falls in. The block's row and
// columns are the destination's; blockIdx.z is the tensor's a (fft_crop) or the grid's
// (a, tile) (fft_pack). act_offset indexes filters too: KCRS and KRSC have the form of NCHW and
// NHWC.
template <bool TO_GRID>
__device__ __forceinline__ void grid_copy(const float* __restrict__ src, float* __restrict__ dst,
                                          float (*tile)[COPY_TILE + 1], int B, int H, int W,
                                          int Th, int Tw, Placement pl, float scale) {
  const int cols = TO_GRID ? Tw : W;
  const int col_tiles = ceil_div(cols, COPY_TILE);
  const int row = blockIdx.x / col_tiles, col0 = blockIdx.x % col_tiles * COPY_TILE;
  const int b0 = blockIdx.y * COPY_TILE;
  const int tiles = pl.tiles_y * pl.tiles_x;
  const int a = TO_GRID ? blockIdx.z / tiles : blockIdx.z;
  // fft_pack: this block's tile and the tensor row its grid row holds.
  const int t = blockIdx.z % tiles, ty = t / pl.tiles_x, tx = t % pl.tiles_x;
  const int y = TO_GRID ? ty * pl.step_y + row - pl.start_y : row;
  const bool row_inside = TO_GRID ? row < pl.extent_y && y >= 0 && y < H : true;
  // fft_crop: the tile row y falls in, and that tile's grid row.
  const int cy = row / pl.step_y, gy = row - cy * pl.step_y + pl.start_y;
  const bool tensor_channels_fastest = NHWC;

  for (int e = threadIdx.x; e < COPY_TILE * COPY_TILE; e += COPY_THREADS) {
    int u, v;
    tile_box(e, TO_GRID && tensor_channels_fastest, u, v);
    const int b = b0 + u, c = col0 + v;  // c: the destination's column
    float value = 0.f;
    if (TO_GRID) {
      const int x = tx * pl.step_x + c - pl.start_x;
      if (b < B && row_inside && c < pl.extent_x && x >= 0 && x < W)
        value = src[act_offset(a, b, y, x, B, H, W)];
    } else if (b < B && c < W) {
      const int cx = c / pl.step_x, gx = c - cx * pl.step_x + pl.start_x;
      const int item = ((a * pl.tiles_y + cy) * pl.tiles_x + cx) * B + b;
      value = src[(item * Th + gy) * Tw + gx];
    }
    tile[u][v] = value;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < COPY_TILE * COPY_TILE; e += COPY_THREADS) {
    int u, v;
    tile_box(e, !TO_GRID && tensor_channels_fastest, u, v);
    const int b = b0 + u, c = col0 + v;
    if (b >= B || c >= cols) continue;
    if (TO_GRID)
      dst[((blockIdx.z * B + b) * Th + row) * Tw + c] = tile[u][v];
    else
      dst[act_offset(a, b, row, c, B, H, W)] = scale * tile[u][v];
  }
}

// grids (A·tiles·B items of Th×Tw, item (a, ty, tx, b)) <- tensor (A×B×H×W in the layout).
// Grid: (Th · ceil(Tw / COPY_TILE), ceil(B / COPY_TILE), A · tiles) blocks of COPY_THREADS.
extern "C" __global__ void __launch_bounds__(COPY_THREADS)
    fft_pack(const float* __restrict__ tensor, float* __restrict__ grid, int B, int H, int W,
             int Th, int Tw, int start_y, int start_x, int step_y, int step_x, int tiles_y,
             int tiles_x, int extent_y, int extent_x) {
  __shared__ float tile[COPY_TILE][COPY_TILE + 1];  // +1: columns of the tile hit every bank
  grid_copy<true>(tensor, grid, tile, B, H, W, Th, Tw,
                  {start_y, start_x, step_y, step_x, tiles_y, tiles_x, extent_y, extent_x}, 1.f);
}

// tensor (A×B×H×W in the layout) <- scale · its cells of the grids.
// Grid: (H · ceil(W / COPY_TILE), ceil(B / COPY_TILE), A) blocks of COPY_THREADS.
extern "C" __global__ void __launch_bounds__(COPY_THREADS)
    fft_crop(const float* __restrict__ grid, float* __restrict__ tensor, int B, int H, int W,
             int Th, int Tw, int start_y, int start_x, int step_y, int step_x, int tiles_y,
             int tiles_x, float scale) {
  __shared__ float tile[COPY_TILE][COPY_TILE + 1];
  grid_copy<false>(grid, tensor, tile, B, H, W, Th, Tw,
                   {start_y, start_x, step_y, step_x, tiles_y, tiles_x, Th, Tw}, scale);
}

// Stages rows × PROD_TL × PROD_TF of a factor: s[l][row][f] = factor (row0 + row, l0 + l) at
// frequency f0 + f, conjugated if asked, zero outside the F × rows × L extent.
__device__ __forceinline__ void stage(float2* __restrict__ s, const float2* __restrict__ g,
                                      int rows, int row0, int n_rows, int row_stride, int l0,
                                      int L, int l_stride, int f0, int F, float imag_sign) {
  for (int e = threadIdx.x; e < PROD_TL * rows * PROD_TF; e += kProdThreads) {
    const int f = e % PROD_TF, row = e / PROD_TF % rows, l = e / (PROD_TF * rows);
    float2 v = make_float2(0.f, 0.f);
    if (f0 + f < F && row0 + row < n_rows && l0 + l < L) {
      v = g[((row0 + row) * row_stride + (l0 + l) * l_stride) * F + f0 + f];
      v.y *= imag_sign;
    }
    s[e] = v;
  }
}

// out[f][m][n] = Σ_l lhs[f][m][l] · rhs[f][l][n] (see the top of the file), conj_lhs/conj_rhs
// non-zero to conjugate that factor. Grid: (ceil(F / PROD_TF), ceil(N / PROD_TN),
// ceil(M / PROD_TM)) blocks of PROD_TF · (PROD_TM / PROD_MM) · (PROD_TN / PROD_MN) threads.
// __launch_bounds__(…, PROD_MIN_BLOCKS), 1: ptxas takes the 135 registers it wants (one block
// of 8 warps per SM). Held to 128 for two blocks (one staging while the other multiplies) it
// fitted on a quiet machine, but at the cap ptxas was seen to spill at random while the CPU was
// busy (kernels/gemm.cu), which made the compile gate flake. The l loop is not unrolled: unrolled
// by 2 under the 128 cap it spilled.
extern "C" __global__ void __launch_bounds__(kProdThreads, PROD_MIN_BLOCKS)
    fft_product(const float2* __restrict__ lhs, const float2* __restrict__ rhs,
                float2* __restrict__ out, int F, int M, int N, int L, int lhs_m, int lhs_l,
                int rhs_l, int rhs_n, int out_m, int out_n, int conj_lhs, int conj_rhs) {
  __shared__ float2 ls[PROD_TL][PROD_TM][PROD_TF];
  __shared__ float2 rs[PROD_TL][PROD_TN][PROD_TF];
  const int f0 = blockIdx.x * PROD_TF, n0 = blockIdx.y * PROD_TN, m0 = blockIdx.z * PROD_TM;
  // With PROD_TF · kGroupsN = 32 a warp spans the frequencies and kGroupsN columns: its lhs
  // reads are broadcasts, its rhs reads consecutive float2s (no bank conflicts).
  const int f = threadIdx.x % PROD_TF, group = threadIdx.x / PROD_TF;
  const int gn = group % kGroupsN, gm = group / kGroupsN;  // thread's m = gm + i·kGroupsM, etc.

  float2 acc[PROD_MM][PROD_MN];
#pragma unroll
  for (int i = 0; i < PROD_MM; ++i)
#pragma unroll
    for (int j = 0; j < PROD_MN; ++j) acc[i][j] = make_float2(0.f, 0.f);

  for (int l0 = 0; l0 < L; l0 += PROD_TL) {
    stage(&ls[0][0][0], lhs, PROD_TM, m0, M, lhs_m, l0, L, lhs_l, f0, F, conj_lhs ? -1.f : 1.f);
    stage(&rs[0][0][0], rhs, PROD_TN, n0, N, rhs_n, l0, L, rhs_l, f0, F, conj_rhs ? -1.f : 1.f);
    __syncthreads();
#pragma unroll 1
    for (int l = 0; l < PROD_TL; ++l) {
      float2 a[PROD_MM], b[PROD_MN];
#pragma unroll
      for (int i = 0; i < PROD_MM; ++i) a[i] = ls[l][gm + i * kGroupsM][f];
#pragma unroll
      for (int j = 0; j < PROD_MN; ++j) b[j] = rs[l][gn + j * kGroupsN][f];
#pragma unroll
      for (int i = 0; i < PROD_MM; ++i)
#pragma unroll
        for (int j = 0; j < PROD_MN; ++j) {
          acc[i][j].x += a[i].x * b[j].x - a[i].y * b[j].y;
          acc[i][j].y += a[i].x * b[j].y + a[i].y * b[j].x;
        }
    }
    __syncthreads();
  }
  if (f0 + f >= F) return;
#pragma unroll
  for (int i = 0; i < PROD_MM; ++i)
#pragma unroll
    for (int j = 0; j < PROD_MN; ++j) {
      const int m = m0 + gm + i * kGroupsM, n = n0 + gn + j * kGroupsN;
      if (m < M && n < N) out[(m * out_m + n * out_n) * F + f0 + f] = acc[i][j];
    }
}
