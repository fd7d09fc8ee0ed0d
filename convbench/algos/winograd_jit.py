"""Winograd's transforms compiled (`algos.winograd`): the filters' G g Gᵀ and the data tiles'
Bᵀ d B (and bwd_filter's dy tiles, G d Gᵀ), each operand read once and its alpha² values
written once, vectorised over the channels.

As GEMMs the transforms made several passes over memory: the filters one product with G⊗G,
of depth r² = 9 over K·C columns (BLAS runs it far below its peak), after a copy gathering
krsc taps (and another for the nhwc product's (C, K) order); the data tiles a gathering copy
and two GEMMs with Bᵀ, three passes over alpha²/m² times the input. On AlexNet's conv3-conv5
at batch 8 those were 30-40% of a pass (docs/pages/cpu-algorithms.md, Winograd). Here a
filter's r² taps (a window's alpha², from the padded nhwc activation) are loaded once, the two
small matrix products computed from registers (the matrices' entries scalars), and the values
stored into a block buffer of the task's, then copied out by rows.

The kernels are Python in `templates/winograd_filter.py.tmpl` (per alpha, r and filter layout)
and `templates/winograd_tiles.py.tmpl` (per matrix shape), rendered by `jit.source`, compiled
serial (a third of a parallel kernel's compile: 1-4 s a shape, then cached on disk) and run on
the run's threads by `threads.run_shares`.
"""

from __future__ import annotations

import functools

import numpy as np

from ..core.problem import FILTER_LAYOUT
from ..machine import threads
from . import jit


def _sandwich(mat: str, rows: int, width: int, load: str, store: str) -> dict[str, list[str]]:
    """The lines of M·D·Mᵀ (M `rows` × `width`, the kernel's argument `mat`) for a D whose value
    (u, v) is `load` (formatted with u, v and x = u·width + v), each result (a, b) stored by
    `store` (formatted with x = a·rows + b): M's entries named before the loops
    (`constants`), D loaded (`loads`), M·D (`rows`), (M·D)·Mᵀ (`values`)."""
    return {
        "constants": [f"M{a}_{u} = {mat}[{a}, {u}]" for a in range(rows) for u in range(width)],
        "loads": [f"d{u}_{v} = " + load.format(u=u, v=v, x=u * width + v)
                  for u in range(width) for v in range(width)],
        "rows": [f"e{a}_{v} = " + " + ".join(f"M{a}_{u} * d{u}_{v}" for u in range(width))
                 for a in range(rows) for v in range(width)],
        "values": [store.format(x=a * rows + b) + " = " +
                   " + ".join(f"e{a}_{v} * M{b}_{v}" for v in range(width))
                   for a in range(rows) for b in range(rows)]}


@functools.cache
def _filter_module(alpha: int, R: int, krsc: bool):
    """`transform` of r×r filters by a G of alpha × r, from krsc or kcrs filters."""
    fill = [] if krsc else ["for j in range(u0, c1 - c0):",
                            f"    for t in range({R * R}):",
                            "        tb[t, j] = w[k, c0 + j, t]"]
    lines = _sandwich("gm", alpha, R, "w[k, {x}, c]" if krsc else "tb[{x}, j]",
                      "loc[{x}, i, j]")
    layout = "krsc" if krsc else "kcrs"
    return jit.load(f"convbench_wino_filter_a{alpha}_r{R}_{layout}",
                    jit.source(["winograd_filter"],
                               f"F(m, {R}x{R}) on {layout} filters, alpha {alpha}",
                               lines={**lines, "fill": fill}, A2=alpha * alpha, T=R * R))


@functools.cache
def _tiles_module(rows: int, width: int):
    """`tiles` for an M of rows × width."""
    lines = _sandwich("mm", rows, width, "x[n, h0 + {u}, w0 + {v}, c]", "loc[{x}, jj]")
    return jit.load(f"convbench_wino_tiles_{rows}x{width}",
                    jit.source(["winograd_tiles"], f"{rows}x{width} windows", lines=lines,
                               R2=rows * rows))


@functools.cache
def _inverse_module(m: int, alpha: int):
    """`inverse` for an Aᵀ of m × alpha."""
    lines = _sandwich("am", m, alpha, "prod[{x}, tile, c]", "loc[{x}, jj]")
    return jit.load(f"convbench_wino_inverse_{m}x{alpha}",
                    jit.source(["winograd_inverse"], f"{m}x{alpha} inverse", lines=lines,
                               M=m, M2=m * m))


#: The fewest bytes of a transformed operand (filters, tiles, products) the kernels take:
#: below it the GEMM's transform is as quick, and a layer's first call would wait seconds for a
#: compile (once per machine: Numba caches it).
MIN_BYTES = 1 << 20


def applies(values: int, dtype) -> bool:
    """Whether the compiled transforms take an operand transformed into this many values:
    Numba here, MIN_BYTES of them."""
    return jit.available() is None and values * np.dtype(dtype).itemsize >= MIN_BYTES


class _Kernel:
    """A compiled transform of one shape: `compile` (in `prepare`, never in a timed call; a
    pass that is only described or sized neither loads its module nor compiles), then calls."""

    @property
    def fn(self):
        """The Numba function (its module generated and loaded on first use)."""
        raise NotImplementedError

    def _empty(self) -> tuple:
        raise NotImplementedError

    def compile(self) -> None:
        self.fn(*self._empty(), 0, 0)

    def _run(self, tasks: int, *args) -> None:
        """The tasks split over the run's threads (`threads.run_shares`: the kernels are serial
        and release the GIL; compiled serial they take a third of a parallel one's compile)."""
        threads.run_shares(self.fn, [(*args, t0, t1) for t0, t1 in threads.shares(tasks)])


class FilterKernel(_Kernel):
    """The transform of `layout`'s filters (K, C, r×r) by G (alpha × r) into (alpha², K, C)."""

    def __init__(self, g: np.ndarray, shape, layout: str, dtype):
        size = dict(zip(FILTER_LAYOUT[layout], shape))
        c, self.r = size["c"], size["r"]
        self.g = np.ascontiguousarray(g, dtype=dtype)
        self.krsc = FILTER_LAYOUT[layout] == "krsc"
        self.taps = (self.r ** 2, c) if self.krsc else (c, self.r ** 2)  # a filter's, in order

    @functools.cached_property
    def fn(self):
        return _filter_module(self.g.shape[0], self.r, self.krsc).transform

    def _empty(self) -> tuple:
        dtype, alpha = self.g.dtype, self.g.shape[0]
        return np.zeros((0, 0, 0), dtype), self.g, np.zeros((alpha * alpha, 0, 0), dtype)

    def __call__(self, w: np.ndarray, out: np.ndarray) -> None:
        """out (alpha², K', C) from the filters w of K' output channels (the first axis)."""
        self._run(-(-len(w) // 16), w.reshape(len(w), *self.taps), self.g, out)


class TileKernel(_Kernel):
    """M·d·Mᵀ of every `width`-wide window every `step` of an nhwc activation (N, H, W, C),
    `counts` tiles down and across, into (rows², tiles, C)."""

    def __init__(self, mat: np.ndarray, step: int, counts: tuple[int, int], dtype):
        self.m = np.ascontiguousarray(mat, dtype=dtype)
        self.step, self.counts = step, counts

    @functools.cached_property
    def fn(self):
        return _tiles_module(*self.m.shape).tiles

    def _empty(self) -> tuple:
        rows, dtype = self.m.shape[0], self.m.dtype
        return (np.zeros((0, 0, 0, 0), dtype), self.m, np.zeros((rows * rows, 0, 0), dtype),
                self.step, 0, 0)

    def __call__(self, x: np.ndarray, out: np.ndarray) -> None:
        self._run(len(x) * self.counts[0], x, self.m, out, self.step, *self.counts)


class InverseKernel(_Kernel):
    """Aᵀ·M·A of every tile's products (alpha², tiles, K) into an nhwc output (N, P, Q, K),
    `counts` tiles down and across, cropped at its edges."""

    def __init__(self, at: np.ndarray, counts: tuple[int, int], dtype):
        self.a = np.ascontiguousarray(at, dtype=dtype)
        self.counts = counts

    @functools.cached_property
    def fn(self):
        return _inverse_module(*self.a.shape).inverse

    def _empty(self) -> tuple:
        alpha, dtype = self.a.shape[1], self.a.dtype
        return (np.zeros((alpha * alpha, 0, 0), dtype), self.a, np.zeros((0, 0, 0, 0), dtype),
                0, 0)

    def __call__(self, prod: np.ndarray, y: np.ndarray) -> None:
        self._run(len(y) * self.counts[0], prod, self.a, y, *self.counts)


def compile_all(*parts) -> None:
    """Compile the kernels of a pass's parts (those with a `kernel`)."""
    for part in parts:
        kernel = getattr(part, "kernel", None)
        if kernel is not None:
            kernel.compile()
