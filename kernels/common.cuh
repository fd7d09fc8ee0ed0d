// Helpers shared by convbench's kernels: integer division, split-reduction sums and tensor-layout
// indexing.
//
// Included with #include "common.cuh"; convbench/kernels.py inlines it (once) into the source it
// hands to NVRTC and to the emulator's g++, so it needs no include path and no guard.
//
// Layout helpers exist when the file is compiled with -DNHWC=0 (activations NCHW, filters KCRS)
// or -DNHWC=1 (activations NHWC, filters KRSC): one compiled kernel per layout, no transposes.
// Offsets are 32-bit: wrappers refuse tensors of 2^31 elements or more.

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }  // a >= 0, b > 0

// ceil(a / b) for any sign of a, b > 0 (C++ division truncates toward zero).
__device__ __forceinline__ int ceil_div_signed(int a, int b) {
  return a >= 0 ? (a + b - 1) / b : -(-a / b);
}

// One element of a split reduction's result: the sum of its `splits` partials (`count`
// elements each, back to back) in slice order, so the result does not depend on scheduling.
__device__ __forceinline__ float sum_splits(const float* __restrict__ part, int count,
                                            int splits, int i) {
  float sum = 0.f;
  for (int z = 0; z < splits; ++z) sum += part[static_cast<size_t>(z) * count + i];
  return sum;
}

#ifdef NHWC

// Offset of element (n, c, y, x) of an activation tensor of C channels and H×W pixels.
__device__ __forceinline__ int act_offset(int n, int c, int y, int x, int C, int H, int W) {
#if NHWC
  return ((n * H + y) * W + x) * C + c;
#else
  return ((n * C + c) * H + y) * W + x;
#endif
}

// Offset of element (k, c, r, s) of a filter of C channels and R×S taps (KCRS or KRSC).
__device__ __forceinline__ int filter_offset(int k, int c, int r, int s, int C, int R, int S) {
#if NHWC
  return ((k * R + r) * S + s) * C + c;
#else
  return ((k * C + c) * R + r) * S + s;
#endif
}

// Coordinates of the e-th element of an nc × ny × nx box of activations, counted in the order the
// layout stores them (x fastest in NCHW, c fastest in NHWC), so that consecutive threads staging
// a box into shared memory read consecutive addresses.
__device__ __forceinline__ void act_box(int e, int nc, int ny, int nx, int& c, int& y, int& x) {
#if NHWC
  c = e % nc; x = e / nc % nx; y = e / (nc * nx);
#else
  x = e % nx; y = e / nx % ny; c = e / (nx * ny);
#endif
}

// The same for a (any) × nc × R × S box of a filter (s fastest in KCRS, c fastest in KRSC). For
// e below nc·R·S it splits a filter row's offset (c·R·S + r·S + s, or (r·S + s)·C + c) into
// (c, r, s), with k = 0.
__device__ __forceinline__ void filter_box(int e, int nc, int R, int S, int& k, int& c, int& r,
                                           int& s) {
#if NHWC
  c = e % nc; s = e / nc % S; r = e / (nc * S) % R; k = e / (nc * S * R);
#else
  s = e % S; r = e / S % R; c = e / (S * R) % nc; k = e / (S * R * nc);
#endif
}

#endif  // NHWC
