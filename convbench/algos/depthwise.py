"""`direct`'s depthwise path on the CPU without Numba (`depthwise_jit` is the path where Numba
is installed; this one stands in for it, and the row's note says which ran): groups = C (each
input channel its own group, K = C·m output channels, m the channel multiplier), the taps
unrolled, each an elementwise multiply-add over a strided view of the whole activation.

A depthwise layer has no reduction over channels, so a matrix product per tap (the dense direct
path) or per group (gemm) is a product per channel: C calls of a few multiply-adds each. Here
the channels are the vector instead: for each filter tap (r, s),

- fwd:        y  += window_rs(x_pad) · w[:, r, s]       (one `addcmul_`, the first tap a `mul`)
- bwd_data:   window_rs(dx_pad) += dy · w[:, r, s]       (the scatter of the same windows)
- bwd_filter: dw[:, r, s] = Σ_{n,p,q} dy · window_rs(x_pad)  (a multiply, then a sum over the
  pixels into a per-channel vector)

where window_rs is the strided view of the padded activation that tap (r, s) reads for every
output pixel (rows r·dh, r·dh + sh, ..., columns likewise), and the filter tap broadcasts over
the pixels: along the channels, contiguous, in nhwc; along the pixels in nchw, a scalar per
channel plane. No lowering, no product: R·S elementwise passes, run by torch's vectorised,
threaded loops on views of NumPy's buffers.

Blocks: the passes go a block of output rows at a time (about `BLOCK_BYTES` of y), every tap
before the next block, so each tap re-reads the block from cache, not from memory; the views of
every block and tap are made once, in `prepare` (a view costs about a microsecond; a 5x5 filter
over a few blocks is a hundred of them). What limits it: each tap is a pass over the block (two
loads and a store per multiply-add), so it runs at the cache's bandwidth, not at the FMA units'
rate a register-blocked kernel (oneDNN's, the CUDA kernel in kernels/depthwise.cu) reaches.

Buffers (`buffers`, which `workspace_bytes` adds up): the zero-bordered input (fwd, bwd_filter)
or dx (bwd_data), whose border is written once; the filter in tap-major order, copied per call
(a few KiB); bwd_filter's product block and its per-channel sums.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.problem import ConvProblem
from ._lowering import nbytes, spatial, tensor

#: Bytes of y (dy) per block: big enough that a tap's pass is worth its call (a few μs each),
#: small enough that the block and its windows stay in L2 while every tap reads them.
BLOCK_BYTES = 512 << 10


def is_depthwise(p: ConvProblem) -> bool:
    """groups = C > 1: each input channel convolved alone (K = C·m)."""
    return p.groups == p.c and p.c > 1


def _padded_shape(p: ConvProblem, layout: str) -> tuple[int, ...]:
    """The zero-bordered activation the windows read (x) or add into (dx): padding after may be
    negative (rows no window reaches), so the buffer holds what it adds, if anything."""
    hp = p.pad_top + p.h + max(p.pad_bottom, 0)
    wp = p.pad_left + p.w + max(p.pad_right, 0)
    return (p.n, p.c, hp, wp) if layout == "nchw" else (p.n, hp, wp, p.c)


def _in_place(p: ConvProblem) -> bool:
    """No padding: the windows are views of x (or dx) itself."""
    return not any((p.pad_top, p.pad_bottom, p.pad_left, p.pad_right))


def _multiplier(p: ConvProblem) -> int:
    return p.k // p.c


def blocks(p: ConvProblem, dtype) -> list[tuple[slice, slice]]:
    """(image slice, output-row slice) blocks of about BLOCK_BYTES of y: whole images where an
    image is smaller, else runs of rows of one image."""
    row = p.q * p.k * np.dtype(dtype).itemsize
    rows = max(1, BLOCK_BYTES // row)
    if rows >= p.p:
        per = max(1, min(p.n, rows // p.p))
        return [(slice(n0, min(p.n, n0 + per)), slice(0, p.p)) for n0 in range(0, p.n, per)]
    return [(slice(n, n + 1), slice(p0, min(p.p, p0 + rows)))
            for n in range(p.n) for p0 in range(0, p.p, rows)]


def buffers(p: ConvProblem, pass_: str, layout: str, dtype) -> dict[str, tuple[int, ...]]:
    """Every buffer a prepared pass holds beyond its operands: the padded activation (none where
    there is no padding), the filter's taps (fwd, bwd_data), and for bwd_filter the block's
    products and the per-tap channel sums."""
    m = _multiplier(p)
    out = {} if _in_place(p) else {"padded": _padded_shape(p, layout)}
    if pass_ == "bwd_filter":
        n, rows = max((b[0].stop - b[0].start, b[1].stop - b[1].start)
                      for b in blocks(p, dtype))
        out["product"] = _y_shape(p, layout, n, rows)
        out["sums"] = (p.r, p.s, p.c, m)
    else:
        out["taps"] = (p.r, p.s, p.c, m)
    return out


def workspace_bytes(p: ConvProblem, pass_: str, layout: str, precision: str, dtype) -> int:
    return nbytes(sum(math.prod(s) for s in buffers(p, pass_, layout, dtype).values()),
                  precision)


def _y_shape(p: ConvProblem, layout: str, n: int, rows: int) -> tuple[int, ...]:
    """y (or dy) of n images and `rows` output rows, with the multiplier an axis of its own:
    (n, C, m, rows, Q) in nchw, (n, rows, Q, C, m) in nhwc."""
    m = _multiplier(p)
    return (n, p.c, m, rows, p.q) if layout == "nchw" else (n, rows, p.q, p.c, m)


def _y_view(a: np.ndarray, p: ConvProblem, layout: str):
    """y or dy as a torch view with the multiplier split off (`_y_shape`)."""
    return tensor(a).view(_y_shape(p, layout, p.n, p.p))


def _tap_weights(taps: np.ndarray, layout: str):
    """(R, S) of per-tap weights broadcasting against a y view: (C, m) in nhwc, (C, m, 1, 1) in
    nchw."""
    t = tensor(taps)
    return t[..., None, None] if layout == "nchw" else t


def _filter_view(w: np.ndarray, p: ConvProblem, layout: str) -> np.ndarray:
    """w or dw as an (R, S, C, m) view: kcrs (C·m, 1, R, S) and krsc (C·m, R, S, 1) hold the
    same order of elements, one input channel per filter."""
    return w.reshape(p.c, _multiplier(p), p.r, p.s).transpose(2, 3, 0, 1)


class _Windows:
    """The strided windows of one activation buffer (x padded, or dx padded): for a block of
    output rows and a tap, the view that tap reads (or adds into) for every output pixel of
    the block, shaped like the block of y with the multiplier axis of size 1."""

    def __init__(self, p: ConvProblem, layout: str):
        self.p, self.layout = p, layout

    def of(self, act, n: slice, rows: slice, r: int, s: int):
        p = self.p
        h0 = rows.start * p.stride_h + r * p.dil_h
        w0 = s * p.dil_w
        hs = slice(h0, h0 + (rows.stop - rows.start - 1) * p.stride_h + 1, p.stride_h)
        ws = slice(w0, w0 + (p.q - 1) * p.stride_w + 1, p.stride_w)
        view = act[(n,) + spatial(self.layout, hs, ws)[1:]]
        return view[:, :, None] if self.layout == "nchw" else view[..., None]


def _block_of(y, layout: str, n: slice, rows: slice):
    return y[n, :, :, rows] if layout == "nchw" else y[n, rows]


class _Pass:
    """What every pass of one problem holds: its buffers, the blocks of output rows, the taps,
    and the windows of every block and tap in the padded activation, made once (without
    padding they are views of the call's operand, made per call)."""

    def __init__(self, p: ConvProblem, pass_: str, layout: str, dtype):
        self.p, self.layout = p, layout
        self.bufs = {name: np.zeros(shape, dtype)
                     for name, shape in buffers(p, pass_, layout, dtype).items()}
        self.padded = self.bufs.get("padded")
        self.interior = spatial(layout, slice(p.pad_top, p.pad_top + p.h),
                                slice(p.pad_left, p.pad_left + p.w))
        self.win, self.parts = _Windows(p, layout), blocks(p, dtype)
        self.taps = [(r, s) for r in range(p.r) for s in range(p.s)]
        self.fixed = None if self.padded is None else self.windows_of(tensor(self.padded))

    def windows_of(self, act):
        """Every block's window of every tap in `act` (a torch view of x or dx, padded)."""
        return [[self.win.of(act, n, rows, r, s) for r, s in self.taps] for n, rows in self.parts]

    def input_windows(self, x):
        """The windows of x (fwd, bwd_filter): x copied into the padded buffer, or views of x."""
        if self.padded is None:
            return self.windows_of(tensor(np.ascontiguousarray(x)))
        self.padded[self.interior] = x
        return self.fixed


class _Weighted(_Pass):
    """fwd and bwd_data: the filter copied per call into tap-major order, a weight per tap."""

    def __init__(self, p: ConvProblem, pass_: str, layout: str, dtype):
        super().__init__(p, pass_, layout, dtype)
        self.wtaps = self.bufs["taps"]
        weights = _tap_weights(self.wtaps, layout)
        self.tap_w = [weights[r, s] for r, s in self.taps]


class _Forward(_Weighted):
    """y, a block at a time: the first tap's product, then every other tap added."""

    def __call__(self, x, w, out):
        p, layout = self.p, self.layout
        self.wtaps[...] = _filter_view(w, p, layout)
        windows = self.input_windows(x)
        yv = _y_view(out, p, layout)
        for b, (n, rows) in enumerate(self.parts):
            block = _block_of(yv, layout, n, rows)
            for t, (window, wt) in enumerate(zip(windows[b], self.tap_w)):
                if t == 0:
                    torch_mul(window, wt, block)
                else:
                    block.addcmul_(window, wt)


class _BackwardData(_Weighted):
    """Every tap adds dy·w into its window of dx (padded); windows of one tap never overlap,
    those of different taps may (stride < filter), and run one after another."""

    def __call__(self, dy, w, out):
        p, layout, padded = self.p, self.layout, self.padded
        self.wtaps[...] = _filter_view(w, p, layout)
        (out if padded is None else padded).fill(0)
        windows = self.windows_of(tensor(out)) if padded is None else self.fixed
        dyv, m = _y_view(dy, p, layout), _multiplier(p)
        for b, (n, rows) in enumerate(self.parts):
            block = _block_of(dyv, layout, n, rows)
            for window, wt in zip(windows[b], self.tap_w):
                if m == 1:
                    window.addcmul_(block, wt)
                else:  # the multiplier's outputs all read the same input channel
                    for j in range(m):
                        axis = (slice(None),) * (2 if layout == "nchw" else 4)
                        window.addcmul_(block[axis + (slice(j, j + 1),)], wt[:, j:j + 1])
        if padded is not None:
            out[...] = padded[self.interior]


class _BackwardFilter(_Pass):
    """dw per tap: dy's block times the tap's window, summed over the block's pixels into the
    tap's channel sums (the first block's written, the others' added)."""

    def __init__(self, p: ConvProblem, pass_: str, layout: str, dtype):
        super().__init__(p, pass_, layout, dtype)
        self.product, self.sums = tensor(self.bufs["product"]), tensor(self.bufs["sums"])
        # the pixel axes of a y block, summed away: (n, rows, Q) of nhwc's, (n, rows, Q) of
        # nchw's (n, C, m, rows, Q)
        self.axes = (0, 3, 4) if layout == "nchw" else (0, 1, 2)

    def __call__(self, x, dy, out):
        p, layout = self.p, self.layout
        windows = self.input_windows(x)
        dyv = _y_view(dy, p, layout)
        for b, (n, rows) in enumerate(self.parts):
            block = _block_of(dyv, layout, n, rows)
            prod = self.product[tuple(slice(0, d) for d in block.shape)]
            for t, window in enumerate(windows[b]):
                torch_mul(block, window, prod)
                target = self.sums[self.taps[t]]
                if b == 0:
                    torch_sum(prod, self.axes, target)
                else:
                    target.add_(torch_sum(prod, self.axes, None))
        _filter_view(out, p, layout)[...] = self.bufs["sums"]


_PASSES = {"fwd": _Forward, "bwd_data": _BackwardData, "bwd_filter": _BackwardFilter}


def prepare(p: ConvProblem, pass_: str, layout: str, dtype):
    """The pass `run(a, b, out)` of a depthwise problem (`is_depthwise`): a `_Pass`."""
    return _PASSES[pass_](p, pass_, layout, dtype)


def torch_mul(a, b, out) -> None:
    import torch

    torch.mul(a, b, out=out)


def torch_sum(a, axes: tuple[int, ...], out):
    """The sum of `a` over `axes` (kept as size-1 axes dropped), into `out` where given."""
    import torch

    if out is None:
        return torch.sum(a, dim=axes)
    return torch.sum(a, dim=axes, out=out)
