"""Index arithmetic shared by the CPU `direct` and `gemm` implementations.

Both walk a grid of taps and, for each, copy a rectangle between an activation (x or dx) and a
lowered buffer: `gemm` copies what filter tap (r, s) sees into its im2col matrix, `direct` copies
the input into stride × stride phase planes. In both cases tap t of an axis reads input index
``o * stride + t * step - pad`` for output position o, so one function (`axis_pairs`) finds the
output and input ranges where that index lies inside the input. Padding costs nothing per call:
positions outside those ranges are zeros written once when the buffer is allocated, and the
copies in the timed call touch only the rectangles.

The copies are precomputed as `Window`s in `prepare()`; each is a pair of index tuples
(into the lowered buffer, into the activation), used by `gather` (im2col), `scatter` (the inverse
of a bijective gather) and `scatter_add` (col2im: overlapping windows add up).
"""

from __future__ import annotations

import numpy as np

from ..problem import ELEMENT_BYTES

#: (index into the lowered buffer, index into the activation).
Window = tuple[tuple, tuple]


def axis_pairs(taps: int, step: int, out_size: int, in_size: int, stride: int,
               pad: int) -> list[tuple[slice, slice]]:
    """For each tap t of one spatial axis: the output slice and the (strided) input slice of the
    positions o whose input index o*stride + t*step - pad lies in [0, in_size)."""
    pairs = []
    for t in range(taps):
        first = t * step - pad
        lo = max(0, -(first // stride))  # ceil(-first / stride), clipped at 0
        hi = max(lo, min(out_size, (in_size - 1 - first) // stride + 1))
        start = lo * stride + first
        pairs.append((slice(lo, hi), slice(start, start + (hi - lo - 1) * stride + 1, stride)
                      if hi > lo else slice(0, 0)))
    return pairs


def spatial(layout: str, *index) -> tuple:
    """An index tuple putting `index` on the axes after N (nhwc) or after N and C (nchw): the
    spatial axes of an activation, and the tap/position axes of a lowered buffer."""
    return (slice(None), slice(None), *index) if layout == "nchw" else (slice(None), *index)


def windows(rows: list[tuple[slice, slice]], cols: list[tuple[slice, slice]], layout: str,
            taps_first: bool) -> list[Window]:
    """The windows of a grid of taps: the buffer has axes (tap_r, tap_s, out_h, out_w) when
    `taps_first`, else (out_h, out_w, tap_r, tap_s), where `spatial` puts them."""
    out = []
    for r, (po, hi) in enumerate(rows):
        for s, (qo, wi) in enumerate(cols):
            buf = (r, s, po, qo) if taps_first else (po, qo, r, s)
            out.append((spatial(layout, *buf), spatial(layout, hi, wi)))
    return out


def gather(act: np.ndarray, buf: np.ndarray, wins: list[Window]) -> None:
    """Copy every window of `act` into `buf` (im2col; the phase split)."""
    for b, a in wins:
        buf[b] = act[a]


def scatter(buf: np.ndarray, act: np.ndarray, wins: list[Window]) -> None:
    """Copy `buf` back into `act`, for windows that tile the activation exactly once."""
    for b, a in wins:
        act[a] = buf[b]


def scatter_add(buf: np.ndarray, act: np.ndarray, wins: list[Window]) -> None:
    """col2im: zero `act`, then add every window of `buf` into it. Windows of different taps
    overlap; adding one tap's strided slice at a time sums them without np.add.at (within one
    tap the positions are distinct)."""
    act.fill(0)
    for b, a in wins:
        act[a] += buf[b]


def span(g: int, size: int) -> slice:
    """The channels of group g, for groups of `size` channels."""
    return slice(g * size, (g + 1) * size)


def reshaped(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`a` reshaped as a view: writes through a silent copy would never reach the output."""
    v = a.reshape(shape)
    if not np.may_share_memory(v, a):
        raise ValueError(f"output of shape {a.shape} must be C-contiguous")
    return v


def channel_major(a: np.ndarray, layout: str) -> np.ndarray:
    """A (..., channels, length) view of a (..., channels, length) nchw or (..., length,
    channels) nhwc array: one matrix-product formula then serves both layouts, and BLAS reads
    the nhwc operand transposed, in place."""
    return a if layout == "nchw" else a.swapaxes(-1, -2)


def nbytes(elements: int, precision: str) -> int:
    return elements * ELEMENT_BYTES[precision]


def tensor(a: np.ndarray):
    """A torch tensor sharing `a`'s memory, so the CPU algorithms run their copies and products
    through torch (MKL, its thread pool) on NumPy's buffers; a copy only for what torch cannot
    view (negative strides, read-only arrays)."""
    import torch

    if not a.flags.writeable or any(s < 0 for s in a.strides):
        a = a.copy()
    return torch.from_numpy(a)
