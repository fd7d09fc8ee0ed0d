"""What an algorithm is, declared where it is registered: its traits (`Algorithm`).

Like the numerical notes cuDNN attaches to each engine, every algorithm states once, beside its
implementation (`registry.register(Algorithm(...), backend)`), what the rest of convbench asks
of it: the verification reads its tolerance column, the plausibility guard its arithmetic
reduction, the operation counts its `Count`, the reports its family and origin, the advice
whether it is deterministic. No table
elsewhere is keyed by algorithm names, so a new algorithm is one file; a trait left out is a
TypeError where the algorithm is declared, a value outside the vocabulary a ValueError, never a
silent default.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .transforms import CPU_FILTER_SIZES, phase_split

if TYPE_CHECKING:
    from ..core.problem import ConvProblem

#: How an algorithm computes the convolution. `chosen`: a library that picks its kernel per
#: problem (torch's convolution, cuDNN's heuristic or search); `undisclosed`: a library's
#: kernel it does not name (cuDNN's ALGO_0 of a backward pass).
FAMILIES = {
    "direct": "sums the products of each output in place",
    "gemm": "lowers the convolution to matrix products (im2col, or implicitly)",
    "fft": "multiplies spectra: fewer products, transforms around them",
    "winograd": "minimal filtering F(m, r) on tiles: fewer products, transforms around them",
    "chosen": "a library's pick of kernel per problem (torch, cuDNN)",
    "undisclosed": "a library's kernel whose method it does not name",
}
#: Whose code runs. `ours`: convbench's own kernel (the best of ours in every report); `library`:
#: another's, run one by one or around our lowering (cuBLAS's product, cuDNN's find); `torch`:
#: torch's own convolution as a model runs it, the baseline a plan must beat.
ORIGINS = {
    "ours": "convbench's own kernel",
    "library": "another library's kernel (cuBLAS, cuDNN one by one)",
    "torch": "torch's own convolution, as a model runs it",
}
#: What the plausibility guard allows for (`measure.rows.reduction`): a row's direct-convolution
#: rate may exceed the device's ceiling by the algorithm's arithmetic reduction only.
REDUCTIONS = {
    "none": "does the direct convolution's flops, no fewer: no reduction allowed",
    "counted": "its own operation count's: direct flops over its count (`any` where it has none)",
    "any": "may run a transform we do not count: the largest reduction a counted algorithm has "
           "on the problem and pass",
}

#: Relative-error tolerances per column and precision, for reductions up to 4096 terms
#: (`measure.verify` grows them beyond). `exact`: direct sums, a few ulps per term; `fft`: its
#: transforms add O(log size) rounding steps; Winograd's by the size alpha = m + r - 1 of its
#: transform (its interpolation points), whose coefficients amplify rounding the more the larger
#: alpha. Each is the measured error with ample headroom: loose enough for other summation
#: orders, tight enough that a wrong coefficient fails (docs/pages/measurement.md).
TOLERANCES = {
    "exact": {"fp64": 1e-12, "fp32": 1e-5, "tf32": 5e-3, "fp16": 1e-2, "bf16": 5e-2},
    "fft": {"fp64": 1e-11, "fp32": 2e-5, "tf32": 5e-3, "fp16": 2e-2, "bf16": 5e-2},
    "winograd-alpha4": {"fp64": 1e-11, "fp32": 2e-5, "tf32": 5e-3, "fp16": 2e-2, "bf16": 5e-2},
    "winograd-alpha6": {"fp64": 1e-10, "fp32": 1e-4, "tf32": 1e-2, "fp16": 5e-2, "bf16": 1e-1},
    "winograd-alpha8": {"fp64": 2e-10, "fp32": 2e-4, "tf32": 2e-2, "fp16": 1e-1, "bf16": 2e-1},
}
#: The column of a Winograd transform of size alpha (m + r - 1), whatever m and r make it.
ALPHA_TOLERANCES = {4: "winograd-alpha4", 6: "winograd-alpha6", 8: "winograd-alpha8"}


class Count(abc.ABC):
    """How an algorithm's theoretical cost is counted (`convbench.algos.counts` has the
    families'): its operations and its workspace on paper, for one pass of `algo` as its
    implementation on `backend` runs it (FFT's grid and Winograd's phase split are the
    implementation's choice, so a count asks it rather than restating it)."""

    @abc.abstractmethod
    def ops(self, algo: str, problem: ConvProblem, pass_: str, precision: str, backend: str):
        """The pass's `counts.OpCount`, or None where there is none (the algorithm does not
        run the problem in the form counted)."""

    @abc.abstractmethod
    def workspace(self, algo: str, problem: ConvProblem, pass_: str, precision: str,
                  backend: str) -> int | None:
        """Bytes the pass needs beyond its inputs and output, on paper; None when unknown."""


@dataclass(frozen=True)
class Algorithm:
    """One algorithm's traits, the same on every backend that runs it (each registration of the
    name passes an equal declaration). Every field but `tile` and `torch_benchmark` is required:
    an algorithm says what it is rather than inheriting a default meant for another.

    - `family`, `origin`: keys of `FAMILIES` and `ORIGINS` (the reports' "ours" and the
      libraries, the FFT and Winograd comparisons);
    - `tolerance`: its column of `TOLERANCES` (for a Winograd tile, the 3x3 filter's);
    - `reduction`: a key of `REDUCTIONS`, the plausibility guard's allowance;
    - `counts`: its `Count`, or None where there is nothing to count (a library's choice of
      kernel); `counted` needs one;
    - `deterministic`: whether its results are bitwise equal run to run (the advice's
      `--deterministic` keeps only these). Ours reduce in a fixed order (the NumPy ones and
      torch's CPU convolution for a fixed thread count; our CUDA kernels use no floating-point
      atomics: a kernel that adds them declares False); cuDNN's own choice may be one of its
      algorithms that accumulate with atomics, and the rows were not measured under torch's
      `cudnn.deterministic`, so it is not;
    - `tile`: Winograd's output tile m, where its error follows the transform's size alpha =
      m + r - 1 with the filter r (`tolerance_column`);
    - `torch_benchmark`: for torch's own convolution, the `cudnn.benchmark` it runs with (None:
      whatever is set);
    - `weights_once`: an inference variant, whose filter is transformed at a pass's first call
      and kept while the weights stay the same (as inference engines transform weights once).
      Its rows are reported apart from the others, never in the best of ours, and no plan
      takes it: a per-call algorithm pays that transform in every call, and a training step
      changes the weights.
    """

    name: str
    family: str
    origin: str
    tolerance: str
    reduction: str
    counts: Count | None
    deterministic: bool
    tile: int | None = None
    torch_benchmark: bool | None = None
    weights_once: bool = False

    def __post_init__(self):
        if not (isinstance(self.name, str) and self.name and self.name == self.name.strip()
                and "," not in self.name and self.name != "all"):
            raise ValueError(f"algorithm name {self.name!r}: a non-empty word without commas, "
                             "not 'all' (the command line's lists are comma-separated)")
        for trait, valid in (("family", FAMILIES), ("origin", ORIGINS),
                             ("tolerance", TOLERANCES), ("reduction", REDUCTIONS)):
            if getattr(self, trait) not in valid:
                raise ValueError(f"{self.name}: unknown {trait} {getattr(self, trait)!r}; "
                                 f"valid: {', '.join(valid)}")
        if self.counts is not None and not isinstance(self.counts, Count):
            raise TypeError(f"{self.name}: counts must be a traits.Count or None, not "
                            f"{self.counts!r}")
        if not isinstance(self.deterministic, bool):
            raise TypeError(f"{self.name}: deterministic must be True or False, not "
                            f"{self.deterministic!r}")
        if self.reduction == "counted" and self.counts is None:
            raise ValueError(f"{self.name}: a `counted` reduction needs a count (counts=None)")
        if self.tile is not None and not (isinstance(self.tile, int) and self.tile > 0):
            raise ValueError(f"{self.name}: tile must be a positive int, not {self.tile!r}")
        if not isinstance(self.weights_once, bool):
            raise TypeError(f"{self.name}: weights_once must be True or False, not "
                            f"{self.weights_once!r}")
        if self.torch_benchmark is not None and self.origin != "torch":
            raise ValueError(f"{self.name}: torch_benchmark is for torch's own convolution "
                             f"(origin 'torch'), not origin {self.origin!r}")

    def tolerance_column(self, problem: ConvProblem | None = None) -> str:
        """Its column of `TOLERANCES` on `problem`: the declared one, or for a Winograd tile
        (`tile`) the column of its transform's size alpha = m + r - 1, r the filter its tiles
        transform (at a stride the phase split's: 9x9 at stride 2 runs as 5x5 phases,
        F(2x2, 5x5) with alpha 6, not alpha 10); a size without a column of its own keeps the
        declared one."""
        if problem is None or self.tile is None:
            return self.tolerance
        split = phase_split(problem, CPU_FILTER_SIZES)
        r = problem.r if split is None else split.r
        if r == 3:
            return self.tolerance
        return ALPHA_TOLERANCES.get(self.tile + r - 1, self.tolerance)
