"""OpenBLAS's core type, chosen by measurement: where `convbench machine --probe-openblas` found a
core type faster than the one OpenBLAS picks by itself (an AVX2 fallback on a CPU with AVX-512),
and it took, convbench sets `OPENBLAS_CORETYPE` to it before NumPy loads, in the command and the
worker processes it starts. OpenBLAS reads the variable once, when it loads, so this module
imports no NumPy.

The choice is kept in the cache folder (`cache_dir`) for this CPU and this NumPy (whose wheel
carries its OpenBLAS); another CPU or NumPy measures again. A core type the environment already
names is left as it is: machines set it where an older OpenBLAS crashes on its own choice.
"""

from __future__ import annotations

import json
import os
from importlib import metadata

from .host import cache_dir, cpu_model

ENV = "OPENBLAS_CORETYPE"
RECORD = "openblas-coretype.json"


def _key() -> dict[str, str | None]:
    """What a recorded choice holds for: the CPU model (/proc/cpuinfo) and NumPy's version."""
    try:
        numpy = metadata.version("numpy")
    except metadata.PackageNotFoundError:
        numpy = None
    return {"cpu": cpu_model(), "numpy": numpy}


def record(probe: dict) -> str | None:
    """Keep a probe's verdict (`ceilings.probe_openblas_coretype`'s result) for this CPU and
    NumPy; returns the core type convbench will set from now on, None where OpenBLAS's own
    choice is the fastest that took."""
    fastest = probe.get("fastest")
    current = probe.get("current")
    chosen = fastest if fastest and (current or "").lower() != fastest.lower() else None
    path = cache_dir() / RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**_key(), "coretype": chosen, "probe": probe}, indent=1))
    return chosen


def recorded() -> str | None:
    """The core type a probe on this CPU and NumPy found faster, if one was recorded."""
    try:
        data = json.loads((cache_dir() / RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or {k: data.get(k) for k in _key()} != _key():
        return None
    return data.get("coretype") or None


def apply() -> str | None:
    """Set `OPENBLAS_CORETYPE` to the recorded faster core type where the environment names
    none (call before NumPy loads); returns what was set."""
    if os.environ.get(ENV):
        return None
    chosen = recorded()
    if chosen:
        os.environ[ENV] = chosen
    return chosen
