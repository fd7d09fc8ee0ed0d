"""`winograd-2x2`, `-4x4`, `-5x5`, `-6x6`: F(m×m, 3×3) Winograd convolution on the CPU.

Structured like cuDNN's WINOGRAD_NONFUSED, one pass over memory per stage, each a phase
(`convbench.algos.phases`): input tiles (alpha×alpha every m, alpha = m + 2) transformed by
Bᵀ d B and filters by G g Gᵀ; one GEMM per frequency position over channels, all alpha² in one
batched call (`products.Route`: torch's MKL or NumPy's OpenBLAS, the faster for the shape here,
named in the row's note; the transforms' small GEMMs stay on torch); the inverse Aᵀ M A, tiles
written straight into the output, partial edge tiles cropped.

The rules, each chosen side by side against the alternative (the measurements are in
docs/pages/cpu-algorithms.md, Winograd):

- Arrays are torch tensors sharing the NumPy buffers (zero-copy), so copies and GEMMs use the
  run's threads (`threads.count()`); only BLAS and strided copies are borrowed, no convolution.
- Stride-1 data tiles and filters are transformed by compiled kernels (`winograd_jit`) where
  the transformed operand is at least `winograd_jit.MIN_BYTES`: each window or filter read
  once, its alpha² values written once (`_CompiledTiles`, `_FilterTransform`'s kernel). Else
  transforms are GEMMs: data tiles gathered by one copy, then two GEMMs with the small Bᵀ
  (`_Sandwich`); filters one GEMM with G⊗G (`_FilterTransform`). The inverse is two GEMMs
  with Aᵀ in nhwc, one with Aᵀ⊗Aᵀ writing the tiles transposed in nchw (`_Kron`).
- Tiles are gathered channels last in both layouts, and products ordered to land in the output's
  order, (K×C)·(C×T) for nchw and (T×C)·(C×K) for nhwc; transposes reach BLAS as flags.
- Buffers are made once, on 2 MiB huge pages where the kernel offers them
  (`_lowering.workspace`): other work evicts them between calls, and a cold call walks the page
  tables once per page.

Where the transformed filters are large and the tiles few (wide layers at batch 1), fwd and
bwd_data transform the filters a block of output channels at a time, each block's products
right after, so the transformed filters never go out to memory: one phase, `fused`, between
the data's transform and the inverse (`filter_block` says where, and why not elsewhere).

bwd_data is the same machinery (`_TiledOutput`); bwd_filter is the weight-gradient form
F(3x3, m×m) (`_WeightGradient`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from ..core.problem import ELEMENT_BYTES, FILTER_LAYOUT, ConvProblem, pair_text
from ..machine import threads
from . import winograd_jit
from ._lowering import pages_note, tensor, workspace
from .counts import WinogradCount
from .phases import FUSED, Phased, phase_names
from .products import BACKENDS, Route, note
from .reference import DTYPES
from .registry import Implementation, register
from .traits import Algorithm
from .transforms import CPU_FILTER_SIZES, phase_split, winograd_matrices

_R = 3  # the filter size the GPU kernels take
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
    mat ⊗ mat, and as fast as it for the square Bᵀ (the data transforms); for the wide Aᵀ of
    nhwc's inverse too (see `_Kron`)."""

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
    (or r²). MKL runs this short, wide GEMM well below its peak, so whether it or `_Sandwich`'s
    two GEMMs (a third of the multiply-adds) is faster depends on the machine; nhwc's inverse,
    whose tiles keep their order, takes two, and this form stays for `last`. The result is
    (m, m, ...), or with `last` (..., m, m): written transposed (Xᵀ·(mat ⊗ mat)ᵀ), which puts
    the tile innermost for free, so nchw outputs and kcrs filters are copied out in runs of
    whole tile rows rather than element by element."""

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
    where gathering tiles straight from nchw's rows reads them element by element, which is
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
    (alpha, alpha, *order with the tile counts).

    With `split` s > 1 (an nhwc operand, for a stride-s convolution's phase split,
    `transforms.phase_split`) the tiles are tiles of the phase planes: h and w read as (h/s, s)
    and (w/s, s), the s·s phases become channels, (phase row, phase column, channel). The
    planes are made by one copy first — each run of s·C values (a phase column's channels)
    moved as one opaque record by NumPy — and the tiles gathered from them with their channels
    contiguous, faster than gathering straight from the padded input, whose runs are C values."""

    def __init__(self, shape, labels: str, order: str, mat: np.ndarray, step: int,
                 counts: tuple[int, int], dtype, split: int = 1):
        size = dict(zip(labels, shape))
        self.planes = None
        if split > 1:
            if labels + order != "nhwcnhwc":
                raise ValueError("a phase split gathers nhwc tiles only")
            n, h, w, c = (size[a] for a in "nhwc")
            self.planes = workspace((n, h // split, w // split, split, split, c), dtype)
            labels = order = "nhwc"
            size.update(h=h // split, w=w // split, c=c * split * split)
        size.update(zip("hw", counts))
        tiled = tuple(size[a] for a in order)
        width = mat.shape[1]
        self.perm, self.step, self.width, self.split = _order(labels, order), step, width, split
        self.axes = (order.index("h"), order.index("w"))
        self.gathered = _torch().from_numpy(workspace((width, width) + tiled, dtype))
        self.sandwich = _Sandwich(mat, tiled, dtype)
        # unfold appends the windows' widths as the last two axes; they go first.
        n = len(order)
        self.widths_first = (n, n + 1, *range(n))

    @property
    def nbytes(self) -> int:
        planes = 0 if self.planes is None else self.planes.nbytes
        return planes + self.gathered.numel() * self.gathered.element_size() + \
            self.sandwich.nbytes

    def __call__(self, a):
        if self.split > 1:
            a = self._phase_planes(a)
        view = a.permute(self.perm)
        view = view.unfold(self.axes[0], self.width, self.step)
        view = view.unfold(self.axes[1], self.width, self.step)
        self.gathered.copy_(view.permute(self.widths_first))
        return self.sandwich(self.gathered)

    def _phase_planes(self, a):
        """(n, h, w, C) -> the phase planes (n, h/s, w/s, s·s·C), one copy."""
        s, planes = self.split, self.planes
        n, h, w, c = a.shape
        record = np.dtype(f"V{s * c * planes.itemsize}")  # one phase column's channels
        src = a.numpy().reshape(n, h, w * c).view(record).reshape(n, h // s, s, w // s)
        dst = planes.reshape(n, h // s, w // s, s, s * c).view(record)[..., 0]
        np.copyto(dst, src.transpose(0, 1, 3, 2))
        return _torch().from_numpy(planes).view(n, h // s, w // s, -1)


class _CompiledTiles:
    """`_TileTransform` of an nhwc activation by the compiled kernel (`winograd_jit.TileKernel`):
    each window read once and its rows² values written once, where the gathering copy and two
    GEMMs wrote and read them three times. The result is the same (rows, rows, n, tile rows,
    tile columns, C)."""

    def __init__(self, shape, mat: np.ndarray, step: int, counts: tuple[int, int], dtype):
        n, _, _, c = shape
        rows = mat.shape[0]
        self.kernel = winograd_jit.TileKernel(mat, step, counts, dtype)
        self.out = _torch().from_numpy(workspace((rows, rows, n, *counts, c), dtype))

    @property
    def nbytes(self) -> int:
        return self.out.numel() * self.out.element_size()

    def __call__(self, a):
        x = a.numpy()
        if not x.flags.c_contiguous:  # a cropped view (padding past r - 1): made whole
            x = np.ascontiguousarray(x)
        rows = self.out.shape[0]
        self.kernel(x, self.out.numpy().reshape(rows * rows, -1, self.out.shape[-1]))
        return self.out


def _tiles(shape, mat: np.ndarray, step: int, counts: tuple[int, int], dtype, split: int = 1):
    """The transform of the tiles of an nhwc activation of `shape`: compiled where
    `winograd_jit.applies` (no phase split), else `_TileTransform`'s copy and GEMMs."""
    n, _, _, c = shape
    if split == 1 and winograd_jit.applies(mat.shape[0] ** 2 * n * counts[0] * counts[1] * c,
                                           dtype):
        return _CompiledTiles(shape, mat, step, counts, dtype)
    return _TileTransform(shape, "nhwc", "nhwc", mat, step, counts, dtype, split=split)


class _PhaseScatter:
    """The inverse of the phase split for bwd_data: dx from the gradient of the phase planes,
    (n, i, j, s, s, C) channels last, where dx[h] is plane row i, phase b with
    s·i + b = h + pad; one strided copy per phase, and zeros for rows and columns past the
    planes (past the last window: no output reads them, so their gradient is 0)."""

    def __init__(self, planes: tuple[int, int], extent: tuple[int, int], stride: int, pad: int,
                 layout: str):
        self.perm, self.stride = _order(layout, "nhwc"), stride
        axes = []
        for rows, size in zip(planes, extent):
            per = []
            for b in range(stride):
                h0 = (b - pad) % stride
                i0 = (h0 + pad) // stride
                count = max(0, min(-(-(size - h0) // stride), rows - i0))
                per.append((slice(i0, i0 + count), slice(h0, h0 + stride * count, stride)))
            axes.append(per)
        self.copies = [(bh, bw, ih, h, jw, w) for bh, (ih, h) in enumerate(axes[0])
                       for bw, (jw, w) in enumerate(axes[1])]
        # rows and columns of dx no plane holds
        self.zero = [slice(min(size, stride * rows - pad), size)
                     for rows, size in zip(planes, extent)]

    def __call__(self, planes, out) -> None:
        dx = out.permute(self.perm)
        for bh, bw, ih, h, jw, w in self.copies:
            dx[:, h, w].copy_(planes[:, ih, jw, bh, bw])
        dx[:, self.zero[0]].zero_()
        dx[:, :, self.zero[1]].zero_()


class _FilterTransform:
    """G g Gᵀ for every r×r filter: at stride 1, where `winograd_jit.applies`, by the compiled
    kernel into (alpha², K, C) from either layout (`ck` is then ignored: the product reads the
    filters transposed, within a few % of (C, K) rows, where the GEMM path's (C, K) took a
    second copy). Else as one GEMM with G⊗G (alpha² × r²): the transformed filters
    as (alpha², K, C), a view. kcrs filters are read in place (a transposed operand); krsc ones
    are first gathered as (r·s, K, C). With `ck` they are kept as (alpha², C, K) in memory
    (gathered as (r·s, C, K) from either layout, a copy of the small filter): the nhwc forward
    product (tiles×C)·(C×K) then reads its right operand untransposed, which MKL runs faster.

    At stride s > 1 the filter is the phase split's (`transforms.phase_split`): copied into a
    zero buffer of s·r' taps per axis (r' G's size; taps past the filter stay zero), whose taps
    s·a + b are gathered, phases next to the channels, as (r', r', K, s, s, C) by a second copy
    (two copies, not one per phase), and transformed the same way, as (alpha², K, s·s·C)."""

    def __init__(self, g: np.ndarray, shape, layout: str, dtype, stride: int = 1,
                 ck: bool = False):
        torch = _torch()
        self.kron = torch.from_numpy(np.ascontiguousarray(np.kron(g, g)))
        size = dict(zip(FILTER_LAYOUT[layout], shape))
        k, c = size["k"], size["c"]
        self.kernel = None
        if stride == 1 and winograd_jit.applies(g.shape[0] ** 2 * k * c, dtype):
            # compiled (`winograd_jit`): (alpha², K, C) from either layout in one pass; the
            # nhwc product reads it transposed, as fast as (C, K) rows
            self.kernel = winograd_jit.FilterKernel(g, shape, layout, dtype)
            ck = False
        self.layout, self.k, self.c, self.stride, self.ck = layout, k, c, stride, ck
        channels = (c * stride ** 2, k) if ck else (k, c * stride ** 2)
        self.out = torch.from_numpy(workspace((len(self.kron), *channels), dtype))
        taps = g.shape[1]
        self.r2 = taps ** 2
        phases = (stride, stride, c, k) if ck else (k, stride, stride, c)
        self.taps = None if self.kernel or layout == "nchw" and stride == 1 and not ck else \
            torch.from_numpy(workspace((taps, taps, *phases), dtype))
        self.padded = None if stride == 1 else \
            torch.from_numpy(workspace((k, stride * taps, stride * taps, c), dtype))
        self.window = (slice(None), slice(0, size["r"]), slice(0, size["s"]))

    @property
    def nbytes(self) -> int:
        size = sum(0 if t is None else t.numel() for t in (self.out, self.taps, self.padded))
        return size * self.out.element_size()

    def __call__(self, w):
        torch = _torch()
        if self.kernel is not None:
            self.kernel(w.numpy(), self.out.numpy())
            return self.out
        krsc = w.permute(_order(FILTER_LAYOUT[self.layout], "krsc"))
        if self.taps is None:  # kcrs: (K·C, r²), transposed
            src = w.reshape(self.k * self.c, self.r2).t()
        elif self.padded is None:  # -> (rs, K, C) or (rs, C, K)
            taps = self.taps.view(self.r2, *((self.c, self.k) if self.ck else (self.k, self.c)))
            taps.copy_(krsc.reshape(self.k, self.r2, self.c).permute(
                (1, 2, 0) if self.ck else (1, 0, 2)))
            src = self.taps.view(self.r2, -1)
        else:  # (K, s·r', s·r', C) -> (r', r', K, s, s, C) or (r', r', s, s, C, K)
            self.padded[self.window].copy_(krsc)
            s, taps = self.stride, self.taps.shape[0]
            phased = self.padded.view(self.k, taps, s, taps, s, self.c)
            self.taps.copy_(phased.permute((1, 3, 2, 4, 5, 0) if self.ck else (1, 3, 0, 2, 4, 5)))
            src = self.taps.view(self.r2, -1)
        torch.matmul(self.kron, src, out=self.out.view(len(self.kron), -1))
        return self.out.transpose(1, 2) if self.ck else self.out


#: The most bytes of transformed filters a blocked pass holds at a time (`filter_block`).
FILTER_BLOCK_BYTES = 4 << 20
#: How many times the transformed tiles the transformed filters must be for a pass to block.
FILTER_BLOCK_RATIO = 32
#: How many times the filters their transform must be (alpha² / r²) for a pass to block.
FILTER_BLOCK_EXPANSION = 4


def filter_block(problem: ConvProblem, pass_: str, m: int, dtype) -> int | None:
    """Output channels per block of a pass whose filters are transformed block by block, just
    before that block's products (`_BlockedFilter`); None where the pass transforms them whole:
    bwd_filter (its "filter" is dy), a strided problem's phase split, and any pass whose
    transformed filters (alpha² × K × C) fit in `FILTER_BLOCK_BYTES`, are less than
    `FILTER_BLOCK_RATIO` times its transformed tiles (output channels < ratio × tiles) or less
    than `FILTER_BLOCK_EXPANSION` times the filters (alpha² < 4 r²: F(2x2, 3x3) and every
    5x5 filter's tiles).

    Why: transformed whole, the filters are alpha² / r² times the filter's size, written out
    and read back by the products, which made the transform most of the pass on layers with
    large filters and few tiles (batch 1). A block's transformed filters stay in cache until
    its products read them. But each block's products read all the transformed tiles again,
    in products a block wide, which BLAS runs slower than one product over every channel, so
    where the tiles are many blocking loses; and each block's taps are gathered by a copy,
    which a transform little larger than the filters (F(2x2)'s 16/9) does not repay. The
    channels are split into as few
    blocks as hold at most `FILTER_BLOCK_BYTES` each (but at least 16 channels), evenly, each
    rounded up to a multiple of 16. Measured side by side in docs/pages/cpu-algorithms.md
    (Winograd)."""
    p = problem
    if pass_ == "bwd_filter" or p.stride != 1:
        return None
    alpha = m + p.r - 1
    cout, cin = (p.k, p.c) if pass_ == "fwd" else (p.c, p.k)
    extent = (p.p, p.q) if pass_ == "fwd" else (p.h, p.w)
    tiles = p.n * int(np.prod(_tile_counts(extent, m)))
    per_channel = alpha * alpha * cin * np.dtype(dtype).itemsize
    if (per_channel * cout <= FILTER_BLOCK_BYTES or cout < FILTER_BLOCK_RATIO * tiles
            or alpha * alpha < FILTER_BLOCK_EXPANSION * p.r * p.s):
        return None
    most = max(16, FILTER_BLOCK_BYTES // per_channel // 16 * 16)
    blocks = -(-cout // most)
    per_block = -(-cout // blocks)
    return min(cout, (per_block + 15) // 16 * 16)


class _BlockedFilter:
    """G g Gᵀ for a block of output channels' filters: fwd's by the compiled kernel where it
    applies (`winograd_jit`: the block's filters are a slice of whole filters); else the
    block's taps gathered by one copy —
    fwd's block is filters lo:hi, as (r², channels, C); bwd_data's (whose output channels are
    the filters' C) is channels lo:hi of every filter, as (r², K, channels), so each filter's
    run of channels is copied whole — then one GEMM with G⊗G, both on the library the block's
    products run on (`Route.library`). Both buffers hold one block, made once; a shorter last
    block uses their first part, contiguous."""

    def __init__(self, g: np.ndarray, layout: str, pass_: str, block: int, cin: int, dtype):
        torch = _torch()
        self.kron = torch.from_numpy(np.ascontiguousarray(np.kron(g, g)))
        self.layout, self.pass_, self.cin = layout, pass_, cin
        alpha2, taps = self.kron.shape
        self.kernel = self.taps = None
        if pass_ == "fwd" and winograd_jit.applies(g.shape[0] ** 2 * block * cin, dtype):
            r = g.shape[1]
            shape = (block, cin, r, r) if layout == "nchw" else (block, r, r, cin)
            self.kernel = winograd_jit.FilterKernel(g, shape, layout, dtype)
        else:  # the taps gathered for the GEMM
            self.taps = torch.from_numpy(workspace((taps * block * cin,), dtype))
        self.out = torch.from_numpy(workspace((alpha2 * block * cin,), dtype))

    @property
    def nbytes(self) -> int:
        taps = 0 if self.taps is None else self.taps.numel()
        return (taps + self.out.numel()) * self.out.element_size()

    def view(self, lo: int, hi: int):
        """Where `__call__` puts the transformed filters of output channels lo:hi: (alpha²,
        hi - lo, input channels), a view of the buffer."""
        alpha2 = len(self.kron)
        out = self.out[:alpha2 * (hi - lo) * self.cin]
        if self.pass_ == "fwd":
            return out.view(alpha2, hi - lo, self.cin)
        return out.view(alpha2, self.cin, hi - lo).transpose(1, 2)

    def __call__(self, w, lo: int, hi: int, library: str = "torch"):
        """The transformed filters of output channels lo:hi (`view`), computed on `library`
        ("torch" or "numpy": its copy and its GEMM)."""
        alpha2, taps = self.kron.shape
        size = (hi - lo) * self.cin
        if self.kernel is not None:
            self.kernel(w[lo:hi].numpy(), self.out[:alpha2 * size].view(alpha2, hi - lo,
                                                                           self.cin).numpy())
            return self.view(lo, hi)
        if self.pass_ == "fwd" and self.layout == "nchw":  # kcrs: (n·C, r²), transposed
            src = w[lo:hi].reshape(size, taps).t()
        else:
            krsc = w.permute(_order(FILTER_LAYOUT[self.layout], "krsc"))
            if self.pass_ == "fwd":  # filters lo:hi: (n, r, s, C) -> (r, s, n, C)
                block = krsc[lo:hi].permute(1, 2, 0, 3)
            else:  # channels lo:hi of every filter: (K, r, s, n) -> (r, s, K, n), runs of n
                block = krsc[..., lo:hi].permute(1, 2, 0, 3)
            src = self.taps[:taps * size]
            if library == "numpy":
                np.copyto(src.numpy().reshape(block.shape), block.numpy())
            else:
                src.view(block.shape).copy_(block)
            src = src.view(taps, size)
        out = self.out[:alpha2 * size].view(alpha2, size)
        BACKENDS[library].matmul(self.kron, src, out)
        return self.view(lo, hi)


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

    A strided problem runs as its phase split (`transforms.phase_split`, given as `split`):
    fwd gathers the tiles of x's phase planes, made by one copy from the padded x
    (`_TileTransform`'s `split`), and transforms the split filter; bwd_data computes the
    gradient of the phase planes, channels last, and scatters it into dx (`_PhaseScatter`).
    """

    def __init__(self, problem: ConvProblem, pass_: str, layout: str, m: int, dtype,
                 split: ConvProblem | None = None, route: Route | None = None,
                 whole_filter: bool = False):
        torch = _torch()
        eq = split or problem  # the stride-1 problem the tiles run
        stride = problem.stride
        self.pass_, self.route = pass_, route
        r = eq.r
        t = winograd_matrices(m, r).astype(dtype)
        in_shape = problem.operand_shapes(pass_, layout)[0]
        extent = (eq.p, eq.q) if pass_ == "fwd" else (eq.h, eq.w)
        counts = _tile_counts(extent, m)
        sizes = tuple(c * m + r - 1 for c in counts)
        if pass_ == "fwd":  # x padded by pad, to whole tiles of the phase planes
            self.pad = _Padding(in_shape, layout, problem.pad, tuple(stride * e for e in sizes),
                                dtype)
            self.data = _tiles(self.pad.shape, t.BT, m, counts, dtype, split=stride)
        else:
            self.pad = _Padding(in_shape, layout, r - 1 - eq.pad, sizes, dtype)
            self.data = _tiles(self.pad.shape, t.BT, m, counts, dtype)
        g = t.G if pass_ == "fwd" else t.G[:, ::-1]
        channels = {"fwd": (eq.c, eq.k), "bwd_data": (eq.k, eq.c)}[pass_]
        self.cin, self.cout = channels
        #: Output channels per block of `fused`'s filter transforms and products, or None
        #: where the filters are transformed whole (`transform_w`, then `product`).
        self.block = None if whole_filter else filter_block(problem, pass_, m, dtype)
        if self.block:
            self.filter = _BlockedFilter(g, layout, pass_, self.block, self.cin, dtype)
        else:  # the nhwc forward product (T×C)·(C×K) reads the filters as (C, K) rows
            self.filter = _FilterTransform(g, problem.w_shape(layout), layout, dtype, stride,
                                           ck=pass_ == "fwd" and layout == "nhwc")
        self.tiles = eq.n * counts[0] * counts[1]
        self.alpha2 = t.alpha ** 2
        # bwd_data at a stride: the phase planes' gradient, channels last, then dx from it
        self.scatter = self.planes = None
        if pass_ == "bwd_data" and stride > 1:
            self.planes = torch.from_numpy(workspace(eq.x_shape("nhwc"), dtype))
            self.scatter = _PhaseScatter((eq.h, eq.w), (problem.h, problem.w), stride,
                                         problem.pad, layout)
        self.tile_layout = tiled = "nhwc" if self.planes is not None else layout
        # the product's order is the output's: (channel, tiles) for nchw, (tiles, channel) nhwc
        size = {"n": eq.n, "c": self.cout, "h": counts[0], "w": counts[1]}
        order = _TILE_ORDER[tiled]
        self.prod = torch.from_numpy(workspace((self.alpha2, *(size[a] for a in order)), dtype))
        nchw = tiled == "nchw"
        # nhwc: compiled where the products are large (`winograd_jit.InverseKernel`), else two
        # GEMMs with Aᵀ; nchw: one GEMM writing the tiles transposed (`_Kron`'s note)
        self.kernel = None
        if not nchw and winograd_jit.applies(self.alpha2 * self.tiles * self.cout, dtype):
            self.kernel = winograd_jit.InverseKernel(t.AT, counts, dtype)
            self.untransform = None
        else:
            self.untransform = (_Kron(t.AT, tuple(size[a] for a in order), dtype, last=nchw)
                                if nchw else _Sandwich(t.AT, tuple(size[a] for a in order),
                                                       dtype))
        self.place = _Placement((order + "ij") if nchw else ("ij" + order), tiled, m, extent)
        self.v = self.u = None

    @property
    def workspace_bytes(self) -> int:
        planes = 0 if self.planes is None else self.planes.numel() * self.planes.element_size()
        untransform = 0 if self.untransform is None else self.untransform.nbytes
        return (self.pad.nbytes + self.data.nbytes + self.filter.nbytes + planes
                + self.prod.numel() * self.prod.element_size() + untransform)

    def compile(self) -> None:
        """The compiled transforms' machine code, before any timed call."""
        winograd_jit.compile_all(self.data, self.filter, self)

    def gemm_shape(self) -> tuple[int, int, int]:
        """(rows, depth, columns) of each per-frequency GEMM."""
        return ((self.cout, self.cin, self.tiles) if self.tile_layout == "nchw" else
                (self.tiles, self.cin, self.cout))

    def transform_a(self, a, b, out) -> None:
        self.v = _channel_major(self.data(self.pad(tensor(a))))  # (alpha², in ch, tiles)

    def transform_w(self, a, w, out) -> None:
        u = self.filter(tensor(w))
        self.u = u if self.pass_ == "fwd" else u.transpose(1, 2)  # (alpha², out ch, in ch)

    def product(self, a, b, out) -> None:
        nchw = self.tile_layout == "nchw"
        prod = self.prod.view(self.alpha2, -1, self.tiles if nchw else self.cout)
        if nchw:  # (K×C)·(C×T): the product in (channel, tiles) order
            self.route.matmul(self.u, self.v, prod)
        else:  # (T×C)·(C×K): in (tiles, channel) order
            self.route.matmul(self.v.transpose(1, 2), self.u.transpose(1, 2), prod)

    def fused(self, a, w, out) -> None:
        """The filters transformed a block of output channels at a time, each block's products
        right after, while its transformed filters are in cache: the block's rows of the
        product (nchw) or its columns (nhwc)."""
        w = tensor(w)
        if self.tile_layout == "nchw":
            prod = self.prod.view(self.alpha2, self.cout, self.tiles)
        else:
            prod = self.prod.view(self.alpha2, self.tiles, self.cout)
            v = self.v.transpose(1, 2)  # (alpha², T, in ch)
        for lo in range(0, self.cout, self.block):
            hi = min(self.cout, lo + self.block)
            u = self.filter.view(lo, hi)  # (alpha², channels, in ch)
            left, right, dest = ((u, self.v, prod[:, lo:hi]) if self.tile_layout == "nchw"
                                 else (v, u.transpose(1, 2), prod[:, :, lo:hi]))
            # the block's filters on the product's library: one thread pool, not two in turn
            library = self.route.library(left, right, dest)
            self.filter(w, lo, hi, library)
            BACKENDS[library].matmul(left, right, dest)

    def inverse(self, a, b, out) -> None:
        target = tensor(out) if self.planes is None else self.planes
        if self.kernel is not None:  # nhwc: (alpha², tiles, K) into the nhwc target
            self.kernel(self.prod.view(self.alpha2, self.tiles, self.cout).numpy(),
                        target.numpy())
        else:
            self.place(self.untransform(self.prod), target)
        if self.planes is None:
            return
        s = self.scatter.stride
        n, h, w, c = self.planes.shape
        self.scatter(self.planes.view(n, h, w, s, s, c // (s * s)), tensor(out))


class _WeightGradient:
    """bwd_filter (x, dy -> dw) with F(3x3, m×m): dw[k, c] is the sum over batch and dy tiles of
    the correlation of an (m+2)×(m+2) x tile with an m×m dy tile as the filter; the sum is the
    per-frequency GEMM (K×tiles)·(tiles×C).

    A strided problem runs as its phase split (`split`): the x tiles are tiles of its phase
    planes (`_TileTransform`'s `split`), the GEMM gives the split filter's gradient, and each
    phase's taps are copied into dw's taps s·a + b (the padding taps past the filter dropped)."""

    #: Never transformed by blocks (`filter_block`): its "filter" is dy.
    block = None

    def __init__(self, problem: ConvProblem, layout: str, m: int, dtype,
                 split: ConvProblem | None = None, route: Route | None = None):
        torch = _torch()
        p, eq = problem, split or problem
        self.route = route
        stride = p.stride
        t = winograd_matrices(eq.r, m).astype(dtype)
        counts = _tile_counts((eq.p, eq.q), m)
        self.x_pad = _Padding(p.x_shape(layout), layout, p.pad,
                              tuple(stride * (c * m + eq.r - 1) for c in counts), dtype)
        self.dy_pad = _Padding(p.y_shape(layout), layout, 0, tuple(c * m for c in counts), dtype)
        self.x = _tiles(self.x_pad.shape, t.BT, m, counts, dtype, split=stride)
        self.dy = _tiles(self.dy_pad.shape, t.G, m, counts, dtype)
        self.alpha2 = t.alpha ** 2
        self.prod = torch.from_numpy(workspace((self.alpha2, eq.k, eq.c), dtype))
        # kcrs: the untransform's transposed form is (K, C, r, s), the filters' own order
        nchw = layout == "nchw" and stride == 1
        self.untransform = _Kron(t.AT, (eq.k, eq.c), dtype, last=nchw)
        self.perm = _order("kcrs" if nchw else "rskc", FILTER_LAYOUT[layout])
        self.k, self.c, self.tiles = eq.k, eq.c, eq.n * counts[0] * counts[1]
        self.stride, self.layout, self.channels = stride, layout, p.c
        # at a stride: the split filter's gradient (r', r', K, s, s, C) put in taps s·a + b of
        # (K, s·r', s·r', C), whose taps inside the filter are dw
        self.padded = None if stride == 1 else torch.from_numpy(
            workspace((p.k, stride * eq.r, stride * eq.r, p.c), dtype))
        self.window = (slice(None), slice(0, p.r), slice(0, p.s))
        self.v = self.u = None

    @property
    def workspace_bytes(self) -> int:
        padded = 0 if self.padded is None else self.padded.numel() * self.padded.element_size()
        return (self.x_pad.nbytes + self.dy_pad.nbytes + self.x.nbytes + self.dy.nbytes + padded
                + self.prod.numel() * self.prod.element_size() + self.untransform.nbytes)

    def compile(self) -> None:
        winograd_jit.compile_all(self.x, self.dy)

    def gemm_shape(self) -> tuple[int, int, int]:
        return (self.k, self.tiles, self.c)

    def transform_a(self, x, dy, out) -> None:
        self.v = _channel_major(self.x(self.x_pad(tensor(x))))  # (alpha², C, tiles)

    def transform_w(self, x, dy, out) -> None:
        self.u = _channel_major(self.dy(self.dy_pad(tensor(dy))))  # (alpha², K, tiles)

    def product(self, x, dy, out) -> None:
        self.route.matmul(self.u, self.v.transpose(1, 2), self.prod)

    def inverse(self, x, dy, out) -> None:
        grad = self.untransform(self.prod)
        if self.stride == 1:
            tensor(out).copy_(grad.permute(self.perm))
            return
        s, taps = self.stride, grad.shape[0]
        grad = grad.view(taps, taps, self.k, s, s, self.channels)  # (a_h, a_w, K, b_h, b_w, C)
        self.padded.view(self.k, taps, s, taps, s, self.channels).copy_(
            grad.permute(2, 0, 3, 1, 4, 5))
        dw = tensor(out).permute(_order(FILTER_LAYOUT[self.layout], "krsc"))
        dw.copy_(self.padded[self.window])


class Winograd(Implementation):
    """F(m×m, r×r) for square `filter_sizes` filters, stride 1, dense, one padding for both
    axes; subclasses set `m`. The GPU kernels (`winograd_kernels`) subclass it too, so both
    refuse the same problems alike (the kernels take 3x3 only)."""

    m: int
    precisions = ("fp64", "fp32")
    filter_sizes: tuple[int, ...] = (_R,)
    #: Whether a stride above 1 runs, as its phase split (`transforms.phase_split`).
    strided = False

    def supports(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        p = problem
        sizes = " or ".join(f"{r}x{r}" for r in self.filter_sizes)
        split = self.strided and not isinstance(p.stride, tuple) and p.stride > 1
        if split:  # the phase split's filter: ceil(r/stride) taps, rounded up to a size
            s, least, most = p.stride, min(self.filter_sizes), max(self.filter_sizes)
            lo, hi = s * (least - 1) + 1, s * most
            filters = (p.r == p.s and lo <= p.r <= hi,
                       f"{lo}x{lo} to {hi}x{hi} filters at stride {s} ({sizes} per phase)",
                       f"{p.r}x{p.s}")
        else:
            filters = (p.r == p.s and p.r in self.filter_sizes, f"{sizes} filters",
                       f"{p.r}x{p.s}")
        stride = ((not isinstance(p.stride, tuple), "one stride for both axes",
                   pair_text(p.stride)) if self.strided else
                  (p.stride == 1, "stride 1", pair_text(p.stride)))
        for ok, need, got in (filters, stride,
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
    """The NumPy-backend passes: `_TiledOutput` and `_WeightGradient`, in four phases. A
    strided problem runs as its phase split (`transforms.phase_split`): AlexNet's 11x11 conv1
    at stride 4 as 16 phases of 3 channels, 48 in all, with 3x3 filters (11x11 padded to 12x12:
    the 144/121 zero taps cost 19% more products, Winograd saves 2.3-4x)."""

    filter_sizes = CPU_FILTER_SIZES
    strided = True
    split_dilation = True  # a dilated filter's phases are undilated tiles' problems

    def _split(self, problem: ConvProblem) -> ConvProblem | None:
        """The stride-1 problem a strided one runs as, None at stride 1."""
        return None if problem.stride == 1 else phase_split(problem, self.filter_sizes)

    def _pass(self, problem, pass_, layout, precision, route: Route | None = None):
        """The pass's buffers and steps; `route` takes its products (a pass that only
        describes or sizes itself runs none)."""
        dtype, split = DTYPES[precision], self._split(problem)
        if pass_ == "bwd_filter":
            return _WeightGradient(problem, layout, self.m, dtype, split, route)
        return _TiledOutput(problem, pass_, layout, self.m, dtype, split, route)

    def describe(self, problem, pass_, layout, precision) -> str:
        run = self._pass(problem, pass_, layout, precision)
        rows, depth, cols = run.gemm_shape()
        pages = pages_note(run.workspace_bytes)
        split = self._split(problem)
        how = "" if split is None else (
            f"; stride {problem.stride} as {problem.stride ** 2} stride-1 phases: {split.c} "
            f"channels, {problem.r}x{problem.s} filters as {split.r}x{split.s}")
        if run.block:
            how += (f"; filters transformed {run.block} output channels at a time, each "
                    "block's products next")
        return (f"{super().describe(split or problem, pass_, layout, precision)} "
                f"({rows}x{depth})·({depth}x{cols}), "
                f"{note((self.algo, problem, pass_, layout, precision))}, "
                f"{threads.count()} threads{how}" + (f"; {pages}" if pages else ""))

    def workspace_bytes(self, problem: ConvProblem, pass_: str, layout: str,
                        precision: str) -> int:
        """Bytes of the buffers a prepared pass holds beyond its operands: padded inputs,
        gathered and transformed tiles and filters, the per-frequency products, output tiles.
        (Allocated untouched, so asking costs no memory traffic.)"""
        return self._pass(problem, pass_, layout, precision).workspace_bytes

    def phases(self, problem, pass_, layout, precision) -> list[str]:
        """The four of `phase_names`; where the filters are transformed by blocks
        (`filter_block`), their transform and the product alternate block by block: one
        phase, `FUSED`, between the transform of the data and the inverse."""
        names = phase_names(pass_)
        if filter_block(problem, pass_, self.m, DTYPES[precision]):
            return [names[0], FUSED, names[3]]
        return names

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        route = Route((self.algo, problem, pass_, layout, precision))
        run = self._pass(problem, pass_, layout, precision, route)
        run.compile()
        steps = ((run.transform_a, run.fused, run.inverse) if run.block else
                 (run.transform_a, run.transform_w, run.product, run.inverse))
        return Phased(dict(zip(self.phases(problem, pass_, layout, precision), steps)))


def winograd(m: int, tolerance: str, name: str = "winograd", fused: bool = False) -> Algorithm:
    """The traits of F(m×m, r×r) on m×m tiles: our own, counted (its products are fewer),
    judged by the column of its transform's size (`tolerance`, for 3x3 filters)."""
    return Algorithm(f"{name}-{m}x{m}", family="winograd", origin="ours", tolerance=tolerance,
                     reduction="counted", counts=WinogradCount(m, fused=fused), deterministic=True,
                     tile=m)


#: Per tile m, its traits: F(5x5, 3x3)'s alpha 7 takes the column of alpha 8 (6x6's), the
#: measured errors of 5x5 tiles being 6x6's kind (docs/pages/cpu-algorithms.md, Winograd).
WINOGRAD = {2: winograd(2, "winograd-alpha4"), 4: winograd(4, "winograd-alpha6"),
            5: winograd(5, "winograd-alpha8"), 6: winograd(6, "winograd-alpha8")}


@register(WINOGRAD[2], "numpy")
class Winograd2x2(WinogradCPU):
    m = 2


@register(WINOGRAD[4], "numpy")
class Winograd4x4(WinogradCPU):
    m = 4


@register(WINOGRAD[5], "numpy")
class Winograd5x5(WinogradCPU):
    """F(5x5, 3x3), alpha 7: on 13x13 outputs (AlexNet's conv3-conv5) its tiles cover 15x15
    where F(4x4)'s cover 16x16, so 49/25·(15/13)² = 2.61 multiplications per output against
    3.41. 3x3 filters only: F(5x5, 5x5) needs alpha 9, past 6x6's points."""

    m = 5
    filter_sizes = (3,)


@register(WINOGRAD[6], "numpy")
class Winograd6x6(WinogradCPU):
    m = 6
    filter_sizes = (3,)


#: The phase of an inference variant that compares w with the copy its transform was made
#: from, transforming it again only where it differs.
CHECK_W = "check w"


class _KeptFilter:
    """The filters of a `_TiledOutput` transformed once: each call compares w with the copy
    of the weights the transform was made from, and transforms again only where they differ
    (the first call, new weights), so a changed filter is never run with a stale transform."""

    def __init__(self, run: _TiledOutput):
        self.run, self.copy = run, None

    def check(self, a, w, out) -> None:
        now = tensor(w)
        if self.copy is not None and self.copy.dtype == now.dtype and \
                _torch().equal(self.copy, now):
            return
        self.run.transform_w(a, w, out)
        self.copy = now.clone()

    def forget(self) -> None:
        """Drop the kept weights (the pass forgets its last call's arrays)."""
        self.copy = None


class WinogradInference(WinogradCPU):
    """Winograd's forward pass as an inference engine runs it (NNPACK's, TVM's and oneDNN's
    inference formats): the filters transformed at the first call and kept (whole: never by
    blocks) while the weights stay the same, so a call transforms the input, multiplies and
    transforms back. Each call compares w with the weights the transform was made from (a phase
    of its own, `CHECK_W`, timed): new weights are transformed again, never run stale. Its
    traits say `weights_once`: its rows are reported apart and no plan takes it."""

    def supports(self, problem, pass_, layout, precision):
        if pass_ != "fwd":
            return f"{self.algo} is an inference variant: fwd only"
        return super().supports(problem, pass_, layout, precision)

    def _pass(self, problem, pass_, layout, precision, route: Route | None = None):
        return _TiledOutput(problem, pass_, layout, self.m, DTYPES[precision],
                            self._split(problem), route, whole_filter=True)

    def describe(self, problem, pass_, layout, precision) -> str:
        return (f"{super().describe(problem, pass_, layout, precision)}; filters transformed "
                "once and kept while w is unchanged (inference: each call compares w with its "
                "copy)")

    def workspace_bytes(self, problem, pass_, layout, precision) -> int:
        """The per-call variant's, the filters transformed whole, and the copy of w."""
        w = math.prod(problem.w_shape()) * ELEMENT_BYTES[precision]
        return super().workspace_bytes(problem, pass_, layout, precision) + w

    def phases(self, problem, pass_, layout, precision) -> list[str]:
        names = phase_names(pass_)
        return [CHECK_W, names[0], names[2], names[3]]

    def prepare(self, problem, pass_, layout, precision):
        route = Route((self.algo, problem, pass_, layout, precision))
        run = self._pass(problem, pass_, layout, precision, route)
        run.compile()
        kept = _KeptFilter(run)
        steps = (kept.check, run.transform_a, run.product, run.inverse)
        return Phased(dict(zip(self.phases(problem, pass_, layout, precision), steps)),
                      on_forget=kept.forget)


def inference(m: int) -> Algorithm:
    """The traits of tile m's inference variant: its per-call twin's, but `weights_once` and
    counted without the filter transform."""
    base = WINOGRAD[m]
    return dataclasses.replace(base, name=f"{base.name}-inference",
                               counts=WinogradCount(m, filters_once=True), weights_once=True)


WINOGRAD_INFERENCE = {m: inference(m) for m in WINOGRAD}


def _register_inference() -> None:
    """Each tile's inference variant, a subclass taking its per-call twin's tile and filter
    sizes, registered under its traits."""
    for twin in (Winograd2x2, Winograd4x4, Winograd5x5, Winograd6x6):
        cls = type(f"{twin.__name__}Inference", (WinogradInference,),
                   {"m": twin.m, "filter_sizes": twin.filter_sizes, "__module__": __name__,
                    "__doc__": f"{WinogradInference.__name__} of {twin.__name__}."})
        register(WINOGRAD_INFERENCE[twin.m], "numpy")(cls)


_register_inference()
