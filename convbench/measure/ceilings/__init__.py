"""A device's ceilings, measured once per machine and library versions, and cached: the fastest
fp32 product it attains, its theoretical peak, its memory bandwidth beyond and within cache, and
on a GPU the clock that ran.

A row's rate means something only against what the device can do, and a row faster than the
device can go is a timing bug, never a win (docs/pages/design.md §5). Measuring takes seconds and
the figures change only with the machine or a library, so `measure` caches by CPU or GPU model,
cores, threads and library versions (the OpenBLAS core type included): a machine measures once
and a changed library measures again. A figure timed while other work took the cores is
reported as contended and not cached: a low ceiling would stand for the machine's until
refreshed.

The record is `ceilings.record`'s, the measurements `ceilings.cpu`'s and `ceilings.gpu`'s, the
guard and the roofline `roofline`'s; this module is their face (callers import `ceilings`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from ...machine.host import cache_dir
from ...machine.threads import available_cores
from ...machine.threads import count as thread_count
from . import cpu, gpu
from .cpu import cpu_model, gemm_rates, measure_cpu, probe_openblas_coretype
from .gpu import gpu_info, measure_gpu
from .record import SCHEMA, Ceilings, Product, from_env
from .roofline import MARGIN, bound, implausible, roofline_point

#: The measured-peak version a cached record must carry: records cached before the FMA peak was
#: measured lack it and are measured again (stored run records keep schema 1 and are read).
PEAK_VERSION = 1

__all__ = ["MARGIN", "SCHEMA", "Ceilings", "Product", "bound", "cache_dir", "cache_key",
           "cache_path", "fastest_gemm", "from_env", "implausible", "measure", "measure_cpu",
           "measure_gpu", "probe_openblas_coretype", "roofline_point"]


def _versions(device: str) -> dict[str, str | None]:
    """The library versions a ceiling of `device` (`cpu`, `cuda`) depends on."""
    return cpu.versions() if device == "cpu" else gpu.versions()


def _device(device: str) -> str:
    """`cpu` for the host's names (`cpu`, `numpy`, `emu`: emulated kernels run on the host)."""
    if device in ("cpu", "numpy", "emu"):
        return "cpu"
    if device.startswith("cuda"):
        return "cuda"
    raise ValueError(f"ceilings of device {device!r}: valid: cpu, cuda")


def cache_key(device: str, threads: int, scale: float = 1.0) -> dict:
    """What a cached ceiling must match: the schema, the device's model and cores, the thread
    count, the sizes' scale and the library versions (`_versions`)."""
    device = _device(device)
    model = cpu_model() if device == "cpu" else gpu_info().name
    return {"schema": SCHEMA, "peak": PEAK_VERSION, "device": device, "model": model, "cores": available_cores(),
            "threads": threads, "scale": scale, **_versions(device)}


def cache_path(key: Mapping) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"ceilings-{key['device']}-{digest}.json"


def _load(path: Path, key: Mapping) -> Ceilings | None:
    try:
        record = json.loads(path.read_text())
        if record.get("key") != dict(key):
            return None
        return Ceilings.from_dict(record["ceilings"])
    except (OSError, ValueError, KeyError, TypeError):  # absent, torn, another schema
        return None


def _store(path: Path, key: Mapping, ceilings: Ceilings) -> None:
    """Written whole or not at all (a temporary file renamed), so a reader never sees half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": dict(key), "ceilings": ceilings.to_dict()}, indent=1))
    os.replace(tmp, path)


def measure(device: str = "cpu", threads: int | None = None, *, refresh: bool = False,
            scale: float = 1.0) -> Ceilings:
    """The device's ceilings for `threads` threads (None: `threads.count()`): from the cache
    where one matches `cache_key`, else measured (a few seconds) and cached; `refresh`
    measures again. The record's `source` says which (`cache` or `measured`). A measurement that other work contended is returned but not cached: a
    ceiling measured low would stand for the machine's until refreshed."""
    device = _device(device)
    threads = threads or thread_count()
    key = cache_key(device, threads, scale)
    path = cache_path(key)
    if not refresh and (cached := _load(path, key)) is not None:
        return replace(cached, source="cache")
    if device == "cpu":
        ceilings = measure_cpu(threads, scale=scale)
    else:
        ceilings = measure_gpu(threads, scale=scale)
    ceilings = replace(ceilings, source="measured")
    if not ceilings.contended:
        _store(path, key, replace(ceilings, source=None))
    return ceilings


def fastest_gemm(shape: str | Product = "square", ceilings: Ceilings | None = None,
                 threads: int | None = None) -> tuple[str, float]:
    """The fastest GEMM library for a product and its GFLOP/s: a product's name (`square`,
    `im2col`, `winograd`) read from `ceilings` (None: `measure("cpu", threads)`), or a
    `Product` measured now on the CPU."""
    if isinstance(shape, Product):
        rates = {b: by[shape.name] for b, by in gemm_rates([shape], threads).items()}
    else:
        c = ceilings or measure("cpu", threads)
        rates = {b: by[shape] for b, by in c.gflops_by_backend.items() if shape in by}
        if not rates:
            known = sorted({s for by in c.gflops_by_backend.values() for s in by})
            raise ValueError(f"no GEMM rate for {shape!r}; measured: {', '.join(known)}")
    name = max(rates, key=rates.get)
    return name, rates[name]
