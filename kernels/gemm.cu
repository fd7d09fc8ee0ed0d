// Tiled SGEMM: C = op(A) · op(B) in FP32, batched over groups and images, with the option of
// summing over images and splitting that reduction across blocks. It is the product of the `gemm`
// convolution (convbench/algos/gemm_kernels.py maps each pass and layout onto one call).
//
// Matrices are row-major with leading dimensions lda, ldb, ldc. op(A) is M×K and op(B) is K×N;
// the entry point's suffix says how each is stored: sgemm_<a><b> with n = as is (A is M×K, B is
// K×N) and t = transposed (A stored K×M, B stored N×K). The four variants are one template, so
// no pass needs a transpose kernel: the operand is read in the order it is stored.
//
// Tiling. A block computes a BM × BN tile of C; each of its (BM/TM)·(BN/TN) threads holds a
// TM × TN sub-tile in registers. The sub-tile is strided, TM/4 (TN/4) runs of 4 rows (columns)
// BM/(TM/4) (BN/(TN/4)) apart, so a warp reads its A and B values from shared memory as float4s,
// the 16 threads across N hitting 16 consecutive float4s (no bank conflict) and the threads
// across M a broadcast; its stores to C are float4s along a row. The K dimension is walked BK at a
// time: both operands' BK-deep tiles are staged in shared memory as [BK][BM] and [BK][BN] (k
// outermost, whichever way the operand is stored in global memory), rows padded by 4 floats.
//
// Double buffering. There are two shared-memory copies of each tile. While the block multiplies
// the tile in one, each thread's share of the next tile is already on its way from global memory
// into registers; after the multiply it goes into the other copy, and a single __syncthreads per
// K-tile both publishes it and retires the copy just read (which the next iteration overwrites).
//
// Vector loads. Global tiles are read as float4 along the operand's contiguous axis wherever the
// operand's base is 16-byte aligned, its leading dimension a multiple of 4 and the 4 elements
// inside the matrix; everywhere else (edges, odd leading dimensions, unaligned batch offsets) the
// same thread reads the 4 elements one by one, zero outside. So any M, N, K is correct.
//
// Batches and reductions. blockIdx.z = split · groups + g. Group g offsets A, B and C by their
// group strides. The reduction runs over `images` × ceil(K/BK) K-tiles, image-major (image n
// offsets A and B by their image strides): the block of split j takes K-tiles
// [j·tiles_per_split, (j+1)·tiles_per_split) of that sequence and writes C offset by j·c_split.
//   - separate products per image (a batched GEMM): tiles_per_split = ceil(K/BK), so split j is
//     image j, and c_split is C's image stride;
//   - one product summed over images (and over K), split into slices: each slice writes a partial
//     C at c_split apart, and gemm_sum_splits adds the partials in slice order. No atomics: the
//     result is deterministic, run to run.
//
// Tile sizes are -D defines (BM, BN, BK, TM, TN; MIN_BLOCKS for the launch bounds), declared in
// convbench/algos/gemm_kernels.py, which also sizes the dynamic shared memory (smem_bytes there
// must match the layout below).
// Offsets are 32-bit: the wrapper refuses matrices and workspaces of 2^31 elements or more.
#include "common.cuh"

#if !defined(BM) || !defined(BN) || !defined(BK) || !defined(TM) || !defined(TN) || \
    !defined(MIN_BLOCKS)
#error "gemm.cu needs -D BM, BN, BK, TM, TN, MIN_BLOCKS"
#endif

constexpr int kThreadsM = BM / TM, kThreadsN = BN / TN;  // threads along M and N of a tile
constexpr int kThreads = kThreadsM * kThreadsN;
// Row padding of the shared tiles: keeps rows 16-byte aligned, and puts the 4 rows that one
// thread's transposed (X-major) float4 lands in on different banks.
constexpr int kPad = 4;
constexpr int kLdA = BM + kPad, kLdB = BN + kPad;  // shared tile row lengths, floats
constexpr int kBufA = BK * kLdA, kBufB = BK * kLdB;  // one copy of a shared tile, floats
static_assert(TM % 4 == 0 && TN % 4 == 0 && BM % TM == 0 && BN % TN == 0 && BK % 4 == 0,
              "a thread's sub-tile and the K step come in float4s");
static_assert(BM * BK % (4 * kThreads) == 0 && BN * BK % (4 * kThreads) == 0,
              "each thread stages whole float4s of both tiles");

// True when float4 loads from `p` with leading dimension `ld` are aligned (tile origins and the
// float4s within a tile are multiples of 4 elements along the contiguous axis).
__device__ __forceinline__ bool vector_ok(const float* p, int ld) {
  return (reinterpret_cast<size_t>(p) & 15) == 0 && ld % 4 == 0;
}

// One operand's BK × BX tile on its way from global to shared memory (BX = BM for A, BN for B).
// In global memory the operand is K-major (element (x, k) at k·ld + x: A transposed, B as is) or
// X-major ((x, k) at x·ld + k); in shared memory it is [BK][BX + kPad] either way.
template <int BX, bool KMAJOR>
struct TileLoader {
  static constexpr int kRun = (KMAJOR ? BX : BK) / 4;  // float4s along the contiguous axis
  static constexpr int kVecs = BX * BK / 4 / kThreads;  // float4s per thread
  float4 v[kVecs];

  // Fetch into registers the tile at (x0, k0) of an xs × ks matrix (zeros outside it).
  __device__ __forceinline__ void load(const float* __restrict__ p, int ld, int x0, int k0, int xs,
                                       int ks, bool vec) {
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int e = threadIdx.x + i * kThreads;
      const int along = e % kRun * 4, across = e / kRun;
      const int x = x0 + (KMAJOR ? along : across), k = k0 + (KMAJOR ? across : along);
      const bool row = KMAJOR ? k < ks : x < xs;
      const int left = KMAJOR ? xs - x : ks - k;  // elements before the contiguous axis ends
      const float* src = p + (KMAJOR ? k * ld + x : x * ld + k);
      if (row && vec && left >= 4) {
        v[i] = *reinterpret_cast<const float4*>(src);
      } else {
        v[i].x = row && left > 0 ? src[0] : 0.f;
        v[i].y = row && left > 1 ? src[1] : 0.f;
        v[i].z = row && left > 2 ? src[2] : 0.f;
        v[i].w = row && left > 3 ? src[3] : 0.f;
      }
    }
  }

  // Store the fetched tile into one shared copy, [BK][BX + kPad].
  __device__ __forceinline__ void store(float* __restrict__ s) const {
    constexpr int ld = BX + kPad;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int e = threadIdx.x + i * kThreads;
      const int along = e % kRun * 4, across = e / kRun;
      if (KMAJOR) {
        *reinterpret_cast<float4*>(s + across * ld + along) = v[i];
      } else {
        s[(along + 0) * ld + across] = v[i].x;
        s[(along + 1) * ld + across] = v[i].y;
        s[(along + 2) * ld + across] = v[i].z;
        s[(along + 3) * ld + across] = v[i].w;
      }
    }
  }
};

template <bool TRANS_A, bool TRANS_B>
__device__ __forceinline__ void sgemm(const float* __restrict__ A, const float* __restrict__ B,
                                      float* __restrict__ C, int M, int N, int K, int lda, int ldb,
                                      int ldc, int groups, int images, int tiles_per_split,
                                      int a_group, int a_image, int b_group, int b_image,
                                      int c_group, int c_split) {
  extern __shared__ __align__(16) float smem[];
  float* const As = smem;              // [2][BK][kLdA]
  float* const Bs = smem + 2 * kBufA;  // [2][BK][kLdB]

  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const int g = blockIdx.z % groups, split = blockIdx.z / groups;
  const int k_tiles = ceil_div(K, BK);
  const int t_begin = split * tiles_per_split;
  const int t_end = min(images * k_tiles, t_begin + tiles_per_split);
  A += g * a_group;
  B += g * b_group;
  C += g * c_group + split * c_split;

  TileLoader<BM, TRANS_A> a_tile;   // A stored K×M is K-major
  TileLoader<BN, !TRANS_B> b_tile;  // B stored K×N is K-major
  auto fetch = [&](int t) {
    const int n = t / k_tiles, k0 = t % k_tiles * BK;
    const float* a = A + n * a_image;
    const float* b = B + n * b_image;
    a_tile.load(a, lda, m0, k0, M, K, vector_ok(a, lda));
    b_tile.load(b, ldb, n0, k0, N, K, vector_ok(b, ldb));
  };

  const int tx = threadIdx.x % kThreadsN, ty = threadIdx.x / kThreadsN;
  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

  if (t_begin < t_end) {  // the same for every thread of the block: the barriers agree
    fetch(t_begin);
    a_tile.store(As);
    b_tile.store(Bs);
    __syncthreads();
    for (int t = t_begin; t < t_end; ++t) {
      const int cur = (t - t_begin) & 1;
      const bool more = t + 1 < t_end;
      if (more) fetch(t + 1);  // in flight while this tile is multiplied
      const float* as = As + cur * kBufA;
      const float* bs = Bs + cur * kBufB;
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) {
        float a[TM], b[TN];
#pragma unroll
        for (int i = 0; i < TM / 4; ++i) {
          const float4 v = *reinterpret_cast<const float4*>(as + kk * kLdA +
                                                            (i * kThreadsM + ty) * 4);
          a[4 * i] = v.x; a[4 * i + 1] = v.y; a[4 * i + 2] = v.z; a[4 * i + 3] = v.w;
        }
#pragma unroll
        for (int j = 0; j < TN / 4; ++j) {
          const float4 v = *reinterpret_cast<const float4*>(bs + kk * kLdB +
                                                            (j * kThreadsN + tx) * 4);
          b[4 * j] = v.x; b[4 * j + 1] = v.y; b[4 * j + 2] = v.z; b[4 * j + 3] = v.w;
        }
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
          for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
      }
      if (more) {
        a_tile.store(As + (cur ^ 1) * kBufA);
        b_tile.store(Bs + (cur ^ 1) * kBufB);
      }
      __syncthreads();
    }
  }

  const bool vec = vector_ok(C, ldc);
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int m = m0 + (i / 4 * kThreadsM + ty) * 4 + i % 4;
    if (m >= M) continue;
    float* row = C + m * ldc;
#pragma unroll
    for (int j = 0; j < TN / 4; ++j) {
      const int n = n0 + (j * kThreadsN + tx) * 4;
      if (vec && n + 3 < N) {
        *reinterpret_cast<float4*>(row + n) =
            make_float4(acc[i][4 * j], acc[i][4 * j + 1], acc[i][4 * j + 2], acc[i][4 * j + 3]);
      } else {
#pragma unroll
        for (int f = 0; f < 4; ++f)
          if (n + f < N) row[n + f] = acc[i][4 * j + f];
      }
    }
  }
}

// MIN_BLOCKS resident blocks per SM, which caps a thread's registers at 65536 / (MIN_BLOCKS ·
// kThreads). The small tile asks for 4 blocks of 128 threads (128 registers; it needs 93-107,
// unconstrained on sm_80/sm_90). The large tile asks for 1 block of 256 (8 warps, each thread
// with 64 independent accumulators for latency hiding): it needs 132-145 registers
// unconstrained, and held to 128 (2 blocks) ptxas fitted it on a quiet machine but spilled 72
// bytes in about one compile in six while the CPU was busy, so the compile gate flaked.
constexpr int kMinBlocks = MIN_BLOCKS;

extern "C" __global__ void __launch_bounds__(kThreads, kMinBlocks)
    sgemm_nn(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
             int M, int N, int K, int lda, int ldb, int ldc, int groups, int images,
             int tiles_per_split, int a_group, int a_image, int b_group, int b_image, int c_group,
             int c_split) {
  sgemm<false, false>(A, B, C, M, N, K, lda, ldb, ldc, groups, images, tiles_per_split, a_group,
                      a_image, b_group, b_image, c_group, c_split);
}

extern "C" __global__ void __launch_bounds__(kThreads, kMinBlocks)
    sgemm_nt(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
             int M, int N, int K, int lda, int ldb, int ldc, int groups, int images,
             int tiles_per_split, int a_group, int a_image, int b_group, int b_image, int c_group,
             int c_split) {
  sgemm<false, true>(A, B, C, M, N, K, lda, ldb, ldc, groups, images, tiles_per_split, a_group,
                     a_image, b_group, b_image, c_group, c_split);
}

extern "C" __global__ void __launch_bounds__(kThreads, kMinBlocks)
    sgemm_tn(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
             int M, int N, int K, int lda, int ldb, int ldc, int groups, int images,
             int tiles_per_split, int a_group, int a_image, int b_group, int b_image, int c_group,
             int c_split) {
  sgemm<true, false>(A, B, C, M, N, K, lda, ldb, ldc, groups, images, tiles_per_split, a_group,
                     a_image, b_group, b_image, c_group, c_split);
}

extern "C" __global__ void __launch_bounds__(kThreads, kMinBlocks)
    sgemm_tt(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
             int M, int N, int K, int lda, int ldb, int ldc, int groups, int images,
             int tiles_per_split, int a_group, int a_image, int b_group, int b_image, int c_group,
             int c_split) {
  sgemm<true, true>(A, B, C, M, N, K, lda, ldb, ldc, groups, images, tiles_per_split, a_group,
                    a_image, b_group, b_image, c_group, c_split);
}

// out = the sum of the `splits` partial results (`count` elements each, back to back) of a split
// reduction, added in slice order.
extern "C" __global__ void __launch_bounds__(kThreads)
    gemm_sum_splits(const float* __restrict__ part, float* __restrict__ out, int count,
                    int splits) {
  const int i = blockIdx.x * kThreads + threadIdx.x;
  if (i < count) out[i] = sum_splits(part, count, splits, i);
}
