"""The host as convbench reads it: the CPU's fields (/proc/cpuinfo), its model, and the folder
convbench keeps its per-machine caches in. Nothing heavy is imported: the command reads these
before NumPy loads.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from pathlib import Path


def read(path: str | Path) -> str | None:
    """A file's text, or None where it cannot be read (no such file on this platform)."""
    try:
        return Path(path).read_text()
    except OSError:
        return None


def parse_cpuinfo(text: str) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo text (x86's spelling)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if out:
                break
            continue
        key, _, value = line.partition(":")
        out.setdefault(key.strip(), value.strip())
    return out


def cpuinfo() -> dict[str, str]:
    """This machine's first processor's fields ({} where there is no /proc/cpuinfo)."""
    return parse_cpuinfo(read("/proc/cpuinfo") or "")


def cpu_model(info: Mapping[str, str] | None = None) -> str:
    """The CPU's model name (of `info`, else this machine's), else what `platform` says."""
    info = cpuinfo() if info is None else info
    return info.get("model name") or platform.processor() or platform.machine()


#: The CPU flags that say it computes bfloat16 itself: x86's AVX512_BF16 and AMX-BF16 (in
#: /proc/cpuinfo's `flags`), Arm's BF16 (in its `Features`).
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def cpu_flags(info: Mapping[str, str] | None = None) -> set[str]:
    """The CPU's flags (of `info`, else this machine's): x86's `flags`, Arm's `Features`."""
    info = cpuinfo() if info is None else info
    return set((info.get("flags") or info.get("Features") or "").split())


def bf16_flag(info: Mapping[str, str] | None = None) -> str | None:
    """The flag by which the CPU computes bfloat16 products itself (`BF16_FLAGS`), or None:
    without one a library converts to fp32 and back around each product, and a bf16 time
    measures that emulation, not the precision."""
    flags = cpu_flags(info)
    return next((f for f in BF16_FLAGS if f in flags), None)


def user_cache() -> Path:
    """$XDG_CACHE_HOME/convbench, else ~/.cache/convbench: where each cache has its folder."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "convbench"


def cache_dir() -> Path:
    """The machine's measured facts (ceilings, the OpenBLAS core type): $CONVBENCH_CACHE_DIR,
    else `user_cache()`."""
    return Path(os.environ.get("CONVBENCH_CACHE_DIR") or user_cache())


def last_level_cache_bytes(default: int = 32 << 20) -> int:
    """The largest CPU cache of core 0 (the last level, shared), from sysfs; `default` where
    the system does not say."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        try:
            unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * unit)
        except (ValueError, OSError):
            continue
    return max(sizes, default=default)

