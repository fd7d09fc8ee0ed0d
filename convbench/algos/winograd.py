"""`winograd-2x2`, `-4x4`, `-5x5`, `-6x6`: F(m×m, 3×3) Winograd convolution on the CPU.

Structured like cuDNN's WINOGRAD_NONFUSED, one pass over memory per stage, each stage a phase
(`convbench.phases`):

1. transform: input tiles (alpha×alpha every m, alpha = m + 2) by Bᵀ d B, filters by G g Gᵀ;
2. product: one GEMM per frequency position over channels, all alpha² of them in one batched
   call;
3. inverse: Aᵀ M A on every tile, the tiles written straight into the output, partial edge tiles
   cropped.

Why it is built this way (measured on a 2-core AVX-512 Xeon, AlexNet conv3, batch 8):

- Every array operation runs on torch tensors that share the NumPy buffers (`torch.from_numpy`,
  zero-copy): the batched product through torch's MKL runs ~370 GFLOP/s where NumPy's OpenBLAS
  `matmul` reached ~200 (36 GEMMs of 128×256×384: 2.4 ms instead of 4.6), and torch's copies and
  GEMMs use every thread of the run's policy (`threads.count()`, set in torch by `threads.use`)
  where NumPy's copies use one. Only BLAS and strided copies are borrowed, never a convolution.
- A data transform is one copy gathering every tile (a strided window view, no loop over tiles)
  and two GEMMs with the small Bᵀ (rows of every tile at once, then columns): ~12 multiply-adds
  per tile element where Bᵀ⊗Bᵀ would take alpha², in the same time. The inverse is one GEMM
  with Aᵀ⊗Aᵀ: it shrinks the tiles, so one pass over the products beats two.
- The filter transform is one GEMM with the Kronecker product G⊗G (alpha² × r²) on the filters
  seen as r² × (K·C): a single pass writing the alpha²·K·C transformed filters, which dominate its
  memory traffic (twice as fast as the two-stage form, whose intermediate is as large).
- Every buffer is on 2 MiB transparent huge pages where the kernel offers them
  (`_lowering.workspace`): between two calls other work evicts the buffers, and a cold call
  then walked the page tables for each 4 KiB page (5% of the pass on conv3-conv5).
- The inverse writes whole tiles straight into the output (up to four rectangles: whole tiles,
  and the partial tiles of the bottom and right edges), without a tile-aligned buffer to crop.

Input tiles are gathered channels last in both layouts (an nchw input is transposed by the copy
that pads it anyway), so the gather copies contiguous channel vectors; the products are ordered
so they land in the output's own order — (K×C)·(C×T) for nchw, (T×C)·(C×K) for nhwc — and
transposed operands reach BLAS as flags, not copies.

bwd_data is the same machinery on dy padded by r-1-pad, with the filter rotated 180° (G's
columns reversed) and K/C swapped (the transformed filter transposed). bwd_filter is Winograd in
the weight-gradient form: dw[k, c] sums, over the batch and the m×m tiles of dy, the correlation
of an x tile with a dy tile — F(3, m) with the dy tile as the filter, F(3x3, m×m); the sum over
tiles and batch is the per-frequency GEMM (K×tiles)·(tiles×C).
"""

from __future__ import annotations

import itertools

import numpy as np

from .. import threads
from ..phases import Phased, phase_names
from ..problem import FILTER_LAYOUT, ConvProblem, pair_text
from ..reference import DTYPES
from ..registry import Implementation, register
from ..transforms import winograd_matrices
from ._lowering import pages_note, tensor, workspace

_R = 3  # the filter size the GPU kernels take
#: Filter sizes the CPU passes take: 5x5 too, as cuDNN's WINOGRAD_NONFUSED does — F(4x4, 5x5)
#: does a fifth of a direct 5x5 convolution's multiplications (AlexNet's conv2) — except with
#: 6x6 tiles: F(6x6, 5x5)'s alpha = 10 needs the points ±3, and its fp32 error reached 2.5e-4
#: on AlexNet's conv2 (F(4x4, 5x5): 6e-6), too large to call a convolution.
CPU_FILTER_SIZES = (3, 5)
#: Physical axis order of the product and output tiles: the layout's, with tile counts for h, w.
_TILE_ORDER = {"nchw": "cnhw", "nhwc": "nhwc"}


def _torch():
    import torch

    return torch


def _order(labels: str, dst: str) -> list[int]:
    """The permutation taking axes labelled by `labels` to the order `dst`."""
    return [labels.index(label) for label in dst]


def _tile_counts(extent: tuple[int, int], m: int) -> tuple[int, int]:
    return tuple(-(-e // m) for e in extent)


class _Sandwich:
    """mat·X·matᵀ for a stack of matrices X laid out (rows, cols, ...), into buffers made once.

    Separable, so two GEMMs over the whole stack: mat times every X's rows at once, then mat
    applied, batched, to each transformed row — a half to a third of the work of one GEMM with
    mat ⊗ mat, and as fast as it for the square Bᵀ (the data transforms)."""

    def __init__(self, mat: np.ndarray, rest: tuple[int, ...], dtype):
        torch = _torch()
        out_rows, cols = mat.shape
        self.mat = torch.from_numpy(np.array(mat, order="C"))
        self.mid = torch.from_numpy(workspace((out_rows, cols) + rest, dtype))
        self.out = torch.from_numpy(workspace((out_rows, out_rows) + rest, dtype))

    @property
    def nbytes(self) -> int:
        return (self.mid.numel() + self.out.numel()) * self.mid.element_size()

    def __call__(self, src):
        torch = _torch()
        out_rows, cols = self.mat.shape
        torch.matmul(self.mat, src.reshape(cols, -1), out=self.mid.view(out_rows, -1))
        torch.matmul(self.mat, self.mid.view(out_rows, cols, -1),
                     out=self.out.view(out_rows, out_rows, -1))
        return self.out


class _Kron:
    """mat·X·matᵀ for a stack of alpha×alpha matrices X laid out (alpha, alpha, ...), as one GEMM
    with mat ⊗ mat: for the wide Aᵀ of the inverse transforms, which shrink alpha² values to m²
    (or r²), one pass over the products beats two (measured 0.48 against 0.84 ms on AlexNet
    conv3's output tiles). The result is (m, m, ...), or with `last` (..., m, m): written
    transposed (Xᵀ·(mat ⊗ mat)ᵀ), which puts the tile innermost for free, so nchw outputs and
    kcrs filters are copied out in runs of whole tile rows rather than element by element."""

    def __init__(self, mat: np.ndarray, rest: tuple[int, ...], dtype, last: bool = False):
        torch = _torch()
        self.kron = torch.from_numpy(np.ascontiguousarray(np.kron(mat, mat)))
        m = mat.shape[0]
        self.last = last
        self.out = torch.from_numpy(workspace((*rest, m, m) if last else (m, m, *rest), dtype))

    @property
    def nbytes(self) -> int:
        return self.out.numel() * self.out.element_size()

    def __call__(self, src):
        torch = _torch()
        src = src.reshape(self.kron.shape[1], -1)
        if self.last:
            torch.matmul(src.t(), self.kron.t(), out=self.out.view(-1, self.kron.shape[0]))
        else:
            torch.matmul(self.kron, src, out=self.out.view(self.kron.shape[0], -1))
        return self.out


class _Padding:
    """Places an activation, channels last, at a spatial offset in a zero buffer sized to whole
    tiles; a negative offset crops. The buffer and its zero border are made once; a call only
    copies the interior (an nchw activation transposed on the way: one pass over the input,
    where gathering tiles straight from nchw's rows reads them element by element, measured 3x
    slower). An nhwc activation needing no zero border is used in place."""

    def __init__(self, shape, layout: str, before: int, sizes: tuple[int, int], dtype):
        size = dict(zip(layout, shape))
        self.perm = _order(layout, "nhwc")
        padded, dst, src = [size[a] for a in "nhwc"], [slice(None)] * 4, [slice(None)] * 4
        needs_zeros = layout != "nhwc"
        for axis, extent in ((1, sizes[0]), (2, sizes[1])):
            start, stop = max(before, 0), min(before + padded[axis], extent)
            padded[axis], dst[axis] = extent, slice(start, stop)
            src[axis] = slice(start - before, stop - before)
            needs_zeros |= stop - start != extent
        self.shape, self.src, self.dst = tuple(padded), tuple(src), tuple(dst)
        self.buf = _torch().from_numpy(workspace(padded, dtype)) if needs_zeros else None

    @property
    def nbytes(self) -> int:
        return 0 if self.buf is None else self.buf.numel() * self.buf.element_size()

    def __call__(self, a):
        a = a.permute(self.perm)
        if self.buf is None:
            return a[self.src]
        self.buf[self.dst].copy_(a[self.src])
        return self.buf


class _TileTransform:
    """mat·tile·matᵀ for every tile of an activation of fixed shape, into buffers made once.

    `labels` name the operand's axes, `order` is the order the result keeps them in; h and w are
    tiled (tiles of mat's column count, every `step`) and become tile counts. The tiles are
    gathered by one copy from a window view and transformed by a `_Sandwich`: the result is
    (alpha, alpha, *order with the tile counts)."""

    def __init__(self, shape, labels: str, order: str, mat: np.ndarray, step: int,
                 counts: tuple[int, int], dtype):
        size = dict(zip(labels, shape))
        size.update(zip("hw", counts))
        tiled = tuple(size[a] for a in order)
        width = mat.shape[1]
        self.perm, self.step, self.width = _order(labels, order), step, width
        self.axes = (order.index("h"), order.index("w"))
        self.gathered = _torch().from_numpy(workspace((width, width) + tiled, dtype))
        self.sandwich = _Sandwich(mat, tiled, dtype)
        # unfold appends the windows' widths as the last two axes; they go first.
        n = len(order)
        self.widths_first = (n, n + 1, *range(n))

    @property
    def nbytes(self) -> int:
        return self.gathered.numel() * self.gathered.element_size() + self.sandwich.nbytes

    def __call__(self, a):
        view = a.permute(self.perm)
        view = view.unfold(self.axes[0], self.width, self.step)
        view = view.unfold(self.axes[1], self.width, self.step)
        self.gathered.copy_(view.permute(self.widths_first))
        return self.sandwich(self.gathered)


class _FilterTransform:
    """G g Gᵀ for every r×r filter, as one GEMM with G⊗G (alpha² × r²): the transformed filters
    as (alpha², K, C). kcrs filters are read in place (a transposed operand); krsc ones are
    first gathered as (r·s, K, C)."""

    def __init__(self, g: np.ndarray, shape, layout: str, dtype):
        torch = _torch()
        self.kron = torch.from_numpy(np.ascontiguousarray(np.kron(g, g)))
        k, c = (dict(zip(FILTER_LAYOUT[layout], shape))[a] for a in "kc")
        self.layout, self.k, self.c = layout, k, c
        self.out = torch.from_numpy(workspace((len(self.kron), k, c), dtype))
        self.r2 = g.shape[1] ** 2
        self.taps = None if layout == "nchw" else \
            torch.from_numpy(workspace((self.r2, k, c), dtype))

    @property
    def nbytes(self) -> int:
        size = self.out.numel() + (0 if self.taps is None else self.taps.numel())
        return size * self.out.element_size()

    def __call__(self, w):
        torch = _torch()
        if self.taps is None:  # kcrs: (K·C, r²), transposed
            src = w.reshape(self.k * self.c, self.r2).t()
        else:  # krsc -> (rs, K, C)
            self.taps.copy_(w.reshape(self.k, self.r2, self.c).permute(1, 0, 2))
            src = self.taps.view(self.r2, -1)
        torch.matmul(self.kron, src, out=self.out.view(len(self.kron), -1))
        return self.out


class _Placement:
    """Output tiles into an activation in `layout`, cropped: the whole tiles as one rectangle
    copy, the partial tiles of the last tile row and column as up to three more. The tiles'
    axes are named by `labels`: i and j (within a tile), n, c, and h, w (tile counts)."""

    def __init__(self, labels: str, layout: str, m: int, extent: tuple[int, int]):
        self.labels, self.m = labels, m
        # per spatial axis: (tile range, rows within the tile) rectangles along it
        self.parts = [[(slice(0, e // m), m)] * (e >= m) +
                      [(slice(e // m, e // m + 1), e % m)] * (e % m > 0) for e in extent]
        dst = "".join(a + {"h": "i", "w": "j"}.get(a, "") for a in layout)
        self.perm = _order(labels, dst)
        self.h, self.w = layout.index("h"), layout.index("w")

    def __call__(self, y, out) -> None:
        m, at = self.m, self.labels.index
        for (th, rows), (tw, cols) in itertools.product(*self.parts):
            idx = [slice(None)] * 6
            idx[at("i")], idx[at("j")], idx[at("h")], idx[at("w")] = (slice(0, rows),
                                                                       slice(0, cols), th, tw)
            src = y[tuple(idx)].permute(self.perm)
            h0, w0 = th.start * m, tw.start * m
            dst = [slice(None)] * 4
            dst[self.h] = slice(h0, h0 + (th.stop - th.start) * rows)
            dst[self.w] = slice(w0, w0 + (tw.stop - tw.start) * cols)
            view = out[tuple(dst)]
            # split h into (tiles, rows) and w into (tiles, cols); w after h, so h's split
            # shifts w's axis by one
            view = view.unflatten(self.h, (th.stop - th.start, rows))
            view = view.unflatten(self.w + 1, (tw.stop - tw.start, cols))
            view.copy_(src)


def _channel_major(t):
    """Transformed channel-last tiles (alpha, alpha, n, tile rows, tile cols, channels) as
    (alpha², channels, tiles), a transposed view."""
    return t.view(t.shape[0] * t.shape[1], -1, t.shape[-1]).transpose(1, 2)


class _TiledOutput:
    """fwd (x, w -> y) and bwd_data (dy, w -> dx) with F(m×m, 3×3): output tiles of m×m, the
    GEMM contracting C for fwd and K for bwd_data.

    bwd_data correlates dy, padded by r-1-pad, with the filter rotated 180° — G's columns
    reversed — and K/C swapped — the transformed filter transposed.
    """

    def __init__(self, problem: ConvProblem, pass_: str, layout: str, m: int, dtype):
        torch = _torch()
        p = problem
        self.pass_, self.layout = pass_, layout
        r = p.r
        t = winograd_matrices(m, r).astype(dtype)
        in_shape, _, out_shape = p.operand_shapes(pass_, layout)
        extent = (p.p, p.q) if pass_ == "fwd" else (p.h, p.w)
        counts = _tile_counts(extent, m)
        before = p.pad if pass_ == "fwd" else r - 1 - p.pad
        self.pad = _Padding(in_shape, layout, before, tuple(c * m + r - 1 for c in counts),
                            dtype)
        self.data = _TileTransform(self.pad.shape, "nhwc", "nhwc", t.BT, m, counts, dtype)
        g = t.G if pass_ == "fwd" else t.G[:, ::-1]
        self.filter = _FilterTransform(g, p.w_shape(layout), layout, dtype)
        self.cout = dict(zip(layout, out_shape))["c"]
        self.cin = dict(zip(layout, in_shape))["c"]
        self.tiles = p.n * counts[0] * counts[1]
        self.alpha2 = t.alpha ** 2
        # the product's order is the output's: (channel, tiles) for nchw, (tiles, channel) nhwc
        size = {"n": p.n, "c": self.cout, "h": counts[0], "w": counts[1]}
        order = _TILE_ORDER[layout]
        self.prod = torch.from_numpy(workspace((self.alpha2, *(size[a] for a in order)), dtype))
        nchw = layout == "nchw"
        self.untransform = _Kron(t.AT, tuple(size[a] for a in order), dtype, last=nchw)
        self.place = _Placement((order + "ij") if nchw else ("ij" + order), layout, m, extent)
        self.v = self.u = None

    @property
    def workspace_bytes(self) -> int:
        return (self.pad.nbytes + self.data.nbytes + self.filter.nbytes
                + self.prod.numel() * self.prod.element_size() + self.untransform.nbytes)

    def gemm_shape(self) -> tuple[int, int, int]:
        """(rows, depth, columns) of each per-frequency GEMM."""
        return ((self.cout, self.cin, self.tiles) if self.layout == "nchw" else
                (self.tiles, self.cin, self.cout))

    def transform_a(self, a, b, out) -> None:
        self.v = _channel_major(self.data(self.pad(tensor(a))))  # (alpha², in ch, tiles)

    def transform_w(self, a, w, out) -> None:
        u = self.filter(tensor(w))
        self.u = u if self.pass_ == "fwd" else u.transpose(1, 2)  # (alpha², out ch, in ch)

    def product(self, a, b, out) -> None:
        torch = _torch()
        prod = self.prod.view(self.alpha2, -1, self.cout if self.layout == "nhwc" else
                              self.tiles)
        if self.layout == "nchw":  # (K×C)·(C×T): the product in (channel, tiles) order
            torch.matmul(self.u, self.v, out=prod)
        else:  # (T×C)·(C×K): in (tiles, channel) order
            torch.matmul(self.v.transpose(1, 2), self.u.transpose(1, 2), out=prod)

    def inverse(self, a, b, out) -> None:
        self.place(self.untransform(self.prod), tensor(out))


class _WeightGradient:
    """bwd_filter (x, dy -> dw) with F(3x3, m×m): dw[k, c] is the sum over batch and dy tiles of
    the correlation of an (m+2)×(m+2) x tile with an m×m dy tile as the filter; the sum is the
    per-frequency GEMM (K×tiles)·(tiles×C)."""

    def __init__(self, problem: ConvProblem, layout: str, m: int, dtype):
        torch = _torch()
        p = problem
        t = winograd_matrices(p.r, m).astype(dtype)
        counts = _tile_counts((p.p, p.q), m)
        self.x_pad = _Padding(p.x_shape(layout), layout, p.pad,
                              tuple(c * m + p.r - 1 for c in counts), dtype)
        self.dy_pad = _Padding(p.y_shape(layout), layout, 0, tuple(c * m for c in counts), dtype)
        self.x = _TileTransform(self.x_pad.shape, "nhwc", "nhwc", t.BT, m, counts, dtype)
        self.dy = _TileTransform(self.dy_pad.shape, "nhwc", "nhwc", t.G, m, counts, dtype)
        self.alpha2 = t.alpha ** 2
        self.prod = torch.from_numpy(workspace((self.alpha2, p.k, p.c), dtype))
        # kcrs: the untransform's transposed form is (K, C, r, s), the filters' own order
        nchw = layout == "nchw"
        self.untransform = _Kron(t.AT, (p.k, p.c), dtype, last=nchw)
        self.perm = _order("kcrs" if nchw else "rskc", FILTER_LAYOUT[layout])
        self.k, self.c, self.tiles = p.k, p.c, p.n * counts[0] * counts[1]
        self.v = self.u = None

    @property
    def workspace_bytes(self) -> int:
        return (self.x_pad.nbytes + self.dy_pad.nbytes + self.x.nbytes + self.dy.nbytes
                + self.prod.numel() * self.prod.element_size() + self.untransform.nbytes)

    def gemm_shape(self) -> tuple[int, int, int]:
        return (self.k, self.tiles, self.c)

    def transform_a(self, x, dy, out) -> None:
        self.v = _channel_major(self.x(self.x_pad(tensor(x))))  # (alpha², C, tiles)

    def transform_w(self, x, dy, out) -> None:
        self.u = _channel_major(self.dy(self.dy_pad(tensor(dy))))  # (alpha², K, tiles)

    def product(self, x, dy, out) -> None:
        _torch().matmul(self.u, self.v.transpose(1, 2), out=self.prod)

    def inverse(self, x, dy, out) -> None:
        tensor(out).copy_(self.untransform(self.prod).permute(self.perm))


class Winograd(Implementation):
    """F(m×m, r×r) for square `filter_sizes` filters, stride 1, dense, one padding for both
    axes; subclasses set `m`. The GPU kernels (`winograd_kernels`) subclass it too, so both
    refuse the same problems alike (the kernels take 3x3 only)."""

    m: int
    precisions = ("fp64", "fp32")
    filter_sizes: tuple[int, ...] = (_R,)

    def supports(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        p = problem
        sizes = " or ".join(f"{r}x{r}" for r in self.filter_sizes)
        for ok, need, got in ((p.r == p.s and p.r in self.filter_sizes, f"{sizes} filters",
                               f"{p.r}x{p.s}"),
                              (p.stride == 1, "stride 1", pair_text(p.stride)),
                              (p.dilation == 1, "dilation 1", pair_text(p.dilation)),
                              # its tiles and kernels take one padding for both axes
                              (not isinstance(p.pad, tuple), "one padding for both axes",
                               f"pad {pair_text(p.pad)}"),
                              (p.groups == 1, "groups 1", p.groups)):
            if not ok:
                return f"{self.algo} needs {need} (got {got})"
        return None

    def describe(self, problem, pass_, layout, precision) -> str:
        m, r = self.m, problem.r
        tile = f"F({r}x{r}, {m}x{m})" if pass_ == "bwd_filter" else f"F({m}x{m}, {r}x{r})"
        return f"{tile}, {(m + r - 1) ** 2} batched GEMMs"


class WinogradCPU(Winograd):
    """The NumPy-backend passes: `_TiledOutput` and `_WeightGradient`, in four phases."""

    filter_sizes = CPU_FILTER_SIZES

    def _pass(self, problem, pass_, layout, precision):
        dtype = DTYPES[precision]
        if pass_ == "bwd_filter":
            return _WeightGradient(problem, layout, self.m, dtype)
        return _TiledOutput(problem, pass_, layout, self.m, dtype)

    def describe(self, problem, pass_, layout, precision) -> str:
        run = self._pass(problem, pass_, layout, precision)
        rows, depth, cols = run.gemm_shape()
        pages = pages_note(run.workspace_bytes)
        return (f"{super().describe(problem, pass_, layout, precision)} "
                f"({rows}x{depth})·({depth}x{cols}), MKL through torch, "
                f"{threads.count()} threads" + (f"; {pages}" if pages else ""))

    def workspace_bytes(self, problem: ConvProblem, pass_: str, layout: str,
                        precision: str) -> int:
        """Bytes of the buffers a prepared pass holds beyond its operands: padded inputs,
        gathered and transformed tiles and filters, the per-frequency products, output tiles.
        (Allocated untouched, so asking costs no memory traffic.)"""
        return self._pass(problem, pass_, layout, precision).workspace_bytes

    def phases(self, problem, pass_, layout, precision) -> list[str]:
        return phase_names(pass_)

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        run = self._pass(problem, pass_, layout, precision)
        steps = (run.transform_a, run.transform_w, run.product, run.inverse)
        return Phased(dict(zip(phase_names(pass_), steps)))


@register("winograd-2x2", "numpy")
class Winograd2x2(WinogradCPU):
    m = 2


@register("winograd-4x4", "numpy")
class Winograd4x4(WinogradCPU):
    m = 4


@register("winograd-5x5", "numpy")
class Winograd5x5(WinogradCPU):
    """F(5x5, 3x3), alpha 7: on 13x13 outputs (AlexNet's conv3-conv5) its tiles cover 15x15
    where F(4x4)'s cover 16x16, so 49/25·(15/13)² = 2.61 multiplications per output against
    3.41 (measured 5-9% faster than winograd-4x4 there). 3x3 filters only: F(5x5, 5x5) needs
    alpha 9, past 6x6's points."""

    m = 5
    filter_sizes = (3,)


@register("winograd-6x6", "numpy")
class Winograd6x6(WinogradCPU):
    m = 6
    filter_sizes = (3,)
