"""Theoretical arithmetic and workspace of each algorithm: what a pass *must* cost.

The study's "kernel operation counts for each conv layer" figure, as a table. Counts are
floating-point operations (a multiply-add is 2, a complex multiply-add 8), split into
`products` (the core reduction: the direct loop, the GEMM, FFT's and Winograd's per-frequency
products summed over channels), `transforms` (FFT's and Winograd's transforms, as dense matrix
products; GEMM's col2im adds), `multiplications` (the scalar multiplications inside `products`,
which Winograd and FFT set out to reduce) and `lowering_bytes` (im2col/col2im's column buffer
written and read once: GEMM's time that is not arithmetic).

A library that chooses its own kernel (cuDNN, torch-cpu) has no count; Winograd's exist where it
runs (3×3 or 5×5 filters, stride 1, dilation 1, groups 1, one padding for both axes, and on the
CPU a strided layer counted as its phase split, `transforms.phase_split`). FFT's count follows
the transform grid the implementation actually runs (`registry.TransformGrid`: FFTW's sizes on
the CPU, cuFFT's on the GPU, fft-tiled's tiles), asked of it rather than restated here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..algos import padding, registry
from ..algos.transforms import phase_split
from ..core.problem import ELEMENT_BYTES, ConvProblem

#: Flops of a real-to-complex (or complex-to-real) 2-D FFT of n points: half the 5·n·log2(n) of
#: the classic complex radix-2 count.
_RFFT_FLOPS_PER_POINT_LOG = 2.5


@dataclass(frozen=True)
class OpCount:
    products: int
    multiplications: int
    transforms: int = 0
    lowering_bytes: int = 0

    @property
    def total(self) -> int:
        """Arithmetic operations, products and transforms together."""
        return self.products + self.transforms


def _direct(p: ConvProblem) -> OpCount:
    return OpCount(products=p.flops, multiplications=p.flops // 2)


def _column_elements(p: ConvProblem) -> int:
    """Elements of the im2col matrix: one row of C·R·S per output pixel."""
    return p.n * p.p * p.q * p.c * p.r * p.s


def _gemm(p: ConvProblem, pass_: str, precision: str) -> OpCount:
    cols = _column_elements(p)
    return OpCount(products=p.flops, multiplications=p.flops // 2,
                   transforms=cols if pass_ == "bwd_data" else 0,  # col2im's scatter-adds
                   lowering_bytes=2 * cols * ELEMENT_BYTES[precision])


def _fft_grid(p: ConvProblem, pass_: str, algo: str, backend: str) -> tuple[int, int, int]:
    """(transform height, width, tiles per image) as the implementation of `algo` on `backend`
    chooses them (ValueError if there is none, or it does not say): the count follows the grid
    that really runs."""
    impl = registry.get(algo, backend)
    if not isinstance(impl, registry.TransformGrid):
        raise ValueError(f"{algo} on {backend} does not give its transform grid "
                         f"(registry.TransformGrid), so its transforms cannot be counted")
    return impl.transform_grid(p, pass_)


def _fft_planes(p: ConvProblem, grid: tuple[int, int, int]) -> tuple[int, int]:
    """(transformed planes, spectrum bins per plane) on `grid`: the image tensors per tile,
    filters once. Each pass transforms two of x, w, y and inverts the third: the same total."""
    th, tw, tiles = grid
    return (p.n * p.c + p.n * p.k) * tiles + p.k * p.cg, th * (tw // 2 + 1)


def _fft(p: ConvProblem, grid: tuple[int, int, int]) -> OpCount:
    th, tw, tiles = grid
    planes, bins = _fft_planes(p, grid)
    points = th * tw
    transforms = round(planes * _RFFT_FLOPS_PER_POINT_LOG * points * math.log2(points))
    macs = p.n * p.k * p.cg * tiles * bins  # complex multiply-adds, summed over channels
    return OpCount(products=8 * macs, multiplications=4 * macs, transforms=transforms)


def _winograd_tile(algo: str) -> int:
    """m of `winograd-<m>x<m>` and `winograd-fused-<m>x<m>`."""
    return int(algo.rpartition("-")[2].split("x")[0])


def _winograd_applies(p: ConvProblem) -> bool:
    """Where the Winograd implementations run (they refuse everything else)."""
    return (p.r == p.s and p.r in (3, 5) and p.stride == 1 and p.dilation == 1 and p.groups == 1
            and not isinstance(p.pad, tuple))


def _winograd_problem(algo: str, p: ConvProblem, backend: str) -> ConvProblem | None:
    """The stride-1 problem Winograd's tiles run for `p`: `p` itself, or its phase split where
    the implementation on `backend` runs strided problems that way (the CPU's); None where it
    does not run."""
    try:
        impl = registry.get(algo, backend)
    except ValueError:  # no implementation of it there: counted as written
        impl = None
    if p.stride != 1 and getattr(impl, "strided", False):
        return phase_split(p, impl.filter_sizes)
    return p if _winograd_applies(p) else None


def _sandwich(out: int, inner: int) -> int:
    """Flops of L·X·R taking an inner×inner tile to out×out with dense L (out×inner), R."""
    return 2 * out * inner * inner + 2 * out * out * inner


def _winograd_tiles(p: ConvProblem, pass_: str, m: int) -> int:
    """Output tiles of m×m per plane: over dx for bwd_data, over y for fwd and bwd_filter."""
    h, w = (p.h, p.w) if pass_ == "bwd_data" else (p.p, p.q)
    return math.ceil(h / m) * math.ceil(w / m)


def _winograd(p: ConvProblem, pass_: str, m: int) -> OpCount:
    r, a = p.r, m + p.r - 1
    tiles = _winograd_tiles(p, pass_, m)
    if pass_ == "bwd_filter":
        # F(3×3, m×m): x tiles a×a and dy tiles m×m in, one a×a -> 3×3 output per filter.
        transforms = (p.n * p.c * tiles * _sandwich(a, a) + p.n * p.k * tiles * _sandwich(a, m)
                      + p.k * p.cg * _sandwich(r, a))
    else:
        src, dst = (p.c, p.k) if pass_ == "fwd" else (p.k, p.c)
        transforms = (p.n * src * tiles * _sandwich(a, a) + p.k * p.cg * _sandwich(a, r)
                      + p.n * dst * tiles * _sandwich(m, a))
    mults = a * a * p.n * p.k * p.cg * tiles
    return OpCount(products=2 * mults, multiplications=mults, transforms=transforms)


def _route(algo: str, p: ConvProblem, pass_: str, precision: str, backend: str
           ) -> tuple[ConvProblem, tuple[int, int, int, int]]:
    """(the problem the implementation of `algo` runs for `p`, the explicit pad (left, right,
    top, bottom) before it): `p` padded alike after an explicit pad where `p` is padded unequally
    and the implementation pads both sides alike (`registry.ExplicitPad.route`), else `p`."""
    try:
        impl = registry.get(algo, backend)
    except ValueError:  # no implementation of it there: counted as written
        impl = None
    if not p.asymmetric or not isinstance(impl, registry.ExplicitPad):
        return p, (0, 0, 0, 0)
    padded, explicit, _ = impl.route(p, pass_, "nchw", precision)
    return padded, explicit


def op_count(algo: str, problem: ConvProblem, pass_: str, precision: str = "fp32",
             backend: str = "numpy") -> OpCount | None:
    """The theoretical operations of `algo` for one pass, or None where it has no count
    (a library-chosen kernel, or Winograd where it does not run). `backend` matters to FFT
    only: its implementation there chooses the grid."""
    if algo == "direct":
        return _direct(problem)
    if algo in ("gemm", "gemm-cublas"):
        return _gemm(problem, pass_, precision)
    problem = _route(algo, problem, pass_, precision, backend)[0]  # after its explicit pad
    if algo in ("fft", "fft-tiled"):
        return _fft(problem, _fft_grid(problem, pass_, algo, backend))
    if algo.startswith("winograd-fused-") and pass_ == "bwd_filter":
        return None  # no fused weight gradient
    tiled = _winograd_problem(algo, problem, backend) if algo.startswith("winograd-") else None
    if tiled is not None:
        return _winograd(tiled, pass_, _winograd_tile(algo))
    return None


def theoretical_workspace(algo: str, problem: ConvProblem, pass_: str, precision: str = "fp32",
                          backend: str = "numpy") -> int | None:
    """Bytes an algorithm needs beyond its inputs and output, on paper: GEMM's column matrix,
    FFT's spectra (complex, on the grid of its implementation on `backend`), Winograd's
    transformed tiles and filters; None when unknown."""
    p, elem = problem, ELEMENT_BYTES[precision]
    if algo == "direct":
        return 0
    if algo in ("gemm", "gemm-cublas"):
        return _column_elements(p) * elem
    # FFT and Winograd run a padding that differs before and after as their symmetric part
    # after an explicit pad, whose buffer (x or dx, padded) adds to theirs.
    if p.asymmetric:
        padded, explicit = _route(algo, p, pass_, precision, backend)
        if padded is not p:
            spent = theoretical_workspace(algo, padded, pass_, precision, backend)
            return None if spent is None else spent + padding.explicit_bytes(p, precision,
                                                                             explicit)
    if algo in ("fft", "fft-tiled"):
        planes, bins = _fft_planes(p, _fft_grid(p, pass_, algo, backend))
        return planes * bins * 2 * elem
    if algo.startswith("winograd-fused-") and _winograd_applies(p):
        if pass_ == "bwd_filter":
            return None
        a = _winograd_tile(algo) + p.r - 1  # only the transformed filters leave the kernel
        return p.k * p.cg * a * a * elem
    tiled = _winograd_problem(algo, p, backend) if algo.startswith("winograd-") else None
    if tiled is not None:
        p, m = tiled, _winograd_tile(algo)
        a, tiles = m + p.r - 1, _winograd_tiles(p, pass_, m)
        return (p.n * (p.c + p.k) * tiles + p.k * p.cg) * a * a * elem
    return None


def workspace_bytes(impl: registry.Implementation, problem: ConvProblem, pass_: str, layout: str,
                    precision: str) -> int | None:
    """What the implementation says it allocates, when it says, else the theoretical figure for
    its algorithm."""
    declared = impl.workspace_bytes(problem, pass_, layout, precision)
    if declared is not None:
        return declared
    return theoretical_workspace(impl.algo, problem, pass_, precision, impl.backend)
