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
  probe remains): `PROBE_ROUNDS` rounds of one call each, or one round alone where it took
  `PROBE_CAP` (so large a product's warm-up effects are small; more rounds would not be).
  Each library's median time counts, not its best: the median of three drops one outlier, the
  first call's page faults into a fresh `out` or a preempted call; and NumPy's batched matmul
  wakes OpenBLAS's threads once per matrix, which on a busy machine is now quick, now a
  scheduler's time slice, and a best time would pick it for a lucky round. Torch (the first
  library, on which these algorithms ran before) keeps a product unless another's median is
  `PROBE_MARGIN` lower: near ties flip with noise, and a product moved to NumPy also wakes a
  second thread pool between torch's transforms, a cost the probe sees only in part. The
  choice is kept for the process (`_choices`). The harness's first call, which prepares and
  verifies, is the one that probes: timed calls never do.
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
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..machine import threads

#: Names a library that runs every product, unprobed: "torch" or "numpy".
GEMM_ENV = "CONVBENCH_GEMM"
#: Rounds of a probe (one call of each library per round).
PROBE_ROUNDS = 3
#: A first round this long (s) decides alone: more would multiply a large product's cost.
PROBE_CAP = 0.2
#: How much lower (a fraction) another library's median must be to take a product from torch.
PROBE_MARGIN = 0.1

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
    pool = threads.numpy_blas_pool()
    if not pool:
        return "its BLAS (NumPy)"
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
    """The fastest of `candidates` (name -> matmul, the incumbent first) on this product: their
    median times over interleaved rounds, in the bounds and with the margin of the module's
    rule."""
    names = list(candidates)
    if len(names) == 1:
        return names[0]
    times: dict[str, list[float]] = {name: [] for name in names}
    start = clock()
    for round_ in range(PROBE_ROUNDS):
        for name in names if round_ % 2 == 0 else names[::-1]:
            before = clock()
            candidates[name](a, b, out)
            times[name].append(clock() - before)
        if round_ == 0 and clock() - start >= PROBE_CAP:
            break
    median = {name: statistics.median(t) for name, t in times.items()}
    fastest = min(names, key=median.__getitem__)
    return fastest if median[fastest] < (1 - PROBE_MARGIN) * median[names[0]] else names[0]


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

    def library(self, a, b, out) -> str:
        """The library the product out = a·b runs on (`choose`, probing it on first use,
        which writes into `out`), counted as run: for work that must run on the same thread
        pool as the product (two pools taking turns on the same cores each wake the other's
        threads, which spin)."""
        name = choose(a, b, out)
        self.ran.setdefault(name)
        return name

    def addmm(self, out, a, b) -> None:
        """out += a·b (batched over a leading axis where the operands have one), on torch:
        NumPy's matmul only overwrites its output, and adding a product made apart would cost
        a buffer and a pass over it."""
        if out.dim() == 2:
            out.addmm_(a, b)
        else:
            out.baddbmm_(a, b)
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
