"""The only reader of kernels/: loads CUDA sources for both backends and launches them. The
compile gate is `cuda.gate`; the wrappers' base, `KernelImplementation`, is in
`algos.kernel_base`.

A wrapper module (`convbench/algos/<algo>_kernels.py`) declares at import every set of ``-D``
defines it compiles a file with (``kernels.declare("direct", [{"NHWC": 0, "TILE_H": 8}])``): the
declarations are the compile gate's work list, and `launcher` refuses a configuration not
declared, so nothing runs that the gate has not compiled. ``launcher(backend, name, defines)``
compiles once per (file, defines, arch) — NVRTC through a `cupy.RawModule` on `cuda`, g++ and the
host emulator (`convbench.cuda.emu`) on `emu` — and ``launch.kernel(entry)(grid, block, args,
shared_mem=0)`` is the same call on both, so a wrapper is written once (``launch.xp``: CuPy or
NumPy, for workspaces). Arguments are checked against the entry point's parameters, parsed from
the source: C-contiguous ``xp`` arrays of the pointee's dtype; scalars converted to the
parameter's C type (CuPy would pass a Python int as 64 bits to an ``int``). `load` compiles any
file, declared or not, for tests and experiments.

Kernel sources follow rules, so that NVRTC, g++ and the parameter parser agree: entry points
are ``extern "C" __global__ void name(...)`` (``__launch_bounds__`` allowed), not templates, not
inside ``#if``, no macros in the parameter list; tile sizes are ``-D`` defines, checked in the
source (``#error``/``static_assert``); ``#include "x.cuh"`` is inlined here once, with ``#line``
markers, so the text compiled, cached and hashed is self-contained; no inline PTX, and warp
intrinsics only where `convbench/cuda/emu/cuda_emu.h` emulates them. Adding a kernel file:
docs/pages/cuda.md, Writing a kernel. Sources come from the repository's kernels/ (the editable
install), or from convbench/_kernels/ in a wheel (setup.py copies them there).
"""

from __future__ import annotations

import functools
import numbers
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..core.fmt import first_line
from ..core.problem import check_choice
from ..machine import backends
from . import emu

#: Options of every compilation, on the GPU and in the gate.
COMPILE_OPTIONS = ("-std=c++17",)
#: Dynamic shared memory a launch gets without opting in (above it, `cuda` sets the attribute).
DEFAULT_DYNAMIC_SHARED = 48 * 1024

#: A normalized set of defines: sorted (name, value) pairs.
Defines = tuple[tuple[str, str], ...]


# --- sources ------------------------------------------------------------------------------------
def kernel_dir() -> Path:
    """Where the .cu files are: convbench/_kernels in a wheel, else the repository's kernels/."""
    package = Path(__file__).resolve().parents[1]
    shipped = package / "_kernels"
    return shipped if shipped.is_dir() else package.parent / "kernels"


_INCLUDE = re.compile(r'[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*')


def read_source(path: Path) -> str:
    """The text of a .cu file with its quoted includes inlined, each once, under #line markers."""
    return _expand(Path(path), set())


def _expand(path: Path, seen: set[Path]) -> str:
    lines = [f'#line 1 "{path.name}"']
    for number, line in enumerate(path.read_text().splitlines(), 1):
        m = _INCLUDE.fullmatch(line)
        if not m:
            lines.append(line)
            continue
        target = next((d / m.group(1) for d in (path.parent, kernel_dir())
                       if (d / m.group(1)).is_file()), None)
        if target is None:
            raise FileNotFoundError(f"{path.name}:{number}: {m.group(1)} is neither in "
                                    f"{path.parent} nor in {kernel_dir()}")
        if target.resolve() not in seen:
            seen.add(target.resolve())
            lines.append(_expand(target, seen))
        lines.append(f'#line {number + 1} "{path.name}"')
    return "\n".join(lines) + "\n"


# --- entry points -------------------------------------------------------------------------------
class Param(NamedTuple):
    """One parameter of an entry point."""

    decl: str  #: as written, e.g. ``const float* __restrict__ x``
    name: str
    pointer: bool
    #: a pointer's accepted array dtypes (empty: any), or a scalar's one dtype
    dtypes: tuple[np.dtype, ...]


_SCALARS = {"float": "float32", "double": "float64", "int": "int32", "unsigned": "uint32",
            "unsigned int": "uint32", "long long": "int64", "unsigned long long": "uint64",
            "size_t": "uint64", "int32_t": "int32", "uint32_t": "uint32", "int64_t": "int64",
            "uint64_t": "uint64", "bool": "bool"}
_POINTEES = {**{c: (d,) for c, d in _SCALARS.items()}, "float2": ("float32", "complex64"),
             "float4": ("float32",), "double2": ("float64", "complex128"), "void": (),
             "char": (), "unsigned char": ()}
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict"}
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_BOUNDS = r"(?:__launch_bounds__\s*\([^)]*\)\s*)?"
_ENTRY = re.compile(rf'extern\s+"C"\s+__global__\s+{_BOUNDS}void\s+{_BOUNDS}(\w+)\s*\(([^)]*)\)')


def entry_points(code: str) -> dict[str, tuple[Param, ...]]:
    """Every ``extern "C" __global__`` function of a source, with its parameters."""
    entries = {}
    for m in _ENTRY.finditer(_COMMENT.sub(" ", code)):
        text = " ".join(m.group(2).split())
        decls = [] if text in ("", "void") else [d.strip() for d in text.split(",")]
        entries[m.group(1)] = tuple(_param(m.group(1), d) for d in decls)
    return entries


def _param(kernel: str, decl: str) -> Param:
    m = re.fullmatch(r"(.+?)\s*\b(\w+)", decl)
    ctype = m.group(1) if m else ""
    base = " ".join(w for w in ctype.replace("*", " ").split() if w not in _QUALIFIERS)
    pointer = ctype.count("*") == 1
    dtypes = _POINTEES.get(base) if pointer else (_SCALARS.get(base),)
    if ctype.count("*") > 1 or dtypes is None or None in dtypes:
        raise ValueError(f"kernel {kernel}: cannot pass parameter {decl!r}; launchers pass "
                         f"pointers to and scalars of {', '.join(_SCALARS)}")
    return Param(decl, m.group(2), pointer, tuple(map(np.dtype, dtypes)))


def _convert(kernel: str, param: Param, value, xp):
    """`value` checked against `param`: the array itself, or the scalar as its C type."""
    where = f"{kernel}: argument {param.name}"
    if param.pointer:
        if not isinstance(value, xp.ndarray):
            raise TypeError(f"{where} must be a {xp.__name__} array, got {type(value).__name__}")
        if param.dtypes and value.dtype not in param.dtypes:
            raise TypeError(f"{where} ({param.decl}) must be "
                            f"{' or '.join(map(str, param.dtypes))}, got {value.dtype}")
        if not value.flags.c_contiguous:
            raise ValueError(f"{where} must be C-contiguous")
        return value
    dtype = param.dtypes[0]
    if not isinstance(value, numbers.Integral if dtype.kind in "biu" else numbers.Real):
        raise TypeError(f"{where} ({param.decl}) got {value!r}")
    if dtype.kind in "biu":
        value, info = int(value), np.iinfo(dtype)  # a NumPy integer would wrap, not raise
        if not info.min <= value <= info.max:
            raise OverflowError(f"{where} ({param.decl}) got {value}, outside {dtype}")
    return dtype.type(value)


def _dim3(value) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, numbers.Integral) else tuple(value)
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"grid and block dimensions have 1 to 3 entries, got {value!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


class Kernel:
    """One entry point of a loaded file: ``kernel(grid, block, args, shared_mem=0)``.

    `grid` and `block` are ints or 1-3 tuples; `args` follow the entry point's parameters.
    Converting and checking them costs tens of microseconds a launch (a NumPy scalar and a range
    check per int), which a timed pass of a few hundred microseconds must not pay: `bind` does
    it once, in `prepare`, for everything but the arrays.
    """

    def __init__(self, name: str, params: tuple[Param, ...], xp, launch: Callable):
        self.name, self.params, self._xp, self._launch = name, params, xp, launch

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        if len(args) != len(self.params):
            raise TypeError(f"{self.name} takes {len(self.params)} arguments "
                            f"({', '.join(p.name for p in self.params)}), got {len(args)}")
        values = tuple(_convert(self.name, p, a, self._xp) for p, a in zip(self.params, args))
        self._launch(_dim3(grid), _dim3(block), values, int(shared_mem))

    def bind(self, grid, block, scalars=(), shared_mem: int = 0) -> Callable[..., None]:
        """``launch(*arrays)``: this kernel with its grid, block, shared memory and trailing
        scalar parameters converted now; each call checks only the arrays, which are the
        leading parameters (the kernels' convention; TypeError otherwise)."""
        arrays = self.params[:len(self.params) - len(scalars)]
        if not all(p.pointer for p in arrays) or any(
                p.pointer for p in self.params[len(arrays):]):
            raise TypeError(f"{self.name}: bind takes the trailing scalars "
                            f"({', '.join(p.name for p in self.params if not p.pointer)}), "
                            f"got {len(scalars)} values")
        fixed = tuple(_convert(self.name, p, v, self._xp)
                      for p, v in zip(self.params[len(arrays):], scalars))
        dims, threads, smem = _dim3(grid), _dim3(block), int(shared_mem)
        name, xp, launch = self.name, self._xp, self._launch

        def bound(*values) -> None:
            if len(values) != len(arrays):
                raise TypeError(f"{name} takes {len(arrays)} arrays "
                                f"({', '.join(p.name for p in arrays)}), got {len(values)}")
            launch(dims, threads, tuple(_convert(name, p, v, xp)
                                        for p, v in zip(arrays, values)) + fixed, smem)

        return bound


class Launcher:
    """A kernel file compiled with one set of defines for one backend."""

    def __init__(self, backend: str, path: Path, defines: Defines, xp,
                 entries: dict[str, tuple[Param, ...]], function: Callable[[str], Callable]):
        self.backend, self.path, self.defines, self.xp = backend, path, defines, xp
        self.entries, self._function = entries, function
        self._kernels: dict[str, Kernel] = {}

    def kernel(self, name: str) -> Kernel:
        if name not in self.entries:
            raise ValueError(f"{self.path.name} has no entry point {name!r}; it has "
                             f"{', '.join(self.entries) or 'none'}")
        if name not in self._kernels:
            self._kernels[name] = Kernel(name, self.entries[name], self.xp, self._function(name))
        return self._kernels[name]


# --- configurations and loading -----------------------------------------------------------------
_DECLARED: dict[str, list[Defines]] = {}


def normalize_defines(defines: Mapping[str, object] | None) -> Defines:
    """`{"NHWC": 1}` as the sorted (name, text) pairs configurations are compared and keyed by."""
    out = []
    for key, value in sorted((defines or {}).items()):
        if not re.fullmatch(r"[A-Za-z_]\w*", str(key)) or isinstance(value, bool):
            raise ValueError(f"bad define {key}={value!r}: a C identifier and an int or string")
        out.append((str(key), str(value)))
    return tuple(out)


def define_options(defines: Defines) -> tuple[str, ...]:
    """The ``-DNAME=VALUE`` options of a set of defines, for NVRTC and g++ alike."""
    return tuple(f"-D{k}={v}" for k, v in defines)


def declare(name: str, configurations: Iterable[Mapping[str, object]]) -> None:
    """Declare the define sets `kernels/<name>.cu` is launched with (call at import time)."""
    known = _DECLARED.setdefault(name, [])
    for defines in map(normalize_defines, configurations):
        if defines not in known:
            known.append(defines)


def declared() -> dict[str, list[Defines]]:
    """Every declaration so far (file name -> define sets): the algorithm modules declare at
    import, so the whole list is there once they are imported (`registry.load`)."""
    return {name: list(sets) for name, sets in _DECLARED.items()}


def nvrtc_available() -> str | None:
    """None if CuPy's NVRTC loads here (no GPU needed), else why not."""
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except (ImportError, OSError, RuntimeError) as exc:  # no CuPy, no libnvrtc
        return f"CuPy cannot load NVRTC: {first_line(exc)}"
    return None


def available(backend: str) -> str | None:
    """None if kernels compile and launch on `backend` here, else why not."""
    reason = backends.available(backend)
    return reason or (nvrtc_available() if backend == "cuda" else None)


def launcher(backend: str, name: str, defines: Mapping[str, object] | None = None) -> Launcher:
    """`kernels/<name>.cu` compiled with a declared set of defines, for `backend`."""
    normalized = normalize_defines(defines)
    if normalized not in _DECLARED.get(name, []):
        raise ValueError(f"{name}.cu with {dict(normalized)} is not declared: add it to "
                         f"kernels.declare({name!r}, ...) so the compile gate covers it")
    return load(backend, kernel_dir() / f"{name}.cu", defines)


def load(backend: str, path: Path, defines: Mapping[str, object] | None = None) -> Launcher:
    """Any .cu file (tests, experiments) compiled with `defines` for `backend`; memoized."""
    check_choice("backend", backend, ("cuda", "emu"))
    arch = None
    if backend == "cuda":
        import cupy

        arch = cupy.cuda.Device().compute_capability
    return _load(backend, Path(path).resolve(), normalize_defines(defines), arch)


@functools.cache
def _load(backend: str, path: Path, defines: Defines, arch: str | None) -> Launcher:
    code = read_source(path)
    entries = entry_points(code)
    if backend == "emu":
        module = emu.load(code, entries, define_options(defines))
        return Launcher(backend, path, defines, np, entries, module.function)
    import cupy

    module = cupy.RawModule(code=code, options=COMPILE_OPTIONS + define_options(defines))
    return Launcher(backend, path, defines, cupy, entries,
                    lambda name: _cuda_function(module.get_function(name)))


def _cuda_function(fn) -> Callable:
    def launch(grid, block, args, shared_mem):
        # Above 48 KiB a kernel must opt in; the attribute is read only then (a driver call).
        if (shared_mem > DEFAULT_DYNAMIC_SHARED
                and shared_mem > fn.max_dynamic_shared_size_bytes):
            fn.max_dynamic_shared_size_bytes = shared_mem
        fn(grid, block, args, shared_mem=shared_mem)

    return launch


# --- the timer's head start -----------------------------------------------------------------------
declare("timing", [{}])


def head_start(backend: str = "cuda") -> Callable[[float], None]:
    """``start(ms)``: queue a one-thread kernel that keeps the GPU busy for about `ms` (at the
    GPU's base SM clock; longer if it runs slower), so the host can issue what follows before the
    GPU reaches it (`timing`'s GPU rounds). On `emu`, `ms` of the host's clock."""
    spin = launcher(backend, "timing").kernel("spin")
    if backend == "cuda":
        import cupy

        cycles_per_ms = cupy.cuda.Device().attributes["ClockRate"]  # kHz
    else:
        cycles_per_ms = 1e6  # the emulator's clock64 counts ns
    launch = {}

    def start(ms: float) -> None:
        cycles = max(1, int(ms * cycles_per_ms))
        if cycles not in launch:
            launch.clear()  # one size at a time: a slack rarely changes
            launch[cycles] = spin.bind(1, 1, (cycles,))
        launch[cycles]()

    return start

