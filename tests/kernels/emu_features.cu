// Kernels exercising the emulator's other guarantees (tests/test_emu.py).

// Sum of `n` floats: a tree reduction per block in dynamic shared memory (blockDim.x floats,
// a power of two), then one atomicAdd per block into *total.
extern "C" __global__ void block_sum(const float* __restrict__ in, float* total, int n) {
  extern __shared__ float partial[];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  partial[threadIdx.x] = i < n ? in[i] : 0.f;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(total, partial[0]);
}

// Counts every thread of the grid with an integer atomic.
extern "C" __global__ void count_threads(int* counter) { atomicAdd(counter, 1); }

// Threads past `active` leave before the barrier the others wait at: undefined on a GPU, an
// error in the emulator.
extern "C" __global__ void divergent_barrier(float* out, int active) {
  if (threadIdx.x >= active) return;
  out[threadIdx.x] = 1.f;
  __syncthreads();
}

// Copies dynamic shared memory nobody wrote: the emulator fills it with NaN before each block.
extern "C" __global__ void peek_shared(float* out) {
  extern __shared__ float untouched[];
  out[blockIdx.x * blockDim.x + threadIdx.x] = untouched[threadIdx.x];
}
