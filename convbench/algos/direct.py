"""`direct` on the CPU: the convolution as a sum over filter taps, without a lowering buffer.

For each filter tap (r, s) the output gains the product of the tap's (K/g) × (C/g) filter slice
with the input window that tap sees: R·S accumulated matrix products over the input read in
place — the tap loop of a direct convolution, with the channel and pixel loops handed to BLAS.

A window of a padded, strided input is not a matrix BLAS can read (its pixels are not evenly
spaced in memory). Two rearrangements make it one, each costing one copy of an activation per
call:

- phase planes: the padded input is split into sh × sw planes (the stride per axis), plane
  (a, b) holding the padded rows a, a+sh, ... and columns b, b+sw, ..., so a tap becomes a tap
  of stride 1 at offset (r·dh // sh, s·dw // sw) of plane (r·dh % sh, s·dw % sw). For stride 1
  this is just the padded copy of x.
- wide rows: the output is computed `ws` (the plane width) columns wide instead of Q, so each
  tap's window in a flattened plane is one contiguous range, a (C/g) × (P·ws) matrix with unit
  stride. The ws − Q extra columns are discarded (fwd) or zero (bwd: dy is widened with zeros);
  about 15 % extra work on AlexNet's 3×3 and 5×5 layers.

bwd_data runs the taps in reverse: each tap's Wᵀ·dy is added into its window of dx's phase
planes, which are then un-split. bwd_filter sums dy · windowᵀ over the images, per tap.
Both layouts run natively: nhwc windows are (rows) × (C/g) matrices that BLAS reads transposed;
only views are transposed, never data. A filter's tap matrices are unit-stride in krsc, so BLAS
reads w and writes dw in place; in kcrs they are strided, so nchw packs w into tap matrices (a
filter-sized copy per call) and sums each tap of dw through a (K/g) × (C/g) buffer. Every buffer
a pass holds is listed by `_buffers`, which `workspace_bytes` adds up.
"""

from __future__ import annotations

import enum
import math
from typing import NamedTuple

import numpy as np

from ..core.problem import ConvProblem
from ..machine import threads
from . import depthwise, depthwise_jit, grouped_jit, jit
from ._lowering import (
    axis_pairs,
    channel_major,
    gather,
    nbytes,
    scatter,
    span,
    spatial,
    windows,
)
from .counts import DirectCount
from .reference import DTYPES
from .registry import Implementation, register
from .traits import Algorithm

#: Accumulator bytes per block: small enough to stay in cache while every tap adds into it, big
#: enough that a block is one product of thousands of rows (few BLAS calls, each worth its
#: threads' start-up). 1-4 MiB measured alike on AlexNet; fewer calls suffer less on shared cores.
_CHUNK_BYTES = 4 << 20


class _Tap(NamedTuple):
    r: int
    s: int
    a: int  # phase plane row
    b: int  # phase plane column
    offset: int  # start of the window in the flattened plane


class _Geometry:
    """Phase planes and wide rows of one problem in one layout.

    nhwc folds the images into the wide rows too: its planes are stored image after image
    within each phase, (sh, sw, N, hs, ws, C), so one window of N·hs·ws rows (less the tail no
    output needs) spans the batch and a tap is one matrix product with M = N·hs·ws rows, as in
    an implicit-GEMM kernel (cut into cache-sized blocks of rows). In nchw the channels separate
    the images, so a tap is one product per image, as in Caffe: many more, smaller BLAS calls
    (which suffer most when the cores are shared) — the layout's cost, measured rather than
    converted away.
    """

    def __init__(self, problem: ConvProblem, layout: str):
        p, sh, sw = problem, problem.stride_h, problem.stride_w
        self.problem, self.layout = p, layout
        # One spare row: the wide window of the bottom tap runs up to ws - 1 elements past the
        # last row it needs (only into columns that are discarded).
        self.hs = -(-(p.h + p.pad_top + p.pad_bottom) // sh) + 1
        self.ws = -(-(p.w + p.pad_left + p.pad_right) // sw)
        folded = layout == "nhwc"
        self.batch = 1 if folded else p.n
        self.length = (p.n - 1) * self.hs * self.ws * folded + p.p * self.ws
        self.windows = windows(axis_pairs(sh, 1, self.hs, p.h, sh, p.pad_top),
                               axis_pairs(sw, 1, self.ws, p.w, sw, p.pad_left), layout,
                               taps_first=True)
        self.taps = []
        for r in range(p.r):
            i0, a = divmod(r * p.dil_h, sh)
            for s in range(p.s):
                j0, b = divmod(s * p.dil_w, sw)
                self.taps.append(_Tap(r, s, a, b, i0 * self.ws + j0))
        self.crop = spatial(layout, slice(0, p.p), slice(0, p.q))

    def plane_shape(self, channels: int) -> tuple[int, ...]:
        p, sh, sw = self.problem, self.problem.stride_h, self.problem.stride_w
        if self.layout == "nchw":
            return (p.n, channels, sh, sw, self.hs, self.ws)
        return (sh, sw, p.n, self.hs, self.ws, channels)

    def wide_shape(self, channels: int) -> tuple[int, ...]:
        """Output-shaped, with rows ws wide (and, nhwc, hs rows per image)."""
        p = self.problem
        if self.layout == "nchw":
            return (p.n, channels, p.p, self.ws)
        return (p.n, self.hs, self.ws, channels)

    def planes(self, channels: int, dtype) -> tuple[np.ndarray, np.ndarray]:
        """A zeroed phase-plane buffer (the zeros are the padding; copies never touch them) and
        its view with the image axis first, as the windows index it."""
        buf = np.zeros(self.plane_shape(channels), dtype)
        return buf, buf if self.layout == "nchw" else buf.transpose(2, 0, 1, 3, 4, 5)

    def plane_matrices(self, buf: np.ndarray) -> np.ndarray:
        """(batch, sh, sw, channels, flat plane) view of a phase-plane buffer: the window of a
        tap is [:, a, b, channels, offset:offset + length]."""
        sh, sw = self.problem.stride_h, self.problem.stride_w
        if self.layout == "nchw":
            return buf.reshape(self.batch, buf.shape[1], sh, sw, -1).transpose(0, 2, 3, 1, 4)
        return channel_major(buf.reshape(1, sh, sw, -1, buf.shape[-1]), self.layout)

    def wide_matrices(self, buf: np.ndarray) -> np.ndarray:
        """(batch, channels, length) view of a wide buffer."""
        if self.layout == "nchw":
            return buf.reshape(self.batch, buf.shape[1], -1)
        flat = channel_major(buf.reshape(1, -1, buf.shape[-1]), self.layout)
        return flat[..., :self.length]

    def scratch_shape(self, blocks: list[tuple[slice, slice]], channels: int) -> tuple[int, ...]:
        """A product buffer as big as the largest block, stored in the layout's order so adding
        it to a window or a block of a wide buffer walks both in the same order."""
        batch = max(n.stop - n.start for n, _ in blocks)
        length = max(m.stop - m.start for _, m in blocks)
        return (batch, channels, length) if self.layout == "nchw" else (batch, length, channels)

    def blocks(self, channels: int, dtype) -> list[tuple[slice, slice]]:
        """(batch slice, length slice) blocks of an accumulator of `channels` rows, each of about
        _CHUNK_BYTES: whole images in nchw, runs of rows in nhwc."""
        row = channels * np.dtype(dtype).itemsize
        if self.batch > 1:
            n = max(1, min(self.batch, _CHUNK_BYTES // (row * self.length)))
            return [(slice(n0, n0 + n), slice(0, self.length)) for n0 in range(0, self.batch, n)]
        m = max(1, _CHUNK_BYTES // row)
        return [(slice(0, 1), slice(m0, min(m0 + m, self.length)))
                for m0 in range(0, self.length, m)]

    def steps(self, blocks: list[tuple[slice, slice]]):
        """(batch slice, length slice, K slice, C slice, tap): every block runs every tap of a
        group before the next, so its accumulator stays in cache."""
        p = self.problem
        kg, cg = p.k // p.groups, p.cg
        for n, m in blocks:
            for g in range(p.groups):
                for tap in self.taps:
                    yield n, m, span(g, kg), span(g, cg), tap


def _tap_matrices(w: np.ndarray, layout: str) -> np.ndarray:
    """(R, S, K, C/g) view of a filter (w or dw) in either layout: [r, s, k] is tap (r, s)'s
    (K/g) × (C/g) matrix, unit-stride (a matrix BLAS reads or writes in place) in krsc only."""
    return w.transpose(2, 3, 0, 1) if layout == "nchw" else w.transpose(1, 2, 0, 3)


def _buffers(problem: ConvProblem, pass_: str, layout: str, dtype
             ) -> tuple[_Geometry, list[tuple[slice, slice]], dict[str, tuple[int, ...]]]:
    """The geometry, the accumulator blocks and the shape of every buffer a prepared pass holds
    beyond its operands: `prepare` allocates exactly these and `workspace_bytes` adds them up,
    so the declared workspace is the allocated one by construction.

    - planes, wide: the phase planes (about the padded input) and the wide output (about y);
    - taps (fwd, bwd_data in nchw): the filter packed into unit-stride tap matrices, since
      kcrs's are strided (krsc's are read in place);
    - scratch (fwd, bwd_data): one block's product, added into its accumulator (NumPy's matmul
      cannot accumulate): about _CHUNK_BYTES, or one image's (nchw) where that is more;
    - acc, product (bwd_filter in nchw): one tap's (K/g) × (C/g) sum over the images and one
      image's product, since kcrs's tap matrices are strided (krsc's are written in place, and
      nhwc folds the images into one product).
    """
    p, geo = problem, _Geometry(problem, layout)
    kg = p.k // p.groups
    shapes = {"planes": geo.plane_shape(p.c), "wide": geo.wide_shape(p.k)}
    if pass_ == "bwd_filter":
        blocks = [(slice(0, geo.batch), slice(0, geo.length))]
        if layout == "nchw":
            shapes["acc"] = (1, kg, p.cg)
            if geo.batch > 1:
                shapes["product"] = (1, kg, p.cg)
        return geo, blocks, shapes
    if layout == "nchw":
        shapes["taps"] = (p.r, p.s, p.k, p.cg)
    if pass_ == "fwd":
        blocks = geo.blocks(p.k, dtype)
        shapes["scratch"] = geo.scratch_shape(blocks, kg)
    else:
        # Each tap adds into its own window of the planes: a block's accumulator is about its
        # rows of all sh·sw planes.
        blocks = geo.blocks(p.c * p.stride_h * p.stride_w, dtype)
        shapes["scratch"] = geo.scratch_shape(blocks, p.cg)
    return geo, blocks, shapes


def _mac(a: np.ndarray, b: np.ndarray, acc: np.ndarray, tmp: np.ndarray, first: bool) -> None:
    """acc += a @ b, or acc = a @ b if `first`: NumPy's matmul cannot accumulate in place."""
    if first:
        np.matmul(a, b, out=acc)
    else:
        part = tmp[:acc.shape[0], :, :acc.shape[-1]]
        np.matmul(a, b, out=part)
        acc += part


class _Path(enum.Enum):
    """How `direct` runs one problem, decided once (`_path`) and read by every hook."""

    GROUPED_JIT = "grouped_jit"  # grouped, few channels a group: compiled by Numba
    DEPTHWISE_JIT = "depthwise_jit"  # depthwise: compiled by Numba
    DEPTHWISE = "depthwise"  # depthwise without Numba: taps over views (torch)
    DENSE = "dense"  # the rest (and grouped without Numba): tap products, this module's


def _path(problem: ConvProblem) -> _Path:
    """The path of `problem`: the compiled kernels where Numba compiles here (`jit.available`)
    and the layer is grouped with few channels a group or depthwise; a depthwise layer's taps
    over views where it does not; else the dense tap products."""
    compiled = jit.available() is None
    if compiled and grouped_jit.applies(problem):
        return _Path.GROUPED_JIT
    if depthwise.is_depthwise(problem):
        return _Path.DEPTHWISE_JIT if compiled else _Path.DEPTHWISE
    return _Path.DENSE


#: The module that runs each path but the dense one (its `prepare`, `workspace_bytes`; the
#: compiled ones' `kernel` and `describe`).
_MODULES = {_Path.GROUPED_JIT: grouped_jit, _Path.DEPTHWISE_JIT: depthwise_jit,
            _Path.DEPTHWISE: depthwise}
_COMPILED = (_Path.GROUPED_JIT, _Path.DEPTHWISE_JIT)


class _Dense:
    """The buffers of one dense pass (`_buffers`), allocated once, and its run: each pass's
    tap loop over them (`fwd`, `bwd_data`, `bwd_filter`)."""

    def __init__(self, problem: ConvProblem, pass_: str, layout: str, dtype):
        self.problem, self.layout = problem, layout
        self.geo, self.blocks, shapes = _buffers(problem, pass_, layout, dtype)
        self.planes, self.indexed = self.geo.planes(problem.c, dtype)
        self.wide = np.zeros(shapes["wide"], dtype)
        self.xm = self.geo.plane_matrices(self.planes)
        self.ym = self.geo.wide_matrices(self.wide)
        self.extra = {name: np.empty(shapes[name], dtype) for name in shapes
                      if name not in ("planes", "wide")}

    def window(self, t: _Tap, batch: slice, rows: slice, channels: slice) -> np.ndarray:
        return self.xm[batch, t.a, t.b, channels, t.offset + rows.start:t.offset + rows.stop]

    def taps(self):
        """w -> its tap matrices: views in krsc, packed into the `taps` buffer in kcrs."""
        layout, packed = self.layout, self.extra.get("taps")

        def taps(w):
            if packed is None:
                return _tap_matrices(w, layout)
            packed[...] = _tap_matrices(w, layout)  # kcrs: a filter-sized copy per call
            return packed

        return taps

    def fwd(self):
        geo, blocks, indexed, wide, ym, window = (self.geo, self.blocks, self.indexed,
                                                  self.wide, self.ym, self.window)
        tmp, taps = channel_major(self.extra["scratch"], self.layout), self.taps()

        def run(x, w, out):
            gather(x, indexed, geo.windows)
            tw = taps(w)
            for n, m, k, c, t in geo.steps(blocks):
                _mac(tw[t.r, t.s, k], window(t, n, m, c), ym[n, k, m], tmp, t is geo.taps[0])
            out[...] = wide[geo.crop]
        return run

    def bwd_data(self):
        geo, blocks, planes, indexed, wide, ym, window = (
            self.geo, self.blocks, self.planes, self.indexed, self.wide, self.ym, self.window)
        tmp, taps = channel_major(self.extra["scratch"], self.layout), self.taps()
        unread = self.problem.pad_bottom < 0 or self.problem.pad_right < 0

        def run(dy, w, out):
            wide[geo.crop] = dy
            tw = taps(w)
            planes.fill(0)
            for n, m, k, c, t in geo.steps(blocks):
                _mac(tw[t.r, t.s, k].T, ym[n, k, m], window(t, n, m, c), tmp, False)
            if unread:  # input rows past the last window: the planes hold none of them
                out.fill(0)
            scatter(indexed, out, geo.windows)
        return run

    def bwd_filter(self):
        geo, blocks, indexed, wide, ym, window, layout = (
            self.geo, self.blocks, self.indexed, self.wide, self.ym, self.window, self.layout)
        acc, product = self.extra.get("acc"), self.extra.get("product")

        def run(x, dy, out):
            gather(x, indexed, geo.windows)
            wide[geo.crop] = dy
            dw = _tap_matrices(out, layout)
            for _, m, k, c, t in geo.steps(blocks):
                target = dw[t.r, t.s, k][None] if acc is None else acc
                for i in range(geo.batch):  # nchw: one product per image, summed
                    n = slice(i, i + 1)
                    _mac(ym[n, k, m], window(t, n, m, c).swapaxes(-1, -2), target, product,
                         i == 0)
                if acc is not None:
                    dw[t.r, t.s, k] = acc[0]
        return run


#: Every output summed in place: exact, the direct convolution's flops, no workspace.
DIRECT = Algorithm("direct", family="direct", origin="ours", tolerance="exact", reduction="none",
                   counts=DirectCount(), deterministic=True)


@register(DIRECT, "numpy")
class DirectCPU(Implementation):
    """The dense tap products of this module, or, for a depthwise layer or a grouped one of few
    channels a group, their own kernels: which, `_path` decides once per problem."""

    precisions = ("fp64", "fp32")
    asymmetric_pad = True  # the planes hold the padded input, whatever its two sides

    def supports(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        return None

    def describe(self, problem, pass_, layout, precision) -> str:
        """A depthwise layer, or a grouped one of few channels a group, names its path; the
        dense path has nothing to add."""
        path = _path(problem)
        if path is _Path.GROUPED_JIT:  # its nhwc copies name the way probed for the dtype
            return grouped_jit.describe(problem, pass_, layout, DTYPES[precision])
        if path in _COMPILED:
            return _MODULES[path].describe(problem, pass_, layout)
        if path is _Path.DENSE:
            if grouped_jit.blocks_dense(problem, pass_):
                return "dense: " + grouped_jit.blocked_note(problem, pass_, layout,
                                                            DTYPES[precision], "the tap products")
            return ""
        blocks = len(depthwise.blocks(problem, DTYPES[precision]))
        return (f"depthwise (Numba unavailable: {jit.available()}): "
                f"{problem.r * problem.s} taps as elementwise multiply-adds over "
                f"strided views (torch, {threads.count()} threads), {blocks} block"
                f"{'s' * (blocks > 1)} of output rows")

    def compile(self, problem, pass_, layout, precision) -> None:
        """The compiled depthwise and grouped kernels, and the blocked ones a dense pass
        probes, compiled (or loaded from the disk cache), nothing allocated."""
        path = _path(problem)
        if path in _COMPILED:
            _MODULES[path].kernel(problem, pass_, layout, DTYPES[precision])
        elif path is _Path.DENSE and grouped_jit.blocks_dense(problem, pass_):
            grouped_jit.compile_blocked(problem, pass_, layout, DTYPES[precision])

    def workspace_bytes(self, problem: ConvProblem, pass_: str, layout: str,
                        precision: str) -> int:
        """Bytes of the buffers `_buffers` lists, computed without allocating them: about the
        padded input and y, plus a filter-sized packed copy (fwd, bwd_data in nchw) and a block
        of products, and the blocked kernels' where the pass probes them
        (`grouped_jit.dense_workspace_bytes`); a depthwise or grouped layer's, its path's."""
        path, dtype = _path(problem), DTYPES[precision]
        if path is _Path.DEPTHWISE:  # the only one that also reads the precision's name
            return depthwise.workspace_bytes(problem, pass_, layout, precision, dtype)
        if path is not _Path.DENSE:
            return _MODULES[path].workspace_bytes(problem, pass_, layout, dtype)
        shapes = _buffers(problem, pass_, layout, dtype)[2].values()
        return grouped_jit.dense_workspace_bytes(
            problem, pass_, layout, dtype, nbytes(sum(math.prod(s) for s in shapes), precision))

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        path, dtype = _path(problem), DTYPES[precision]
        if path is not _Path.DENSE:
            return _MODULES[path].prepare(problem, pass_, layout, dtype)
        return grouped_jit.blocked_pass(
            problem, pass_, layout, dtype,
            lambda: getattr(_Dense(problem, pass_, layout, dtype), pass_)())
