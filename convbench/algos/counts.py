"""Theoretical arithmetic and workspace of each family: what a pass *must* cost.

Each algorithm names its `Count` in its traits (`traits.Algorithm.counts`); `measure.opcount`
reads them. Counts are floating-point operations (a multiply-add is 2, a complex multiply-add
8), split into `products` (the core reduction: the direct loop, the GEMM, FFT's and Winograd's
per-frequency products summed over channels), `transforms` (FFT's and Winograd's transforms,
as dense matrix products; GEMM's col2im adds), `multiplications` (the scalar multiplications
inside `products`, which Winograd and FFT set out to reduce) and `lowering_bytes`
(im2col/col2im's column buffer written and read once: GEMM's time that is not arithmetic).

Winograd's counts exist where it runs (3×3 or 5×5 filters, stride 1, dilation 1, groups 1, one
padding for both axes, and on the CPU a strided layer counted as its phase split,
`transforms.phase_split`). FFT's count follows the transform grid the implementation actually
runs (`registry.TransformGrid`: FFTW's sizes on the CPU, cuFFT's on the GPU, fft-tiled's tiles),
asked of it rather than restated here. FFT and Winograd run a padding that differs before and
after as their symmetric part after an explicit pad (`registry.ExplicitPad`), and on the CPU
a dilated problem as its undilated phases (`registry.DilationSplit`), counted so.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass

from ..core.problem import ELEMENT_BYTES, ConvProblem
from . import dilation, padding, registry
from .traits import Count
from .transforms import phase_split

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


def _impl(algo: str, backend: str) -> registry.Implementation | None:
    """`algo`'s implementation on `backend`, or None where it has none (counted as written)."""
    try:
        return registry.get(algo, backend)
    except ValueError:
        return None


def _route(algo: str, p: ConvProblem, pass_: str, precision: str, backend: str
           ) -> tuple[ConvProblem, tuple[int, int, int, int], int]:
    """(the problem the implementation of `algo` runs for `p`, the explicit pad (left, right,
    top, bottom) before it, the bytes of the copies leading there): a dilated `p` as its
    undilated phases where the implementation splits dilation (`registry.DilationSplit`);
    `p` padded alike after an explicit pad where `p` is padded unequally and the implementation
    pads both sides alike (`registry.ExplicitPad.route`); else `p`."""
    impl, spent = _impl(algo, backend), 0
    if isinstance(impl, registry.DilationSplit):
        p, split = impl.undilated(p)
        impl = impl.inner
        spent = 0 if split is None else dilation.workspace_bytes(split, precision)
    if not p.asymmetric or not isinstance(impl, registry.ExplicitPad):
        return p, (0, 0, 0, 0), spent
    padded, explicit, _ = impl.route(p, pass_, "nchw", precision)
    return padded, explicit, spent + padding.explicit_bytes(p, precision, explicit)


def _column_elements(p: ConvProblem) -> int:
    """Elements of the im2col matrix: one row of C·R·S per output pixel."""
    return p.n * p.p * p.q * p.c * p.r * p.s


@dataclass(frozen=True)
class DirectCount(Count):
    """The direct convolution's flops; nothing beyond the operands."""

    def ops(self, algo, problem, pass_, precision, backend) -> OpCount:
        return OpCount(products=problem.flops, multiplications=problem.flops // 2)

    def workspace(self, algo, problem, pass_, precision, backend) -> int:
        return 0


@dataclass(frozen=True)
class GemmCount(Count):
    """The direct flops as matrix products, col2im's scatter-adds for bwd_data, and the im2col
    column matrix written and read once."""

    def ops(self, algo, problem, pass_, precision, backend) -> OpCount:
        p, cols = problem, _column_elements(problem)
        return OpCount(products=p.flops, multiplications=p.flops // 2,
                       transforms=cols if pass_ == "bwd_data" else 0,  # col2im's scatter-adds
                       lowering_bytes=2 * cols * ELEMENT_BYTES[precision])

    def workspace(self, algo, problem, pass_, precision, backend) -> int:
        return _column_elements(problem) * ELEMENT_BYTES[precision]


class _PadsAlike(Count):
    """The count of an implementation that pads both sides alike (and splits dilation): a
    problem is counted as the problem it runs (`_route`: its undilated phases, after an
    explicit pad), and the copies leading there add to its workspace. Subclasses count
    undilated problems padded alike (`symmetric_ops`, `symmetric_workspace`)."""

    def ops(self, algo, problem, pass_, precision, backend) -> OpCount | None:
        padded = _route(algo, problem, pass_, precision, backend)[0]
        return self.symmetric_ops(algo, padded, pass_, precision, backend)

    def workspace(self, algo, problem, pass_, precision, backend) -> int | None:
        padded, _, copies = _route(algo, problem, pass_, precision, backend)
        spent = self.symmetric_workspace(algo, padded, pass_, precision, backend)
        return spent if spent is None else spent + copies

    @abc.abstractmethod
    def symmetric_ops(self, algo: str, p: ConvProblem, pass_: str, precision: str,
                      backend: str) -> OpCount | None:
        """`ops` of a problem padded alike on both sides."""

    @abc.abstractmethod
    def symmetric_workspace(self, algo: str, p: ConvProblem, pass_: str, precision: str,
                            backend: str) -> int | None:
        """`workspace` of a problem padded alike on both sides."""


def fft_grid(p: ConvProblem, pass_: str, algo: str, backend: str) -> tuple[int, int, int]:
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


@dataclass(frozen=True)
class FFTCount(_PadsAlike):
    """Real-to-complex transforms of every plane on the implementation's grid, and complex
    multiply-adds per spectrum bin summed over channels; the spectra as workspace."""

    def symmetric_ops(self, algo, p, pass_, precision, backend) -> OpCount:
        grid = fft_grid(p, pass_, algo, backend)
        th, tw, tiles = grid
        planes, bins = _fft_planes(p, grid)
        points = th * tw
        transforms = round(planes * _RFFT_FLOPS_PER_POINT_LOG * points * math.log2(points))
        macs = p.n * p.k * p.cg * tiles * bins  # complex multiply-adds, summed over channels
        return OpCount(products=8 * macs, multiplications=4 * macs, transforms=transforms)

    def symmetric_workspace(self, algo, p, pass_, precision, backend) -> int:
        planes, bins = _fft_planes(p, fft_grid(p, pass_, algo, backend))
        return planes * bins * 2 * ELEMENT_BYTES[precision]


def _winograd_applies(p: ConvProblem) -> bool:
    """Where the Winograd implementations run (they refuse everything else)."""
    return (p.r == p.s and p.r in (3, 5) and p.stride == 1 and p.dilation == 1 and p.groups == 1
            and not isinstance(p.pad, tuple))


def _winograd_problem(algo: str, p: ConvProblem, backend: str) -> ConvProblem | None:
    """The stride-1 problem Winograd's tiles run for `p`: `p` itself, or its phase split where
    the implementation on `backend` runs strided problems that way (the CPU's); None where it
    does not run."""
    impl = _impl(algo, backend)
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


def _winograd(p: ConvProblem, pass_: str, m: int, filters: bool = True) -> OpCount:
    """`filters`: the fwd or bwd_data filter transform counted (not where it is done once)."""
    r, a = p.r, m + p.r - 1
    tiles = _winograd_tiles(p, pass_, m)
    if pass_ == "bwd_filter":
        # F(3×3, m×m): x tiles a×a and dy tiles m×m in, one a×a -> 3×3 output per filter.
        transforms = (p.n * p.c * tiles * _sandwich(a, a) + p.n * p.k * tiles * _sandwich(a, m)
                      + p.k * p.cg * _sandwich(r, a))
    else:
        src, dst = (p.c, p.k) if pass_ == "fwd" else (p.k, p.c)
        transforms = (p.n * src * tiles * _sandwich(a, a)
                      + filters * p.k * p.cg * _sandwich(a, r)
                      + p.n * dst * tiles * _sandwich(m, a))
    mults = a * a * p.n * p.k * p.cg * tiles
    return OpCount(products=2 * mults, multiplications=mults, transforms=transforms)


@dataclass(frozen=True)
class WinogradCount(_PadsAlike):
    """F(m×m, r×r) on m×m output tiles: alpha² products per tile and channel pair, the input,
    filter and output transforms as dense matrix products; the transformed tiles and filters as
    workspace. `fused`: one kernel does the forward form (no weight gradient to count), and only
    the transformed filters leave it."""

    m: int
    fused: bool = False
    #: the filters transformed once for every call (an inference variant): not counted
    filters_once: bool = False

    def symmetric_ops(self, algo, p, pass_, precision, backend) -> OpCount | None:
        if self.fused and pass_ == "bwd_filter":
            return None  # no fused weight gradient
        tiled = _winograd_problem(algo, p, backend)
        return None if tiled is None else _winograd(tiled, pass_, self.m,
                                                    filters=not self.filters_once)

    def symmetric_workspace(self, algo, p, pass_, precision, backend) -> int | None:
        elem = ELEMENT_BYTES[precision]
        if self.fused and _winograd_applies(p):
            if pass_ == "bwd_filter":
                return None
            a = self.m + p.r - 1  # only the transformed filters leave the kernel
            return p.k * p.cg * a * a * elem
        tiled = _winograd_problem(algo, p, backend)
        if tiled is None:
            return None
        a, tiles = self.m + tiled.r - 1, _winograd_tiles(tiled, pass_, self.m)
        return (tiled.n * (tiled.c + tiled.k) * tiles + tiled.k * tiled.cg) * a * a * elem
