"""A dilated convolution as an undilated one over its phases (space to batch).

Tap k of an axis dilated by d at stride s reads input ``s·o + d·k - p`` for output o. Where s
divides d, the outputs o = q·a + b (q = d / s phases, b < q) read ``d·(a + k) + s·b - p``:
phase b is an undilated stride-1 convolution of the same filter over the plane
``Z_b[j] = x[d·(j + P) + s·b - p]`` padded by P. The q_h·q_w phases of both axes are equal
problems, so they run as one, the batch times q_h·q_w (TensorFlow's atrous convolution runs
the same way, through `space_to_batch`). A 3x3 filter dilated by 2 is then a 3x3 filter again:
Winograd's and FFT's tiles run it with no zero taps, where the dilated filter as a 5x5 would
spend 25 products on 9 taps.

`split` finds the undilated problem. The copies are `Split`'s: x (or dy) into its phases,
each call copying only the positions inside the input; the phases' result back out. The
buffers are allocated, zeroed, at the first call, where the array module (NumPy or CuPy) and
dtype are known: positions past the input are the zeros the copies never touch, and the
harness's first call is its untimed check, whose memory is the prepared pass's. The copies
are part of the pass (its phases `SPLIT` and `MERGE`), timed with it.
"""

from __future__ import annotations

import dataclasses
import math

from ..core.problem import ELEMENT_BYTES, ConvProblem
from ._lowering import axis_pairs, spatial
from .padding import Buffer

#: The pass's phases before and after the undilated problem's.
SPLIT = "dilation split"
MERGE = "dilation merge"


@dataclasses.dataclass(frozen=True)
class Axis:
    """One spatial axis of the split: `phases` (q) undilated problems of `outputs` outputs
    each (A, the last ones past the problem's where q does not divide it), over `inputs` (J)
    positions padded by `pad` (before, after); `windows[b]` is (slice of Z_b, slice of x)
    holding the positions inside x."""

    phases: int
    outputs: int
    inputs: int
    pad: tuple[int, int]
    windows: tuple[tuple[slice, slice], ...]
    #: the problem's outputs on this axis
    size_out: int
    #: whether the windows hold every input position (else dx has zeros no phase writes)
    covers: bool
    #: the phases' stride: 1 where the axis is dilated, else the problem's
    stride: int

    def lengths(self) -> list[int]:
        """Outputs of each phase that lie in the problem's output: ceil((P - b) / q)."""
        return [-(-(self.size_out - b) // self.phases) for b in range(self.phases)]


def _axis(size: int, out: int, sides: tuple[int, int], stride: int, dil: int,
          taps: int) -> Axis | None:
    """The split of one axis, or None where the stride does not divide the dilation. An
    undilated axis is one phase, the input whole, its stride and padding kept. A dilated one's
    phases are stride 1, padded by P: the largest up to (taps - 1) / 2 whose padded positions
    all lie outside x (so padding supplies exactly the zeros x's border would); P = 0 always
    does, the planes then holding every zero they read."""
    before = sides[0]
    if dil == 1:
        return Axis(1, out, size, sides, ((slice(0, size), slice(0, size)),), out, True, stride)
    if dil % stride:
        return None
    q = dil // stride
    outputs = -(-out // q)
    for pad in range((taps - 1) // 2, -1, -1):
        inputs = outputs + taps - 1 - 2 * pad
        left = pad == 0 or dil * (pad - 1) + stride * (q - 1) - before < 0
        right = pad == 0 or dil * (inputs + pad) - before >= size
        if inputs >= 1 and left and right:
            break
    pairs = axis_pairs(q, stride, inputs, size, dil, before - dil * pad)
    covers = sum(len(range(*x.indices(size))) for _, x in pairs) == size
    return Axis(q, outputs, inputs, (pad, pad), tuple(pairs), out, covers, 1)


@dataclasses.dataclass(frozen=True)
class Split:
    """A dilated problem's undilated form: `problem`, whose batch is the problem's times
    `rows.phases`·`cols.phases` (phase-major: phase (b_h, b_w)'s images are one block)."""

    problem: ConvProblem
    rows: Axis
    cols: Axis

    @property
    def phases(self) -> int:
        return self.rows.phases * self.cols.phases


def split(problem: ConvProblem) -> Split | None:
    """`problem` as undilated phases, or None: it is not dilated, or a stride does not divide
    its axis's dilation (stride 2 with dilation 3 reads every input residue from every
    phase)."""
    p = problem
    if p.dil_h == 1 and p.dil_w == 1:
        return None
    rows = _axis(p.h, p.p, (p.pad_top, p.pad_bottom), p.stride_h, p.dil_h, p.r)
    cols = _axis(p.w, p.q, (p.pad_left, p.pad_right), p.stride_w, p.dil_w, p.s)
    if rows is None or cols is None:
        return None
    sub = ConvProblem(n=p.n * rows.phases * cols.phases, c=p.c, h=rows.inputs, w=cols.inputs,
                      k=p.k, r=p.r, s=p.s, stride=(rows.stride, cols.stride),
                      pad=(rows.pad, cols.pad), groups=p.groups)
    assert (sub.p, sub.q) == (rows.outputs, cols.outputs), (p, sub)
    return Split(sub, rows, cols)


def text(s: Split) -> str:
    """How the row's note says it ran."""
    p = s.problem
    return (f"dilation as {s.rows.phases}x{s.cols.phases} undilated phases (space to batch): "
            f"batch {p.n}, {p.h}x{p.w} planes")


def workspace_bytes(s: Split, precision: str) -> int:
    """The phases' two buffers, the undilated problem's x and y (or dx, dy) in every pass."""
    sub = s.problem
    x, dy = math.prod(sub.x_shape("nchw")), sub.n * sub.k * sub.p * sub.q
    return (x + dy) * ELEMENT_BYTES[precision]


class Phases:
    """The copies between a pass's operands and its undilated problem's, in `layout`."""

    def __init__(self, problem: ConvProblem, s: Split, layout: str):
        sub = s.problem
        qh, qw = s.rows.phases, s.cols.phases
        self.layout, self.s, self.n = layout, s, problem.n
        x_shape, y_shape = sub.x_shape(layout), sub.y_shape(layout)
        self.x = Buffer((qh, qw, problem.n, *x_shape[1:]), zeros=True)
        self.y = Buffer((qh, qw, problem.n, *y_shape[1:]), zeros=True)
        rows, cols = s.rows, s.cols
        self.x_windows = [((bh, bw, *spatial(layout, jh, jw)), spatial(layout, ih, iw))
                          for bh, (jh, ih) in enumerate(rows.windows)
                          for bw, (jw, iw) in enumerate(cols.windows)]
        self.y_windows = [((bh, bw, *spatial(layout, slice(0, lh), slice(0, lw))),
                           spatial(layout, slice(bh, None, qh), slice(bw, None, qw)))
                          for bh, lh in enumerate(rows.lengths())
                          for bw, lw in enumerate(cols.lengths())]
        self.covers = rows.covers and cols.covers

    @staticmethod
    def _flat(buf):
        """The phase-major buffer as the undilated problem's batch."""
        return buf.reshape(-1, *buf.shape[3:])

    def split_x(self, x):
        """x into its phases (fwd, bwd_filter): the undilated problem's input."""
        buf = self.x.get(x)
        for dst, src in self.x_windows:
            buf[dst] = x[src]
        return self._flat(buf)

    def split_y(self, dy):
        """dy into its phases (bwd_data, bwd_filter); outputs past P stay zero."""
        buf = self.y.get(dy)
        for dst, src in self.y_windows:
            buf[dst] = dy[src]
        return self._flat(buf)

    def y_target(self, like):
        """The undilated problem's y, for fwd to write."""
        return self._flat(self.y.get(like))

    def x_target(self, like):
        """The undilated problem's dx, for bwd_data to write."""
        return self._flat(self.x.get(like))

    def merge_y(self, y) -> None:
        buf = self.y.get(y)
        for src, dst in self.y_windows:
            y[dst] = buf[src]

    def merge_x(self, dx) -> None:
        """dx from its phases: each input position belongs to one phase at most; positions no
        phase reads (stride 2 with dilation 2 reads every other row) get zeros."""
        buf = self.x.get(dx)
        if not self.covers:
            dx[...] = 0
        for src, dst in self.x_windows:
            dx[dst] = buf[src]
