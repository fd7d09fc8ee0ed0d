// A kernel that must spill: 64 accumulators kept live in registers (fully unrolled) under a
// launch bound that leaves 32 registers per thread. tests/test_kernels.py shows the compile gate
// reports it as a failure.
extern "C" __global__ void __launch_bounds__(1024, 2)
    spills(const float* __restrict__ in, float* __restrict__ out, int n) {
  float acc[64];
#pragma unroll
  for (int j = 0; j < 64; ++j) acc[j] = in[j * blockDim.x + threadIdx.x];
  for (int i = 0; i < n; ++i) {
    const float v = in[i];
#pragma unroll
    for (int j = 0; j < 64; ++j) acc[j] = acc[j] * acc[(j + 1) % 64] + v;
  }
#pragma unroll
  for (int j = 0; j < 64; ++j) out[j * blockDim.x + threadIdx.x] = acc[j];
}
