"""Which implementations exist: one per (algo, backend), found by `@register`.

An implementation is a class with

- ``precisions``: the precisions it runs (`fp64`, `fp32`, ...);
- ``supports(problem, pass_, layout, precision) -> str | None``: None, or a one-line reason why
  it cannot run this combination (never an exception: the runner records the reason);
- ``prepare(problem, pass_, layout, precision) -> Callable[[a, b, out], None]``: everything that
  must not be timed (plans, compilation, workspace allocation) happens here; the returned callable
  runs one pass, reading the two inputs and writing every element of the preallocated ``out``.
  Operands follow `ConvProblem.operand_shapes(pass_, layout)`; arrays are NumPy for the `numpy`
  and `emu` backends, CuPy for `cuda` (cuDNN wraps them as torch tensors, without a copy).
- optionally ``available() -> str | None``: None when its own needs (beyond the backend) are met
  here, else why not (`impl_available` checks the backend first);
- optionally ``describe(problem, pass_, layout, precision) -> str``: a note for the results row
  (e.g. which FFT library or which cuDNN kernel ran);
- optionally ``workspace_bytes(problem, pass_, layout, precision) -> int``: the bytes it
  allocates beyond inputs and outputs (`opcount.workspace_bytes` falls back to theory without it);
- optionally ``phases(...) -> list[str]`` and a ``phase_fns`` attribute on the prepared callable:
  the per-phase breakdown, whose contract is in `convbench.phases`;
- FFT implementations also give ``transform_grid(problem, pass_) -> (height, width, tiles)``,
  the grid they transform on, which `opcount` counts.

Modules under `convbench.algos` register themselves on import; `load()` imports them all, so a
new algorithm is one new file, with no list to edit.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

from .problem import LAYOUTS, PASSES, PRECISIONS, ConvProblem, check_choice

ALGOS = ("direct", "gemm", "gemm-cublas", "fft", "fft-tiled", "winograd-2x2", "winograd-4x4",
         "winograd-fused-2x2", "winograd-fused-4x4", "cudnn", "cudnn-autotune", "torch-cpu")
BACKENDS = ("numpy", "cuda", "emu")
#: What `winograd` and `all` mean on the command line.
ALIASES = {"winograd": ("winograd-2x2", "winograd-4x4"),
           "winograd-fused": ("winograd-fused-2x2", "winograd-fused-4x4")}

_IMPLS: dict[tuple[str, str], object] = {}
_loaded = False


def register(algo: str, backend: str) -> Callable[[type], type]:
    """Class decorator: instantiate the class and file it under (algo, backend)."""
    check_choice("algo", algo, ALGOS)
    check_choice("backend", backend, BACKENDS)

    def deco(cls: type) -> type:
        key = (algo, backend)
        if key in _IMPLS:
            raise RuntimeError(f"{algo} on {backend} registered twice")
        inst = cls()
        inst.algo, inst.backend = algo, backend
        _IMPLS[key] = inst
        return cls

    return deco


def load() -> None:
    """Import every module of `convbench.algos` once, so each registers itself."""
    global _loaded
    if _loaded:
        return
    from . import algos

    for mod in sorted(pkgutil.iter_modules(algos.__path__), key=lambda m: m.name):
        importlib.import_module(f"{algos.__name__}.{mod.name}")
    _loaded = True


def get(algo: str, backend: str):
    """The implementation of `algo` on `backend`; ValueError naming what exists if none."""
    load()
    check_choice("algo", algo, ALGOS)
    check_choice("backend", backend, BACKENDS)
    impl = _IMPLS.get((algo, backend))
    if impl is None:
        have = ", ".join(sorted(a for a, b in _IMPLS if b == backend)) or "none"
        raise ValueError(f"algo {algo!r} has no {backend} implementation; {backend} has: {have}")
    return impl


def implementations(backend: str | None = None) -> list:
    """Registered implementations, in ALGOS order, optionally of one backend."""
    load()
    order = {a: i for i, a in enumerate(ALGOS)}
    keys = sorted(_IMPLS, key=lambda k: (order[k[0]], BACKENDS.index(k[1])))
    return [_IMPLS[k] for k in keys if backend is None or k[1] == backend]


def algos_for(backend: str) -> list[str]:
    return [impl.algo for impl in implementations(backend)]


def expand_algos(text: str, backend: str) -> list[str]:
    """`direct,winograd` -> ['direct', 'winograd-2x2', 'winograd-4x4']; `all` -> every algo the
    backend has. Unknown names raise ValueError naming the valid ones."""
    have = algos_for(backend)
    out: list[str] = []
    for name in (t.strip() for t in text.split(",")):
        if not name:
            continue
        names = have if name == "all" else ALIASES.get(name, (name,))
        for a in names:
            check_choice("algo", a, list(ALGOS) + list(ALIASES) + ["all"])
            if a not in have:
                raise ValueError(f"algo {a!r} is not available on {backend}; "
                                 f"valid: {', '.join(have)}")
            if a not in out:
                out.append(a)
    if not out:
        raise ValueError(f"no algo given; valid: {', '.join(have)}")
    return out


def available(backend: str) -> str | None:
    """None if `backend` can run on this machine, else the reason (no GPU, no compiler)."""
    check_choice("backend", backend, BACKENDS)
    if backend == "emu":
        import shutil

        return None if shutil.which("g++") else "the emu backend needs g++ on PATH"
    if backend == "cuda":
        return _cuda_available()
    return None


def _cuda_available() -> str | None:
    try:
        import cupy
    except ImportError:
        return "the cuda backend needs CuPy: pip install 'convbench[cuda]'"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001  (no driver, no device: CuPy's own runtime errors)
        return f"no CUDA GPU: {str(exc).splitlines()[0]}"
    return None if count > 0 else "no CUDA GPU found"


def impl_available(impl) -> str | None:
    """None if this implementation can run here: its backend, then its own needs."""
    reason = available(impl.backend)
    if reason is None and hasattr(impl, "available"):
        reason = impl.available()
    return reason


def supports(impl, problem: ConvProblem, pass_: str, layout: str, precision: str) -> str | None:
    """None if `impl` runs this combination, else a one-line reason."""
    check_choice("pass", pass_, PASSES)
    check_choice("layout", layout, LAYOUTS)
    check_choice("precision", precision, PRECISIONS)
    if precision not in impl.precisions:
        return f"{impl.algo} on {impl.backend} runs {'/'.join(impl.precisions)}, not {precision}"
    return impl.supports(problem, pass_, layout, precision)
