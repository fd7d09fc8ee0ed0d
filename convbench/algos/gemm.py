"""`gemm` on the CPU: explicit im2col and one matrix product per group — Caffe's convolution.

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
    span,
    tensor,
    windows,
    workspace,
)
from .phases import FUSED, OPERAND_NAMES, Phased
from .products import Route, note
from .reference import DTYPES
from .registry import Implementation, register


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


class _Lowered:
    """The column buffer of one problem in one layout, the padded input it is copied from, and
    per group the channel-major batched matrices the products use."""

    def __init__(self, problem: ConvProblem, pass_: str, layout: str, dtype,
                 images: int | None = None):
        import torch

        p = problem
        self.layout, self.problem = layout, p
        #: Images the column buffer holds: all of them, or one block of the blocked passes.
        self.images = n = images or p.n
        padded = _padded_shape(p, pass_, layout)
        self.padded = None if padded is None else torch.from_numpy(workspace(padded, dtype))
        kg = p.k // p.groups
        if layout == "nchw":
            self.col = torch.from_numpy(workspace((p.n, p.c, p.r, p.s, p.p, p.q), dtype))
            self.indexed = self.col.numpy()
            # per group: (N, C/g·R·S, P·Q)
            self.matrices = [self.col[:, span(g, p.cg)].reshape(p.n, -1, p.p * p.q)
                             for g in range(p.groups)]
        else:
            # Group-major, so each group's (N·P·Q) × (R·S·C/g) matrix is one contiguous block;
            # col2im's windows index it as (N, P, Q, R, S, G, C/g), x viewed as N,H,W,G,C/g.
            self.col = torch.from_numpy(workspace((p.groups, n, p.p, p.q, p.r, p.s, p.cg),
                                                 dtype))
            self.indexed = self.col.numpy().transpose(1, 2, 3, 4, 5, 0, 6)
            self.matrices = [self.col[g].reshape(n * p.p * p.q, -1) for g in range(p.groups)]
        self.spans = [span(g, kg) for g in range(p.groups)]
        rows = axis_pairs(p.r, p.dil_h, p.p, p.h, p.stride_h, p.pad_top)
        cols = axis_pairs(p.s, p.dil_w, p.q, p.w, p.stride_w, p.pad_left)
        self.windows = windows(rows, cols, layout, taps_first=layout == "nchw")

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

    def block(self, g: int, count: int):
        """Group g's (count·P·Q) × (R·S·C/g) matrix of the first `count` images the buffer
        holds (nhwc)."""
        p = self.problem
        return self.col[g, :count].reshape(count * p.p * p.q, -1)

    def col2im(self, dx: np.ndarray) -> None:
        """dx as the sum of every tap's window of the column buffer (overlaps add up)."""
        p = self.problem
        act = dx if self.layout == "nchw" else dx.reshape(p.n, p.h, p.w, p.groups, p.cg)
        scatter_add(self.indexed, act, self.windows)

    def filters(self, w) -> list:
        """Per group, the (K/g) × (reduction) filter matrix, a view of w or dw."""
        w2 = w.reshape(self.problem.k, -1)
        return [w2[s] for s in self.spans]

    def output_side(self, a) -> list:
        """Per group, y or dy: (N, K/g, P·Q) in nchw, (N·P·Q, K/g) in nhwc."""
        p = self.problem
        if self.layout == "nchw":
            return [a.reshape(p.n, p.k, -1)[:, s] for s in self.spans]
        return [a.reshape(-1, p.k)[:, s] for s in self.spans]


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
    if layout != "nhwc" or pass_ == "bwd_data" or p.p * p.q < BLOCK_MIN_ROWS:
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
        # per group: fwd's (y rows, filter), bwd_filter's (dy rows, dw)
        if pass_ == "fwd":
            pairs = list(zip(low.output_side(tensor(out)), low.filters(other)))
        else:
            pairs = list(zip(low.output_side(other), low.filters(tensor(out))))
        for first in range(0, p.n, block):
            count = min(block, p.n - first)
            low.im2col(src, first, count)
            lo, hi = first * rows, (first + count) * rows
            for g, (side, wg) in enumerate(pairs):
                if pass_ == "fwd":
                    route.matmul(low.block(g, count), wg.t(), side[lo:hi])
                elif first == 0:
                    route.matmul(side[lo:hi].t(), low.block(g, count), wg)
                else:
                    route.addmm(wg, side[lo:hi].t(), low.block(g, count))
    return fused


@register("gemm", "numpy")
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
        else:
            lowering = "im2col: one strided copy"
        pages = pages_note(self.workspace_bytes(problem, pass_, layout, precision))
        products = note((self.algo, problem, pass_, layout, precision))
        return (f"{lowering}; {products}, {threads.count()} threads"
                + (f"; {pages}" if pages else ""))

    def workspace_bytes(self, problem: ConvProblem, pass_: str, layout: str,
                        precision: str) -> int:
        """Bytes of the im2col buffer (every pass lowers the input or dx once, the blocked
        passes a block of images at a time) and, where there is padding, of the zero-bordered
        input it is copied from (fwd, bwd_filter)."""
        p = problem
        images = images_per_block(p, pass_, layout, precision)
        col = images * p.c * p.r * p.s * p.p * p.q
        padded = _padded_shape(p, pass_, layout)
        return nbytes(col + (int(np.prod(padded)) if padded else 0), precision)

    def phases(self, problem, pass_, layout, precision) -> list[str]:
        """im2col is the transform of x (fwd, bwd_filter), col2im the inverse into dx
        (bwd_data); the product between. A blocked pass alternates them block by block: one
        phase, `FUSED`."""
        a, _, out = OPERAND_NAMES[pass_]
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

        if pass_ == "fwd":
            def product(x, w, out):
                ys = low.output_side(tensor(out))
                for g, wg in enumerate(low.filters(tensor(np.ascontiguousarray(w)))):
                    if nchw:  # (K/g × CRS/g) · (CRS/g × PQ) per image
                        route.matmul(wg, low.matrices[g], ys[g])
                    else:  # (NPQ × RSC/g) · (RSC/g × K/g)
                        route.matmul(low.matrices[g], wg.t(), ys[g])
            steps = (im2col, product)
        elif pass_ == "bwd_data":
            def product(dy, w, out):
                dys = low.output_side(tensor(np.ascontiguousarray(dy)))
                for g, wg in enumerate(low.filters(tensor(np.ascontiguousarray(w)))):
                    if nchw:
                        route.matmul(wg.t(), dys[g], low.matrices[g])
                    else:
                        route.matmul(dys[g], wg, low.matrices[g])
            steps = (product, col2im)
        else:
            def product(x, dy, out):
                dys = low.output_side(tensor(np.ascontiguousarray(dy)))
                for g, dwg in enumerate(low.filters(tensor(out))):
                    col = low.matrices[g]
                    if nchw:  # one product per image, each added into dw by BLAS
                        route.matmul(dys[g][0], col[0].t(), dwg)
                        for i in range(1, len(col)):
                            route.addmm(dwg, dys[g][i], col[i].t())
                    else:  # (K/g × NPQ) · (NPQ × RSC/g)
                        route.matmul(dys[g].t(), col, dwg)
            steps = (im2col, product)
        return Phased(dict(zip(self.phases(problem, pass_, layout, precision), steps)))
