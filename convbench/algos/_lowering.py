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

import functools

import numpy as np

from ..core.problem import ELEMENT_BYTES

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
    """A torch tensor sharing `a`'s memory, so the CPU algorithms run their copies through
    torch (its thread pool) on NumPy's buffers, and their products through `products.Route`
    (torch's or NumPy's BLAS, on the same memory); a copy only for what torch cannot view
    (negative strides, read-only arrays)."""
    import torch

    if not a.flags.writeable or any(s < 0 for s in a.strides):
        a = a.copy()
    return torch.from_numpy(a)


#: The transparent huge page size of x86-64 Linux.
HUGE_PAGE = 2 << 20
#: NumPy's tracemalloc domain (NPY_TRACE_DOMAIN): a workspace on huge pages is reported in it,
#: so the harness's `tracemalloc` peak counts it like any NumPy buffer.
_NUMPY_TRACE_DOMAIN = 389047
#: Set to "0" to keep every workspace on ordinary pages (a before/after comparison).
HUGE_PAGES_ENV = "CONVBENCH_HUGE_PAGES"


@functools.cache
def _kernel_offers_huge_pages() -> bool:
    """The kernel gives transparent huge pages on request (`enabled` is `always` or `madvise`)
    and Python can ask (`mmap.MADV_HUGEPAGE`): read once per process."""
    import mmap

    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read()
    except OSError:
        return False
    return "[always]" in mode or "[madvise]" in mode


def huge_pages_available() -> bool:
    """Whether workspaces go on transparent huge pages: the kernel offers them on request
    (`/sys/kernel/mm/transparent_hugepage/enabled` is `always` or `madvise`), Python can ask
    (`mmap.MADV_HUGEPAGE`), and `CONVBENCH_HUGE_PAGES` is not "0"."""
    import os

    return os.environ.get(HUGE_PAGES_ENV, "1") != "0" and _kernel_offers_huge_pages()


def workspace(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zeroed buffer for a CPU algorithm's workspace: on 2 MiB transparent huge pages where
    it spans one or more (`huge_pages_available`), else `np.zeros`.

    Why: the workspaces are made once in `prepare` and touched on every call, and between two
    calls other work evicts them, page-table entries included. On 4 KiB pages the ~45 MB of
    winograd-5x5's buffers on AlexNet's conv5 are ~11,000 pages, a page walk each when cold;
    on huge pages, about 30. Measured in `make bench`'s shuffled rounds, huge against ordinary
    pages side by side (2-core AVX-512 Xeon, batch 8, fwd, nhwc): winograd-5x5 conv3 6.73 vs
    7.12 ms, conv4 9.89 vs 10.47, conv5 7.24 vs 7.58; gemm conv3 8.26 vs 8.64, conv1 9.33 vs
    9.37 (a tie). (Fresh anonymous memory is zero, so no pass over it is made here.)"""
    import ctypes
    import mmap
    import weakref

    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    size = count * dtype.itemsize
    if size < HUGE_PAGE or not huge_pages_available():
        return np.zeros(shape, dtype)
    # private: a shared anonymous mapping is shmem, whose huge pages the kernel gives apart
    mapped = mmap.mmap(-1, -(-size // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE,
                       flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapped.madvise(mmap.MADV_HUGEPAGE)
    raw = np.frombuffer(mapped, np.uint8)
    offset = -raw.ctypes.data % HUGE_PAGE  # the first huge page boundary inside the mapping
    flat = np.frombuffer(mapped, dtype, count, offset)
    address = flat.ctypes.data
    domain, track = ctypes.c_uint(_NUMPY_TRACE_DOMAIN), ctypes.pythonapi.PyTraceMalloc_Track
    track.argtypes = (ctypes.c_uint, ctypes.c_size_t, ctypes.c_size_t)
    if track(domain, address, size) == 0:
        untrack = ctypes.pythonapi.PyTraceMalloc_Untrack
        untrack.argtypes = (ctypes.c_uint, ctypes.c_size_t)
        weakref.finalize(flat, untrack, domain, address)
    del raw
    return flat.reshape(shape)


def pages_note(nbytes_: int) -> str:
    """What a row's note says of its workspace's pages: "" below one huge page."""
    if nbytes_ < HUGE_PAGE:
        return ""
    import os

    if os.environ.get(HUGE_PAGES_ENV, "1") == "0":
        return f"workspace on 4 KiB pages ({HUGE_PAGES_ENV}=0)"
    return ("workspace on 2 MiB huge pages" if _kernel_offers_huge_pages() else
            "workspace on 4 KiB pages (no transparent huge pages here)")
