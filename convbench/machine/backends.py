"""Backends (`numpy`, `cuda`, `emu`): where an implementation runs, and whether this machine
can run each. A machine fact, asked before any algorithm is loaded: the device defaults, the
kernel loader and the registry all ask it.
"""

from __future__ import annotations

from ..core.fmt import first_line
from ..core.problem import check_choice

BACKENDS = ("numpy", "cuda", "emu")


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
        return f"no CUDA GPU: {first_line(exc)}"
    return None if count > 0 else "no CUDA GPU found"
