"""Error metrics and tolerances: when is an implementation's output right?

The metric is ‖out − ref‖ / ‖ref‖ (relative Frobenius error) with the max abs error beside it,
against the float64 reference. NaN or inf anywhere makes the error inf: an unwritten element of a
NaN-filled output can never pass.

Tolerances are per algorithm and precision: each algorithm declares its column of
`traits.TOLERANCES` (exact, FFT, Winograd by its transform's size) where it registers
(`registry.algorithm`), for reductions up to 4096 terms; they grow as sqrt(L / 4096) beyond, as
rounding error of a sum of L random-sign terms does (a batch-256 weight gradient sums N·P·Q ≈
43k terms). A Winograd tile's column follows the size alpha = m + r - 1 of the transform it runs
on the problem (`traits.Algorithm.tolerance_column`), not the tile alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..algos import registry
from ..algos.traits import TOLERANCES
from ..core.problem import ConvProblem


def reduction_length(problem: ConvProblem, pass_: str) -> int:
    """How many products are summed into one output element of the pass."""
    if pass_ == "fwd":
        return problem.cg * problem.r * problem.s
    if pass_ == "bwd_data":
        return (problem.k // problem.groups) * problem.r * problem.s
    return problem.n * problem.p * problem.q


def column(algo: str, problem: ConvProblem | None = None) -> str:
    """`algo`'s column of `traits.TOLERANCES` on `problem`, from its traits; a pass a plan
    leaves to torch (`registry.TORCH_DEFAULT`) is judged as exact."""
    if algo == registry.TORCH_DEFAULT:
        return "exact"
    return registry.algorithm(algo).tolerance_column(problem)


def tolerance(algo: str, precision: str, problem: ConvProblem | None = None,
              pass_: str = "fwd") -> float:
    """The relative error `algo`'s pass may have: its column's (`column`) for `precision`,
    grown as sqrt(L / 4096) past L = 4096 summed terms (`reduction_length`)."""
    base = TOLERANCES[column(algo, problem)][precision]
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
        """One line for a `failed` or `inexact` row: the error against the tolerance."""
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


def verdict(chk: Check, algo: str) -> str:
    """A checked result's status: `ok` within its tolerance; beyond it `inexact` where `algo` is
    a library's (its traits' origin is not `ours`: torch's pick, cuDNN's algorithms) and its
    error finite, else `failed`. A library's result is what its users run: timed and kept, it
    stays the baseline it is with its error said, and advice chooses it only where the
    constraints admit that error. Ours beyond tolerance is a bug of ours, never timed, so it
    never wins; a non-finite error (NaN, an unwritten element, a wrong shape) is no result of
    anyone's."""
    if chk.ok:
        return "ok"
    if registry.algorithm(algo).origin != "ours" and math.isfinite(chk.rel_error):
        return "inexact"
    return "failed"


def check(out, ref, algo: str, precision: str, problem: ConvProblem | None = None,
          pass_: str = "fwd", floor: float = 0.0) -> Check:
    """`floor`: `magnitude_floor` of the operands (the runner's `Operands.floor`)."""
    rel, mx = errors(out, ref, floor)
    tol = tolerance(algo, precision, problem, pass_)
    return Check(rel <= tol, rel, mx, tol)
