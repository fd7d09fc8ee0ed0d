"""Build a kernel source into a shared library the emulator can call, and cache it.

The translation is small on purpose, so that what runs is the kernel as written:

- ``extern __shared__ T name[];`` becomes
  ``T* const name = reinterpret_cast<T*>(emu_dynamic_shared);``, a pointer, at any scope, to the
  one dynamic shared-memory buffer `cuda_emu.h` defines (128-byte aligned, so ``__align__`` is
  dropped): every dynamic shared array aliases its start, as in CUDA. It is the one construct
  the header cannot supply by a macro (``extern static`` is not C++; and GCC ignores an asm
  label on a block-scope declaration inside a template).
- Each entry point gets a C launcher, called through ctypes::

      extern "C" int emu_launch_<name>(const unsigned* dims, size_t smem, <its parameters>)

  which runs ``<name>(<arguments>)`` on every thread of every block (`emu::launch`) and returns
  non-zero, with the reason in ``emu_error()``, when the emulator refuses or catches a fault.

The library is cached under `cache_dir()` by a hash of the translated source, the header, the
compiler's version and the command line, so a test run compiles each configuration once.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from ...machine.host import user_cache

CXX = "g++"
FLAGS = ("-O2", "-std=c++17", "-fPIC", "-shared", "-fno-strict-aliasing")
HEADER = Path(__file__).with_name("cuda_emu.h")

_DYNAMIC_SHARED = re.compile(r"\bextern\s+__shared__\s+([^;\[\]]+?)\s*\b(\w+)\s*\[\s*\]\s*;")
_ALIGN = re.compile(r"__align__\s*\(\s*\d+\s*\)")


def _dynamic_shared(m: re.Match) -> str:
    ctype = " ".join(_ALIGN.sub(" ", m.group(1)).split())
    return f"{ctype}* const {m.group(2)} = reinterpret_cast<{ctype}*>(emu_dynamic_shared);"


class EmuBuildError(RuntimeError):
    """g++ rejected the translated kernel source; the message carries its diagnostics."""


def cache_dir() -> Path:
    """$CONVBENCH_EMU_CACHE, else $XDG_CACHE_HOME/convbench/emu, else ~/.cache/convbench/emu."""
    if os.environ.get("CONVBENCH_EMU_CACHE"):
        return Path(os.environ["CONVBENCH_EMU_CACHE"])
    return user_cache() / "emu"


def translate(code: str, entries: Mapping[str, Iterable]) -> str:
    """The kernel source as g++ compiles it: dynamic shared memory redirected, launchers added.

    `entries` maps each entry point to its parameters (objects with `.decl` and `.name`, as
    `convbench.cuda.kernels.entry_points` returns them).
    """
    body = _DYNAMIC_SHARED.sub(_dynamic_shared, code)
    stubs = []
    for name, params in entries.items():
        params = list(params)
        decls = "".join(f", {p.decl}" for p in params)
        args = ", ".join(p.name for p in params)
        stubs.append(
            f'extern "C" int emu_launch_{name}(const unsigned* emu_dims, size_t emu_smem{decls}) {{\n'
            f"  return emu::launch(dim3(emu_dims[0], emu_dims[1], emu_dims[2]),\n"
            f"                     dim3(emu_dims[3], emu_dims[4], emu_dims[5]), emu_smem,\n"
            f"                     [&] {{ {name}({args}); }});\n}}\n")
    return body + '\n#line 1 "emu-launchers"\n' + "\n".join(stubs)


@functools.cache
def _compiler_version() -> str:
    return subprocess.run([CXX, "--version"], capture_output=True, text=True,
                          check=True).stdout


def build_library(code: str, entries: Mapping[str, Iterable], defines: tuple[str, ...] = ()) -> Path:
    """The cached shared library of `code` compiled with `defines` (``-DNAME=VALUE`` options)."""
    source = translate(code, entries)
    command = [CXX, *FLAGS, *defines, "-include", str(HEADER)]
    key = hashlib.sha256("\0".join([source, HEADER.read_text(), _compiler_version(),
                                    *command[1:-1]]).encode()).hexdigest()[:32]
    target = cache_dir() / f"{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src, out = Path(tmp) / "kernel.cpp", Path(tmp) / "kernel.so"
        src.write_text(source)
        proc = subprocess.run([*command, str(src), "-o", str(out)], capture_output=True,
                              text=True, check=False)
        if proc.returncode:
            raise EmuBuildError(f"g++ could not build the emulated kernel:\n{proc.stderr}")
        os.replace(out, target)  # atomic: a concurrent build of the same key is harmless
    return target
