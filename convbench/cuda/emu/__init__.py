"""The `emu` backend: the CUDA sources of kernels/ run on the CPU, so CI checks their numerics.

Why
    CI has no GPU. The compile gate (`convbench.cuda.kernels`) proves every kernel compiles without
    spills; the emulator proves it computes the right thing: the same .cu text, compiled by
    g++, is checked against the float64 reference on small problems on every commit. It is slow
    (each CUDA thread is a fiber) and meant for small problems only (`too_big`).

How a kernel runs here
    1. `build.translate` adds a C launcher per ``extern "C" __global__`` entry point and points
       ``extern __shared__`` arrays at the one dynamic shared buffer; g++ compiles it with
       `cuda_emu.h` force-included (``-include``), which defines the CUDA built-ins as host C++.
       The library is cached on disk (`build.cache_dir`, ``$CONVBENCH_EMU_CACHE``).
    2. A launch runs the blocks of the grid one after another. The threads of a block are
       cooperative fibers (ucontext, 128 KiB stack each, guard page below), switched only at
       ``__syncthreads()``: the scheduler runs each fiber up to its next barrier or its exit,
       then releases them all. Threads therefore interleave exactly at barriers, and only
       there: a kernel missing a barrier reads shared memory its neighbours have not written
       yet. All shared memory, static and dynamic, is filled with 0xFF bytes (NaN) before each
       block, so such a read poisons the result and the reference check fails.
    3. Faults the scheduler can see raise `EmuError`: a divergent barrier (some threads wait at
       ``__syncthreads()`` while others have exited), an invalid launch configuration, too
       much dynamic shared memory. Faults it cannot see are real host faults: an out-of-bounds
       global access may corrupt memory or kill the process, as it may on the GPU.
    4. Atomics are plain read-modify-writes (fibers never preempt one another); ``__ldg`` is a
       load; math functions are the host's libm. Warp intrinsics are not emulated: write kernels
       without them, or add them to `cuda_emu.h` with warp-wide barrier semantics.

Kernels reach the emulator only through `convbench.cuda.kernels.launcher("emu", ...)`, which gives
the same ``kernel(grid, block, args, shared_mem)`` call as on `cuda`, with NumPy arrays.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np

from .build import EmuBuildError, build_library, cache_dir

__all__ = ["MAX_MACS", "EmuBuildError", "EmuError", "Module", "cache_dir", "load", "too_big"]

#: The most multiply-accumulates a wrapper should hand the emulator (a few seconds' work).
MAX_MACS = 20_000_000

# The scheduler keeps its state (fibers, shared memory) in globals: one launch at a time.
_LOCK = threading.Lock()


class EmuError(RuntimeError):
    """The emulator refused a launch or caught a fault in the kernel (e.g. divergent barrier)."""


def too_big(macs: int) -> str | None:
    """None if a problem of `macs` multiply-accumulates suits the emulator, else the reason."""
    if macs <= MAX_MACS:
        return None
    return f"{macs:,} MACs is too much for the emulator (at most {MAX_MACS:,}); run it on cuda"


class Module:
    """A built library: `function(name)` is entry point `name` as a launch callable."""

    def __init__(self, path: Path, entries: Mapping[str, Iterable]):
        self._lib = ctypes.CDLL(str(path))
        self._lib.emu_error.restype = ctypes.c_char_p
        self._entries = {name: list(params) for name, params in entries.items()}

    def function(self, name: str) -> Callable:
        """``launch(grid, block, args, shared_mem)``: grid and block are 3-tuples; `args` are
        C-contiguous NumPy arrays for pointers and NumPy scalars of the parameters' types."""
        params = self._entries[name]
        fn = getattr(self._lib, f"emu_launch_{name}")
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.c_size_t] + [
            ctypes.c_void_p if p.pointer else np.ctypeslib.as_ctypes_type(p.dtypes[0])
            for p in params]

        def launch(grid, block, args, shared_mem):
            dims = (ctypes.c_uint * 6)(*grid, *block)
            values = [a.ctypes.data if p.pointer else a for p, a in zip(params, args)]
            with _LOCK:
                if fn(dims, shared_mem, *values):
                    raise EmuError(f"{name}: {self._lib.emu_error().decode()}")

        return launch


def load(code: str, entries: Mapping[str, Iterable], defines: tuple[str, ...] = ()) -> Module:
    """Build (or find in the cache) and load `code` compiled with `defines` (``-D`` options).

    `entries` maps entry points to their parameters (`convbench.cuda.kernels.entry_points`)."""
    return Module(build_library(code, entries, defines), entries)
