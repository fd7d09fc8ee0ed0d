"""What a run ran on: the facts that make a results folder comparable to another (env.json).

A time means nothing without the device, the library versions and the thread counts behind it;
this module gathers them once per run. Everything optional is probed, never required: a missing
library is recorded as absent, not an error.
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import platform
import re
import subprocess
from pathlib import Path

from .. import __version__
from ..machine import backends, nvml
from ..machine.host import cpu_model
from ..machine.threads import numpy_blas_pool


def _version(module: str) -> str | None:
    try:
        mod = __import__(module)
    except ImportError:
        return None
    return getattr(mod, "__version__", "unknown")


def gpu_name() -> str | None:
    """The current CUDA device's name, or None where the cuda backend cannot run."""
    if backends.available("cuda"):
        return None
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else name


def device_slug(backend: str) -> str:
    """The device part of a run folder's name: `cpu-2core`, `nvidia-h200`, `emu`."""
    if backend == "cuda":
        name = gpu_name() or "gpu"
        return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if backend == "emu":
        return "emu"
    return f"cpu-{os.cpu_count()}core"


def _blas() -> dict:
    """NumPy's BLAS as its build reports it, with its thread count when threadpoolctl is there."""
    import numpy as np

    info: dict = {}
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info = {k: blas.get(k) for k in ("name", "version", "openblas configuration") if k in blas}
    except (TypeError, KeyError):  # older NumPy (no dict mode), or a build without BLAS
        pass
    if importlib.util.find_spec("threadpoolctl"):
        info["threads"] = numpy_blas_pool().get("num_threads")
    else:
        env = {v: os.environ[v] for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                          "MKL_NUM_THREADS") if v in os.environ}
        info["threads"] = env or f"library default (install threadpoolctl to read it; "\
                                 f"{os.cpu_count()} cores)"
    return info


def _torch() -> dict:
    try:
        import torch
    except ImportError:
        return {"version": None}
    from ..algos.cudnn import AUTOTUNE_BENCHMARK_LIMIT

    info = {"version": torch.__version__, "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
            "mkldnn": torch.backends.mkldnn.is_available(),
            # cudnn-autotune's search: 0 = every engine; torch's own default besides it
            "cudnn_benchmark_limit": {"cudnn-autotune": AUTOTUNE_BENCHMARK_LIMIT,
                                      "torch default": torch.backends.cudnn.benchmark_limit}}
    if torch.cuda.is_available():
        info["cuda"] = torch.version.cuda
        info["cudnn"] = torch.backends.cudnn.version()
    return info


def _numba() -> dict:
    """Numba's version and threading layer (direct's depthwise kernels), None without it."""
    try:
        import numba
    except ImportError:
        return {"version": None}
    return {"version": numba.__version__, "threads": numba.config.NUMBA_NUM_THREADS,
            "threading_layer": numba.config.THREADING_LAYER}


def _pyfftw() -> dict:
    try:
        import pyfftw
    except ImportError:
        return {"version": None}
    return {"version": pyfftw.__version__, "threads": pyfftw.config.NUM_THREADS}


#: FP32 lanes (CUDA cores) per SM, by compute capability.
FP32_LANES = {"70": 64, "75": 64, "80": 64, "86": 128, "87": 128, "89": 128, "90": 128,
              "100": 128, "103": 128, "120": 128}


def fp32_peak_tflops(compute_capability: str, sm_count: int,
                     clock_khz: int | None) -> float | None:
    """The FP32 peak without tensor cores: SMs × FP32 lanes × 2 (a fused multiply-add) × the
    boost clock; None where the lanes or the clock are not known."""
    lanes = FP32_LANES.get(str(compute_capability))
    if not lanes or not clock_khz:
        return None
    return sm_count * lanes * 2 * clock_khz * 1e3 / 1e12


def _gpu() -> dict | None:
    if gpu_name() is None:
        return None
    import cupy

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    clock = dev.attributes.get("ClockRate") or props.get("clockRate")
    return {
        "name": gpu_name(),
        "compute_capability": dev.compute_capability,
        "memory_bytes": props["totalGlobalMem"],
        "sm_count": props["multiProcessorCount"],
        "l2_bytes": dev.attributes.get("L2CacheSize"),
        "clock_khz": clock,
        "fp32_peak_tflops": fp32_peak_tflops(dev.compute_capability,
                                             props["multiProcessorCount"], clock),
        "driver": cupy.cuda.runtime.driverGetVersion(),
        "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
    }


#: The variable that names the commit where the checkout has no `.git` (a GPU machine is
#: sent a copy of the working tree without it): the caller sets it.
COMMIT_VARIABLE = "CONVBENCH_COMMIT"


def git_commit() -> str | None:
    """What `COMMIT_VARIABLE` says, where the caller set it (a GPU machine's copy of the
    working tree may carry a stale `.git`, or none); else HEAD of the checkout convbench runs
    from, `+dirty` when it has uncommitted changes."""
    root = Path(__file__).resolve().parents[2]
    told = os.environ.get(COMMIT_VARIABLE) or None
    if told:
        return told
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], check=False, cwd=root, capture_output=True,
                              text=True, timeout=10)
        if head.returncode:
            return told
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               check=False, cwd=root, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return told
    return head.stdout.strip() + ("+dirty" if dirty.strip() else "")


def device_name(backend: str) -> str:
    """The device a run on `backend` measures: the GPU's name, or the CPU's model and cores."""
    gpu = gpu_name() if backend == "cuda" else None
    return gpu or f"{cpu_model()}, {os.cpu_count()} cores"


def collect(backend: str) -> dict:
    """env.json's contents for a run on `backend`."""
    gpu = _gpu() if backend == "cuda" else None
    device = device_name(backend)
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "convbench": __version__,
        "git_commit": git_commit(),
        "backend": backend,
        "device": device,
        "device_slug": device_slug(backend),
        "cpu": {"model": cpu_model(), "cores": os.cpu_count()},
        "gpu": gpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": {"version": _version("numpy"), "blas": _blas()},
        "torch": _torch(),
        "cupy": _version("cupy"),
        "pyfftw": _pyfftw(),
        "numba": _numba(),
        "nvml": nvml.snapshot() if backend == "cuda" else None,
    }
