"""Memory a pass allocates, read from the allocators around an untimed call; and memory limits.

A workspace decides whether the fastest algorithm fits beside a batch's activations, so every
results row carries the workspace an algorithm declares (`workspace_bytes`, predicted) and the
peak it was seen to allocate (`peak_bytes`), and `memory_method` says how that was read:

- `torch-profiler+tracemalloc` (`numpy`, `emu`): NumPy's buffers through `tracemalloc`
  (pyFFTW's too), plus torch's CPU allocator through the profiler's memory events. Blind to a
  library's own malloc: BLAS thread buffers, FFTW plans, oneDNN's scratchpad.
- `cupy-pool+torch-cuda` (`cuda`): CuPy's pool, its used bytes read after every malloc (the
  high-water mark it keeps no statistic of), plus torch's caching allocator's peak. Blind to
  cuBLAS's own workspace.

Bytes allocated, not pages resident. A row records the pass's own memory: the trace starts once
the operands and output exist, counts the prepared buffers and every temporary of one call but
not the preparation's (FFTW planning, cuDNN's autotuning), and runs around the verifying call,
never around timing. `MemoryLimit` makes a budget an out-of-memory condition (`OverLimit`, a
MemoryError) on the predicted, then the measured footprint — a real host allocation failure
would take the machine's other work down, and on a GPU only the measured sum sees both pools —
and on a GPU holds each allocator to it for real. The two pools never lend each other a block,
so `release_device_memory` returns both pools' cached blocks before each GPU case.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import tracemalloc
from dataclasses import dataclass

import numpy as np

from ..algos import registry
from ..core.problem import ConvProblem

#: What each `memory_method` reads, for reports and env.json.
METHODS = {
    "torch-profiler+tracemalloc": (
        "host: NumPy buffers via tracemalloc plus torch's CPU allocator via the profiler's memory "
        "events; blind to memory libraries malloc themselves (BLAS buffers, FFTW plans, oneDNN "
        "scratchpad)"),
    "cupy-pool+torch-cuda": (
        "GPU: CuPy memory-pool high-water (a MemoryHook reads used bytes after each malloc) plus "
        "torch.cuda.max_memory_allocated; blind to cuBLAS's own workspace"),
}

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}


def parse_size(text: str) -> int:
    """`2GiB`, `256MiB`, `1.5 GB`, `4096` -> bytes; ValueError naming the units otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = m and m.group(2).lower()
    if not m or unit not in _UNITS or float(m.group(1)) * _UNITS[unit] < 1:
        raise ValueError(f"{text!r} is not a positive size such as 512MiB, 2GiB or 1.5GB")
    return int(float(m.group(1)) * _UNITS[unit])


def format_size(nbytes: float) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1: `1.5 GiB`; three
    significant digits, four from 1000 up (`1020 MiB`, never `1.02e+03 MiB`)."""
    for unit, scale in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30),
                        ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            value = nbytes / scale
            return f"{value:.4g} {unit}" if abs(value) >= 1000 else f"{value:.3g} {unit}"
    return f"{int(nbytes)} B"


def operand_bytes(problem: ConvProblem, pass_: str, dtype) -> int:
    """Bytes of a pass's two inputs and its output."""
    elements = sum(math.prod(s) for s in problem.operand_shapes(pass_))
    return elements * np.dtype(dtype).itemsize


# --- traces ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    """One mark of a trace, relative to where the trace began: the bytes allocated at the mark,
    and the most allocated at any moment since the previous mark."""

    allocated: int
    peak: int


class Trace:
    """A context manager reading one allocator: `mark()` records a `Point`; leaving the block
    records a last one. The points are complete once the block is left."""

    method: str

    def __init__(self) -> None:
        self.points: list[Point] = []

    def __enter__(self):
        self._start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def mark(self) -> None:
        raise NotImplementedError

    def _start(self) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError


class Tracemalloc(Trace):
    """NumPy's (and Python's) allocations. An outer tracemalloc session is left running."""

    method = "tracemalloc"

    def _start(self) -> None:
        self._owner = not tracemalloc.is_tracing()
        if self._owner:
            tracemalloc.start()
        tracemalloc.reset_peak()
        self._base = tracemalloc.get_traced_memory()[0]

    def mark(self) -> None:
        current, peak = tracemalloc.get_traced_memory()
        self.points.append(Point(current - self._base, peak - self._base))
        tracemalloc.reset_peak()

    def _stop(self) -> None:
        self.mark()
        if self._owner:
            tracemalloc.stop()


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2: torch's profiler writes a `USDT ... profiler_start` line
    there from C++ each time it starts and stops, one pair per results row otherwise."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class TorchHostAllocator(Trace):
    """torch's CPU allocator, from the autograd profiler's `[memory]` events (one per
    allocation and free, signed sizes) and marks recorded as profiler events on the same clock;
    the points are computed from the ordered events when the trace ends. A block freed in the
    trace but allocated before it is not reported by the profiler, so it never goes negative."""

    method = "torch-profiler"
    _MARK = "convbench.measure.memory.mark"

    def _start(self) -> None:
        from torch.autograd import profiler

        self._profile = profiler.profile(use_kineto=False, profile_memory=True)
        with _quiet_stderr():
            self._profile.__enter__()

    def mark(self) -> None:
        from torch.autograd import profiler

        with profiler.record_function(self._MARK):
            pass

    def _stop(self) -> None:
        self.mark()
        with _quiet_stderr():
            self._profile.__exit__(None, None, None)
        events = sorted((e.start_ns(), e.name() == self._MARK, e.nbytes())
                        for e in self._profile.kineto_results.events()
                        if e.name() in ("[memory]", self._MARK))
        allocated = peak = 0
        for _, is_mark, nbytes in events:
            if is_mark:
                self.points.append(Point(allocated, peak))
                peak = allocated
            else:
                allocated += nbytes
                peak = max(peak, allocated)


def release_device_memory(backend: str, collect: bool = True) -> None:
    """On the GPU: drop what implementations cache there (`registry.clear_device_caches`),
    collect garbage where `collect` (a guard: a reference cycle would keep a finished case's
    arrays, which no pool can give back while they are alive; the runner asks once per group,
    since a collection over torch's and pandas' objects costs tens of milliseconds a case), and
    return both pools' free blocks to the device, so the next case starts from an empty device
    whichever allocator it uses. Nothing on the host."""
    if backend != "cuda":
        return
    import gc

    import cupy

    registry.clear_device_caches()
    if collect:
        gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()
    torch = _torch_cuda()
    if torch is not None:
        torch.cuda.empty_cache()


def _torch_cuda():
    """torch, if it is imported and has made a CUDA context (else it has allocated nothing)."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.cuda.is_initialized() else None


class CudaPools(Trace):
    """CuPy's default memory pool and torch's caching allocator on the current GPU.

    The pool's peak between marks: the largest used-bytes figure seen right after a malloc (a
    CuPy MemoryHook, registered on this thread, where the kernels are launched). torch's: its
    own peak statistic, reset at every mark. Between two marks the two peaks are added: exact
    when one allocator is in use (CuPy kernels or cuDNN), an upper bound otherwise.
    """

    method = "cupy-pool+torch-cuda"

    def _start(self) -> None:
        import cupy
        from cupy.cuda import memory_hook

        pool = cupy.get_default_memory_pool()

        class PeakHook(memory_hook.MemoryHook):
            name = "convbench-peak"

            def malloc_postprocess(self, **kwargs):
                self.peak = max(self.peak, pool.used_bytes())

        self._pool, self._hook = pool, PeakHook()
        self._hook.peak = pool.used_bytes()
        self._hook.__enter__()
        torch = _torch_cuda()
        if torch is not None:
            torch.cuda.reset_peak_memory_stats()
        self._base = pool.used_bytes() + (torch.cuda.memory_allocated() if torch else 0)

    def mark(self) -> None:
        used = self._pool.used_bytes()
        allocated, peak = used, max(self._hook.peak, used)
        self._hook.peak = used
        torch = _torch_cuda()
        if torch is not None:
            allocated += torch.cuda.memory_allocated()
            peak += torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        self.points.append(Point(allocated - self._base, peak - self._base))

    def _stop(self) -> None:
        self.mark()
        self._hook.__exit__(None, None, None)


class Sum(Trace):
    """Several allocators that never see each other's blocks, read together: allocated bytes
    add up exactly, peaks between marks add up to an upper bound. Started in order, stopped in
    reverse, so a trace started first does not count the others' bookkeeping."""

    def __init__(self, *traces: Trace):
        super().__init__()
        self.traces = traces
        self.method = "+".join(t.method for t in traces)

    def _start(self) -> None:
        for t in self.traces:
            t._start()

    def mark(self) -> None:
        for t in self.traces:
            t.mark()

    def _stop(self) -> None:
        for t in reversed(self.traces):
            t._stop()
        self.points = [Point(sum(p.allocated for p in ps), sum(p.peak for p in ps))
                       for ps in zip(*(t.points for t in self.traces))]


def trace(backend: str) -> Trace:
    """The trace of the allocators a backend's passes use."""
    return CudaPools() if backend == "cuda" else Sum(TorchHostAllocator(), Tracemalloc())


def pass_peak(points: list[Point], result_bytes: int = 0) -> int:
    """Peak bytes of a pass from a trace marked once, after `prepare`: the buffers the prepared
    pass holds, or the most allocated during its call if more. `result_bytes`: the result a
    library allocates itself (torch's convolution) before it is copied into the harness's output,
    left out as our kernels' output is (they write into the output they are given): otherwise a
    cuDNN or torch-cpu row would count one output's size as workspace."""
    prepared, called = points[0], points[-1]
    return max(0, prepared.allocated, called.peak - result_bytes)


# --- limits ---------------------------------------------------------------------------------
class OverLimit(MemoryError):
    """A footprint beyond a `MemoryLimit`: recorded as `oom`, like a failed allocation."""


def capacity(backend: str) -> int:
    """The memory a step on `backend` may use by default: the GPU's, or what the host has
    available now."""
    if backend == "cuda":
        import cupy

        return cupy.cuda.Device().mem_info[1]
    return available_host_bytes()


def total_bytes(backend: str) -> int:
    """All the memory `backend` has, free or not: the GPU's, or the host's physical memory. A
    pass whose operands alone need more can never run there."""
    if backend == "cuda":
        import cupy

        return cupy.cuda.Device().mem_info[1]
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def free_bytes(backend: str) -> int:
    """The memory `backend` has free now: the GPU's free memory, or the host's available."""
    if backend == "cuda":
        import cupy

        return cupy.cuda.Device().mem_info[0]
    return available_host_bytes()


def available_host_bytes() -> int:
    """Memory the kernel says a new allocation could get without swapping (MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class MemoryLimit:
    """The most a pass may allocate, its operands included."""

    nbytes: int

    def check(self, backend: str, needed: int, what: str) -> None:
        """Raise OverLimit if `needed` bytes exceed the limit; `what` says what they are. On the
        GPU each pool also refuses beyond the limit (`enforce`), but each alone: this check of
        what the two were seen to hold together is what keeps their sum within it."""
        if needed > self.nbytes:
            raise OverLimit(f"{what} {format_size(needed)} exceeds the memory limit "
                            f"{format_size(self.nbytes)}")

    @contextlib.contextmanager
    def enforce(self, backend: str):
        """On the GPU: CuPy's pool limit and torch's per-process fraction set to the limit for
        the block (each allocator separately), then restored."""
        if backend != "cuda":
            yield
            return
        import cupy

        pool = cupy.get_default_memory_pool()
        before = pool.get_limit()
        pool.set_limit(size=self.nbytes)
        torch = _torch_with_cuda()
        if torch is not None:
            # Readable from torch 2.6 on; before, nothing set it but us, and its default is 1.
            get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
            fraction = get() if get else 1.0
            total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.nbytes / total))
        try:
            yield
        finally:
            pool.set_limit(size=before)
            if torch is not None:
                torch.cuda.set_per_process_memory_fraction(fraction)


def _torch_with_cuda():
    """torch, when it is installed with a usable CUDA device."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None
