"""Theoretical arithmetic and workspace of each algorithm: what a pass *must* cost.

The study's "kernel operation counts for each conv layer" figure, as a table. Each algorithm
declares how it is counted (its traits' `counts`, `convbench.algos.counts`: the families'
counts and what they count); this module asks it, for the implementation on a backend. An
algorithm without a count (a library that chooses its own kernel: cuDNN, torch-cpu) has none,
and a count may have none for a problem its algorithm does not run in the form counted.
"""

from __future__ import annotations

from ..algos import registry
from ..algos.counts import OpCount
from ..core.problem import ConvProblem

__all__ = ["OpCount", "op_count", "theoretical_workspace", "workspace_bytes"]


def op_count(algo: str, problem: ConvProblem, pass_: str, precision: str = "fp32",
             backend: str = "numpy") -> OpCount | None:
    """The theoretical operations of `algo` for one pass, or None where it has no count
    (a library-chosen kernel, or Winograd where it does not run). `backend` matters to the
    counts that follow their implementation (FFT's grid, Winograd's phase split)."""
    counts = registry.algorithm(algo).counts
    return None if counts is None else counts.ops(algo, problem, pass_, precision, backend)


def theoretical_workspace(algo: str, problem: ConvProblem, pass_: str, precision: str = "fp32",
                          backend: str = "numpy") -> int | None:
    """Bytes an algorithm needs beyond its inputs and output, on paper: GEMM's column matrix,
    FFT's spectra (complex, on the grid of its implementation on `backend`), Winograd's
    transformed tiles and filters; None when unknown."""
    counts = registry.algorithm(algo).counts
    return None if counts is None else counts.workspace(algo, problem, pass_, precision,
                                                        backend)


def workspace_bytes(impl: registry.Implementation, problem: ConvProblem, pass_: str, layout: str,
                    precision: str) -> int | None:
    """What the implementation says it allocates, when it says, else the theoretical figure for
    its algorithm."""
    declared = impl.workspace_bytes(problem, pass_, layout, precision)
    if declared is not None:
        return declared
    return theoretical_workspace(impl.algo, problem, pass_, precision, impl.backend)
