"""The one road every CPU algorithm's main products take: each product runs on the faster of the
GEMM libraries here, torch's (MKL in the x86 wheels) and NumPy's (OpenBLAS), chosen per shape.

Why per shape and per machine: neither library is faster everywhere. On an AMD Zen 5 NumPy's
OpenBLAS (AVX-512 kernels) ran our products twice as fast as torch's MKL; on an AVX-512 Xeon MKL
was faster on our products' shapes while OpenBLAS was faster on a large square one. So the
choice is measured where it is used, on the shape it is used for.

The rule:

- A product is known by its key: threads (`threads.count()`), dtype, and each operand's shape
  and strides as the algorithm calls it (so a transposed operand is another key).
- On a key's first use, `probe` times each library that runs it through BLAS on the call's own
  operands, interleaved, each writing into `out` (the real product follows, so nothing of the
  probe remains): at least 2 rounds (the first wakes the library's threads), at most
  `PROBE_ROUNDS`, and no round begins once `PROBE_SECONDS` are spent (one round alone where it
  took `PROBE_CAP`). The fastest best time wins and is kept for the process (`_choices`). The
  harness's first call, which prepares and verifies, is the one that probes: timed calls never
  do.
- NumPy runs a product through BLAS only where each operand has a unit-stride axis and its
  output is row-major (NumPy's `is_blasable2d`); elsewhere its matmul is a plain loop, many times
  slower, and is never probed.
- `CONVBENCH_GEMM=torch|numpy` (or `force`) runs every product on one library, unprobed: for
  reproducible runs and for tests.
- Both libraries write into the algorithm's `out` (a view of its buffers): no extra copy in
  either. A product that adds into `out` (`Route.addmm`, BLAS's beta = 1) runs on torch, the
  only one of the two whose product can.

Never silently: each prepared pass holds a `Route`, which remembers the libraries its products
ran on, and the algorithm's row note says them (`note`).
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..machine import threads

#: Names a library that runs every product, unprobed: "torch" or "numpy".
GEMM_ENV = "CONVBENCH_GEMM"
#: Most rounds of a probe (one call of each library per round).
PROBE_ROUNDS = 3
#: No probe round begins once this much time (s) is spent, after the second.
PROBE_SECONDS = 0.02
#: A first round this long (s) decides alone: a second would double a large product's cost.
PROBE_CAP = 0.2

#: The clock probes read (tests give a fake one).
clock: Callable[[], float] = time.perf_counter


@dataclass(frozen=True)
class Backend:
    """A GEMM library: `matmul(a, b, out)` on torch tensors (out = a·b, batched over leading
    axes, written into `out`); `runs(a, b, out)`, whether it runs that product through BLAS;
    `library()`, what a note calls it."""

    matmul: Callable
    runs: Callable
    library: Callable[[], str]


def _torch_matmul(a, b, out) -> None:
    import torch

    torch.matmul(a, b, out=out)


def _numpy_matmul(a, b, out) -> None:
    np.matmul(a.numpy(), b.numpy(), out=out.numpy())


def _blas_matrix(shape, strides, row_major_only: bool = False) -> bool:
    """NumPy's `is_blasable2d` on the last two axes (strides in elements): the last axis of unit
    stride and the row stride no shorter than a row; or, unless `row_major_only`, the same for
    the transposed matrix."""
    (rows, cols), (row_step, col_step) = shape[-2:], strides[-2:]
    if col_step == 1 and row_step >= cols:
        return True
    return not row_major_only and row_step == 1 and col_step >= rows


def _numpy_runs(a, b, out) -> bool:
    """Whether NumPy's matmul runs this product as BLAS GEMMs: no axis of 1 (NumPy takes other
    roads for vectors), both operands BLAS matrices in either order, the output row-major."""
    if min(a.shape[-2:] + b.shape[-1:]) < 2:
        return False
    return (_blas_matrix(a.shape, a.stride()) and _blas_matrix(b.shape, b.stride())
            and _blas_matrix(out.shape, out.stride(), row_major_only=True))


@functools.cache
def _torch_library() -> str:
    import torch

    if torch.backends.mkl.is_available():
        return "MKL (torch)"
    return "its BLAS (torch)"


@functools.cache
def _numpy_library() -> str:
    """NumPy's BLAS as threadpoolctl reports it: name, version, the core type OpenBLAS chose."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "its BLAS (NumPy)"
    pools = sorted((p for p in threadpool_info() if p.get("user_api") == "blas"),
                   key=lambda p: "numpy" not in p.get("filepath", ""))
    if not pools:
        return "its BLAS (NumPy)"
    pool = pools[0]
    name = {"openblas": "OpenBLAS", "mkl": "MKL", "blis": "BLIS"}.get(
        pool.get("internal_api"), pool.get("internal_api") or "BLAS")
    version = ".".join((pool.get("version") or "").split(".")[:3])
    words = [name, version, pool.get("architecture") or ""]
    return " ".join(w for w in words if w) + " (NumPy)"


#: The libraries, by the name `CONVBENCH_GEMM` takes.
BACKENDS: dict[str, Backend] = {
    "torch": Backend(_torch_matmul, lambda a, b, out: True, _torch_library),
    "numpy": Backend(_numpy_matmul, _numpy_runs, _numpy_library),
}

#: The library chosen per product key, for the process.
_choices: dict[tuple, str] = {}
#: What `force` set (None: the environment, then the probe, decide).
_forced: str | None = None
#: The route of the last pass prepared for each (algo, problem, pass, layout, precision).
_routes: dict[tuple, Route] = {}


def force(name: str | None) -> None:
    """Run every product on `name` ("torch", "numpy"), unprobed; None: as `CONVBENCH_GEMM`
    says, else the probe."""
    global _forced
    _forced = None if name is None else _checked(name, "force")


def _checked(name: str, source: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"{source}: GEMM library {name!r} is none of {', '.join(BACKENDS)}")
    return name


def forced() -> tuple[str, str] | None:
    """(library name, who forced it) where `force` or `CONVBENCH_GEMM` fixes the library."""
    if _forced is not None:
        return _forced, "forced"
    env = os.environ.get(GEMM_ENV)
    return (_checked(env, GEMM_ENV), f"{GEMM_ENV}={env}") if env else None


def key(a, b, out) -> tuple:
    """What a product's choice depends on: threads, dtype, and each operand's shape and
    strides."""
    return (threads.count(), str(a.dtype),
            *((tuple(t.shape), tuple(t.stride())) for t in (a, b, out)))


def probe(candidates: dict[str, Callable], a, b, out) -> str:
    """The fastest of `candidates` (name -> matmul) on this product: their best times over
    interleaved rounds, in the bounds of the module's rule."""
    names = list(candidates)
    if len(names) == 1:
        return names[0]
    best = dict.fromkeys(names, math.inf)
    start = clock()
    for round_ in range(PROBE_ROUNDS):
        for name in names if round_ % 2 == 0 else names[::-1]:
            before = clock()
            candidates[name](a, b, out)
            best[name] = min(best[name], clock() - before)
        spent = clock() - start
        if (round_ >= 1 and spent >= PROBE_SECONDS) or spent >= PROBE_CAP:
            break
    return min(names, key=best.__getitem__)


def choose(a, b, out) -> str:
    """The library this product runs on: the forced one, else the probed one for its key
    (probing on first use)."""
    fixed = forced()
    if fixed is not None:
        return fixed[0]
    k = key(a, b, out)
    name = _choices.get(k)
    if name is None:
        candidates = {n: be.matmul for n, be in BACKENDS.items() if be.runs(a, b, out)}
        name = _choices[k] = probe(candidates, a, b, out)
    return name


class Route:
    """The products of one prepared pass, each on its library, and which libraries they ran on
    (for the row's note). `owner` is (algo, problem, pass, layout, precision): `note` finds the
    route by it."""

    def __init__(self, owner: tuple):
        self.ran: dict[str, None] = {}  # library names, in order of first use
        self.added = False
        _routes[owner] = self

    def matmul(self, a, b, out) -> None:
        """out = a·b on the library `choose` picks."""
        name = choose(a, b, out)
        BACKENDS[name].matmul(a, b, out)
        self.ran.setdefault(name)

    def addmm(self, out, a, b) -> None:
        """out += a·b, on torch: NumPy's matmul only overwrites its output, and adding a
        product made apart would cost a buffer and a pass over it."""
        out.addmm_(a, b)
        self.added = True


def library(name: str) -> str:
    return BACKENDS[name].library()


def note(owner: tuple) -> str:
    """The row note's words on the products of `owner`'s pass: the libraries they ran on, and
    how they were chosen; before the pass ran, how they will be."""
    route = _routes.get(owner)
    fixed = forced()
    if route is None or not route.ran:
        if fixed is not None:
            return f"products: {library(fixed[0])} [{fixed[1]}]"
        return (f"products: the faster of {' and '.join(library(n) for n in BACKENDS)} per "
                "shape [probed on first call]")
    how = fixed[1] if fixed is not None else "probed"
    text = f"products: {', '.join(library(n) for n in route.ran)} [{how}]"
    if route.added and list(route.ran) != ["torch"]:
        text += f"; those adding into their output: {library('torch')}"
    return text
