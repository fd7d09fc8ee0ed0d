"""`direct`'s grouped layers with few channels per group, compiled: wide rows over phase planes.

A grouped layer of G groups multiplies, per group, a (K/G) × (C/G) filter slice per tap: with
4–32 channels a group, a product per tap and group (the dense path) or per group (`gemm`'s
batched one) is a small matrix product behind a copy, its time the copy's and the call's. Here
the pixels are the vector instead, as in depthwise's nchw kernel: one task per image and group
(threads share them) splits the group's C/G input planes, zero-bordered, into sh·sw
stride-phase planes Wq = Q + (S-1)·dw // sw columns wide, so every tap reads a phase plane at a
fixed offset with unit stride; each output channel of the group is then one vector loop per
input channel and row of taps over the whole plane (the row of taps one generated expression
per filter width S, the weights scalars), Wq - Q extra columns dropped when the plane is
stored; KB output channels share each load of the tap's input. The kernels read and write
nchw; an nhwc pass copies its operands to nchw and its result back (counted in its time and
its workspace), each copy by the faster of Numba's tiled transposes and torch's permuted copy on
its shape (`transpose`): neither is faster everywhere.

bwd_data of stride 1 is this forward kernel on dy with the filter flipped and transposed (K/G
inputs, C/G outputs a group); of larger stride each tap's dy·w is added into its phase plane
and the phases merged into dx. bwd_filter (a task per group, the images in turn) is, per tap,
a dot product over the plane of the widened dy (its extra columns zero) with the phase plane
the tap reads, S taps of a row in one loop, summed per image in the working precision and
over the images in float64.

The kernels are Python in `templates/grouped.py.tmpl` (per filter width S, `_source`), beside
`templates/planes.py.tmpl` (the phase planes, shared with `depthwise_jit`) and nhwc's
`templates/transposes.py.tmpl`, rendered by `jit.source`.

Where it applies (`applies`): groups of at most `MAX_GROUP_CHANNELS` input channels, where the
products are small; larger groups stay with the products (`direct`'s dense path, `gemm`).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..core.problem import ConvProblem
from ..machine import threads
from . import blocked_llvm, blocked_nhwc, jit, products

#: The largest C/G this path takes: beyond it a group's products are large enough for BLAS
#: (the measurement: docs/pages/cpu-algorithms.md).
MAX_GROUP_CHANNELS = 32


def applies(p: ConvProblem) -> bool:
    """Grouped (1 < G < C), at most MAX_GROUP_CHANNELS input channels a group."""
    return 1 < p.groups < p.c and p.c // p.groups <= MAX_GROUP_CHANNELS


#: Output channels a pass of the forward loops updates at once (one load of each tap's input
#: for all of them); more gained little (docs/pages/cpu-algorithms.md).
KB = 4


#: The templates of the kernels of one filter width.
TEMPLATES = ["planes", "grouped"]


def _source(S: int) -> str:
    """The module of the kernels of filter width S: a row of S taps is one loop body, KB output
    channels (bwd_filter: 2) a pass."""
    def fwd(kb: int) -> list[str]:
        out = [f"w{i}_{s} = w[g, kk + {i}, cc, r, {s}]" for i in range(kb) for s in range(S)]
        out.append("for j in range(L):")
        out += [f"    v{s} = x{s}[j]" for s in range(S)]
        out += [f"    acc[kk + {i}, j] += " + " + ".join(f"v{s} * w{i}_{s}" for s in range(S))
                for i in range(kb)]
        return out

    bwd = [f"w{i} = w[g, kk + {i}, cc, r, s]" for i in range(KB)]
    bwd += ["for j in range(L):",
            "    target[j] += " + " + ".join(f"wides[kk + {i}, j] * w{i}" for i in range(KB))]

    def bwf(kb: int) -> list[str]:
        out = [f"acc{i}_{s} = zero" for i in range(kb) for s in range(S)]
        out.append("for j in range(L):")
        out += [f"    d{i} = wides[kk + {i}, j]" for i in range(kb)]
        out += [f"    acc{i}_{s} += d{i} * x{s}[j]" for i in range(kb) for s in range(S)]
        out += [f"dwt[g, kk + {i}, cc, r, {s}] += acc{i}_{s}" for i in range(kb)
                for s in range(S)]
        return out

    views = [f"x{s} = ph[cc, a * sw + ({s} * dw) % sw, o + ({s} * dw) // sw:]"
             for s in range(S)]
    lines = dict(views=views, fwd_block=fwd(KB), fwd_single=fwd(1), bwd_block=bwd,
                 bwf_block=bwf(2), bwf_single=bwf(1))
    return jit.source(TEMPLATES, f"filter width S = {S}", lines, S=S, KB=KB, step="j * sw")


@functools.cache
def kernels(S: int):
    """The module of `_source(S)` (`jit.load`)."""
    return jit.load(f"convbench_grouped_s{S}", _source(S))


# --- the passes ----------------------------------------------------------------------------------

def _flipped(p: ConvProblem) -> bool:
    """bwd_data as the forward kernel on dy: stride 1 only."""
    return p.stride_h == 1 and p.stride_w == 1


def _planes(p: ConvProblem, pass_: str) -> tuple[int, int, int]:
    """(phase planes, plane elements, wide elements) of one task: the forward kernel of
    bwd_data at stride 1 runs over dx's rows and columns."""
    if pass_ == "bwd_data" and _flipped(p):
        sh = sw = 1
        rows = p.h + (p.r - 1) * p.dil_h + 1
        wq = p.w + (p.s - 1) * p.dil_w
        return 1, rows * wq, p.h * wq
    sh, sw = p.stride_h, p.stride_w
    wq = p.q + ((p.s - 1) * p.dil_w) // sw
    rows = p.p + ((p.r - 1) * p.dil_h) // sh + 1
    return sh * sw, rows * wq, p.p * wq


def buffers(p: ConvProblem, pass_: str, layout: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """The buffers a prepared pass holds ("work": the working precision): the filter as
    (G, K/G, C/G, R, S) (flipped and transposed to (G, C/G, K/G, R, S) for bwd_data of stride
    1), bwd_filter's float64 sums, and in nhwc the operands in nchw (the kernels' layout)."""
    g, kg, cg = p.groups, p.k // p.groups, p.c // p.groups
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    if pass_ == "bwd_filter":
        out["sums"] = ((g, kg, cg, p.r, p.s), "float64")
    elif pass_ == "bwd_data" and _flipped(p):
        out["taps"] = ((g, cg, kg, p.r, p.s), "work")
    else:
        out["taps"] = ((g, kg, cg, p.r, p.s), "work")
    if layout == "nhwc":
        x, y = (p.n, p.c, p.h, p.w), (p.n, p.k, p.p, p.q)
        out.update({"fwd": {"x_nchw": (x, "work"), "y_nchw": (y, "work")},
                    "bwd_data": {"dy_nchw": (y, "work"), "dx_nchw": (x, "work")},
                    "bwd_filter": {"x_nchw": (x, "work"), "dy_nchw": (y, "work")}}[pass_])
    return out


#: Bytes of one task's phase planes and wide rows, at most: small images are stacked into a
#: task (one wide row over all of them: the loops' start-up paid once, not per image) while
#: they stay in L1: stacked beyond it, the passes over the wide row stream from L2 and lose
#: more than the start-up saves (docs/pages/cpu-algorithms.md).
TASK_BYTES = 48 << 10


def images_per_task(p: ConvProblem, pass_: str, dtype) -> int:
    """How many images a task stacks: as many as fit TASK_BYTES of phase planes, and (but for
    bwd_filter, a task per group) few enough that every thread has two tasks or more."""
    phases, plane, _ = _planes(p, pass_)
    kg, cg = p.k // p.groups, p.c // p.groups
    inputs, outputs = (kg, cg) if pass_ == "bwd_data" and _flipped(p) else (cg, kg)
    image = (inputs * phases + outputs) * plane * np.dtype(dtype).itemsize
    per = max(1, min(p.n, TASK_BYTES // image))
    if pass_ != "bwd_filter":
        while per > 1 and -(-p.n // per) * p.groups < 2 * threads.count():
            per -= 1
    return per


def scratch_elements(p: ConvProblem, pass_: str, per: int = 1) -> int:
    """Elements each thread's task allocates inside the kernel: its phase planes and wide rows
    (fwd: the group's inputs' planes and its outputs' rows; bwd_data: the reverse, or at a
    larger stride the outputs' rows and one input's planes; bwd_filter: both)."""
    phases, plane, wide = _planes(p, pass_)
    plane *= per  # stacked images: a plane and a wide row (no longer than a plane) each
    wide = plane if per > 1 else wide
    kg, cg = p.k // p.groups, p.c // p.groups
    if pass_ == "fwd":
        return cg * phases * plane + kg * wide
    if pass_ == "bwd_data":
        if _flipped(p):
            return kg * phases * plane + cg * wide
        return kg * plane + phases * plane
    return cg * phases * plane + kg * plane


def workspace_bytes(p: ConvProblem, pass_: str, layout: str, dtype) -> int:
    size = {"work": np.dtype(dtype).itemsize, "float64": 8}
    held = sum(math.prod(shape) * size[kind] for shape, kind in buffers(p, pass_, layout).values())
    per = images_per_task(p, pass_, dtype)
    tasks = p.groups if pass_ == "bwd_filter" else -(-p.n // per) * p.groups
    numba = min(threads.count(), tasks) * scratch_elements(p, pass_, per) * np.dtype(dtype).itemsize
    if not blocked(p, pass_):
        return held + numba
    return held + _kept_bytes(p, pass_, layout, dtype, "numba", numba, 0)


def _kept_bytes(p: ConvProblem, pass_: str, layout: str, dtype, incumbent: str, own: int,
                copies: int) -> int:
    """What a probed pass holds: until its first call has probed, the incumbent's `own` bytes,
    every blocked kernel's (with the `copies` they need) and an nhwc pass's `blocked_nhwc`
    kernel's (the probe runs them all: the peak the runner must make room for); then the kept
    way's alone (the others are dropped)."""
    kept = _KERNEL_CHOICE.get((p, pass_, layout, np.dtype(dtype).str))
    if kept == incumbent:
        return own
    nhwc = (blocked_nhwc.scratch_bytes(p, pass_, dtype)
            if nhwc_blocked(p, pass_, layout, dtype) else 0)
    if kept == blocked_nhwc.NAME:
        return nhwc
    q = kernel_problem(p, incumbent == "products")
    blocked_ = (blocked_llvm.scratch_bytes(q, pass_, dtype, kept) + copies
                if blocked(q, pass_) else 0)
    return blocked_ if kept is not None else own + blocked_ + nhwc


def describe(p: ConvProblem, pass_: str, layout: str, dtype) -> str:
    how = {"fwd": "a task per group and images",
           "bwd_data": ("the forward kernel on dy, filter flipped" if _flipped(p)
                        else "each tap added into its phase plane"),
           "bwd_filter": "a task per group, dot products over the planes summed in float64"}
    if _KERNEL_CHOICE.get((p, pass_, layout, np.dtype(dtype).str)) == blocked_nhwc.NAME:
        return (f"grouped: {blocked_note(p, pass_, layout, dtype, 'Numba', dense=False)}, "
                f"{p.c // p.groups} channels a group, {threads.count()} threads")
    copies = (f", nhwc copied to nchw and back {transposes_note(p, pass_, dtype)}"
              if layout == "nhwc" else "")
    kernel_ = "compiled kernel (Numba)"
    if blocked(p, pass_):
        kernel_ = "compiled kernels, " + blocked_note(p, pass_, layout, dtype, "Numba's",
                                                   dense=False)
    return (f"grouped: {kernel_}, {p.c // p.groups} channels a group, wide rows "
            f"over stride-phase planes vectorised over the pixels, {how[pass_]}{copies}, "
            f"{threads.count()} threads")


def _group_filter(w: np.ndarray, p: ConvProblem, layout: str) -> np.ndarray:
    """w or dw (kcrs, or krsc) as a (G, K/G, C/G, R, S) view."""
    g, kg, cg = p.groups, p.k // p.groups, p.c // p.groups
    if layout == "nchw":
        return w.reshape(g, kg, cg, p.r, p.s)
    return w.reshape(g, kg, p.r, p.s, cg).transpose(0, 1, 4, 2, 3)


@functools.cache
def _transposes():
    """The module of nhwc -> nchw (`to_nchw`) and back (`to_nhwc`): templates/transposes.py.tmpl
    (`jit.load`)."""
    return jit.load("convbench_transposes", jit.source(["transposes"], "any shape"))


#: The axes each transpose reads its source in: nhwc -> nchw, and back; and a swapped pass's
#: copies (`wide_filter`, torch's alone), each its own inverse: nchw's planes transposed, nhwc
#: moved to nchw with its planes transposed.
PERMUTATIONS = {"to_nchw": (0, 3, 1, 2), "to_nhwc": (0, 2, 3, 1),
                "swap_nchw": (0, 1, 3, 2), "swap_nhwc": (0, 3, 2, 1)}
#: Each probed (direction, shape, dtype)'s way, kept for the process.
_TRANSPOSE_CHOICE: dict[tuple, str] = {}


def _numba_transpose(kind: str, src: np.ndarray, dst: np.ndarray) -> None:
    getattr(_transposes(), kind)(src, dst)


def _torch_transpose(kind: str, src: np.ndarray, dst: np.ndarray) -> None:
    import torch

    torch.from_numpy(dst).copy_(torch.from_numpy(src).permute(PERMUTATIONS[kind]))


#: The two ways of a transpose, the incumbent first: each wins on some shapes
#: (docs/pages/cpu-algorithms.md, grouped layers).
TRANSPOSERS = {"numba": _numba_transpose, "torch": _torch_transpose}


def transpose(kind: str, src: np.ndarray, dst: np.ndarray) -> None:
    """`dst` = `src` with its axes moved (`kind`: "to_nchw" or "to_nhwc"), by the way that was
    faster on this shape: probed on its first call by the products' rule (`products.probe`:
    interleaved rounds, medians, the incumbent kept unless another is clearly faster; the
    harness's first call, which verifies, is the one that probes) and kept for the process.
    The harness's timing then sees one way only."""
    key = (kind, src.shape, src.dtype.str)
    way = _TRANSPOSE_CHOICE.get(key)
    if way is None:  # the probe calls each way as way(kind, src, dst)
        way = _TRANSPOSE_CHOICE[key] = products.probe(TRANSPOSERS, kind, src, dst)
    TRANSPOSERS[way](kind, src, dst)


def transposes_note(p: ConvProblem, pass_: str, dtype) -> str:
    """How an nhwc pass's copies run: the way probed for each, or how it will be chosen."""
    shapes = {"fwd": [("to_nchw", p.x_shape("nhwc")), ("to_nhwc", p.y_shape("nchw"))],
              "bwd_data": [("to_nchw", p.y_shape("nhwc")), ("to_nhwc", p.x_shape("nchw"))],
              "bwd_filter": [("to_nchw", p.x_shape("nhwc")), ("to_nchw", p.y_shape("nhwc"))]}
    ways = [_TRANSPOSE_CHOICE.get((kind, tuple(shape), np.dtype(dtype).str))
            for kind, shape in shapes[pass_]]
    if None in ways:
        return "by the faster of Numba's and torch's transposes per shape [probed on first call]"
    names = {"numba": "Numba", "torch": "torch"}
    return f"by {' and '.join(names[w] for w in dict.fromkeys(ways))}'s transposes [probed]"


def _to_nchw(a: np.ndarray, buf: np.ndarray | None) -> np.ndarray:
    """An nhwc operand copied into its nchw buffer; nchw as it is."""
    if buf is None:
        return a
    transpose("to_nchw", a, buf)
    return buf


def wide_filter(p: ConvProblem) -> bool:
    """Whether `direct`'s dense path runs the blocked kernels on `p` transposed (`swapped`):
    where that wastes at least WIDE_WASTE less of the work. The kernels compute each output row
    as wide as its phase plane, Q + (S-1)·dil_w // stride_w columns, and drop the extra ones: a
    1x7 filter on 17x17 planes wastes 6 of every 23, its 7x1 transpose none. Below the
    threshold the two copies with their planes transposed cost more than the waste they save
    (the measurement: docs/pages/cpu-algorithms.md, wide filters)."""
    return _waste(p.q, p.s, p.dil_w, p.stride_w) - _waste(p.p, p.r, p.dil_h, p.stride_h) \
        >= WIDE_WASTE


#: The least share of a pass's work swapping its axes must save (`wide_filter`): between the
#: shares of the layers measured faster swapped and of those measured slower.
WIDE_WASTE = 0.15


def _waste(out: int, taps: int, dilation: int, stride: int) -> float:
    """The share of an axis's computed outputs the blocked kernels drop (see `wide_filter`)."""
    extra = (taps - 1) * dilation // stride
    return extra / (out + extra)


def swapped(p: ConvProblem) -> ConvProblem:
    """`p` with its two spatial axes swapped (rows for columns, in every field)."""
    return ConvProblem(p.n, p.c, p.w, p.h, p.k, p.s, p.r, stride=(p.stride_w, p.stride_h),
                       pad=((p.pad_left, p.pad_right), (p.pad_top, p.pad_bottom)),
                       dilation=(p.dil_w, p.dil_h), groups=p.groups)


def kernel_problem(p: ConvProblem, dense: bool = True) -> ConvProblem:
    """The problem a pass's blocked kernels run: `direct`'s dense path swaps a wide filter's
    axes (`wide_filter`); this module's grouped pass runs `p` as it is."""
    return swapped(p) if dense and wide_filter(p) else p


def kernel(p: ConvProblem, pass_: str, layout: str, dtype):
    """The compiled kernel of a grouped pass and the integers it takes after its three arrays,
    compiled here on empty arrays (and nhwc's transposes with it): `prepare` and `direct`'s
    `compile` both ask this, and only the first compiles."""
    per = images_per_task(p, pass_, dtype)
    kern = kernels(p.s)
    ranks = (("w", 4), ("w", 5), ("w", 4))
    if pass_ == "bwd_data" and _flipped(p):
        # the forward kernel on dy: K/G inputs, C/G outputs a group, taps reversed
        fn = kern.fwd
        args = (1, 1, p.dil_h, p.dil_w, (p.r - 1) * p.dil_h - p.pad_top,
                (p.s - 1) * p.dil_w - p.pad_left, per)
    else:
        fn = {"fwd": kern.fwd, "bwd_data": kern.bwd_data, "bwd_filter": kern.bwd_filter}[pass_]
        args = (p.stride_h, p.stride_w, p.dil_h, p.dil_w, p.pad_top, p.pad_left, per)
        if pass_ == "bwd_filter":
            ranks = (("w", 4), ("w", 4), ("d", 5))
    jit.compile_empty(fn, dtype, *ranks, ints=len(args))
    compile_blocked(p, pass_, layout, dtype)
    if layout == "nhwc":
        _compile_transposes(dtype)
    return fn, args


def prepare(p: ConvProblem, pass_: str, layout: str, dtype):
    """The pass `run(a, b, out)` of a grouped problem (`applies`), its kernel compiled."""
    bufs = {name: np.zeros(shape, dtype if kind == "work" else np.float64)
            for name, (shape, kind) in buffers(p, pass_, layout).items()}
    fn, args = kernel(p, pass_, layout, dtype)

    key = (p, pass_, layout, np.dtype(dtype).str)
    kept = _KERNEL_CHOICE.get(key)  # probed before in this process: that way alone
    # a strided bwd_data's phases take the filter as Numba's kernel does (`_flipped`)
    ways = {name: _contiguous(k)
            for name, k in blocked_kernels(p, pass_, dtype, kept, _flipped(p)).items()}
    if kept in (None, "numba"):
        ways = {"numba": lambda a, b, out: fn(a, b, out, *args), **ways}

    if pass_ == "bwd_filter":  # the kernels add into the sums: each way's call starts at zero
        sums = bufs["sums"]

        def summed(way):  # on nhwc's operands copied, the sums then written into dw
            def run_filter(x, dy, out):
                sums.fill(0)
                way(_to_nchw(x, bufs.get("x_nchw")), _to_nchw(dy, bufs.get("dy_nchw")), sums)
                _group_filter(out, p, layout)[...] = sums
            return run_filter
        ways = {name: summed(way) for name, way in ways.items()}
    else:
        ways = _forward_ways(p, pass_, layout, bufs, ways)
    if kept in (None, blocked_nhwc.NAME) and nhwc_blocked(p, pass_, layout, dtype):
        ways[blocked_nhwc.NAME] = nhwc_kernel(p, pass_, layout, dtype)
    kernel_ = _probed(ways, key)

    def run(a, w, out):
        jit.set_threads()
        kernel_(a, w, out)
    return run


def _forward_ways(p: ConvProblem, pass_: str, layout: str, bufs: dict, ways: dict) -> dict:
    """fwd's and bwd_data's ways (`prepare`) on the filter as the kernels take it, nhwc's
    operands copied to nchw and the result back."""
    taps = bufs["taps"]
    flip = pass_ == "bwd_data" and _flipped(p)
    a_buf, out_buf = ((bufs.get("x_nchw"), bufs.get("y_nchw")) if pass_ == "fwd"
                      else (bufs.get("dy_nchw"), bufs.get("dx_nchw")))

    def nchw(way):  # on the filter as the kernels take it, nhwc's operands copied
        def run(a, w, out):
            grouped = _group_filter(w, p, layout)
            taps[...] = (grouped[:, :, :, ::-1, ::-1].transpose(0, 2, 1, 3, 4) if flip
                         else grouped)
            way(_to_nchw(a, a_buf), taps, out if out_buf is None else out_buf)
            if out_buf is not None:
                transpose("to_nhwc", out_buf, out)
        return run
    return {name: nchw(way) for name, way in ways.items()}


def nhwc_blocked(p: ConvProblem, pass_: str, layout: str, dtype) -> bool:
    """Whether an nhwc pass also probes `blocked_nhwc`'s kernel (channels in the lanes, no
    copies to nchw): it applies, llvmlite loads, and the pass is worth its compile (a strided
    bwd_data, a kernel per phase, from BLOCKED_MIN_FLOPS, as `blocked`). It implies `blocked`
    (`blocked_nhwc.applies` asks `blocked_llvm.applies`), so it only ever adds a way."""
    return (layout == "nhwc" and jit.available() is None
            and blocked_nhwc.applies(p, pass_, dtype=dtype)
            and (not blocked_llvm.phased(p, pass_) or p.flops >= BLOCKED_MIN_FLOPS))


def nhwc_kernel(p: ConvProblem, pass_: str, layout: str, dtype):
    """`run(a, w, out)` of `blocked_nhwc`'s kernel on the pass's own nhwc operands and filter:
    the kernel reads its taps from a view of w (bwd_data of stride 1: flipped and transposed;
    at a stride, each phase's taps of w as it is)."""
    kernel_ = blocked_nhwc.make(p, pass_, dtype, flipped=False)
    flip = pass_ == "bwd_data" and not blocked_llvm.phased(p, pass_)
    if pass_ == "bwd_filter":  # dw written whole, through its (G, kg, cg, R, S) view
        def run_filter(x, dy, out):
            kernel_(np.ascontiguousarray(x), np.ascontiguousarray(dy),
                    _group_filter(out, p, layout))
        return run_filter

    def run(a, w, out):
        grouped = _group_filter(w, p, layout)
        view = grouped[:, :, :, ::-1, ::-1].transpose(0, 2, 1, 3, 4) if flip else grouped
        dense = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
        kernel_(np.ascontiguousarray(a), view, dense)
        if dense is not out:
            out[...] = dense
    return run


def _contiguous(kernel):
    """`kernel(a, w, out)` (a `blocked_llvm.Kernel`) on operands that may be views: a strided
    one copied in (a or w) or out (out)."""
    def run(a, w, out):
        if out.flags.c_contiguous:
            kernel(np.ascontiguousarray(a), np.ascontiguousarray(w), out)
        else:
            dense = np.empty(out.shape, out.dtype)
            kernel(np.ascontiguousarray(a), np.ascontiguousarray(w), dense)
            out[...] = dense
    return run


def _probed(ways: dict, key: tuple):
    """`run(a, w, out)` by the way of `ways` (name -> run, the incumbent first) its first call
    probes (`probe_kernels`; the harness's first call is the verifying one, so the way kept is
    the way verified), the others then dropped with their scratch; the choice kept under `key`
    for the row's note."""
    chosen: list[str] = []

    def run(a, w, out):
        if not chosen:
            chosen.append(probe_kernels(ways, a, w, out) if len(ways) > 1 else next(iter(ways)))
            _KERNEL_CHOICE[key] = chosen[0]
            for name in [n for n in ways if n != chosen[0]]:
                del ways[name]
        ways[chosen[0]](a, w, out)
    return run


#: The way each prepared (problem, pass, layout, dtype) probed: its row's note (`describe`) and
#: what it holds (`workspace_bytes`).
_KERNEL_CHOICE: dict[tuple, str] = {}


def probe_kernels(ways: dict, a: np.ndarray, w: np.ndarray, out: np.ndarray) -> str:
    """The kernel a pass keeps: the products' rule (`products.probe`), Numba's the incumbent."""
    return products.probe(ways, a, w, out)


def blocked_kernels(p: ConvProblem, pass_: str, dtype, kept: str | None = None,
                    flipped: bool = True) -> dict:
    """The register-blocked kernels (`blocked_llvm`) a pass probes besides its own, compiled;
    none where they do not apply or llvmlite does not load. `kept`: the way an earlier probe of
    this pass kept in this process, the only one then built; `flipped`: whether a strided
    bwd_data's phases take the filter flipped (the dense path's) or as it is (`prepare`'s)."""
    return blocked_llvm.kernels(p, pass_, dtype, kept, flipped) if blocked(p, pass_) else {}


def blocked(p: ConvProblem, pass_: str) -> bool:
    """Whether a pass may run the blocked kernels: they take it (`blocked_llvm.applies`) and
    llvmlite, which comes with Numba, loads (`jit.available`); a strided bwd_data (a kernel
    per phase and block probed: up to 12 compiles) only from BLOCKED_MIN_FLOPS."""
    return (blocked_llvm.applies(p, pass_) and jit.available() is None
            and (not blocked_llvm.phased(p, pass_) or p.flops >= BLOCKED_MIN_FLOPS))


#: The fewest FLOPs of a pass for which `direct`'s dense path (dense layers, and grouped ones
#: of more than MAX_GROUP_CHANNELS a group) also probes the blocked kernels: below it both
#: take microseconds, and two compiles (0.05-0.5 s) would cost more than they could save.
BLOCKED_MIN_FLOPS = 20_000_000


def compile_blocked(p: ConvProblem, pass_: str, layout: str, dtype) -> None:
    """The blocked kernels a pass probes compiled (kept for the process; an nhwc pass's
    `blocked_nhwc` kernels too), and nhwc's transposes: `direct`'s `compile` hook calls it,
    outside any timed or traced call (the compilers' own memory is not the pass's)."""
    q = kernel_problem(p)
    if blocked(q, pass_):
        bits = blocked_llvm.vector_bits()
        for block in blocked_llvm.blocks(pass_, bits):
            for gm in blocked_llvm.geometries(q, pass_, dtype, block, bits,
                                              threads_=threads.count()):
                if gm is not None:
                    blocked_llvm.compiled(gm)
        if layout == "nhwc" and q is p:  # a swapped pass copies by torch's permute
            _compile_transposes(dtype)
    if nhwc_blocked(p, pass_, layout, dtype):
        for gm in blocked_nhwc.geometries(p, pass_, dtype, blocked_llvm.vector_bits(),
                                          threads_=threads.count()):
            if gm is not None:
                blocked_llvm.compiled(gm)


def _compile_transposes(dtype) -> None:
    """nhwc's transposes to nchw and back compiled for `dtype` (`jit.compile_empty`)."""
    for move in (_transposes().to_nchw, _transposes().to_nhwc):
        jit.compile_empty(move, dtype, ("w", 4), ("w", 4), ints=0)


def blocks_dense(p: ConvProblem, pass_: str) -> bool:
    """Whether `direct`'s dense pass of `p` probes the blocked kernels (`blocked_pass`; in
    nhwc `blocked_nhwc`'s too, which take no pass the pixel-lane ones do not)."""
    return p.flops >= BLOCKED_MIN_FLOPS and blocked(kernel_problem(p), pass_)


def blocked_pass(p: ConvProblem, pass_: str, layout: str, dtype, products):
    """`direct`'s dense pass, its tap products (`products()` makes it), or where `blocks_dense`
    the faster of them and the blocked kernels as its first call probes them (an earlier probe
    of the pass in this process: its way alone). The kernels run in nchw on the filter as
    (G, K/G, C/G, R, S) (bwd_data: flipped, (G, C/G, K/G, R, S); bwd_filter: summed into it
    in float64); an nhwc pass's operands are copied to nchw and its result back (`transpose`),
    and a wide filter's pass runs with its axes swapped (`wide_filter`: operands and result
    copied with their planes transposed, in either layout), inside the time the probe and the
    harness see."""
    key = (p, pass_, layout, np.dtype(dtype).str)
    kept = _KERNEL_CHOICE.get(key)
    if not blocks_dense(p, pass_) or kept == "products":
        return products()
    if kept == blocked_nhwc.NAME:
        return nhwc_kernel(p, pass_, layout, dtype)
    q = kernel_problem(p)
    swap = q is not p
    g, kg, cg = p.groups, p.k // p.groups, p.c // p.groups
    flip = pass_ == "bwd_data"
    taps = np.empty((g, cg, kg, q.r, q.s) if flip else (g, kg, cg, q.r, q.s),
                    np.float64 if pass_ == "bwd_filter" else dtype)
    a_buf = out_buf = b_buf = None
    if layout == "nhwc" or swap:
        x, y = np.empty(q.x_shape("nchw"), dtype), np.empty(q.y_shape("nchw"), dtype)
        a_buf, out_buf = (x, y) if pass_ == "fwd" else (y, x)
        if pass_ == "bwd_filter":
            a_buf, b_buf, out_buf = x, y, None
        if not swap:
            _compile_transposes(dtype)  # where `compile` did not (the kernels: `blocked_kernels`)

    def operand(a, buf):
        if not swap:
            return _to_nchw(a, buf)
        _torch_transpose(f"swap_{layout}", a, buf)
        return buf

    def result(buf, out):
        if swap:
            _torch_transpose(f"swap_{layout}", buf, out)
        else:
            transpose("to_nhwc", buf, out)

    def filter_(w):  # (G, K/G, C/G, R, S), or its transpose where swapped
        grouped = _group_filter(w, p, layout)
        return grouped.swapaxes(-1, -2) if swap else grouped

    def way(kernel):
        if pass_ == "bwd_filter":
            def run_filter(x, dy, out):
                taps.fill(0)
                kernel(operand(x, a_buf), operand(dy, b_buf), taps)
                filter_(out)[...] = taps
            return run_filter

        def run(a, w, out):
            grouped = filter_(w)
            taps[...] = grouped[:, :, :, ::-1, ::-1].transpose(0, 2, 1, 3, 4) if flip else grouped
            kernel(operand(a, a_buf), taps, out if out_buf is None else out_buf)
            if out_buf is not None:
                result(out_buf, out)
        return run
    ways = {name: way(_contiguous(k))
            for name, k in blocked_kernels(q, pass_, dtype, kept).items()}
    if kept is None:
        ways = {"products": products(), **ways}
        if nhwc_blocked(p, pass_, layout, dtype):
            ways[blocked_nhwc.NAME] = nhwc_kernel(p, pass_, layout, dtype)
    return _probed(ways, key)


def dense_workspace_bytes(p: ConvProblem, pass_: str, layout: str, dtype, products: int) -> int:
    """Bytes `blocked_pass` holds beside `direct`'s dense products (`products` bytes): the
    blocked kernels' scratch, the filter's copy and nhwc's operands in nchw, as `_kept_bytes`
    counts them."""
    if not blocks_dense(p, pass_):
        return products
    copies = p.k * (p.c // p.groups) * p.r * p.s  # the filter (bwd_filter: its float64 sums)
    if pass_ == "bwd_filter":
        copies *= 8 // np.dtype(dtype).itemsize
    if layout == "nhwc" or wide_filter(p):
        copies += math.prod(p.x_shape("nchw")) + math.prod(p.y_shape("nchw"))
    return _kept_bytes(p, pass_, layout, dtype, "products", products,
                       copies * np.dtype(dtype).itemsize)


def blocked_note(p: ConvProblem, pass_: str, layout: str, dtype, incumbent: str,
                 dense: bool = True) -> str:
    """What a probed pass runs: `incumbent`, the blocked kernels or an nhwc pass's
    `blocked_nhwc` kernel, as probed or to be."""
    way = _KERNEL_CHOICE.get((p, pass_, layout, np.dtype(dtype).str))
    probed = f"[probed: {way}]" if way else "[probed on first call]"
    nhwc = nhwc_blocked(p, pass_, layout, dtype)
    if nhwc and way == blocked_nhwc.NAME:
        return f"{nhwc_note(p, pass_, dtype)} {probed}"
    bits = blocked_llvm.vector_bits()
    blocks = " or ".join(f"{kb}x{pb}" for kb, pb in blocked_llvm.blocks(pass_, bits))
    what = "taps" if pass_ == "bwd_filter" else "vectors of pixels"
    q = kernel_problem(p, dense)
    if blocked_llvm.phased(q, pass_):
        what += f", as {q.stride_h * q.stride_w} stride-1 phases"
    if q is not p:
        what += ", on planes transposed (the filter wider than tall)"
    ways = [incumbent, f"register-blocked LLVM kernels ({blocks} output channels x {what})"]
    if nhwc:
        ways.append(nhwc_note(p, pass_, dtype))
    return f"the faster of {', '.join(ways[:-1])} and {ways[-1]} {probed}"


def nhwc_note(p: ConvProblem, pass_: str, dtype) -> str:
    """`blocked_nhwc`'s kernel of a pass, in a row's note."""
    gms = [gm for gm in blocked_nhwc.geometries(p, pass_, dtype, blocked_llvm.vector_bits(),
                                                 threads_=threads.count()) if gm]
    gm = gms[0]
    phases = f", as {len(gms)} stride-1 phases" if blocked_llvm.phased(p, pass_) else ""
    block = "input channels" if pass_ == "bwd_filter" else "pixels"
    return (f"the nhwc LLVM kernel ({gm.pb} {block} x {gm.kv} vectors of {gm.lanes} output "
            f"channels{phases}, on nhwc as it is)")
