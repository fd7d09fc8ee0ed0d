"""The `emu` backend: the CUDA sources of kernels/ run on the CPU, so CI checks their numerics.

CI has no GPU: the compile gate (`convbench.cuda.gate`) proves every kernel compiles without
spills, the emulator that it computes the right thing — the same .cu text, compiled by g++ with
`cuda_emu.h` force-included (the CUDA built-ins as host C++; `build.translate` adds a C launcher
per entry point; the library cached in `build.cache_dir`, ``$CONVBENCH_EMU_CACHE``), checked
against the float64 reference on small problems (`too_big`: each CUDA thread is a fiber, slow).

A launch runs the grid's blocks one after another, a block's threads as cooperative fibers
(ucontext, 128 KiB stacks, a guard page) switched only at ``__syncthreads()``, so threads
interleave exactly at barriers; shared memory is filled with NaN bytes (0xFF) before each block,
so a missing barrier poisons the result and the check fails. A divergent barrier, a bad launch
configuration or too much shared memory raise `EmuError`; an out-of-bounds global access is a
real host fault, as on the GPU. Atomics are plain read-modify-writes (fibers never preempt),
``__ldg`` a load, math the host's libm; warp intrinsics are not emulated (add them to
`cuda_emu.h` with warp-wide barrier semantics, or write kernels without them).

Kernels reach it only through `convbench.cuda.kernels.launcher("emu", ...)`: the same
``kernel(grid, block, args, shared_mem)`` call as on `cuda`, with NumPy arrays.
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
