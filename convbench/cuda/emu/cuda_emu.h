// Host emulation of the CUDA C++ that convbench's kernels use.
//
// g++ force-includes this header (-include cuda_emu.h) ahead of a kernels/*.cu source, so the
// unmodified kernel compiles as host C++. The design, and how kernels reach it from Python, is in
// convbench/emu/__init__.py. In short:
//
//   * Blocks run one after another; the threads of a block run as cooperative fibers (ucontext,
//     one stack each) that switch only at __syncthreads(). The scheduler runs every fiber of the
//     block up to its next barrier (or its exit), then releases them all. A barrier that some
//     threads wait at while others have exited is a divergent barrier: the launch fails.
//   * __shared__ variables are static storage in the section "emu_shared", shared by the fibers
//     of the running block; `extern __shared__` arrays (rewritten by convbench/emu/build.py) all
//     alias one dynamic buffer, as in CUDA. Both are filled with 0xFF bytes (NaN as float, -1 as
//     int) before each block, so a read before the write that should precede it shows up.
//     (Static __shared__ inside inline or template helpers is shared correctly, but GCC places it
//     outside the section, so it is not refilled: declare shared tiles in the kernel.)
//   * Fibers never preempt each other, so atomics are plain read-modify-writes, and a thread sees
//     another's shared-memory writes only across a barrier, as a correct kernel assumes.
//
// Not emulated: warp-level intrinsics (__shfl_*_sync, __syncwarp, votes), cooperative groups,
// inline PTX, textures. A kernel that needs one fails to compile here; add it below when a kernel
// needs it (a shuffle is a warp-wide barrier: write a slot, barrier, read a slot, barrier).
#pragma once

#include <ucontext.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#define CONVBENCH_EMU 1

// --- qualifiers --------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __constant__
#define __shared__ static __attribute__((section("emu_shared")))

// --- clocks ------------------------------------------------------------------------------------
// clock64(): the host's steady clock in ns stands in for the SM's cycle counter (only differences
// mean anything, as on the GPU).
#include <chrono>
inline long long clock64() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// --- vector types --------------------------------------------------------------------------------
#define EMU_VECTOR2(T, V, ALIGN)                                                                  \
  struct alignas(ALIGN) V { T x, y; };                                                            \
  inline V make_##V(T x, T y) { return V{x, y}; }
#define EMU_VECTOR4(T, V, ALIGN)                                                                  \
  struct alignas(ALIGN) V { T x, y, z, w; };                                                      \
  inline V make_##V(T x, T y, T z, T w) { return V{x, y, z, w}; }
EMU_VECTOR2(float, float2, 8)
EMU_VECTOR4(float, float4, 16)
EMU_VECTOR2(double, double2, 16)
EMU_VECTOR2(int, int2, 8)
EMU_VECTOR4(int, int4, 16)
EMU_VECTOR2(unsigned, uint2, 8)
EMU_VECTOR4(unsigned, uint4, 16)
#undef EMU_VECTOR2
#undef EMU_VECTOR4

struct uint3 { unsigned x, y, z; };
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// --- the scheduler -------------------------------------------------------------------------------
namespace emu {

constexpr std::size_t kStackBytes = 128 * 1024;            // per thread; plus a guard page
constexpr std::size_t kMaxDynamicShared = 227 * 1024;      // sm_90's per-block opt-in limit
constexpr unsigned kMaxThreads = 1024;

struct Fiber {
  enum State { kRunning, kAtBarrier, kDone };
  ucontext_t context;
  char* stack;
  uint3 index;
  State state;
};

struct Scheduler {
  ucontext_t home;                              // the scheduler's own context
  std::vector<Fiber> fibers;                    // grows to the largest block launched
  Fiber* current = nullptr;
  const std::function<void()>* body = nullptr;  // the kernel call, with its arguments bound
  std::string error;
};

inline Scheduler sched;
inline uint3 thread_idx, block_idx;
inline dim3 block_dim, grid_dim;

// The kernel's view: read-only, and always the running fiber's (the scheduler sets them before
// switching to a fiber; the fiber's code reloads them after every barrier, an opaque call).
#define threadIdx (static_cast<const uint3&>(::emu::thread_idx))
#define blockIdx (static_cast<const uint3&>(::emu::block_idx))
#define blockDim (static_cast<const dim3&>(::emu::block_dim))
#define gridDim (static_cast<const dim3&>(::emu::grid_dim))

extern "C" char emu_dynamic_shared[kMaxDynamicShared] __attribute__((aligned(128)));
extern "C" char __start_emu_shared[] __attribute__((weak));  // ld defines both when the section
extern "C" char __stop_emu_shared[] __attribute__((weak));   // exists; null when it does not

inline void fiber_main() {
  (*sched.body)();
  sched.current->state = Fiber::kDone;  // returning resumes uc_link: the scheduler
}

inline void barrier() {
  Fiber* self = sched.current;
  self->state = Fiber::kAtBarrier;
  asm volatile("" ::: "memory");  // no shared value may stay in a register across the switch
  swapcontext(&self->context, &sched.home);
  asm volatile("" ::: "memory");
}

inline bool fail(const std::string& message) {
  sched.error = message;
  return false;
}

inline bool reserve_fibers(unsigned count) {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  while (sched.fibers.size() < count) {
    void* base = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return fail("emu: cannot map a fiber stack");
    mprotect(base, page, PROT_NONE);  // guard page: an overflow faults instead of corrupting
    sched.fibers.push_back(Fiber{});
    sched.fibers.back().stack = static_cast<char*>(base) + page;
  }
  return true;
}

// Run one block to completion: every fiber to its next barrier or exit, round after round.
inline bool run_block(unsigned nthreads) {
  for (unsigned t = 0; t < nthreads; ++t) {
    Fiber& f = sched.fibers[t];
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack;
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = &sched.home;
    makecontext(&f.context, fiber_main, 0);
    f.index = uint3{t % block_dim.x, t / block_dim.x % block_dim.y, t / (block_dim.x * block_dim.y)};
    f.state = Fiber::kRunning;
  }
  for (;;) {
    unsigned waiting = 0, done = 0;
    for (unsigned t = 0; t < nthreads; ++t) {
      Fiber& f = sched.fibers[t];
      if (f.state != Fiber::kDone) {
        sched.current = &f;
        thread_idx = f.index;
        swapcontext(&sched.home, &f.context);
      }
      (f.state == Fiber::kDone ? done : waiting) += 1;
    }
    if (waiting == 0) return true;
    if (done > 0) {
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    "divergent __syncthreads in block (%u,%u,%u): %u of %u threads exited while "
                    "%u wait at a barrier",
                    block_idx.x, block_idx.y, block_idx.z, done, nthreads, waiting);
      return fail(buf);
    }
  }
}

// Launch a kernel: `body` calls it with its arguments. Returns 0, or 1 with sched.error set.
inline int launch(dim3 grid, dim3 block, std::size_t dynamic_shared,
                  const std::function<void()>& body) {
  sched.error.clear();
  const unsigned long long nthreads = 1ull * block.x * block.y * block.z;
  if (nthreads == 0 || nthreads > kMaxThreads || block.z > 64 || grid.x == 0 || grid.y == 0 ||
      grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "invalid launch configuration: grid (%u,%u,%u), block (%u,%u,%u)",
                  grid.x, grid.y, grid.z, block.x, block.y, block.z);
    fail(buf);
    return 1;
  }
  if (dynamic_shared > kMaxDynamicShared) {
    fail("dynamic shared memory of " + std::to_string(dynamic_shared) + " bytes exceeds " +
         std::to_string(kMaxDynamicShared));
    return 1;
  }
  if (!reserve_fibers(static_cast<unsigned>(nthreads))) return 1;
  grid_dim = grid;
  block_dim = block;
  sched.body = &body;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        block_idx = uint3{x, y, z};
        if (__start_emu_shared != nullptr)
          std::memset(__start_emu_shared, 0xFF, __stop_emu_shared - __start_emu_shared);
        std::memset(emu_dynamic_shared, 0xFF, dynamic_shared);
        if (!run_block(static_cast<unsigned>(nthreads))) return 1;
      }
  return 0;
}

}  // namespace emu

extern "C" {
char emu_dynamic_shared[emu::kMaxDynamicShared] __attribute__((aligned(128)));
}
extern "C" const char* emu_error() { return emu::sched.error.c_str(); }

// --- synchronization and memory ----------------------------------------------------------------
inline void __syncthreads() { emu::barrier(); }
inline void __threadfence() {}
inline void __threadfence_block() {}
constexpr int warpSize = 32;

template <class T>
inline T __ldg(const T* p) { return *p; }

// Fibers switch only at barriers, so a read-modify-write cannot be interleaved.
#define EMU_ATOMIC(NAME, T, UPDATE)                                                               \
  inline T NAME(T* address, T val) { T old = *address; *address = (UPDATE); return old; }
#define EMU_ATOMICS_ARITH(T)                                                                      \
  EMU_ATOMIC(atomicAdd, T, old + val)                                                             \
  EMU_ATOMIC(atomicExch, T, val)
#define EMU_ATOMICS_INT(T)                                                                        \
  EMU_ATOMICS_ARITH(T)                                                                            \
  EMU_ATOMIC(atomicSub, T, old - val)                                                             \
  EMU_ATOMIC(atomicMin, T, val < old ? val : old)                                                 \
  EMU_ATOMIC(atomicMax, T, val > old ? val : old)                                                 \
  EMU_ATOMIC(atomicAnd, T, old & val)                                                             \
  EMU_ATOMIC(atomicOr, T, old | val)                                                              \
  EMU_ATOMIC(atomicXor, T, old ^ val)                                                             \
  inline T atomicCAS(T* address, T compare, T val) {                                              \
    T old = *address; if (old == compare) *address = val; return old;                             \
  }
EMU_ATOMICS_INT(int)
EMU_ATOMICS_INT(unsigned)
EMU_ATOMICS_INT(unsigned long long)
EMU_ATOMICS_ARITH(float)
EMU_ATOMICS_ARITH(double)
#undef EMU_ATOMICS_INT
#undef EMU_ATOMICS_ARITH
#undef EMU_ATOMIC

// --- math ----------------------------------------------------------------------------------------
// The host's libm stands in for CUDA's; the fast intrinsics are computed exactly.
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline void __sincosf(float x, float* s, float* c) { *s = std::sin(x); *c = std::cos(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }

// CUDA's min/max: overloads for the floating types (NaN-ignoring, like fminf), the usual
// arithmetic conversions for everything else.
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
template <class A, class B>
inline std::common_type_t<A, B> min(A a, B b) { return b < a ? b : a; }
template <class A, class B>
inline std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }
