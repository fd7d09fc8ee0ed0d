"""`direct`'s passes register-blocked: LLVM IR generated per
geometry (llvmlite), for grouped and dense layers alike (a dense layer is one group).

`grouped_jit`'s Numba loops add each tap's products into an output row in memory: a load and a
store of the sum for every few FMAs. Here the sums of `kb` output channels over `pb` vectors of
pixels stay in vector registers through a group's whole reduction (its channels a loop, the
R·S taps unrolled inside it), each sum stored once: per tap `pb` input loads and `kb` weight
broadcasts feed kb·pb FMAs (8x3 on AVX-512: under 0.5 loads an FMA, against about 2 in
`grouped_jit`). Numba could not be made to emit that loop (its vectoriser spilled the weights
and gave up past ~128 live ones: docs/pages/cpu-algorithms.md), so the loop is written as LLVM
IR with explicit vectors, compiled by llvmlite (Numba's own LLVM, nothing to install) for the
host CPU's name and features, every size a constant.

A task is one image, one group and a part of its output channels (parts only where images x
groups are fewer than two tasks a thread), the tasks split evenly over `threads.count()`
threads (a ctypes call releases the GIL). A task:
1. copies the group's input channels into zero-bordered stride-phase planes (as `grouped_jit`'s
   planes: every tap then reads a plane with unit stride at a constant offset); the planes are
   the thread's own, zeroed once, so only their interior is written per task (stride 2 across:
   each row split into even and odd columns by vector shuffles);
2. runs the blocked products over "wide" rows (the planes' width, its extra columns dropped),
   `pb` vectors of pixels by `kb` output channels at a time, into the thread's wide rows;
3. copies the wide rows' valid columns into y.
bwd_data of stride 1 is the same kernel on dy with the filter flipped and transposed, as in
`grouped_jit`; of a larger stride (at most 4 phases) it is one such kernel per phase of dx
(`PhasedKernel`): the pixels phase + stride·i of each axis take the taps of the flipped filter
from `PhaseAxis.first` every stride, a stride-1 forward over dy that stores its outputs every
stride (`Geometry.osh`, `osw`), so no phase plane of dx is merged afterwards. bwd_filter sums
kb output channels x up to 9 taps of the gradient in registers over the pixels
(`filter_sums`).

Who runs it: `grouped_jit` (groups of up to 32 channels) and `direct`'s dense path (the rest,
above `grouped_jit.BLOCKED_MIN_FLOPS`) probe these kernels beside their own on a pass's first
call (`products.probe`: interleaved rounds, the incumbent kept unless another is clearly
faster), since neither wins everywhere (docs/pages/cpu-algorithms.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import gc
import hashlib
import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.problem import ConvProblem
from ..machine import host, threads
from ..machine import llvm as llvm_machine
from . import jit


@dataclass(frozen=True)
class Correlation:
    """What a kernel computes, whatever its layout (this module's `Geometry`, and
    `blocked_nhwc`'s): a correlation of `n` images of `g` groups of `cg` input and `kg` output
    channels, h x w in, p x q out, at strides (sh, sw) and dilations (dh, dw), padded (pt, pl)
    at the top and left (the bottom and right are zeros the kernel reads past the input). Its
    p x q outputs go to y's planes of oh x ow (0: p x q), output (i, j) at (i·osh + oa,
    j·osw + ob), so a strided bwd_data's phase writes its pixels of dx."""

    n: int
    g: int
    cg: int
    kg: int
    h: int
    w: int
    r: int
    s: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int
    pl: int
    p: int
    q: int
    _: dataclasses.KW_ONLY
    oh: int = 0
    ow: int = 0
    osh: int = 1
    osw: int = 1
    oa: int = 0
    ob: int = 0

    @property
    def out_plane(self) -> tuple[int, int]:
        """y's planes: (oh, ow), or (p, q)."""
        return (self.oh or self.p, self.ow or self.q)


@dataclass(frozen=True)
class Geometry(Correlation):
    """One compiled kernel's constants: a forward pass (`Correlation`) in nchw, over
    stride-phase planes; `kb` x `pb` register blocks of `lanes`-wide vectors."""

    kb: int
    pb: int
    lanes: int
    dtype: str = "float32"
    cpu: str = ""  # the CPU name it compiles for ("" the host's)
    part: int = 0  # output channels a task (0: all kg): split so that threads have work
    #: "fwd" (also bwd_data's flipped forward) or "bwf" (bwd_filter: kb output channels x
    #: `taps` taps of the filter gradient summed in registers over the pixels)
    mode: str = "fwd"
    taps: int = 0  # bwf: taps a pass over the pixels sums at most (0: all R·S)

    @property
    def entry(self) -> str:
        """The kernel's function name."""
        return ENTRY[self.mode]

    def ir(self) -> str:
        """The kernel's LLVM IR (`kernel_ir`): `compiled` asks a geometry for its own, so
        `blocked_nhwc`'s compile the same way."""
        return kernel_ir(self)

    @property
    def tasks(self) -> int:
        """Tasks of the pass: an image, group and part (bwf: a group and part, the images in
        turn, so no two tasks add into one filter gradient)."""
        return (1 if self.mode == "bwf" else self.n) * self.g * self.chunks

    @property
    def chunk(self) -> int:
        """Output channels a task computes (the last of an image and group the rest)."""
        return self.part or self.kg

    @property
    def chunks(self) -> int:
        """Tasks an image and group."""
        return -(-self.kg // self.chunk)

    @property
    def wq(self) -> int:
        """A phase plane's width, and a wide row's."""
        return self.q + ((self.s - 1) * self.dw) // self.sw

    @property
    def rows(self) -> int:
        """A phase plane's rows: the output's, the filter's reach, one row of slack."""
        return self.p + ((self.r - 1) * self.dh) // self.sh + 1

    @property
    def step(self) -> int:
        """Pixels a register block covers."""
        return self.pb * self.lanes

    @property
    def wide(self) -> int:
        """A channel's wide rows, rounded up to whole register blocks."""
        return -(-self.p * self.wq // self.step) * self.step

    @property
    def plane(self) -> int:
        return self.rows * self.wq

    @property
    def cstride(self) -> int:
        """Elements of one input channel's phase planes."""
        return self.sh * self.sw * self.plane

    @property
    def planes_elements(self) -> int:
        """A thread's planes: the group's channels, and slack that the last block's reads past
        the last plane stay inside."""
        return self.cg * self.cstride + self.wide + self.step + self.s * self.dw

    @property
    def wide_elements(self) -> int:
        return self.chunk * self.wide

    def offset(self, r: int, s: int) -> int:
        """Where tap (r, s) reads, from the pixel's own position in a channel's planes."""
        a, b = (r * self.dh) % self.sh, (s * self.dw) % self.sw
        return ((a * self.sw + b) * self.plane + (r * self.dh // self.sh) * self.wq
                + (s * self.dw) // self.sw)


def vector_bits(features: dict | None = None) -> int:
    """The widest vectors the host's FMA units take: 512 bits with AVX-512F, 256 with AVX2 and
    FMA, else 128."""
    if features is None:
        import llvmlite.binding as llvm

        features = dict(llvm.get_host_cpu_features())
    if features.get("avx512f"):
        return 512
    if features.get("avx2") and features.get("fma"):
        return 256
    return 128


#: The register blocks (kb output channels x pb vectors of pixels) a pass probes, by vector
#: width: kb·pb sums, pb inputs and a broadcast weight fit the register file (32 vectors with
#: AVX-512, 16 below), and LLVM spills none of them on 3x3 filters (it did on 4x6 and 6x4).
#: Three shapes because none wins everywhere: 5x4 loads the fewest weights a multiply-add
#: (AlexNet's conv1), 16x1 wastes the fewest pixels of a small plane's last block (13x13 and
#: 14x14 layers), 8x3 sits between (docs/pages/cpu-algorithms.md).
BLOCKS = {512: ((8, 3), (5, 4), (16, 1)), 256: ((3, 3), (4, 2), (8, 1)),
          128: ((3, 3), (4, 2), (8, 1))}
#: bwd_filter's blocks: kb output channels x up to `taps` taps, a vector sum each (kb·taps of
#: them, and kb dy vectors and an input vector, in the registers); a filter of more taps takes
#: several passes over the pixels.
FILTER_BLOCKS = {512: ((2, 9), (4, 6)), 256: ((1, 9), (2, 6)), 128: ((1, 9), (2, 6))}


def blocks(pass_: str, bits: int) -> tuple[tuple[int, int], ...]:
    """The blocks a pass probes on vectors of `bits`."""
    return (FILTER_BLOCKS if pass_ == "bwd_filter" else BLOCKS)[bits]


#: The most filter taps a kernel unrolls: 16x16 (256 taps) compiles in about 2 s, 32x32
#: patchify layers (1,024) took LLVM minutes; larger filters keep the other ways.
MAX_TAPS = 256


def applies(p: ConvProblem, pass_: str) -> bool:
    """fwd and bwd_filter, and bwd_data (the forward kernel on dy, its pads the filter's reach
    less the pass's, which must not be negative; at a stride, of dilation 1, per phase:
    `phases`), of at most MAX_TAPS taps."""
    if p.r * p.s > MAX_TAPS:
        return False
    if pass_ in ("fwd", "bwd_filter"):
        return True
    if pass_ != "bwd_data":
        return False
    if not phased(p, pass_):
        return ((p.r - 1) * p.dil_h >= p.pad_top and (p.s - 1) * p.dil_w >= p.pad_left)
    return (p.dil_h == p.dil_w == 1 and p.stride_h * p.stride_w <= MAX_DATA_PHASES and
            all(axis is None or axis.pad >= 0
                for a, b in _phase_pairs(p) for axis in (a, b)))


#: The most phases a strided bwd_data runs as (stride 2 both ways): each is a kernel of its own
#: per block probed, compiled on the pass's first call.
MAX_DATA_PHASES = 4


def phased(p: ConvProblem, pass_: str) -> bool:
    """Whether the pass runs as phases (`PhasedKernel`): bwd_data at a stride."""
    return pass_ == "bwd_data" and (p.stride_h, p.stride_w) != (1, 1)


@dataclass(frozen=True)
class PhaseAxis:
    """One axis of one phase of a strided bwd_data: dx's pixels phase, phase + stride, ...
    (`count` of them) take `taps` taps of the flipped filter, from `first` every stride, as a
    stride-1 forward over dy padded by `pad`."""

    phase: int
    count: int
    taps: int
    first: int
    pad: int


def phase_axis(size: int, taps: int, stride: int, pad: int, phase: int) -> PhaseAxis | None:
    """The phase's axis (dx of `size`, a filter of `taps`, padding `pad`), or None where no tap
    reaches it (its dx is zero). dx[phase + stride·i] sums w[r]·dy[i + (phase + pad - r)/stride]
    over the taps r ≡ phase + pad (mod stride): as a correlation over dy, the taps from the
    largest such r down, which are the flipped filter's taps from taps - 1 - r every stride."""
    reach = [r for r in range(taps) if (phase + pad - r) % stride == 0]
    if not reach:
        return None
    last = reach[-1]
    return PhaseAxis(phase, len(range(phase, size, stride)), len(reach), taps - 1 - last,
                     (last - phase - pad) // stride)


def _phase_pairs(p: ConvProblem) -> list[tuple[PhaseAxis | None, PhaseAxis | None]]:
    """(row axis, column axis) of each of bwd_data's sh·sw phases, rows first."""
    rows = [phase_axis(p.h, p.r, p.stride_h, p.pad_top, a) for a in range(p.stride_h)]
    cols = [phase_axis(p.w, p.s, p.stride_w, p.pad_left, b) for b in range(p.stride_w)]
    return [(a, b) for a in rows for b in cols]


def _split(gm: Geometry, images: int, threads_: int) -> Geometry:
    """`gm` with its output channels split into parts where the images x groups are fewer than
    two tasks a thread (each part fills the planes again: cheap beside its products)."""
    wanted = max(1, min(-(-2 * threads_ // (images * gm.g)), -(-gm.kg // gm.kb)))
    if wanted == 1:
        return gm
    part = -(-gm.kg // wanted)
    return dataclasses.replace(gm, part=-(-part // gm.kb) * gm.kb)  # whole blocks of kb


def geometries(p: ConvProblem, pass_: str, dtype, block: tuple[int, int], bits: int,
               cpu: str = "", threads_: int = 1) -> list[Geometry | None]:
    """The kernels of a pass: `geometry`'s one, or a strided bwd_data's per phase (None where
    the phase's dx is zero), rows first."""
    if not phased(p, pass_):
        return [geometry(p, pass_, dtype, block, bits, cpu, threads_)]
    lanes = bits // (8 * np.dtype(dtype).itemsize)
    g = p.groups
    out = []
    for a, b in _phase_pairs(p):
        if a is None or b is None:
            out.append(None)
            continue
        gm = Geometry(p.n, g, p.k // g, p.c // g, p.p, p.q, a.taps, b.taps, 1, 1, 1, 1, a.pad,
                      b.pad, a.count, b.count, *block, lanes, np.dtype(dtype).name, cpu,
                      oh=p.h, ow=p.w, osh=p.stride_h, osw=p.stride_w, oa=a.phase, ob=b.phase)
        out.append(_split(gm, p.n, threads_))
    return out


def geometry(p: ConvProblem, pass_: str, dtype, block: tuple[int, int], bits: int,
             cpu: str = "", threads_: int = 1) -> Geometry:
    """The kernel's constants for pass `pass_` of `p` (`applies`; bwd_data of stride 1) with
    register block `block`, for `threads_` threads (`_split`)."""
    lanes = bits // (8 * np.dtype(dtype).itemsize)
    g = p.groups
    kb, pb = block
    if pass_ == "bwd_filter":  # the forward's planes; kb x taps sums, a vector of pixels a step
        gm = Geometry(p.n, g, p.c // g, p.k // g, p.h, p.w, p.r, p.s, p.stride_h, p.stride_w,
                      p.dil_h, p.dil_w, p.pad_top, p.pad_left, p.p, p.q, kb, 1, lanes,
                      np.dtype(dtype).name, cpu, mode="bwf", taps=pb)
    elif pass_ == "fwd":
        gm = Geometry(p.n, g, p.c // g, p.k // g, p.h, p.w, p.r, p.s, p.stride_h, p.stride_w,
                      p.dil_h, p.dil_w, p.pad_top, p.pad_left, p.p, p.q, kb, pb, lanes,
                      np.dtype(dtype).name, cpu)
    else:
        gm = Geometry(p.n, g, p.k // g, p.c // g, p.p, p.q, p.r, p.s, 1, 1, p.dil_h, p.dil_w,
                      (p.r - 1) * p.dil_h - p.pad_top, (p.s - 1) * p.dil_w - p.pad_left,
                      p.h, p.w, kb, pb, lanes, np.dtype(dtype).name, cpu)
    return _split(gm, 1 if pass_ == "bwd_filter" else p.n, threads_)


# --- the IR ---------------------------------------------------------------------------------------

class _Emitter:
    """An IR builder that moves on as loops close (`loop`), so a loop's body is a Python
    function of its index."""

    def __init__(self, fn):
        from llvmlite import ir

        self.ir, self.fn = ir, fn
        self.i64 = ir.IntType(64)
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))

    def const(self, v: int):
        return self.ir.Constant(self.i64, v)

    def block(self, name: str):
        return self.fn.append_basic_block(name)

    def add(self, *terms):
        """The sum of i64 values."""
        total = terms[0]
        for t in terms[1:]:
            total = self.b.add(total, t)
        return total

    def mul(self, v, k: int):
        """An i64 value times a constant."""
        return self.b.mul(v, self.const(k))

    def smaller(self, a, b):
        return self.b.select(self.b.icmp_signed("<", a, b), a, b)

    def sums(self, rows: int, cols: int, zero, name: str):
        """A register-blocked reduction's loop opened: its body's block, its i64 index from 0,
        and a rows x cols grid of vector sums from `zero` (phis); `close_sums` ends it."""
        pre = self.b.block
        body = self.block(name)
        self.b.branch(body)
        b = self.b = self.ir.IRBuilder(body)
        index = b.phi(self.i64)
        index.add_incoming(self.const(0), pre)
        grid = [[b.phi(zero.type) for _ in range(cols)] for _ in range(rows)]
        for acc in (a for row in grid for a in row):
            acc.add_incoming(zero, pre)
        return body, index, grid

    def close_sums(self, body, index, grid, now, end: int, name: str, step: int = 1) -> None:
        """The loop `sums` opened closed: the index steps by `step` while below `end`, the
        sums take `now`; the builder then stands after the loop."""
        nxt = self.b.add(index, self.const(step))
        index.add_incoming(nxt, self.b.block)
        for row, new in zip(grid, now):
            for acc, value in zip(row, new):
                acc.add_incoming(value, self.b.block)
        after = self.block(name)
        self.b.cbranch(self.b.icmp_signed("<", nxt, self.const(end)), body, after)
        self.b = self.ir.IRBuilder(after)

    def tasks(self, t0, t1, task) -> str:
        """The function's body: task(t) for t in t0..t1-1 (none where t0 >= t1), then its return;
        the module's text."""
        inside, done = self.block("tasks"), self.block("done")
        self.b.cbranch(self.b.icmp_signed("<", t0, t1), inside, done)
        self.b = self.ir.IRBuilder(inside)
        self.loop(t0, t1, 1, task, "task")
        self.b.branch(done)
        self.ir.IRBuilder(done).ret_void()
        return str(self.fn.module)

    def loop(self, start, end, step: int, body, name: str, guard: bool = False) -> None:
        """for i in range(start, end, step): body(i); without `guard` the caller knows that
        start < end."""
        if guard:
            inside, after = self.block(name + "_guard"), self.block(name + "_skip")
            self.b.cbranch(self.b.icmp_signed("<", start, end), inside, after)
            self.b = self.ir.IRBuilder(inside)
            self.loop(start, end, step, body, name)
            self.b.branch(after)
            self.b = self.ir.IRBuilder(after)
            return
        pre = self.b.block
        head = self.block(name)
        self.b.branch(head)
        self.b = self.ir.IRBuilder(head)
        i = self.b.phi(self.i64)
        i.add_incoming(start, pre)
        body(i)
        nxt = self.b.add(i, self.const(step))
        i.add_incoming(nxt, self.b.block)
        out = self.block(name + "_end")
        self.b.cbranch(self.b.icmp_signed("<", nxt, end), head, out)
        self.b = self.ir.IRBuilder(out)


def reach(offset: int, stride: int, pad: int, size: int, extent: int) -> tuple[int, int]:
    """The indices [lo, hi) below `extent` whose source offset + stride·i - pad lies in
    [0, size) (empty: lo == hi): a phase's plane rows that hold input, or the output pixels a
    tap (offset: tap · dilation) multiplies by anything but the zero border."""
    lo = max(0, -(-(pad - offset) // stride))
    return lo, max(lo, min(extent, (size - 1 + pad - offset) // stride + 1))


def vector_types(gm) -> tuple:
    """(the element type, the vector of `gm.lanes` of them, a pointer to that vector) of a
    geometry's dtype, as llvmlite IR types."""
    from llvmlite import ir

    ft = ir.FloatType() if gm.dtype == "float32" else ir.DoubleType()
    vec = ir.VectorType(ft, gm.lanes)
    return ft, vec, vec.as_pointer()


def entry_function(gm, pointers: list):
    """The kernel's function `gm.entry` in a module of its own: void (five `pointers`, none
    aliasing another, i64 t0, i64 t1)."""
    from llvmlite import ir

    module = ir.Module(name=gm.entry)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), pointers + [ir.IntType(64)] * 2),
                     name=gm.entry)
    for arg in fn.args[:5]:
        arg.add_attribute("noalias")
    return fn


def kernel_ir(gm: Geometry) -> str:
    """LLVM IR of `void blocked_fwd(x, w, y, planes, wide, i64 t0, i64 t1)`: tasks t0..t1-1 of
    the forward pass `gm` (x: n x C x h x w, w: K x cg x r x s, y: n x K x p x q, all
    contiguous; planes and wide: the thread's scratch, planes zeroed before its first call)."""
    from llvmlite import ir

    ft, vec, vptr = vector_types(gm)
    i32 = ir.IntType(32)
    L = gm.lanes
    third = ir.DoubleType() if gm.mode == "bwf" else ft  # bwf: the float64 filter sums
    fn = entry_function(gm, [ft.as_pointer()] * 2 + [third.as_pointer()] + [ft.as_pointer()] * 2)
    x, w, y, planes, wide, t0, t1 = fn.args  # bwf: x, dy, the sums, planes, dy's wide rows
    e = _Emitter(fn)
    C = e.const
    zeros = ir.Constant(vec, [0.0] * L)
    splat_lanes = ir.Constant(ir.VectorType(i32, L), [0] * L)
    taps = gm.r * gm.s
    channels_in, channels_out = gm.g * gm.cg, gm.g * gm.kg

    add, mul, smaller = e.add, e.mul, e.smaller

    def output_blocks(k_lo, k_hi, block, name: str):
        """block(k0, kb, name) over a task's output channels k_lo..k_hi: whole blocks of kb,
        then the kg % kb left in the task that ends at kg."""
        whole = gm.kg - gm.kg % gm.kb
        if whole:
            e.loop(k_lo, smaller(k_hi, C(whole)), gm.kb,
                   lambda k0: block(k0, gm.kb, "_kb"), name + "blocks", guard=True)
        if gm.kg % gm.kb:
            tail, after = e.block(name + "tail"), e.block(name + "tail_end")
            e.b.cbranch(e.b.icmp_signed("==", k_hi, C(gm.kg)), tail, after)
            e.b = ir.IRBuilder(tail)
            block(C(whole), gm.kg % gm.kb, "_tail")
            e.b.branch(after)
            e.b = ir.IRBuilder(after)

    def task(t):
        part, t = e.b.urem(t, C(gm.chunks)), e.b.udiv(t, C(gm.chunks))
        k_lo = mul(part, gm.chunk)  # this task's output channels: k_lo up to k_hi
        k_hi = smaller(add(k_lo, C(gm.chunk)), C(gm.kg))
        if gm.mode == "bwf":  # a group, the images in turn
            e.loop(C(0), C(gm.n), 1, lambda n: image(n, t, k_lo, k_hi), "images")
        else:
            image(e.b.udiv(t, C(gm.g)), e.b.urem(t, C(gm.g)), k_lo, k_hi)

    def image(n, g, k_lo, k_hi):
        xg = e.b.gep(x, [mul(add(mul(n, channels_in), mul(g, gm.cg)), gm.h * gm.w)])
        wg = e.b.gep(w, [mul(g, gm.kg * gm.cg * taps)])
        out_h, out_w = gm.out_plane
        yg = e.b.gep(y, [mul(add(mul(n, channels_out), mul(g, gm.kg)), out_h * out_w)])

        def source_row(c, a, rr):
            return e.b.gep(xg, [add(mul(c, gm.h * gm.w),
                                    mul(add(C(a - gm.pt), mul(rr, gm.sh)), gm.w))])

        def plane_row(c, phase, rr):
            return e.b.gep(planes, [add(mul(c, gm.cstride), C(phase * gm.plane),
                                        mul(rr, gm.wq))])

        def fill_any(c):  # element by element (LLVM vectorises the unit-stride copies)
            for a in range(gm.sh):
                r_lo, r_hi = reach(a, gm.sh, gm.pt, gm.h, gm.rows)
                for b in range(gm.sw):
                    c_lo, c_hi = reach(b, gm.sw, gm.pl, gm.w, gm.wq)
                    if r_lo >= r_hi or c_lo >= c_hi:
                        continue

                    def row(rr, a=a, b=b, c_lo=c_lo, c_hi=c_hi):
                        dst, src = plane_row(c, a * gm.sw + b, rr), source_row(c, a, rr)

                        def col(cc):
                            v = e.b.load(e.b.gep(src, [add(C(b - gm.pl), mul(cc, gm.sw))]))
                            e.b.store(v, e.b.gep(dst, [cc]))
                        e.loop(C(c_lo), C(c_hi), 1, col, "col")
                    e.loop(C(r_lo), C(r_hi), 1, row, "row")

        def fill_pairs(c):  # stride 2 across: even and odd columns split by shuffles
            used = min(gm.w, 2 * gm.wq - gm.pl)  # source columns with a plane column
            vectors = used // (2 * L)
            halves = [ir.Constant(ir.VectorType(i32, L), list(range(first, 2 * L, 2)))
                      for first in (0, 1)]

            def place(u: int) -> tuple[int, int]:  # source column u's (phase, plane column)
                return (u + gm.pl) % 2, (u + gm.pl) // 2
            for a in range(gm.sh):
                r_lo, r_hi = reach(a, gm.sh, gm.pt, gm.h, gm.rows)
                if r_lo >= r_hi:
                    continue

                def row(rr, a=a):
                    dst = [plane_row(c, a * 2 + b, rr) for b in range(2)]
                    src = source_row(c, a, rr)
                    if vectors:
                        def pair(i):
                            u0 = mul(i, 2 * L)
                            v0 = e.b.load(e.b.bitcast(e.b.gep(src, [u0]), vptr), align=4)
                            v1 = e.b.load(e.b.bitcast(e.b.gep(src, [add(u0, C(L))]), vptr),
                                          align=4)
                            for first, lanes in enumerate(halves):
                                phase, col = place(first)
                                at = e.b.gep(dst[phase], [add(mul(i, L), C(col))])
                                e.b.store(e.b.shuffle_vector(v0, v1, lanes),
                                          e.b.bitcast(at, vptr), align=4)
                        e.loop(C(0), C(vectors), 1, pair, "pair")
                    for u in range(vectors * 2 * L, used):
                        phase, col = place(u)
                        e.b.store(e.b.load(e.b.gep(src, [C(u)])), e.b.gep(dst[phase], [C(col)]))
                e.loop(C(r_lo), C(r_hi), 1, row, "prow")

        def fill_scatter(c):  # many phases: each source element to its phase, one loop nest
            def row(u):
                a, rr = e.b.urem(add(u, C(gm.pt)), C(gm.sh)), e.b.udiv(add(u, C(gm.pt)), C(gm.sh))
                inside, after = e.block("srow"), e.block("srow_end")
                e.b.cbranch(e.b.icmp_unsigned("<", rr, C(gm.rows)), inside, after)
                e.b = ir.IRBuilder(inside)
                src = e.b.gep(xg, [add(mul(c, gm.h * gm.w), mul(u, gm.w))])
                base = add(mul(c, gm.cstride), mul(mul(a, gm.sw), gm.plane), mul(rr, gm.wq))

                def col(v):
                    b = e.b.urem(add(v, C(gm.pl)), C(gm.sw))
                    cc = e.b.udiv(add(v, C(gm.pl)), C(gm.sw))
                    at = e.b.gep(planes, [add(base, mul(b, gm.plane), cc)])
                    e.b.store(e.b.load(e.b.gep(src, [v])), at)
                last = min(gm.w, gm.sw * gm.wq - gm.pl)  # source columns with a plane column
                if last > 0:
                    e.loop(C(0), C(last), 1, col, "scol")
                e.b.branch(after)
                e.b = ir.IRBuilder(after)
            e.loop(C(0), C(gm.h), 1, row, "srows")

        fill = (fill_scatter if gm.sh * gm.sw > MAX_UNROLLED_PHASES
                else fill_pairs if gm.sw == 2 else fill_any)
        e.loop(C(0), C(gm.cg), 1, fill, "fill")
        if gm.mode == "bwf":
            filter_sums(n, g, k_lo, k_hi)
            return

        def pixels(j):
            def block(k0, kb: int, name: str):
                body, c, sums = e.sums(kb, gm.pb, zeros, "sums" + name)
                b = e.b
                xj = b.gep(planes, [add(mul(c, gm.cstride), j)])
                wk = b.gep(wg, [add(mul(k0, gm.cg * taps), mul(c, taps))])
                now = [list(row) for row in sums]
                for r in range(gm.r):
                    for s in range(gm.s):
                        at = gm.offset(r, s)
                        xs = [b.load(b.bitcast(b.gep(xj, [C(at + i * L)]), vptr), align=4)
                              for i in range(gm.pb)]
                        for k in range(kb):
                            weight = b.load(b.gep(wk, [C(k * gm.cg * taps + r * gm.s + s)]))
                            wv = b.shuffle_vector(
                                b.insert_element(ir.Constant(vec, ir.Undefined), weight,
                                                 ir.Constant(i32, 0)),
                                ir.Constant(vec, ir.Undefined), splat_lanes)
                            for i in range(gm.pb):
                                now[k][i] = b.fadd(b.fmul(xs[i], wv, flags=["contract"]),
                                                   now[k][i], flags=["contract"])
                e.close_sums(body, c, sums, now, gm.cg, "store" + name)
                b = e.b
                for k in range(kb):
                    row = b.gep(wide, [add(mul(add(e.b.sub(k0, k_lo), C(k)), gm.wide), j)])
                    for i in range(gm.pb):
                        b.store(now[k][i], b.bitcast(b.gep(row, [C(i * L)]), vptr), align=4)
            output_blocks(k_lo, k_hi, block, "k")
        e.loop(C(0), C(gm.wide), gm.step, pixels, "pixels")

        def out_channel(k):
            def out_row(pp):
                src = e.b.gep(wide, [add(mul(e.b.sub(k, k_lo), gm.wide), mul(pp, gm.wq))])
                dst = e.b.gep(yg, [add(mul(k, out_h * out_w),
                                       mul(add(mul(pp, gm.osh), C(gm.oa)), out_w), C(gm.ob))])

                def col(cc):
                    e.b.store(e.b.load(e.b.gep(src, [cc])), e.b.gep(dst, [mul(cc, gm.osw)]))
                e.loop(C(0), C(gm.q), 1, col, "ocol")
            e.loop(C(0), C(gm.p), 1, out_row, "orow")
        e.loop(k_lo, k_hi, 1, out_channel, "out")

    def filter_sums(n, g, k_lo, k_hi):
        """bwf: image n's dy rows of channels k_lo..k_hi into the wide rows (their extra
        columns stay zero), then per block of kb channels, input channel and group of taps,
        the sums over the pixels in registers, each reduced and added into the float64 sums."""
        dyg = e.b.gep(w, [mul(add(mul(n, channels_out), mul(g, gm.kg)), gm.p * gm.q)])

        def dy_channel(k):
            def dy_row(pp):
                src = e.b.gep(dyg, [add(mul(k, gm.p * gm.q), mul(pp, gm.q))])
                dst = e.b.gep(wide, [add(mul(e.b.sub(k, k_lo), gm.wide), mul(pp, gm.wq))])

                def col(cc):
                    e.b.store(e.b.load(e.b.gep(src, [cc])), e.b.gep(dst, [cc]))
                e.loop(C(0), C(gm.q), 1, col, "dcol")
            e.loop(C(0), C(gm.p), 1, dy_row, "drow")
        e.loop(k_lo, k_hi, 1, dy_channel, "dy")
        all_taps = [(r, s) for r in range(gm.r) for s in range(gm.s)]
        per = gm.taps or len(all_taps)
        groups = [all_taps[i:i + per] for i in range(0, len(all_taps), per)]
        sums_g = e.b.gep(y, [mul(g, gm.kg * gm.cg * taps)])

        def reduce(v):
            width = L
            while width > 1:
                half = width // 2
                lo = e.b.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, half),
                                                          list(range(half))))
                hi = e.b.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, half),
                                                          list(range(half, width))))
                v, width = e.b.fadd(lo, hi), half
            total = e.b.extract_element(v, ir.Constant(i32, 0))
            return total if gm.dtype == "float64" else e.b.fpext(total, ir.DoubleType())

        def block(k0, kb: int, name: str):
            def channel(c):
                for gi, group in enumerate(groups):
                    pre = e.b.block
                    body = e.block(f"dw{name}{gi}")
                    e.b.branch(body)
                    b = e.b = ir.IRBuilder(body)
                    j = b.phi(e.i64)
                    j.add_incoming(C(0), pre)
                    acc = [[b.phi(vec) for _ in group] for _ in range(kb)]
                    for a in (a for row in acc for a in row):
                        a.add_incoming(zeros, pre)
                    dys = [b.load(b.bitcast(b.gep(wide, [add(mul(add(e.b.sub(k0, k_lo), C(k)),
                                                                 gm.wide), j)]), vptr), align=4)
                           for k in range(kb)]
                    xj = b.gep(planes, [add(mul(c, gm.cstride), j)])
                    now = [list(row) for row in acc]
                    for ti, (r, s) in enumerate(group):
                        xv = b.load(b.bitcast(b.gep(xj, [C(gm.offset(r, s))]), vptr), align=4)
                        for k in range(kb):
                            now[k][ti] = b.fadd(b.fmul(dys[k], xv, flags=["contract"]),
                                                now[k][ti], flags=["contract"])
                    nxt = b.add(j, C(L))
                    j.add_incoming(nxt, body)
                    for k in range(kb):
                        for ti in range(len(group)):
                            acc[k][ti].add_incoming(now[k][ti], body)
                    done_ = e.block(f"dwsum{name}{gi}")
                    b.cbranch(b.icmp_signed("<", nxt, C(gm.wide)), body, done_)
                    e.b = ir.IRBuilder(done_)
                    for k in range(kb):
                        for ti, (r, s) in enumerate(group):
                            at = e.b.gep(sums_g, [add(mul(add(k0, C(k)), gm.cg * taps),
                                                      mul(c, taps), C(r * gm.s + s))])
                            e.b.store(e.b.fadd(e.b.load(at), reduce(now[k][ti])), at)
            e.loop(C(0), C(gm.cg), 1, channel, "dwc" + name)
        output_blocks(k_lo, k_hi, block, "dw")

    return e.tasks(t0, t1, task)


# --- compiled -------------------------------------------------------------------------------------

#: The most stride phases whose fill loops are generated one by one: with 64 (stride 8 both
#: ways) LLVM took 50-120 s to compile the kernel, so beyond it one loop nest sends each source
#: element to its phase (scalar, a division by a constant each).
MAX_UNROLLED_PHASES = 16
#: The kernel's function name, by mode.
ENTRY = {"fwd": "blocked_fwd", "bwf": "blocked_bwf"}
_PTR = ctypes.c_void_p
_FN = ctypes.CFUNCTYPE(None, _PTR, _PTR, _PTR, _PTR, _PTR, ctypes.c_int64, ctypes.c_int64)
#: The same function as `run`'s Numba driver calls it: every argument an int64.
_FN_INT = ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 7)


def _optimised(gm: Geometry, text: str | None = None, optimise: bool = True):
    """`gm.ir()` (or its `text`) parsed, and optimised at O3 for its CPU: (module,
    target machine)."""
    import llvmlite.binding as llvm

    machine = llvm_machine.target_machine(gm.cpu)
    module = llvm.parse_assembly(text or gm.ir())
    module.verify()
    if not optimise:
        return module, machine
    try:  # llvmlite 0.45+: the new pass manager
        builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(3))
        builder.getModulePassManager().run(module, builder)
    except AttributeError:  # older llvmlite: the legacy one
        pmb = llvm.create_pass_manager_builder()
        pmb.opt_level, pmb.loop_vectorize = 3, True
        pm = llvm.create_module_pass_manager()
        pmb.populate(pm)
        pm.run(module)
    return module, machine


def object_path(gm: Geometry, text: str) -> Path:
    """Where the machine code of IR `text` for `gm`'s CPU is cached: named by a hash of the IR,
    the CPU's name and features and llvmlite's version, so another CPU or LLVM never meets it."""
    import llvmlite
    import llvmlite.binding as llvm

    cpu = gm.cpu or llvm.get_host_cpu_name()
    features = "" if gm.cpu else llvm.get_host_cpu_features().flatten()
    key = hashlib.sha256(f"{text}\n{cpu}\n{features}\n{llvmlite.__version__}".encode())
    return host.user_cache() / "llvm" / f"{key.hexdigest()[:32]}.o"


def _store(path: Path, buffer: bytes) -> None:
    """`buffer` written to `path` whole or not at all (a temporary file renamed); a cache that
    cannot be written is no error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(buffer)
        tmp.replace(path)
    except OSError:
        pass


@functools.lru_cache(maxsize=64)
def compiled(gm: Geometry):
    """The kernel of `gm` compiled, once per process and geometry; its machine code kept on
    disk (`object_path`), so another process loads it instead of optimising and compiling
    again (0.1-0.5 s a kernel, three kernels a pass probed). The callable holds its engine."""
    import llvmlite.binding as llvm

    with _young_garbage():
        text = gm.ir()
        path = object_path(gm, text)
        try:
            cached = path.read_bytes()
        except OSError:
            cached = None
        module, machine = _optimised(gm, text, optimise=cached is None)
        engine = llvm.create_mcjit_compiler(module, machine)
        engine.set_object_cache(lambda _module, buffer: cached is None and _store(path, buffer),
                                lambda _module: cached)
        engine.finalize_object()
        address = engine.get_function_address(gm.entry)
        call = _FN(address)
        call._engine = engine  # the code lives as long as the engine
        call.as_ints = _FN_INT(address)
    return call


@contextlib.contextmanager
def _young_garbage():
    """The block's garbage freed as it ends, at the cost of a youngest-generation collection:
    llvmlite's IR objects are cycles, MBs a kernel otherwise held until a full collection. With
    the collector paused they stay in generation 0, where a collection scans them alone; left
    to run, it promotes them while the IR is built, and only a full collection, which scans
    the whole process (costly in a large one), would then free them (docs: changes)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
        gc.collect(0)


def assembly(gm: Geometry) -> str:
    """The kernel's machine code as text (compiled again: the kernel itself keeps none)."""
    module, machine = _optimised(gm)
    return machine.emit_assembly(module)


@dataclass(frozen=True)
class HotLoop:
    """The loop body with the most FMAs, read from the assembly: what the kernel promises.
    broadcasts counts the weights, broadcast alone or as an FMA's {1toN} operand; vector_loads
    the input vectors, loaded alone or as an FMA's memory operand."""

    fmas: int
    broadcasts: int
    vector_loads: int
    stack_refs: int
    register: str  # "zmm", "ymm" or "xmm"
    vector_stack_refs: int = 0  # of stack_refs, those that move a vector (a spilled sum)

    @property
    def loads_per_fma(self) -> float:
        return (self.broadcasts + self.vector_loads) / max(self.fmas, 1)


def hot_loop(asm: str) -> HotLoop:
    """`HotLoop` of x86 assembly (AT&T, as LLVM emits it)."""
    best = HotLoop(0, 0, 0, 0, "")
    for body in re.split(r"\n(?=\.LBB\d+_\d+:)", asm):
        label = re.match(r"(\.LBB\d+_\d+):", body)
        back = label and re.search(rf"\n\s+j\w+\s+{re.escape(label[1])}\n", body + "\n")
        if back:  # a loop: its body ends at the branch back to its label
            body = body[:back.end()]
        fmas = re.findall(r"\bvfn?madd\d+[ps][sd]\s+[^\n]*%([xyz]mm)", body)
        if len(fmas) > best.fmas:
            loads = re.findall(r"\bvmov[ua]p[sd]\s+-?\d*\(%r\w+(?:,%r\w+(?:,\d)?)?\), %[xyz]mm",
                               body)
            folded = re.findall(r"\bvfn?madd\d+[ps][sd]\s+-?\d*\(%r(?!sp)\w*(?:,%r\w+(?:,\d)?)?\)"
                                r"(\{1to\d+\})?", body)  # an FMA's memory operand: a vector,
            # or {1toN} a broadcast
            embedded = sum(1 for b in folded if b)
            best = HotLoop(len(fmas), len(re.findall(r"\bvbroadcasts[sd]\b", body)) + embedded,
                           len(loads) + len(folded) - embedded,
                           len(re.findall(r"\(%rsp\)", body)), fmas[0],
                           len(re.findall(r"\(%rsp\)[^\n]*%[xyz]mm|%[xyz]mm[^\n]*\(%rsp\)",
                                          body)))
    return best


@functools.cache
def _driver():
    """`templates/drive.py.tmpl`'s module (`jit.load`)."""
    return jit.load("convbench_drive", jit.source(["drive"], "any blocked kernel"))


def run(call, jobs: list[tuple]) -> None:
    """`call(*job)` for every job at once, a thread each (`threads.shares`' ranges), over
    Numba's thread pool (`drive`): its dispatch takes microseconds, where a Python thread
    pool's (`threads.run_shares`) takes tens, a large share of a small pass. The kernels exist
    only where Numba (and its llvmlite) does."""
    if len(jobs) == 1:
        call(*jobs[0])
    else:
        jit.set_threads()
        _driver().drive(call.as_ints, np.array(jobs, np.int64))


class Kernel:
    """A pass of geometry `gm` on `threads` threads: `kernel(a, w, out)` on contiguous nchw
    arrays of its dtype (a: n x C x h x w, w: K x cg x r x s, out: n x K x p x q); bwf:
    `kernel(x, dy, sums)`, sums float64 (G, K/G, C/G, R, S), added into."""

    def __init__(self, gm: Geometry, threads_: int, scratch: tuple[list, list] | None = None):
        self.gm, self.call = gm, compiled(gm)
        self.ranges = threads.shares(gm.tasks, threads_)
        self.threads = len(self.ranges)
        self.planes, self.wides = scratch or _scratch([gm], self.threads)

    def __call__(self, a: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
        last = np.float64 if self.gm.mode == "bwf" else self.gm.dtype
        for arr, dtype in ((a, self.gm.dtype), (w, self.gm.dtype), (out, last)):
            if not arr.flags.c_contiguous or arr.dtype != dtype:
                raise ValueError("blocked_llvm: operands must be contiguous arrays of "
                                 f"{self.gm.dtype} (bwd_filter's sums: float64)")
        ptrs = (a.ctypes.data, w.ctypes.data, out.ctypes.data)
        run(self.call, [(*ptrs, pl.ctypes.data, wd.ctypes.data, t0, t1)
                        for pl, wd, (t0, t1) in zip(self.planes, self.wides, self.ranges)])


def name(block: tuple[int, int]) -> str:
    """A kernel's name in a probe and a row's note: "llvm 8x3" (kb x pb)."""
    return f"llvm {block[0]}x{block[1]}"


def _scratch(gms: list[Geometry], count: int) -> tuple[list, list]:
    """Each thread's planes (zeroed: their borders stay zero) and wide rows (bwf: zeroed, dy's
    extra columns stay zero), large enough for every geometry of `gms`, which share them: the
    planes' layout does not depend on the block, and the probe runs one kernel at a time."""
    planes = max(gm.planes_elements for gm in gms)
    wide = max(gm.wide_elements for gm in gms)
    make = np.zeros if gms[0].mode == "bwf" else np.empty
    return ([np.zeros(planes, gms[0].dtype) for _ in range(count)],
            [make(wide, gms[0].dtype) for _ in range(count)])


def _kernel_geometries(p: ConvProblem, pass_: str, dtype, kept: str | None = None
                       ) -> dict[str, list[Geometry | None]]:
    """By name, the geometries of the blocked kernels a pass probes (`geometries`: one, or a
    strided bwd_data's phases), or the one `kept`'s."""
    bits, count = vector_bits(), threads.count()
    return {name(block): geometries(p, pass_, dtype, block, bits, threads_=count)
            for block in blocks(pass_, bits) if kept is None or kept == name(block)}


def _by_phase(ways: dict[str, list[Geometry | None]]) -> list[list[Geometry]]:
    """Each phase's geometries across the ways: they share scratch (the planes' layout does not
    depend on the block; a phase's does on its taps and pads, so phases do not share)."""
    phases = len(next(iter(ways.values())))
    return [[way[i] for way in ways.values() if way[i]] for i in range(phases)]


def scratch_bytes(p: ConvProblem, pass_: str, dtype, kept: str | None = None) -> int:
    """Bytes the blocked kernels of a pass hold, all threads' scratch: shared by every kernel of
    `blocks` (`kernels` makes them all for the probe), a strided bwd_data's per phase; or the
    one `kept`'s."""
    ways = _kernel_geometries(p, pass_, dtype, kept)
    if not ways:
        return 0
    count, total = threads.count(), 0
    for gms in _by_phase(ways):
        if gms:
            size = max(gm.planes_elements for gm in gms) + max(gm.wide_elements for gm in gms)
            total += size * max(min(count, gm.tasks) for gm in gms)
    return total * np.dtype(dtype).itemsize + len(ways) * filter_bytes(p, pass_, dtype)


class PhasedKernel:
    """A strided bwd_data as its phases' kernels (`geometries`), each a stride-1 forward over
    dy with its taps of the flipped filter, writing its pixels of dx; a phase no tap reaches is
    zeroed. `kernel(dy, w, dx)` as `Kernel`'s, w the filter flipped and transposed (G, C/G,
    K/G, R, S), or with `flipped` False the filter's own (G, K/G, C/G, R, S) (`grouped_jit`'s,
    whose kernel takes that). Each phase's taps are copied into a buffer of its own, made once
    (`filter_bytes`), but for kernels that read them from a view (`views`: `blocked_nhwc`'s).
    `layout`: dx's, "nhwc" for `blocked_nhwc`'s kernels."""

    def __init__(self, p: ConvProblem, kernels_: list, flipped: bool = True,
                 layout: str = "nchw"):
        self.stride, self.flipped, self.size = (p.stride_h, p.stride_w), flipped, (p.r, p.s)
        self.layout = layout
        self.parts = []
        for kernel, (rows, cols), (ph, pw) in zip(
                kernels_, _phase_pairs(p), itertools.product(range(p.stride_h),
                                                             range(p.stride_w))):
            taps = None if kernel is None or getattr(kernel, "views", False) else np.empty(
                (p.groups, p.c // p.groups, p.k // p.groups, rows.taps, cols.taps),
                kernel.gm.dtype)
            self.parts.append((kernel, rows, cols, ph, pw, taps))

    def _taps(self, w: np.ndarray, rows: PhaseAxis, cols: PhaseAxis):
        """The phase's taps of w, a view: from the flipped filter's `first` every stride."""
        sh, sw = self.stride
        if self.flipped:
            return w[..., rows.first::sh, cols.first::sw]
        r, s = self.size  # the same taps counted from the filter's end, and transposed
        return w[:, :, :, r - 1 - rows.first::-sh, s - 1 - cols.first::-sw].transpose(
            0, 2, 1, 3, 4)

    def __call__(self, a: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
        sh, sw = self.stride
        for kernel, rows, cols, ph, pw, taps in self.parts:
            if kernel is None and self.layout == "nhwc":
                out[:, ph::sh, pw::sw] = 0
            elif kernel is None:
                out[:, :, ph::sh, pw::sw] = 0
            elif taps is None:  # a kernel that reads its taps from a view
                kernel(a, self._taps(w, rows, cols), out)
            else:
                np.copyto(taps, self._taps(w, rows, cols))
                kernel(a, taps, out)


def filter_bytes(p: ConvProblem, pass_: str, dtype) -> int:
    """Bytes of a `PhasedKernel`'s phase taps (0 for any other pass): the filter's taps that
    reach some phase, about the filter."""
    if not phased(p, pass_):
        return 0
    taps = sum(a.taps * b.taps for a, b in _phase_pairs(p) if a and b)
    return p.k * (p.c // p.groups) * taps * np.dtype(dtype).itemsize


def make(p: ConvProblem, pass_: str, dtype, block: tuple[int, int], bits: int, cpu: str = "",
         threads_: int = 1, flipped: bool = True):
    """One way of a pass on its own scratch: a `Kernel`, or a strided bwd_data's
    `PhasedKernel` (`flipped`: which filter it takes)."""
    made = [gm and Kernel(gm, threads_)
            for gm in geometries(p, pass_, dtype, block, bits, cpu, threads_)]
    return made[0] if len(made) == 1 else PhasedKernel(p, made, flipped)


def kernels(p: ConvProblem, pass_: str, dtype, only: str | None = None,
            flipped: bool = True) -> dict:
    """The blocked kernels a pass probes, by name ("llvm 8x3": kb x pb), compiled and their
    scratch allocated (a `Kernel`, or a strided bwd_data's `PhasedKernel`, `flipped` saying
    which filter it takes); `only`: that one alone (a name not among them: none)."""
    ways = _kernel_geometries(p, pass_, dtype, only)
    if not ways:
        return {}
    count = threads.count()
    shared = [gms and _scratch(gms, max(min(count, gm.tasks) for gm in gms))
              for gms in _by_phase(ways)]
    out = {}
    for key, way in ways.items():
        made = [gm and Kernel(gm, count, scratch) for gm, scratch in zip(way, shared)]
        out[key] = made[0] if len(made) == 1 else PhasedKernel(p, made, flipped)
    return out
