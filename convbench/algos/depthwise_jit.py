"""`direct`'s depthwise path compiled: one pass over the activation, the taps in the loop body.

The taps-over-views path (`depthwise`) makes R·S elementwise passes over a block of y, each
reading the block and its window and writing the block back: it runs at the cache's bandwidth.
A depthwise kernel proper (oneDNN's, kernels/depthwise.cu) reads each input once and adds every
tap in registers. These kernels do that on the CPU, compiled by Numba (LLVM), the vector loop
over what is contiguous:

- nhwc, register-blocked (fwd of column stride 1 or 2, and bwd_data; undilated;
  `templates/depthwise_blocked.py.tmpl`, rendered per filter R x S): a pixel's channels,
  UR output pixels of a row a step with every tap unrolled, so each pixel's sum stays in a
  register through all R·S taps, each output is stored once and an input column or weight
  loaded once serves every pixel of the step that reads it (one load per product before,
  and a load and store of the output per row of taps: the kernel was load-bound). A task is
  an image's band of output rows and a block of channels (`blocking`); the band's input rows
  are copied zero-bordered first, within L2, so no pixel needs a border test. That copy is a
  pass over x: where a tap's products per input element are few (R·S / (sh·sw) < 4: 3x3 of
  stride 2, 1x1), or many of them fall on the zero border (small images, large filters), it
  costs more than it saves and the kernel below runs instead. bwd_data is the same kernel on
  dy (`launches`): of stride 1 once, the filter flipped; of a larger stride once per phase of
  dx (the pixels a + sh·i, b + sw·j), a stride-1 pass over dy with the taps that reach that
  phase, flipped, storing every stride-th pixel of dx (faster than the gather below).
- nhwc, otherwise: each row of taps is one expression over the channels,
  ``y[k] += x[.., s=0, k]·w[r, 0, k] + ... + x[.., s=S-1, k]·w[r, S-1, k]`` (rendered per
  filter width S); threads share the output rows (n, p). Pixels whose window crosses the
  border add only the taps inside.
- nchw: a channel plane at a time in wide rows (as the dense path, `direct`): the plane is split
  into sh·sw stride-phase planes Wq = Q + (S-1)·dw // sw columns wide, so each tap reads one
  phase plane at a fixed offset with unit stride and a row of taps is one vector loop over the
  whole plane, the weights scalars; the Wq - Q extra columns are dropped. Threads share the
  planes (n, k); a plane and its phases stay in cache.

Elsewhere, bwd_data of stride 1 is the forward kernel on dy with the filter flipped (its padding
(R-1)·dh - pad); of larger stride a gather per dx pixel (nhwc) or, per plane, each tap's dy·w
added into its phase plane, the phases then merged (nchw). bwd_filter sums dy·x per tap, each
output row's sums in the working precision and the rows in float64, so its error does not grow
with N·P·Q. A channel multiplier m > 1 (K = C·m): nhwc repeats x's channels m times (a copy, in
`buffers`) and sums dx over the multiplier; nchw reads input channel k // m for plane k.

The kernels are Python in `templates/depthwise.py.tmpl` (per filter width S, `_source`),
`templates/depthwise_blocked.py.tmpl` (per filter, column stride and output column step,
`_blocked_source`),
`templates/planes.py.tmpl` (the phase planes, shared with `grouped_jit`) and
`templates/depthwise_nhwc.py.tmpl` (any filter), rendered by `jit.source`. They compile in
`prepare` (a second or two each, the first time on a machine) and are cached on disk beside
their rendered module in `machine.host.user_cache() / "numba"`.
Without Numba (`jit.available`) `direct` runs the taps-over-views path and its note says so.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from ..core.problem import ConvProblem
from ..machine import threads
from . import jit

# --- the kernels: templates/depthwise.py.tmpl (per S), templates/depthwise_nhwc.py.tmpl ---------

#: Column strides with kernels of their own: a constant stride lets LLVM vectorise the strided
#: reads of nchw's phase split and bwd_filter's dot products; others run with the stride a
#: variable (0 in the module's name).
CONSTANT_STRIDES = (1, 2)

#: The templates of the kernels of one filter width.
TEMPLATES = ["planes", "depthwise"]


def _source(S: int, SW: int) -> str:
    """The module of the kernels of filter width S and column stride SW (0: any): each row of
    taps unrolled into one expression."""
    views = [line for s in range(S)
             for line in (f"x{s} = ph[a * sw + ({s} * dw) % sw, o + ({s} * dw) // sw:]",
                          f"w{s} = w[k, r, {s}]")]
    return jit.source(
        TEMPLATES, f"filter width S = {S}, column stride {SW or 'any'}", {"views": views},
        S=S, step="j" if SW == 1 else f"j * {SW}" if SW else "j * sw",
        terms0=" + ".join(f"x[n, hh, iw + {s} * dw, k] * w[r0, {s}, k]" for s in range(S)),
        terms=" + ".join(f"x[n, hh, iw + {s} * dw, k] * w[r, {s}, k]" for s in range(S)),
        terms_c=" + ".join(f"x{s}[j] * w{s}" for s in range(S)))


@functools.cache
def forward_kernels(S: int, sw: int = 1):
    """The module of `_source(S, SW)` for column stride `sw` (`jit.load`)."""
    SW = sw if sw in CONSTANT_STRIDES else 0
    return jit.load(f"convbench_dw_s{S}_sw{SW}", _source(S, SW))


def _unroll(R: int, S: int) -> int:
    """Output pixels a step of the blocked kernel: its body holds their sums and loads each
    input column a row of taps reads once, so the loads per product fall as the step grows,
    until the sums and columns no longer fit the registers; a large filter's body amortises 8
    (the sweep: docs/pages/changes.md)."""
    return 4 if R * S <= 25 else 8


def _taps(R: int, S: int, SW: int, UR: int, read: str, OSW: int = 1) -> list[str]:
    """The channel loop's body of the blocked kernel for UR pixels, their input read by the
    format `read` (of r, c: the tap's row, the column from the step's first): per row of
    taps its input columns and weights named once, each pixel's products added into its sum
    of even or odd rows, each output stored once."""
    lines, started = [], set()
    for r in range(R):
        cols = sorted({u * SW + s for u in range(UR) for s in range(S)})
        lines += [f"c{c} = {read.format(r=r, c=c)}" for c in cols]
        lines += [f"g{s} = w[{r}, {s}, kk]" for s in range(S)]
        for u in range(UR):
            acc, terms = f"a{u}_{r % 2}", " + ".join(f"c{u * SW + s} * g{s}" for s in range(S))
            lines.append(f"{acc} = {acc} + {terms}" if acc in started else f"{acc} = {terms}")
            started.add(acc)
    return lines + [f"y[n, yp, yq + {u * OSW}, kk] = a{u}_0" + (f" + a{u}_1" if R > 1 else "")
                    for u in range(UR)]


def _steps(R: int, S: int, SW: int, OSW: int) -> list[str]:
    """The loops over a row's output pixels: UR (`_unroll`) a step, then the row's last ones
    in steps of UR/2, UR/4, ... 1 (a row of 6 pixels is a step of 4 and one of 2, not 4 and
    two single pixels)."""
    lines, ur = [], _unroll(R, S)
    while ur >= 1:
        body = _taps(R, S, SW, ur, "xp[i0 + {r}, j0 + {c}, k]", OSW)
        # a forward pass stores column q (known not negative: no index wrapped); a phase of
        # dx, ob + OSW·q (OSW 1 only where ob is 0: the layer's column stride is 1)
        lines += [f"while q + {ur} <= Q:", f"    j0 = q * {SW}",
                  "    yq = q" if OSW == 1 else f"    yq = ob + {OSW} * q",
                  "    for k in range(kwu):",
                  "        kk = k0u + k", *(f"        {line}" for line in body), f"    q += {ur}"]
        ur //= 2
    return lines


def _blocked_source(R: int, S: int, SW: int, OSW: int = 1) -> str:
    """The module of the register-blocked nhwc kernel of an R x S filter and column stride
    SW, storing every OSW-th column of its output (a constant: a variable in the stores'
    index slowed the forward pass)."""
    return jit.source(["depthwise_blocked"], f"filter {R}x{S}, column stride {SW}, every "
                      f"{OSW} output columns", {"steps": _steps(R, S, SW, OSW)},
                      R=R, S=S, SW=SW, UR=_unroll(R, S), OSW=OSW)


@functools.cache
def blocked_kernels(R: int, S: int, SW: int, OSW: int = 1):
    """The module of `_blocked_source(R, S, SW, OSW)` (`jit.load`)."""
    return jit.load(f"convbench_dw_blocked_r{R}s{S}_sw{SW}_o{OSW}",
                    _blocked_source(R, S, SW, OSW))


@functools.cache
def nhwc_kernels():
    """The module of the nhwc kernels that need no shape of their own: a strided bwd_data,
    bwd_filter."""
    return jit.load("convbench_dw_nhwc", jit.source(["depthwise_nhwc"], "any filter"))


# --- the passes ----------------------------------------------------------------------------------

def _multiplier(p: ConvProblem) -> int:
    return p.k // p.c


def _flipped(p: ConvProblem) -> bool:
    """bwd_data runs as the forward kernel on dy with the filter flipped: stride 1 only."""
    return p.stride_h == 1 and p.stride_w == 1


#: The products per input element (R·S / (sh·sw)) from which the blocked kernel's band copy,
#: a pass over x, pays for itself (3x3 of stride 2, 2.25, ran slower blocked).
BLOCKED_INTENSITY = 4
#: The least share of its taps' products that fall inside x for the blocked kernel: it
#: computes every tap over the zero border, where the per-row-of-taps kernel skips the taps
#: outside (7x7 filters on 7x7 images, 57% inside, ran slower blocked).
BLOCKED_INSIDE = 0.6


def _inside(out: int, taps: int, stride: int, pad: int, size: int) -> float:
    """The share of (output position, tap) pairs of one axis that read inside [0, size)."""
    inside = sum(max(0, min(taps, size - (o * stride - pad)) - max(0, pad - o * stride))
                 for o in range(out))
    return inside / (out * taps)


@dataclasses.dataclass(frozen=True)
class Launch:
    """One call of the blocked kernel: its filter (R x S taps, the layer's `rows` and `cols`
    in the kernel's order) and column stride, its output (P x Q, stored at row oa + osh·p and
    column ob + osw·q of the pass's output) and its geometry over its input (rows_in x
    cols_in: row stride sh, padding pt and pl)."""

    R: int
    S: int
    SW: int
    P: int
    Q: int
    sh: int
    pt: int
    pl: int
    rows_in: int
    cols_in: int
    rows: tuple[int, ...]
    cols: tuple[int, ...]
    oa: int = 0
    ob: int = 0
    osh: int = 1
    osw: int = 1


def _phase(a: int, stride: int, pad: int, taps: int, size: int):
    """Phase a of one axis of a strided bwd_data: dx's positions a + stride·i (how many), the
    taps that reach them (r ≡ a + pad mod stride), flipped, and the padding of the stride-1
    forward pass over dy that sums them (dy's index i + (a + pad - r) / stride)."""
    out = -(-(size - a) // stride)
    first = (a + pad) % stride
    reach = tuple(range(first, taps, stride))
    return out, reach[::-1], len(reach) - 1 - (a + pad - first) // stride


def launches(p: ConvProblem, pass_: str) -> list[Launch]:
    """The blocked kernel's calls of a pass: fwd one; bwd_data of stride 1 one, the forward
    kernel on dy with the filter flipped (padding (R-1) - pt, (S-1) - pl); of a larger stride
    one per phase of dx (sh·sw), each a stride-1 forward pass over dy with the taps that reach
    that phase, flipped, storing its pixels every stride (a phase no tap reaches: none)."""
    rows, cols = tuple(range(p.r)), tuple(range(p.s))
    if pass_ == "fwd":
        return [Launch(p.r, p.s, p.stride_w, p.p, p.q, p.stride_h, p.pad_top, p.pad_left,
                       p.h, p.w, rows, cols)]
    out = []
    for a in range(p.stride_h):
        P, taps_r, pt = _phase(a, p.stride_h, p.pad_top, p.r, p.h)
        for b in range(p.stride_w):
            Q, taps_s, pl = _phase(b, p.stride_w, p.pad_left, p.s, p.w)
            out.append(Launch(len(taps_r), len(taps_s), 1, P, Q, 1, pt, pl, p.p, p.q, taps_r,
                              taps_s, a, b, p.stride_h, p.stride_w))
    return out


def _blocked(p: ConvProblem, pass_: str, layout: str) -> bool:
    """nhwc's fwd and bwd_data run the register-blocked kernel for undilated filters (of a
    constant column stride in fwd: its loads are shared between pixels only where the
    columns they read are known when it compiles), with taps enough per input element to pay
    for its band copy and few of their products over the border (over all its calls)."""
    if layout != "nhwc" or p.dil_h != 1 or p.dil_w != 1 or pass_ == "bwd_filter":
        return False
    if pass_ == "fwd" and p.stride_w not in CONSTANT_STRIDES:
        return False
    if p.r * p.s < BLOCKED_INTENSITY * p.stride_h * p.stride_w:
        return False
    work = inside = 0
    for c in launches(p, pass_):
        pairs = c.P * c.Q * c.R * c.S
        work += pairs
        if pairs:
            inside += pairs * (_inside(c.P, c.R, c.sh, c.pt, c.rows_in)
                               * _inside(c.Q, c.S, c.SW, c.pl, c.cols_in))
    return inside >= BLOCKED_INSIDE * work


#: The bytes of a blocked task's zero-bordered input band (xp): a core's L2 (1 MiB on Zen 4,
#: 2 MiB on Sapphire Rapids), so a band's rows stay there while every tap reads them; a larger
#: band copies fewer halo rows twice.
BAND_BYTES = 1 << 20
#: An input larger than this (the whole batch) streams from memory, not the last-level cache:
#: the blocked kernel then takes all its channels a task, so its band copy reads whole pixels,
#: contiguous rows; a cached input keeps the blocks, whose weights stay in L1
#: (docs/pages/changes.md).
INPUT_BYTES = 16 << 20


def blocking(p: ConvProblem, c: Launch, dtype) -> tuple[int, int]:
    """The channels a task (KB) and output rows a band (PB) of a blocked call. KB: each tap's
    KB weights stay in L1 beside the band's rows (128 for a 3x3 filter, 64 for larger ones),
    or all K for an input beyond `INPUT_BYTES`; PB: the band's input rows within
    `BAND_BYTES`, halved while the tasks are fewer than two a thread (a batch-1 layer still
    keeps every thread busy)."""
    size = np.dtype(dtype).itemsize
    streamed = p.n * c.rows_in * c.cols_in * p.k * size > INPUT_BYTES
    KB = p.k if streamed else min(p.k, 128 if c.R * c.S <= 9 else 64)
    Wp = (c.Q - 1) * c.SW + c.S
    PB = max(1, min(c.P, (BAND_BYTES // size // (Wp * KB) - c.R) // c.sh + 1))
    while PB > 1 and p.n * -(-c.P // PB) * -(-p.k // KB) < 2 * threads.count():
        PB = -(-PB // 2)
    return KB, PB


def _chunks(p: ConvProblem) -> int:
    """bwd_filter nhwc's partial sums: one per thread, at most one per output row."""
    return max(1, min(threads.count(), p.n * p.p))


def buffers(p: ConvProblem, pass_: str, layout: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every buffer a prepared pass holds beyond its operands, with its dtype ("work" for the
    working precision): the filter in the kernel's order (the taps, flipped for bwd_data of
    stride 1; each blocked call's own), nhwc's channel-repeated x for a multiplier m > 1, the
    pass's output over K channels where dx sums m of them, and bwd_filter's float64 partial
    sums."""
    m, rs = _multiplier(p), (p.r, p.s)
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    if _blocked(p, pass_, layout):  # each call's taps, one after another
        out["taps"] = ((sum(c.R * c.S for c in launches(p, pass_)), p.k), "work")
    elif pass_ != "bwd_filter":
        out["taps"] = ((p.r, p.s, p.k) if layout == "nhwc" else (p.k, p.r, p.s), "work")
    if pass_ == "bwd_data" and m > 1:
        out["dx_k"] = ((p.n, p.h, p.w, p.k) if layout == "nhwc" else (p.n, p.k, p.h, p.w),
                       "work")
    if layout == "nhwc" and m > 1 and pass_ != "bwd_data":
        out["x_k"] = ((p.n, p.h, p.w, p.k), "work")
    if pass_ == "bwd_filter":
        out["sums"] = (((_chunks(p),) + rs + (p.k,)) if layout == "nhwc" else (p.k,) + rs,
                       "float64")
    return out


def _blocked_tasks(p: ConvProblem, pass_: str, dtype) -> tuple[int, int]:
    """The blocked calls' most tasks and the elements of their largest input band."""
    tasks = band = 0
    for c in launches(p, pass_):
        if c.R and c.S and c.P and c.Q:
            KB, PB = blocking(p, c, dtype)
            tasks = max(tasks, p.n * -(-c.P // PB) * -(-p.k // KB))
            band = max(band, ((PB - 1) * c.sh + c.R) * ((c.Q - 1) * c.SW + c.S) * KB)
    return tasks, band


def scratch_elements(p: ConvProblem, pass_: str, layout: str, dtype) -> int:
    """Elements each thread's task allocates inside the kernel: the blocked kernel's input
    band, nchw's phase planes and wide row of a plane (fwd, bwd_data), nhwc bwd_filter's
    per-row sums."""
    if _blocked(p, pass_, layout):
        return _blocked_tasks(p, pass_, dtype)[1]
    if layout == "nhwc":
        return p.r * p.s * p.k if pass_ == "bwd_filter" else 0
    if pass_ == "bwd_filter":
        return 0
    if pass_ == "bwd_data" and _flipped(p):  # the forward kernel over dx's rows
        wq = p.w + (p.s - 1) * p.dil_w
        return (p.h + (p.r - 1) * p.dil_h + 1) * wq + p.h * wq
    wq = p.q + ((p.s - 1) * p.dil_w) // p.stride_w
    rows = p.p + ((p.r - 1) * p.dil_h) // p.stride_h + 1
    return p.stride_h * p.stride_w * rows * wq + p.p * wq


def workspace_bytes(p: ConvProblem, pass_: str, layout: str, dtype) -> int:
    """The buffers `prepare` holds, and every thread's scratch inside the kernel."""
    size = {"work": np.dtype(dtype).itemsize, "float64": 8}
    held = sum(math.prod(shape) * size[kind] for shape, kind in buffers(p, pass_, layout).values())
    tasks = (_blocked_tasks(p, pass_, dtype)[0] if _blocked(p, pass_, layout)
             else _chunks(p) if layout == "nhwc" else p.n * p.k)
    return (held + min(threads.count(), tasks) * scratch_elements(p, pass_, layout, dtype)
            * np.dtype(dtype).itemsize)


def describe(p: ConvProblem, pass_: str, layout: str) -> str:
    vector = "channels" if layout == "nhwc" else "pixels of a row"
    how = {"fwd": ("each row of taps one expression" if layout == "nhwc"
                   else "wide rows over stride-phase planes"),
           "bwd_data": ("the forward kernel on dy, filter flipped" if _flipped(p)
                        else "a gather per dx pixel" if layout == "nhwc"
                        else "each tap added into its phase plane"),
           "bwd_filter": "per-row sums added in float64"}[pass_]
    if _blocked(p, pass_, layout):
        calls = launches(p, pass_)
        how = (f"{_unroll(calls[0].R, calls[0].S)} pixels' sums in registers through every "
               "tap, over zero-bordered row bands")
        if pass_ == "bwd_data":
            how += (", the forward kernel on dy, filter flipped" if len(calls) == 1 else
                    f", one forward kernel on dy per phase of dx ({len(calls)}), its taps "
                    "flipped")
    return (f"depthwise: compiled kernel (Numba), one pass, {p.r * p.s} taps, vectorised over "
            f"the {vector}, {how}, {threads.count()} threads")


def kernel(p: ConvProblem, pass_: str, layout: str, dtype):
    """The compiled kernel of a depthwise pass and the integers it takes after its three
    arrays (the blocked kernel's: its calls, (`Launch`, kernel, integers) each, and None),
    compiled here on empty arrays (`jit.compile_empty`): `prepare` and `direct`'s `compile`
    both ask this, and only the first compiles."""
    nhwc = layout == "nhwc"
    geo = (p.stride_h, p.stride_w, p.dil_h, p.dil_w, p.pad_top, p.pad_left)
    ranks = (("w", 4), ("w", 3), ("w", 4))
    if _blocked(p, pass_, layout):
        calls = []
        for c in launches(p, pass_):
            if not (c.R and c.S and c.P and c.Q):
                calls.append((c, None, ()))  # a phase of dx no tap reaches: zero
                continue
            fn = blocked_kernels(c.R, c.S, c.SW, c.osw).fwd_nhwc_blocked
            args = (c.P, c.Q, c.sh, c.pt, c.pl, c.oa, c.ob, c.osh, *blocking(p, c, dtype))
            jit.compile_empty(fn, dtype, *ranks, ints=len(args))
            calls.append((c, fn, args))
        return calls, None
    if pass_ == "fwd":
        kern = forward_kernels(p.s, p.stride_w)
        fn, args = (kern.fwd_nhwc, geo) if nhwc else (kern.fwd_nchw, geo + (_multiplier(p),))
    elif pass_ == "bwd_data" and _flipped(p):
        # the forward kernel on dy, its padding ·dh - pt (the taps that reach dx row 0
        # start that many rows before dy's first)
        kern = forward_kernels(p.s, 1)
        fgeo = (1, 1, p.dil_h, p.dil_w, (p.r - 1) * p.dil_h - p.pad_top,
                (p.s - 1) * p.dil_w - p.pad_left)
        fn, args = (kern.fwd_nhwc, fgeo) if nhwc else (kern.fwd_nchw, fgeo + (1,))
    elif pass_ == "bwd_data":
        fn = (nhwc_kernels().bwd_data_nhwc if nhwc
              else forward_kernels(p.s, p.stride_w).bwd_data_nchw)
        args = geo
    else:
        ranks = (("w", 4), ("w", 4), ("d", 4 if nhwc else 3))
        fn, args = ((nhwc_kernels().bwd_filter_nhwc, geo + (_chunks(p),)) if nhwc
                    else (forward_kernels(p.s, p.stride_w).bwd_filter_nchw,
                          geo + (_multiplier(p),)))
    jit.compile_empty(fn, dtype, *ranks, ints=len(args))
    return fn, args


def prepare(p: ConvProblem, pass_: str, layout: str, dtype):
    """The pass `run(a, b, out)` of a depthwise problem, its kernel compiled."""
    m = _multiplier(p)
    bufs = {name: np.zeros(shape, dtype if kind == "work" else np.float64)
            for name, (shape, kind) in buffers(p, pass_, layout).items()}
    nhwc = layout == "nhwc"
    fn, args = kernel(p, pass_, layout, dtype)

    def filter_taps(w, flip: bool):
        """w (kcrs or krsc: the same order, one input channel each) in the kernel's order."""
        wk = w.reshape(p.k, p.r, p.s)
        if flip:
            wk = wk[:, ::-1, ::-1]
        taps = bufs["taps"]
        taps[...] = wk.transpose(1, 2, 0) if nhwc else wk
        return taps

    def apply(a, w, target, flip: bool):
        """The pass's kernel on a into target; the blocked kernel's calls one by one, each
        with its taps (a phase of dx no tap reaches set to zero)."""
        if args is not None:
            fn(a, filter_taps(w, flip), target, *args)
            return
        wk, at = w.reshape(p.k, p.r, p.s), 0
        for c, kern, kargs in fn:
            if kern is None:
                target[:, c.oa::c.osh, c.ob::c.osw, :] = 0
                continue
            taps = bufs["taps"][at:at + c.R * c.S].reshape(c.R, c.S, p.k)
            at += c.R * c.S
            taps[...] = wk[:, c.rows][:, :, c.cols].transpose(1, 2, 0)
            kern(a, taps, target, *kargs)

    def x_channels(x):
        """nhwc x with each channel repeated m times (K channels), else x itself."""
        if not nhwc or m == 1:
            return x
        bufs["x_k"].reshape(x.shape + (m,))[...] = x[..., None]
        return bufs["x_k"]

    if pass_ == "fwd":
        def run(x, w, out):
            jit.set_threads()
            apply(x_channels(x), w, out, False)
        return run

    if pass_ == "bwd_data":
        flip = _flipped(p)

        def run(dy, w, out):
            jit.set_threads()
            target = bufs["dx_k"] if m > 1 else out
            apply(dy, w, target, flip)
            if m > 1:  # dx sums the m output channels each input channel feeds
                if nhwc:
                    np.sum(target.reshape(p.n, p.h, p.w, p.c, m), axis=4, out=out)
                else:
                    np.sum(target.reshape(p.n, p.c, m, p.h, p.w), axis=2, out=out)
        return run

    sums = bufs["sums"]

    def run(x, dy, out):
        jit.set_threads()
        sums.fill(0)
        fn(x_channels(x), dy, sums, *args)
        if nhwc:
            out.reshape(p.k, p.r, p.s)[...] = sums.sum(axis=0).transpose(2, 0, 1)
        else:
            out.reshape(p.k, p.r, p.s)[...] = sums
    return run
