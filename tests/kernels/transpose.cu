// Tiled transpose through shared memory: the emulator's proof that barriers matter.
// Compiled with -DSKIP_BARRIER=1 it loses the one __syncthreads() between writing the tile and
// reading it back transposed: a deliberately broken kernel that tests/test_emu.py shows fails.
#ifndef SKIP_BARRIER
#define SKIP_BARRIER 0
#endif
#define TILE 8

extern "C" __global__ void transpose(const float* __restrict__ in, float* __restrict__ out,
                                     int rows, int cols) {
  __shared__ float tile[TILE][TILE + 1];
  int x = blockIdx.x * TILE + threadIdx.x, y = blockIdx.y * TILE + threadIdx.y;
  if (x < cols && y < rows) tile[threadIdx.y][threadIdx.x] = in[y * cols + x];
#if !SKIP_BARRIER
  __syncthreads();
#endif
  x = blockIdx.y * TILE + threadIdx.x;
  y = blockIdx.x * TILE + threadIdx.y;
  if (x < rows && y < cols) out[y * rows + x] = tile[threadIdx.x][threadIdx.y];
}
