"""`gemm` on the CPU: explicit im2col and one matrix product — Caffe's convolution.

The input is lowered into a column matrix holding, for every output position, the R·S·C/groups
input values its filter taps see; each pass is then one BLAS product:

- fwd:        y  = W · col
- bwd_data:   col = Wᵀ · dy, then dx = col2im(col) (overlapping windows add up)
- bwd_filter: dw = dy · colᵀ

The column matrix follows the layout, as implicit-GEMM kernels do: nchw lowers to
(C/g·R·S) × (P·Q) per image (Caffe), nhwc to (N·P·Q) × (R·S·C/g) per group, the reduction
running over (r, s, c) with c fastest, so nhwc's copies move contiguous channel vectors. In nchw
the images are separate blocks of the product (a batched matmul, one call), except in bwd_filter,
where the images are summed: one product per image, each added into dw by BLAS (beta = 1).

Why it is built this way (measured on a 2-core AVX-512 Xeon, AlexNet at batch 8):

- im2col is one strided copy in either layout: the input, padded once into a buffer whose zero
  border is written in `prepare`, is viewed with `as_strided` as (N, C, R, S, P, Q) or
  (groups, N, P, Q, R, S, C/g) — a window per tap and position — and copied whole into the
  column buffer. A copy per tap (121 of them for conv1's 11x11 filter, each of 3-channel vectors
  in nhwc) made conv1's nhwc im2col 3x slower than its nchw one.
- The copies run on torch tensors sharing the NumPy buffers (zero-copy): torch's copies use
  every thread of the run's policy (`threads.count()`). col2im stays a NumPy add per tap (each
  one small: a threaded call would cost more to start than to run).
- Groups are one batched product over a (G, ·, ·) view of the columns, the filter and the
  output (nchw: (N, G, ·, ·)), never a Python loop of one product per group: a grouped layer
  of 32 groups is one call, and a depthwise one (G = C) too.
- A pointwise layer (1x1, stride 1, no padding) has no lowering: x in either layout already is
  its column matrix, so the products read x and write dx in place (`in_place`); a strided
  1x1 keeps its im2col, a copy of the pixels it reads.
- The products go through `products.Route`: each on the faster, for its shape on this machine,
  of torch's MKL and NumPy's OpenBLAS (which one wins depends on both), writing into the
  column buffer or the output in either; the row's note names the library they ran on. The
  sums into dw (nchw's per-image products, the blocks after the first) run on torch, whose
  product alone adds into its output.
- nhwc's fwd and bwd_filter on large images lower and multiply a block of images at a time
  (`images_per_block`): the block's columns are still in cache when its product reads them,
  where the whole matrix (33.5 MiB for conv1) went out to memory and back. One phase then,
  `FUSED`; the row's note gives the block.

The column buffer (and the padded input) are allocated in `prepare`, on 2 MiB transparent huge
pages where the kernel offers them (`_lowering.workspace`); their sizes are
`workspace_bytes` — the memory cost that makes this algorithm notable.
"""

from __future__ import annotations

import numpy as np

from ..core.problem import ConvProblem
from ..machine import threads
from ._lowering import (
    axis_pairs,
    nbytes,
    pages_note,
    scatter_add,
    tensor,
    windows,
    workspace,
)
from .counts import GemmCount
from .phases import FUSED, OPERAND_NAMES, Phased
from .products import Route, note
from .reference import DTYPES
from .registry import Implementation, register
from .traits import Algorithm


def _padded_shape(p: ConvProblem, pass_: str, layout: str) -> tuple[int, ...] | None:
    """The zero-bordered input im2col reads, in `layout`; None where there is no padding, or no
    im2col (bwd_data runs col2im alone, into dx)."""
    if not any((p.pad_top, p.pad_bottom, p.pad_left, p.pad_right)) or pass_ == "bwd_data":
        return None
    # Padding after may be smaller than before (or leave rows unread): the strided windows read
    # no further than the output size allows, so the buffer holds what after adds, if anything.
    hp = p.pad_top + p.h + max(p.pad_bottom, 0)
    wp = p.pad_left + p.w + max(p.pad_right, 0)
    return (p.n, p.c, hp, wp) if layout == "nchw" else (p.n, hp, wp, p.c)


def in_place(p: ConvProblem) -> bool:
    """A pointwise layer (1x1, stride 1, no padding) whose activation is its own column matrix:
    the products read x (write dx) in place, with no im2col (col2im) at all."""
    return (p.r == p.s == 1 and p.stride_h == p.stride_w == 1
            and not any((p.pad_top, p.pad_bottom, p.pad_left, p.pad_right)))


class _Lowered:
    """The column buffer of one problem in one layout, the padded input it is copied from, and
    the batched views the products use: every group in one product, over a (G, ·, ·) view
    (nchw: (N, G, ·, ·)), never a product per group. A pointwise layer (`in_place`) has no
    buffer: its columns are views of the activation."""

    def __init__(self, problem: ConvProblem, pass_: str, layout: str, dtype,
                 images: int | None = None):
        import torch

        p = problem
        self.layout, self.problem = layout, p
        #: Images the column buffer holds: all of them, or one block of the blocked passes.
        self.images = n = images or p.n
        self.in_place = in_place(p)
        padded = None if self.in_place else _padded_shape(p, pass_, layout)
        self.padded = None if padded is None else torch.from_numpy(workspace(padded, dtype))
        self.col = self.indexed = None
        if self.in_place:
            pass
        elif layout == "nchw":
            self.col = torch.from_numpy(workspace((p.n, p.c, p.r, p.s, p.p, p.q), dtype))
            self.indexed = self.col.numpy()
        else:
            # Group-major, so each group's (N·P·Q) × (R·S·C/g) matrix is one contiguous block;
            # col2im's windows index it as (N, P, Q, R, S, G, C/g), x viewed as N,H,W,G,C/g.
            self.col = torch.from_numpy(workspace((p.groups, n, p.p, p.q, p.r, p.s, p.cg),
                                                 dtype))
            self.indexed = self.col.numpy().transpose(1, 2, 3, 4, 5, 0, 6)
        rows = axis_pairs(p.r, p.dil_h, p.p, p.h, p.stride_h, p.pad_top)
        cols = axis_pairs(p.s, p.dil_w, p.q, p.w, p.stride_w, p.pad_left)
        self.windows = windows(rows, cols, layout, taps_first=layout == "nchw")

    def columns(self, act=None):
        """The column matrices of every group, batched: (N, G, C/g·R·S, P·Q) in nchw, (G,
        N·P·Q, R·S·C/g) in nhwc; a view of `act` (x, or dx) where the layer is `in_place`."""
        p = self.problem
        if self.in_place:
            if self.layout == "nchw":
                return act.reshape(p.n, p.groups, p.cg, p.h * p.w)
            return act.reshape(-1, p.groups, p.cg).permute(1, 0, 2)
        if self.layout == "nchw":
            return self.col.reshape(p.n, p.groups, p.cg * p.r * p.s, p.p * p.q)
        return self.col.reshape(p.groups, self.images * p.p * p.q, -1)

    def pad(self, x):
        """The input im2col reads: x, or x copied into the interior of the zero-bordered
        buffer."""
        p = self.problem
        if self.padded is None:
            return x
        h, w = (2, 3) if self.layout == "nchw" else (1, 2)
        interior = [slice(None)] * 4
        interior[h], interior[w] = (slice(p.pad_top, p.pad_top + p.h),
                                    slice(p.pad_left, p.pad_left + p.w))
        self.padded[tuple(interior)].copy_(x)
        return self.padded

    def im2col(self, src, first: int = 0, count: int | None = None) -> None:
        """One copy of every tap's window of `src` (what `pad` returned) into the column
        buffer: of `count` images from `first` on (all the buffer holds by default)."""
        import torch

        p = self.problem
        if self.in_place:
            return
        count = count or self.images
        if self.layout == "nchw":
            sn, sc, sh, sw = src.stride()
            size = (p.n, p.c, p.r, p.s, p.p, p.q)
            stride = (sn, sc, p.dil_h * sh, p.dil_w * sw, p.stride_h * sh, p.stride_w * sw)
        else:
            sn, sh, sw, sc = src.stride()
            size = (p.groups, count, p.p, p.q, p.r, p.s, p.cg)
            stride = (p.cg * sc, sn, p.stride_h * sh, p.stride_w * sw, p.dil_h * sh,
                      p.dil_w * sw, sc)
        dest = self.col if count == self.images else self.col[:, :count]  # nhwc's blocks
        dest.copy_(torch.as_strided(src, size, stride, src.storage_offset() + first * sn))

    def block(self, count: int):
        """Every group's (count·P·Q) × (R·S·C/g) matrix of the first `count` images the buffer
        holds (nhwc), batched: (G, count·P·Q, R·S·C/g)."""
        p = self.problem
        return self.col[:, :count].reshape(p.groups, count * p.p * p.q, -1)

    def col2im(self, dx: np.ndarray) -> None:
        """dx as the sum of every tap's window of the column buffer (overlaps add up); in
        place, the product wrote dx itself."""
        p = self.problem
        if self.in_place:
            return
        act = dx if self.layout == "nchw" else dx.reshape(p.n, p.h, p.w, p.groups, p.cg)
        scatter_add(self.indexed, act, self.windows)

    def filters(self, w):
        """The (K/g) × (reduction) filter matrices of every group, batched: (G, K/g, ·), a view
        of w or dw."""
        return w.reshape(self.problem.groups, self.problem.k // self.problem.groups, -1)

    def output_side(self, a):
        """y or dy, batched over the groups: (N, G, K/g, P·Q) in nchw, (G, N·P·Q, K/g) in nhwc
        (strided: the groups' channels sit side by side in each row)."""
        p = self.problem
        kg = p.k // p.groups
        if self.layout == "nchw":
            return a.reshape(p.n, p.groups, kg, -1)
        return a.reshape(-1, p.groups, kg).permute(1, 0, 2)


#: The largest column block the blocked passes lower at a time.
BLOCK_BYTES = 8 << 20
#: The fewest output positions per image (rows of its product) for which a pass is blocked.
BLOCK_MIN_ROWS = 1024


def images_per_block(p: ConvProblem, pass_: str, layout: str, precision: str) -> int:
    """Images im2col lowers at a time: all of them, except in nhwc's fwd and bwd_filter with
    large images (`BLOCK_MIN_ROWS` output positions or more), where a column matrix larger
    than `BLOCK_BYTES` is lowered and multiplied a block of images at a time (at least one).

    Measured on a 2-core AVX-512 Xeon (AlexNet, batch 8, side by side): blocks of one image
    made conv1 (55x55 outputs) fwd 9.7 -> 9.0 ms and bwd_filter 10.4 -> 9.6 in `make bench`;
    on conv2 (27x27) blocks were within noise (fwd 0.99x, bwd_filter 1.04x with torch-cpu
    1.02x slower in the same run), and on conv3-conv5 (13x13) every block size was as fast or
    up to 8% slower: there the product is most of the time, and its fewer rows per call are
    what MKL runs slower."""
    if (layout != "nhwc" or pass_ == "bwd_data" or p.p * p.q < BLOCK_MIN_ROWS
            or in_place(p)):
        return p.n
    per_image = nbytes(p.p * p.q * p.r * p.s * p.c, precision)
    return max(1, min(p.n, BLOCK_BYTES // per_image))


def _blocked(low: _Lowered, pass_: str, route: Route):
    """The blocked nhwc pass (fwd or bwd_filter): per block of images, im2col into the block's
    columns, then that block's rows of the product (fwd: its rows of y; bwd_filter: its share
    of the sum over images, added into dw by BLAS with beta = 1 after the first)."""
    p, block = low.problem, low.images
    rows = p.p * p.q

    def fused(a, b, out):
        src = low.pad(tensor(np.ascontiguousarray(a)))
        other = tensor(np.ascontiguousarray(b))
        # fwd's (y rows, filter), bwd_filter's (dy rows, dw), every group batched
        if pass_ == "fwd":
            side, wg = low.output_side(tensor(out)), low.filters(other)
        else:
            side, wg = low.output_side(other), low.filters(tensor(out))
        for first in range(0, p.n, block):
            count = min(block, p.n - first)
            low.im2col(src, first, count)
            lo, hi = first * rows, (first + count) * rows
            if pass_ == "fwd":
                route.matmul(low.block(count), wg.transpose(-1, -2), side[:, lo:hi])
            elif first == 0:
                route.matmul(side[:, lo:hi].transpose(-1, -2), low.block(count), wg)
            else:
                route.addmm(wg, side[:, lo:hi].transpose(-1, -2), low.block(count))
    return fused


#: The convolution as matrix products over im2col's columns: exact, the direct flops.
GEMM = Algorithm("gemm", family="gemm", origin="ours", tolerance="exact", reduction="none",
                 counts=GemmCount(), deterministic=True)


@register(GEMM, "numpy")
class GemmCPU(Implementation):
    precisions = ("fp64", "fp32")
    asymmetric_pad = True  # im2col reads padding before; the output size holds the rest

    def supports(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        return None

    def describe(self, problem, pass_, layout, precision) -> str:
        p, block = problem, images_per_block(problem, pass_, layout, precision)
        if block < p.n:
            size = nbytes(block * p.p * p.q * p.r * p.s * p.c, precision) / 2**20
            lowering = (f"im2col and product in blocks of {block} image{'s' * (block > 1)} "
                        f"({size:.1f} MiB of columns)")
        elif in_place(p):
            lowering = "pointwise: the activation is the column matrix (no im2col)"
        else:
            lowering = "im2col: one strided copy"
        if p.groups > 1:
            lowering += f"; {p.groups} groups in one batched product"
        pages = pages_note(self.workspace_bytes(problem, pass_, layout, precision))
        products = note((self.algo, problem, pass_, layout, precision))
        return (f"{lowering}; {products}, {threads.count()} threads"
                + (f"; {pages}" if pages else ""))

    def workspace_bytes(self, problem: ConvProblem, pass_: str, layout: str,
                        precision: str) -> int:
        """Bytes of the im2col buffer (every pass lowers the input or dx once, the blocked
        passes a block of images at a time) and, where there is padding, of the zero-bordered
        input it is copied from (fwd, bwd_filter); none for a pointwise layer (`in_place`)."""
        p = problem
        if in_place(p):
            return 0
        images = images_per_block(p, pass_, layout, precision)
        col = images * p.c * p.r * p.s * p.p * p.q
        padded = _padded_shape(p, pass_, layout)
        return nbytes(col + (int(np.prod(padded)) if padded else 0), precision)

    def phases(self, problem, pass_, layout, precision) -> list[str]:
        """im2col is the transform of x (fwd, bwd_filter), col2im the inverse into dx
        (bwd_data); the product between. A blocked pass alternates them block by block: one
        phase, `FUSED`. A pointwise layer (`in_place`) is its product alone."""
        a, _, out = OPERAND_NAMES[pass_]
        if in_place(problem):
            return ["product"]
        if pass_ == "bwd_data":
            return ["product", f"inverse {out}"]
        if images_per_block(problem, pass_, layout, precision) < problem.n:
            return [FUSED]
        return [f"transform {a}", "product"]

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        route = Route((self.algo, problem, pass_, layout, precision))
        block = images_per_block(problem, pass_, layout, precision)
        low = _Lowered(problem, pass_, layout, DTYPES[precision], block)
        nchw = layout == "nchw"
        if block < problem.n:
            return Phased({FUSED: _blocked(low, pass_, route)})

        def im2col(x, b, out):
            low.im2col(low.pad(tensor(np.ascontiguousarray(x))))

        def col2im(dy, w, out):
            low.col2im(out)

        # Every group in one batched product (nchw: batched over the images too).
        if pass_ == "fwd":
            def product(x, w, out):
                wg = low.filters(tensor(np.ascontiguousarray(w)))
                cols = low.columns(tensor(np.ascontiguousarray(x)))
                if nchw:  # (K/g × CRS/g) · (CRS/g × PQ) per image and group
                    route.matmul(wg, cols, low.output_side(tensor(out)))
                else:  # (NPQ × RSC/g) · (RSC/g × K/g) per group
                    route.matmul(cols, wg.transpose(-1, -2), low.output_side(tensor(out)))
            steps = (product,) if low.in_place else (im2col, product)
        elif pass_ == "bwd_data":
            def product(dy, w, out):
                dys = low.output_side(tensor(np.ascontiguousarray(dy)))
                wg = low.filters(tensor(np.ascontiguousarray(w)))
                cols = low.columns(tensor(out))
                if nchw:
                    route.matmul(wg.transpose(-1, -2), dys, cols)
                else:
                    route.matmul(dys, wg, cols)
            steps = (product,) if low.in_place else (product, col2im)
        else:
            def product(x, dy, out):
                dys = low.output_side(tensor(np.ascontiguousarray(dy)))
                dwg = low.filters(tensor(out))
                cols = low.columns(tensor(np.ascontiguousarray(x)))
                if nchw:  # one product per image, each added into dw by BLAS
                    route.matmul(dys[0], cols[0].transpose(-1, -2), dwg)
                    for i in range(1, len(cols)):
                        route.addmm(dwg, dys[i], cols[i].transpose(-1, -2))
                else:  # (K/g × NPQ) · (NPQ × RSC/g) per group
                    route.matmul(dys.transpose(-1, -2), cols, dwg)
            steps = (product,) if low.in_place else (im2col, product)
        return Phased(dict(zip(self.phases(problem, pass_, layout, precision), steps)))
