// The timer's head start (convbench/timing.py): one thread spins for `cycles` SM clock cycles, so
// the GPU stays busy while the host issues the pass queued behind it. Without it, a pass whose
// host takes longer to issue than the L2 flush before it takes on the GPU leaves the GPU idle
// between the first event and the pass's first kernel, and the event pair counts the idle time.
// (nvbench holds the stream with a kernel that waits on a host flag; a fixed spin, sized from the
// host's measured issue time, needs no mapped memory and cannot hang.)
extern "C" __global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}
