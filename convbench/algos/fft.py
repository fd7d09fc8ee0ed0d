"""`fft` on `numpy`: convolution as per-frequency products of 2-D real FFTs, like cuDNN's FFT.

Every pass is one recipe: place each input on a periodic grid of the transform size (zeros
elsewhere), transform it over its spatial axes, multiply per frequency with a complex matrix
product over channels, transform back, and cut the output from the grid. The passes differ only
in where each operand sits on the grid, whether one is stored reversed, and which way round the
product goes (`_AXIS_STARTS`, `_FLIP_B`, `_PRODUCT`).

The rules (the measurements behind them: docs/pages/cpu-algorithms.md, `fft`):

- The grid is ``H + pad`` per axis (FFT-friendly), not ``H + 2·pad``: one zero gap serves as the
  padding on both sides of a wrapping operand (`_axis`).
- Spectra are channel-minor, ``(A, Th, Tf, B)``, in both layouts: each frequency's matrix has
  unit stride, so the batched product needs no transpose copy.
- Each 2-D transform is two 1-D stages, so all-zero rows (a 5-row filter on a 30-row grid) skip
  the first and only the rows an output keeps get the last: filters (K·C of them) dominate at
  small batch, so this nearly halves the cost.
- Transforms run in cache-sized chunks of the leading axis, single-threaded FFTW_MEASURE plans,
  each worker taking every n-th chunk (`_run_all`); the workers are the run's thread policy
  (`threads.count()`, read in `prepare`), at most one per chunk, and the note says how many.
- The product is one batched complex GEMM (MKL's cgemm through `torch.matmul` on zero-copy
  views), not `np.matmul`, whose OpenBLAS workers spin after each call and take a core from the
  transforms; neither the 3-multiplication form, a frequency-major filter spectrum nor filters
  in groups beat it: at small batch the product, like the filter transform, is bound by the
  filter spectrum's memory traffic, not by multiplications.
- Plans, buffers and the zeros outside an operand's window are made once in `prepare` (every
  chunk overwrites the same window; FFTW's out-of-place transforms preserve their input).
"""

from __future__ import annotations

import functools
import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..core.problem import ConvProblem, pair_text
from ..machine import threads
from .counts import FFTCount
from .phases import Phased, phase_names
from .registry import Implementation, register
from .traits import Algorithm

#: FFTW planner effort: FFTW_MEASURE's plans for these strided batches run several times faster
#: than FFTW_ESTIMATE's, and measuring on one chunk keeps planning to a fraction of a second.
PLANNER_EFFORT = "FFTW_MEASURE"
#: Target bytes of one chunk's spectrum: about a core's L2.
CHUNK_BYTES = 2 << 20

_SPATIAL = {"nchw": (2, 3), "nhwc": (1, 2)}
_DTYPES = {"fp64": (np.float64, np.complex128), "fp32": (np.float32, np.complex64)}

#: Per pass, on one spatial axis with filter extent r, output extent m, padding pad and grid
#: size t: the grid cell where the first input, the second input and the output start. With
#: x_pad the padded input (y = corr(x_pad, w) is x_pad convolved with the reversed w):
#: fwd        y[p]  = (x@pad ⊛ reversed(w)@0)[p + r - 1]
#: bwd_data   dx[h] = (dy@0 ⊛ w@0)[h + pad]
#: bwd_filter dw[i] = (x@pad ⊛ reversed(dy), its last element at cell 0)[i]
_AXIS_STARTS = {
    "fwd": lambda r, m, pad, t: (pad, 0, r - 1),
    "bwd_data": lambda r, m, pad, t: (0, 0, pad),
    "bwd_filter": lambda r, m, pad, t: (pad, (1 - m) % t, 0),
}
#: Whether the second input is stored reversed along both spatial axes (the first never is).
_FLIP_B = {"fwd": True, "bwd_data": False, "bwd_filter": True}
#: out[f] = left[f] @ right[f] per frequency f, each side an input ("a" or "b") and whether it is
#: transposed. Channel-minor, X[f] is N×C, W[f] is K×C and Y[f] is N×K.
_PRODUCT = {
    "fwd": (("a", False), ("b", True)),  # Y = X · W^T, summed over c
    "bwd_data": (("a", False), ("b", False)),  # dX = dY · W, summed over k
    "bwd_filter": (("b", True), ("a", False)),  # dW = dY^T · X, summed over n
}


def _fast_len(n: int) -> int:
    """Smallest 2^a·3^b·5^c·7^d·11^e·13^f >= n with e + f <= 1: FFTW's fast sizes (the rule of
    `pyfftw.next_fast_len`), kept here so the numpy.fft fallback uses the same grid."""
    def smooth(m: int) -> bool:
        for p in (2, 3, 5, 7):
            while m % p == 0:
                m //= p
        return m in (1, 11, 13)

    return next(m for m in itertools.count(n) if smooth(m))


def fft_refusal(algo: str, problem: ConvProblem) -> str | None:
    """Why FFT convolution (CPU and kernels alike) does not run `problem`: it multiplies whole
    spectra, so it has no stride, dilation or groups; padding, per axis too, is zeros on the
    grid."""
    for field in ("stride", "dilation", "groups"):
        value = getattr(problem, field)
        if value != 1:
            return f"{field} {pair_text(value)}: {algo} supports {field} 1 only, like cuDNN's FFT"
    return None


def _axis(pass_: str, n: int, r: int, pad: int) -> tuple[int, tuple[int, int, int]]:
    """Grid size and (first input, second input, output) start cells on one spatial axis.

    A circular convolution equals the linear one on the outputs kept when no kept output also
    collects a product wrapped around the grid; for all three passes that holds once the grid
    has n + pad cells (a wrapped index lands in the pad-wide zero gap beside the input), and the
    grid must hold the output (m) and the filter (r) too.
    """
    m = n + 2 * pad - r + 1
    t = _fast_len(max(n + pad, m, r))
    return t, _AXIS_STARTS[pass_](r, m, pad, t)


def _segments(start: int, length: int, period: int) -> list[tuple[slice, slice]]:
    """(grid slice, operand slice) pairs covering `length` cells from `start` on a circle."""
    first = min(length, period - start)
    segs = [(slice(start, start + first), slice(0, first))]
    if first < length:
        segs.append((slice(0, length - first), slice(first, length)))
    return segs


@dataclass(frozen=True)
class _Window:
    """Where one operand sits on the transform grid: its shape in the layout, the grid cell of
    its first element per spatial axis, and whether it is stored reversed."""

    shape: tuple[int, int, int, int]
    start: tuple[int, int]
    flip: bool = False


@dataclass(frozen=True)
class _Geometry:
    """The grid, windows and buffer shapes of one (problem, pass, layout, precision)."""

    layout: str
    size: tuple[int, int]
    real: type
    cplx: type
    a: _Window
    b: _Window
    out: _Window
    workers: int = 1  #: the run's threads (`threads.count()`) when the pass was prepared

    @property
    def spatial(self) -> tuple[int, int]:
        return _SPATIAL[self.layout]

    def band(self, win: _Window) -> slice:
        """The grid rows an operand touches: its own rows if it does not wrap, else all."""
        start, rows = win.start[0], win.shape[self.spatial[0]]
        return slice(start, start + rows) if start + rows <= self.size[0] else \
            slice(0, self.size[0])

    def spectrum_shape(self, win: _Window) -> tuple[int, int, int, int]:
        """Channel-minor spectrum (A, Th, Tf, B) of an operand."""
        a, b = (d for i, d in enumerate(win.shape) if i not in self.spatial)
        return (a, self.size[0], self.size[1] // 2 + 1, b)

    def chunk(self, win: _Window) -> int:
        """Leading-axis items per chunk: the largest divisor whose spectrum fits CHUNK_BYTES
        (equal chunks, so one plan serves them all)."""
        lead, *rest = self.spectrum_shape(win)
        item = int(np.prod(rest)) * np.dtype(self.cplx).itemsize
        return max(d for d in range(1, lead + 1)
                   if lead % d == 0 and (d == 1 or d * item <= CHUNK_BYTES))

    def grid_shape(self, win: _Window) -> tuple[int, int, int, int]:
        """One chunk of an operand's real grid, in its layout: band rows by full grid width."""
        shape = list(win.shape)
        shape[0] = self.chunk(win)
        band = self.band(win)
        shape[self.spatial[0]] = band.stop - band.start
        shape[self.spatial[1]] = self.size[1]
        return tuple(shape)

    def pieces(self, win: _Window) -> list[tuple[tuple, tuple]]:
        """(grid index, operand index) pairs that copy an operand onto its band grid or back,
        in two parts along an axis where it wraps around the grid's edge."""
        band = self.band(win)
        rows, cols = (win.shape[ax] for ax in self.spatial)
        out = []
        for (g0, o0), (g1, o1) in itertools.product(
                _segments(win.start[0] - band.start, rows, self.size[0]),
                _segments(win.start[1], cols, self.size[1])):
            g, o = [slice(None)] * 4, [slice(None)] * 4
            g[self.spatial[0]], g[self.spatial[1]] = g0, g1
            o[self.spatial[0]], o[self.spatial[1]] = o0, o1
            out.append((tuple(g), tuple(o)))
        return out

    def in_layout_order(self, spectrum: np.ndarray, win: _Window) -> np.ndarray:
        """A channel-minor spectrum viewed in the operand's layout order, band rows only: what
        the width stage reads or writes."""
        view = spectrum.transpose(0, 3, 1, 2) if self.layout == "nchw" else spectrum
        idx = [slice(None)] * 4
        idx[self.spatial[0]] = self.band(win)
        return view[tuple(idx)]

    def half_shape(self, win: _Window) -> tuple[int, int, int, int]:
        """One chunk of the spectrum, as the width stage leaves it (zero outside band rows)."""
        return (self.chunk(win), *self.spectrum_shape(win)[1:])

    def lanes(self, win: _Window) -> int:
        """Workers sharing an operand's chunks: never more than there are chunks."""
        return min(self.workers, win.shape[0] // self.chunk(win))

    def workspace_bytes(self) -> int:
        def size(shape, dtype) -> int:
            return int(np.prod(shape)) * np.dtype(dtype).itemsize

        total = 0
        for win in (self.a, self.b, self.out):
            per_lane = size(self.grid_shape(win), self.real)
            if win is not self.out:
                per_lane += size(self.half_shape(win), self.cplx)
            total += size(self.spectrum_shape(win), self.cplx) + self.lanes(win) * per_lane
        return total


def _geometry(problem: ConvProblem, pass_: str, layout: str, precision: str) -> _Geometry:
    th, (ah, bh, oh) = _axis(pass_, problem.h, problem.r, problem.pad_h)
    tw, (aw, bw, ow) = _axis(pass_, problem.w, problem.s, problem.pad_w)
    a_shape, b_shape, out_shape = problem.operand_shapes(pass_, layout)
    real, cplx = _DTYPES[precision]
    return _Geometry(layout, (th, tw), real, cplx, _Window(a_shape, (ah, aw)),
                     _Window(b_shape, (bh, bw), _FLIP_B[pass_]), _Window(out_shape, (oh, ow)),
                     threads.count())


class _FFTW:
    """1-D stage plans from pyFFTW, single-threaded: the workers are the parallelism."""

    def __init__(self, lib):
        self.lib = lib

    def empty(self, shape, dtype) -> np.ndarray:
        return self.lib.empty_aligned(shape, dtype)

    def plan(self, src: np.ndarray, dst: np.ndarray, axis: int, inverse: bool = False):
        """A callable (src, dst) writing the unnormalized DFT of src along `axis` into dst, for
        arrays shaped and strided like these; the kind follows the dtypes. Planning overwrites
        both arrays. FFTW_UNALIGNED because chunks of a spectrum need not start on a SIMD
        boundary (and it runs no slower)."""
        fftw = self.lib.FFTW(src, dst, axes=(axis,), threads=1,
                             direction="FFTW_BACKWARD" if inverse else "FFTW_FORWARD",
                             flags=(PLANNER_EFFORT, "FFTW_UNALIGNED"))

        def execute(s: np.ndarray, d: np.ndarray) -> None:
            fftw.update_arrays(s, d)
            fftw.execute()

        return execute

    def name(self) -> str:
        return f"pyFFTW {self.lib.__version__}"


class _NumpyFFT:
    """The same stages from numpy.fft, where pyFFTW is missing (NumPy >= 2 keeps float32)."""

    empty = staticmethod(np.empty)

    @staticmethod
    def plan(src: np.ndarray, dst: np.ndarray, axis: int, inverse: bool = False):
        if inverse:
            fn = np.fft.irfft if np.isrealobj(dst) else np.fft.ifft
        else:
            fn = np.fft.rfft if np.isrealobj(src) else np.fft.fft
        n = (dst if inverse else src).shape[axis]
        norm = "forward" if inverse else "backward"  # unnormalized both ways, as FFTW
        return lambda s, d: fn(s, n=n, axis=axis, norm=norm, out=d)

    @staticmethod
    def name() -> str:
        return "numpy.fft (pyFFTW missing)"


def _library():
    """pyFFTW where it imports, else numpy.fft: asked on every prepare, so tests can hide it."""
    try:
        import pyfftw
    except ImportError:
        return _NumpyFFT()
    return _FFTW(pyfftw)


@functools.cache
def _pool(pid: int, helpers: int) -> ThreadPoolExecutor:
    """`helpers` threads for `_run_all` (the calling thread is the last worker), one pool per
    process and size: threads do not survive a fork, so a forked child must not inherit it."""
    return ThreadPoolExecutor(helpers, thread_name_prefix="convbench-fft")


def _run_all(tasks: list) -> None:
    """Run the tasks at once, the last on this thread, and wait for all (errors re-raised).

    One hand-off per transform: FFTW's own threads would synchronize once per chunk and stage,
    which on a busy machine costs a scheduler slice each time.
    """
    *rest, last = tasks
    futures = [_pool(os.getpid(), len(rest)).submit(task) for task in rest] if rest else []
    last()
    for future in futures:
        future.result()


class _Spectrum:
    """A whole channel-minor spectrum and the lanes (one per worker) that fill or empty it,
    each taking every n-th chunk of the leading axis."""

    def __init__(self, geom: _Geometry, win: _Window, fft, lane: type):
        self.array = fft.empty(geom.spectrum_shape(win), geom.cplx)
        size, lanes = geom.chunk(win), geom.lanes(win)
        chunks = [slice(i, i + size) for i in range(0, win.shape[0], size)]
        self.lanes = [lane(geom, win, fft, self.array, chunks[i::lanes]) for i in range(lanes)]

    def __call__(self, arr: np.ndarray) -> None:
        _run_all([functools.partial(lane, arr) for lane in self.lanes])


class _ForwardLane:
    """One worker's share of an input: per chunk, copied onto the zero grid, transformed along
    the width (band rows only), then along the height into the spectrum."""

    def __init__(self, geom: _Geometry, win: _Window, fft, spectrum: np.ndarray, chunks):
        self.grid = fft.empty(geom.grid_shape(win), geom.real)
        self.half = fft.empty(geom.half_shape(win), geom.cplx)
        self.half_band = geom.in_layout_order(self.half, win)
        self.parts = [(chunk, spectrum[chunk]) for chunk in chunks]
        self.width = fft.plan(self.grid, self.half_band, geom.spatial[1])
        self.height = fft.plan(self.half, self.parts[0][1], 1)
        self.grid[...] = 0  # after planning, which scribbles on the buffers
        self.half[...] = 0
        reverse = [slice(None)] * 4
        for ax in geom.spatial:
            reverse[ax] = slice(None, None, -1)
        self.reverse = tuple(reverse) if win.flip else ()
        self.pieces = geom.pieces(win)

    def __call__(self, arr: np.ndarray) -> None:
        src = arr[self.reverse]
        for chunk, spectrum in self.parts:
            part = src[chunk]
            for g, o in self.pieces:
                self.grid[g] = part[o]
            self.width(self.grid, self.half_band)
            self.height(self.half, spectrum)


class _InverseLane:
    """One worker's share of the output: per chunk, the spectrum back along the height in
    place, back along the width for the output's band rows only, scaled and cut into `out`."""

    def __init__(self, geom: _Geometry, win: _Window, fft, spectrum: np.ndarray, chunks):
        self.grid = fft.empty(geom.grid_shape(win), geom.real)
        band = geom.in_layout_order(spectrum, win)
        self.parts = [(chunk, spectrum[chunk], band[chunk]) for chunk in chunks]
        _, first, first_band = self.parts[0]
        self.height = fft.plan(first, first, 1, inverse=True)
        self.width = fft.plan(first_band, self.grid, geom.spatial[1], inverse=True)
        self.pieces = geom.pieces(win)
        self.scale = 1.0 / (geom.size[0] * geom.size[1])

    def __call__(self, out: np.ndarray) -> None:
        for chunk, spectrum, band in self.parts:
            self.height(spectrum, spectrum)
            self.width(band, self.grid)
            part = out[chunk]
            for g, o in self.pieces:
                np.multiply(self.grid[g], self.scale, out=part[o])


def _matrices(spectrum: np.ndarray) -> np.ndarray:
    """(A, Th, Tf, B) spectrum as (F, A, B): one A×B matrix per frequency, unit inner stride."""
    a, th, tf, b = spectrum.shape
    return spectrum.reshape(a, th * tf, b).transpose(1, 0, 2)


def _side(mats: dict[str, np.ndarray], side: tuple[str, bool]) -> np.ndarray:
    """One side of the per-frequency product: an input's matrices, transposed or not."""
    name, transposed = side
    return mats[name].transpose(0, 2, 1) if transposed else mats[name]


#: Spectra multiplied: fewer products, counted on the implementation's own grid.
FFT = Algorithm("fft", family="fft", origin="ours", tolerance="fft", reduction="counted",
                counts=FFTCount(), deterministic=True)


@register(FFT, "numpy")
class FFTConv(Implementation):
    """FFT convolution, stride 1, any padding (per axis too), all three passes, both layouts
    natively; dilation as undilated phases (`registry.DilationSplit`). It refuses a 1x1
    filter, as Winograd refuses tiles that save nothing: that filter's spectrum is the same at
    every frequency, so the products repeat the GEMM's C×K product at each frequency, after a
    filter transform of K·C whole planes (measured: docs, cpu-algorithms.md, `fft`)."""

    precisions = ("fp64", "fp32")
    split_dilation = True

    def supports(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        if problem.r == problem.s == 1:
            return (f"1x1 filter: {self.algo} would repeat the GEMM's product at every "
                    "frequency (the filter's spectrum is constant) after transforming K·C "
                    "whole planes")
        return fft_refusal(self.algo, problem)

    def describe(self, problem, pass_, layout, precision) -> str:
        geom = _geometry(problem, pass_, layout, precision)
        lanes = "/".join(str(geom.lanes(win)) for win in (geom.a, geom.b, geom.out))
        th, tw = geom.size
        return (f"{_library().name()}, transform {th}x{tw}; transform threads {lanes} "
                f"({'/'.join(phase_names(pass_)[i].split()[1] for i in (0, 1, 3))}: the "
                f"policy's {geom.workers}, at most one per chunk), product on MKL through torch, "
                f"{geom.workers} threads")

    def transform_grid(self, problem: ConvProblem, pass_: str) -> tuple[int, int, int]:
        """(transform height, width, tiles per image): one whole-image grid, on FFTW's fast
        sizes (`opcount` counts the transforms on it)."""
        (th, _), (tw, _) = (_axis(pass_, n, r, pad) for n, r, pad in
                            ((problem.h, problem.r, problem.pad_h),
                             (problem.w, problem.s, problem.pad_w)))
        return th, tw, 1

    def workspace_bytes(self, problem, pass_, layout, precision) -> int:
        """Bytes allocated beyond inputs and output: the three whole spectra, and each worker's
        one-chunk grids and half-transformed chunk."""
        return _geometry(problem, pass_, layout, precision).workspace_bytes()

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        import torch

        geom = _geometry(problem, pass_, layout, precision)
        fft = _library()
        forward = [_Spectrum(geom, geom.a, fft, _ForwardLane),
                   _Spectrum(geom, geom.b, fft, _ForwardLane)]
        inverse = _Spectrum(geom, geom.out, fft, _InverseLane)
        mats = {"a": _matrices(forward[0].array), "b": _matrices(forward[1].array)}
        left, right = (torch.from_numpy(_side(mats, side)) for side in _PRODUCT[pass_])
        product = torch.from_numpy(_matrices(inverse.array))  # a view: written in place

        steps = (lambda a, b, out: forward[0](a), lambda a, b, out: forward[1](b),
                 lambda a, b, out: torch.matmul(left, right, out=product),
                 lambda a, b, out: inverse(out))
        return Phased(dict(zip(phase_names(pass_), steps)))

    def phases(self, problem, pass_, layout, precision) -> list[str]:
        return phase_names(pass_)
