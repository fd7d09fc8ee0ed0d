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
where the images are summed: one product per image, accumulated through a buffer of one filter
group's size (NumPy's matmul cannot accumulate). The column buffer is allocated and its padding
zeroed in `prepare`; the timed call copies only the windows inside the input. Its size (plus
that sum buffer) is `workspace_bytes` — the memory cost that makes this algorithm notable.
"""

from __future__ import annotations

import math

import numpy as np

from ..problem import ConvProblem
from ..reference import DTYPES
from ..registry import Implementation, register
from ._lowering import (
    axis_pairs,
    channel_major,
    contiguous_inputs,
    gather,
    nbytes,
    reshaped,
    scatter_add,
    span,
    windows,
)


class _Lowered:
    """The column buffer of one problem in one layout and, per group, the channel-major batched
    views the products use: (batch, reduction, positions)."""

    def __init__(self, problem: ConvProblem, layout: str, dtype):
        p = problem
        self.layout, self.problem = layout, p
        rows = axis_pairs(p.r, p.dil_h, p.p, p.h, p.stride_h, p.pad_top)
        cols = axis_pairs(p.s, p.dil_w, p.q, p.w, p.stride_w, p.pad_left)
        self.windows = windows(rows, cols, layout, taps_first=layout == "nchw")
        if layout == "nchw":
            self.col = np.zeros((p.n, p.c, p.r, p.s, p.p, p.q), dtype)
            self.indexed = self.col
            self.matrices = [self.col[:, span(g, p.cg)].reshape(p.n, -1, p.p * p.q)
                             for g in range(p.groups)]
        else:
            # Group-major, so each group's (N·P·Q) × (R·S·C/g) matrix is one contiguous block;
            # the windows index it as (N, P, Q, R, S, G, C/g) to match x viewed as N,H,W,G,C/g.
            self.col = np.zeros((p.groups, p.n, p.p, p.q, p.r, p.s, p.cg), dtype)
            self.indexed = self.col.transpose(1, 2, 3, 4, 5, 0, 6)
            self.matrices = [channel_major(self.col[g].reshape(1, p.n * p.p * p.q, -1), layout)
                             for g in range(p.groups)]

    def activation(self, a: np.ndarray) -> np.ndarray:
        """x or dx as the windows index it (nhwc: channels split into groups, as a view)."""
        p = self.problem
        return a if self.layout == "nchw" else reshaped(a, (p.n, p.h, p.w, p.groups, p.cg))

    def output_side(self, a: np.ndarray, g: int) -> np.ndarray:
        """Group g of y or dy as (batch, K/g, positions), matching the column views' batch."""
        p = self.problem
        if self.layout == "nchw":
            batched = reshaped(a, (p.n, p.k, p.p * p.q))
        else:
            batched = channel_major(reshaped(a, (1, p.n * p.p * p.q, p.k)), self.layout)
        return batched[:, span(g, p.k // p.groups)]


def _sum_buffer_shape(p: ConvProblem, pass_: str, layout: str) -> tuple[int, int]:
    """The buffer an nchw bwd_filter adds each later image's (K/g) × (C/g·R·S) product through
    (NumPy's matmul cannot accumulate into dw); empty elsewhere: the first image's product is
    written into dw, and nhwc's images are one product."""
    if pass_ != "bwd_filter" or layout != "nchw" or p.n == 1:
        return (0, 0)
    return (p.k // p.groups, p.cg * p.r * p.s)


@register("gemm", "numpy")
class GemmCPU(Implementation):
    precisions = ("fp64", "fp32")
    asymmetric_pad = True  # im2col reads padding before; the output size holds the rest

    def supports(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        return None

    def workspace_bytes(self, problem: ConvProblem, pass_: str, layout: str,
                        precision: str) -> int:
        """Bytes of the im2col buffer (every pass lowers the input or dx once), plus, in an nchw
        bwd_filter of several images, the product buffer the images' products are summed
        through (a filter group's size)."""
        p = problem
        col = p.n * p.c * p.r * p.s * p.p * p.q
        return nbytes(col + math.prod(_sum_buffer_shape(p, pass_, layout)), precision)

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        low = _Lowered(problem, layout, DTYPES[precision])
        kg = problem.k // problem.groups
        spans = [span(g, kg) for g in range(problem.groups)]

        def filters(w):
            """Per group, the (K/g) × (reduction) filter matrix, a view of w or dw."""
            w2 = reshaped(w, (problem.k, -1))
            return [w2[span] for span in spans]

        if pass_ == "fwd":
            @contiguous_inputs
            def run(x, w, out):
                gather(low.activation(x), low.indexed, low.windows)
                for g, wg in enumerate(filters(w)):
                    np.matmul(wg, low.matrices[g], out=low.output_side(out, g))
        elif pass_ == "bwd_data":
            @contiguous_inputs
            def run(dy, w, out):
                for g, wg in enumerate(filters(w)):
                    np.matmul(wg.T, low.output_side(dy, g), out=low.matrices[g])
                scatter_add(low.indexed, low.activation(out), low.windows)
        else:
            tmp = np.empty(_sum_buffer_shape(problem, pass_, layout), DTYPES[precision])

            @contiguous_inputs
            def run(x, dy, out):
                gather(low.activation(x), low.indexed, low.windows)
                for g, dwg in enumerate(filters(out)):
                    col, dyg = low.matrices[g], low.output_side(dy, g)
                    np.matmul(dyg[0], col[0].T, out=dwg)
                    for i in range(1, len(col)):  # nchw: one product per image, summed
                        np.matmul(dyg[i], col[i].T, out=tmp)
                        dwg += tmp
        return run
