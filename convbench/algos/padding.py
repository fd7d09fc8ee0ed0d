"""Padding that differs before and after, for implementations that pad both sides alike.

Most libraries and kernels take one padding per axis, applied on both sides (torch's and
cuDNN's convolutions, the FFT grids, Winograd's tiles). A problem whose axis pads unequally runs
there as `ConvProblem.symmetric_part()`: x padded (or cropped, where no output reads its last
rows) explicitly by the difference, then the same convolution padded alike. This module holds
that explicit step for NumPy and CuPy arrays: fwd and bwd_filter pad x into a buffer allocated
once (its zeros written once, each call copying only the input's rows), bwd_data crops the
symmetric problem's dx into the output (zeros where no output reads the input). The harness
times the step as a phase of its own, kept apart from the pass's time like the copy of a
library's result (`phases.EXPLICIT_PAD`, `phases.CROP`).
"""

from __future__ import annotations

import math

import numpy as np

from ..core.problem import ELEMENT_BYTES, ConvProblem

#: The spatial axes of an activation in each layout.
_SPATIAL = {"nchw": (2, 3), "nhwc": (1, 2)}


def _array_module(a):
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def _windows(size: int, before: int, after: int) -> tuple[slice, slice]:
    """(slice of the padded axis, slice of the original) holding the original's rows that the
    padded axis keeps: `before` zeros first (negative: rows cut), `after` after."""
    padded = size + before + after
    lo_pad, lo_src = max(0, before), max(0, -before)
    n = max(0, min(size - lo_src, padded - lo_pad))
    return slice(lo_pad, lo_pad + n), slice(lo_src, lo_src + n)


def _index(layout: str, rows: slice, cols: slice) -> tuple:
    idx = [slice(None)] * 4
    h, w = _SPATIAL[layout]
    idx[h], idx[w] = rows, cols
    return tuple(idx)


Explicit = tuple[int, int, int, int]


def regions(problem: ConvProblem, layout: str, explicit: Explicit) -> tuple[tuple, tuple]:
    """(index into the padded x, index into this problem's x) of the rows and columns both
    hold, after the explicit pad (left, right, top, bottom) of `symmetric_part()`."""
    left, right, top, bottom = explicit
    rows_pad, rows_src = _windows(problem.h, top, bottom)
    cols_pad, cols_src = _windows(problem.w, left, right)
    return _index(layout, rows_pad, cols_pad), _index(layout, rows_src, cols_src)


def padded_shape(problem: ConvProblem, layout: str, explicit: Explicit) -> tuple[int, ...]:
    """x's shape in `layout` after the explicit pad (left, right, top, bottom)."""
    left, right, top, bottom = explicit
    n, c, h, w = problem.x_shape("nchw")
    h, w = h + top + bottom, w + left + right
    return (n, c, h, w) if layout == "nchw" else (n, h, w, c)


def explicit_bytes(problem: ConvProblem, precision: str, explicit: Explicit) -> int:
    """Bytes of the buffer the explicit step holds: x (or dx) padded; 0 with no explicit pad."""
    if not any(explicit):
        return 0
    return math.prod(padded_shape(problem, "nchw", explicit)) * ELEMENT_BYTES[precision]


class Buffer:
    """x (or dx) padded, in `layout`, allocated at the first call, where the array module
    (NumPy or CuPy) and dtype are known: that call is the harness's untimed check, whose
    memory is the prepared pass's."""

    def __init__(self, shape: tuple[int, ...], zeros: bool):
        self.shape, self.zeros, self.buf = shape, zeros, None

    def get(self, like):
        if self.buf is None or self.buf.dtype != like.dtype or \
                _array_module(self.buf) is not _array_module(like):
            xp = _array_module(like)
            self.buf = (xp.zeros if self.zeros else xp.empty)(self.shape, like.dtype)
        return self.buf


class PadInput:
    """x padded explicitly by (left, right, top, bottom): a buffer zeroed once, the input's
    rows copied in each call."""

    def __init__(self, problem: ConvProblem, layout: str, explicit: Explicit):
        self.buffer = Buffer(padded_shape(problem, layout, explicit), zeros=True)
        self.dst, self.src = regions(problem, layout, explicit)

    def __call__(self, x):
        buf = self.buffer.get(x)
        buf[self.dst] = x[self.src]
        return buf


class CropOutput:
    """dx of the padded problem cropped into this problem's dx: rows cut off by the explicit
    step (read by no output) get zeros, every call, since the output is the caller's."""

    def __init__(self, problem: ConvProblem, layout: str, explicit: Explicit):
        self.buffer = Buffer(padded_shape(problem, layout, explicit), zeros=False)
        self.inner, self.outer = regions(problem, layout, explicit)
        shape = problem.x_shape(layout)
        self.whole = all(self.outer[a].stop - self.outer[a].start == shape[a]
                         for a in _SPATIAL[layout])

    def target(self, out):
        """The buffer the symmetric problem writes its dx into."""
        return self.buffer.get(out)

    def __call__(self, out) -> None:
        if not self.whole:
            out[...] = 0
        out[self.outer] = self.buffer.get(out)[self.inner]
