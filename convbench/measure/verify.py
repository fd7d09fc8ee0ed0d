"""Error metrics and tolerances: when is an implementation's output right?

The metric is ‖out − ref‖ / ‖ref‖ (relative Frobenius error) with the max abs error beside it,
against the float64 reference. NaN or inf anywhere makes the error inf: an unwritten element of a
NaN-filled output can never pass.

Tolerances are per algorithm and precision (`_BASE`), for reductions up to 4096 terms, growing as
sqrt(L / 4096) beyond, as rounding error of a sum of L random-sign terms does (a batch-256 weight
gradient sums N·P·Q ≈ 43k terms). Exact algorithms (direct, GEMM, cuDNN, torch-cpu) get a few
float32 ulps per term; FFT (its transforms add O(log size) rounding steps) and Winograd (whose
transform coefficients amplify rounding, the more the larger the tile) get their measured
errors with ample headroom: loose enough for other summation orders, tight enough that a wrong
coefficient fails (the measurements: docs/pages/measurement.md, checked before it is timed).
Winograd's error follows its transform's size alpha = m + r - 1 (its interpolation points),
not the tile alone: a tile takes the column of the 3x3 tile with the same alpha, r the filter
it transforms (at a stride the phase split's, `transforms.phase_split`); F(5x5, 3x3), alpha 7,
takes 6x6's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..algos.transforms import CPU_FILTER_SIZES, phase_split
from ..core.problem import ConvProblem

_BASE = {  # precision -> (exact algorithms, fft, winograd-2x2, winograd-4x4, winograd-6x6)
    "fp64": (1e-12, 1e-11, 1e-11, 1e-10, 2e-10),
    "fp32": (1e-5, 2e-5, 2e-5, 1e-4, 2e-4),
    "tf32": (5e-3, 5e-3, 5e-3, 1e-2, 2e-2),
    "fp16": (1e-2, 2e-2, 2e-2, 5e-2, 1e-1),
    "bf16": (5e-2, 5e-2, 5e-2, 1e-1, 2e-1),
}
_COLUMN = {"fft": 1, "fft-tiled": 1, "winograd-2x2": 2, "winograd-4x4": 3, "winograd-5x5": 4,
           "winograd-6x6": 4,
           "winograd-fused-2x2": 2, "winograd-fused-4x4": 3,
           # cuDNN's own, one by one (`cudnn_find`): its tiles are not said, so Winograd takes
           # F(4x4, 3x3)'s column, which also holds F(2x2, 5x5) (alpha 6)
           "cudnn-find-fft": 1, "cudnn-find-fft-tiling": 1, "cudnn-find-winograd": 3,
           "cudnn-find-winograd-nonfused": 3}


def reduction_length(problem: ConvProblem, pass_: str) -> int:
    """How many products are summed into one output element of the pass."""
    if pass_ == "fwd":
        return problem.cg * problem.r * problem.s
    if pass_ == "bwd_data":
        return (problem.k // problem.groups) * problem.r * problem.s
    return problem.n * problem.p * problem.q


#: The column of a Winograd transform of size alpha (m + r - 1), whatever m and r make it.
_ALPHA_COLUMN = {4: 2, 6: 3, 8: 4}


def _column(algo: str, problem: ConvProblem | None) -> int:
    column = _COLUMN.get(algo, 0)
    if problem is None or not algo.startswith("winograd-"):
        return column
    # the filter a tile transforms: at a stride the phase split's (9x9 at stride 2 runs as
    # 5x5 phases, F(2x2, 5x5) with alpha 6, not alpha 10); a problem it does not split, its own
    split = phase_split(problem, CPU_FILTER_SIZES)
    r = problem.r if split is None else split.r
    if r != 3:
        m = int(algo.rpartition("-")[2].split("x")[0])
        column = _ALPHA_COLUMN.get(m + r - 1, column)
    return column


def tolerance(algo: str, precision: str, problem: ConvProblem | None = None,
              pass_: str = "fwd") -> float:
    base = _BASE[precision][_column(algo, problem)]
    if problem is None:
        return base
    return base * max(1.0, math.sqrt(reduction_length(problem, pass_) / 4096))


def errors(out, ref, floor: float = 0.0) -> tuple[float, float]:
    """(relative Frobenius error, max abs error) of `out` against `ref`; inf if out is not finite
    or has the wrong shape. Both on the GPU (CuPy), it is computed there, in float64, and only
    the two numbers come back; otherwise on the host. `floor`: the least norm the error is
    taken relative to (`magnitude_floor`), where ‖ref‖ is smaller."""
    xp = _array_module(out) if _array_module(out) is _array_module(ref) else np
    out, ref = (xp.asarray(_host(v) if xp is np else v, dtype=xp.float64) for v in (out, ref))
    if out.shape != ref.shape or not bool(xp.all(xp.isfinite(out))):
        return math.inf, math.inf
    diff = out - ref
    denom = max(float(xp.linalg.norm(ref)), floor)
    rel = float(xp.linalg.norm(diff)) / denom if denom > 0 else float(xp.linalg.norm(diff))
    return rel, float(xp.max(xp.abs(diff))) if diff.size else 0.0


def _array_module(a):
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def _host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a


@dataclass(frozen=True)
class Check:
    ok: bool
    rel_error: float
    max_abs_error: float
    tolerance: float

    @property
    def reason(self) -> str:
        """One line for a `failed` row."""
        return (f"rel_error {self.rel_error:.3g} > tolerance {self.tolerance:.3g} "
                f"(max abs error {self.max_abs_error:.3g})")


def magnitude_floor(abs_ref, problem: ConvProblem, pass_: str) -> float:
    """A floor for the norm the error is relative to, from `abs_ref`, the pass computed on the
    operands' absolute values (`reference.magnitudes`: each element the sum of its terms'
    magnitudes, which bounds its rounding error): that norm over sqrt(L), the size a sum of L
    random-sign terms of those magnitudes typically has. A random output whose terms happen to
    cancel is then not judged against its own small size, which would fail an exact algorithm
    (the case hypothesis drew is in docs/pages/measurement.md and pinned in the tests). Where
    the terms do not cancel, ‖ref‖ is the larger."""
    length = reduction_length(problem, pass_)
    return float(np.linalg.norm(np.asarray(abs_ref, dtype=np.float64))) / math.sqrt(length)


def check(out, ref, algo: str, precision: str, problem: ConvProblem | None = None,
          pass_: str = "fwd", floor: float = 0.0) -> Check:
    """`floor`: `magnitude_floor` of the operands (the runner's `Operands.floor`)."""
    rel, mx = errors(out, ref, floor)
    tol = tolerance(algo, precision, problem, pass_)
    return Check(rel <= tol, rel, mx, tol)
