"""`direct`'s nhwc passes register-blocked with the channels in the vector lanes: LLVM IR
generated per geometry (llvmlite), beside `blocked_llvm`'s pixel-lane kernels.

`blocked_llvm` puts pixels in the lanes: on small planes (7x7, 14x14 outputs) most lanes of a
block compute the wide rows' dropped columns, and an nhwc pass pays two transposes around it.
Here, as oneDNN's nhwc direct kernels do, a vector holds `lanes` output channels of a group
and a register block is `pb` output pixels of one row x `kv` such vectors: per input channel
and tap, `kv` weight vectors are loaded and each pixel's input is broadcast (a scalar load),
feeding pb·kv FMAs; the sums stay in registers through the group's whole reduction (its input
channels a loop, the R·S taps unrolled inside it) and each is stored once, straight into the
nhwc output. No lane is wasted while a group's output channels fill whole vectors (`lanes`
divides them), and a stride is only an address: the pixels' inputs are broadcast from where
they are.

A task is one image, a block of groups (`group_block`: at least ROW_BYTES of a pixel's
channels, so each line of x is read once) and a band of output rows (bands only where the
image would not fit BAND_BYTES of scratch, or the tasks would be fewer than two a thread). A
task copies the band's input rows, the block's channels of each pixel, into the thread's
scratch with a zero border (so no tap tests a border), then runs the blocks row by row, a
group at a time. The block of groups changes slowest on small outputs, so a thread copies
each block's taps once (on large ones the image does, `IMAGES_OUTER_PIXELS`), from the filter
as the caller holds it (a view of any strides): no copy of the whole filter before the call,
and no taps written by one core for another.

bwd_data of stride 1 is the same kernel on dy with the filter flipped and transposed; of a
larger stride, one stride-1 kernel per phase of dx, storing every stride-th pixel
(`blocked_llvm.PhasedKernel`, whose phases and taps it shares). bwd_filter (`Gradient`,
`gradient_ir`) turns the block round: pb input channels x kv vectors of output channels at a
tap, summed over the output pixels that tap reaches inside x, so neither a border nor a copy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..core.problem import ConvProblem
from ..machine import threads
from . import blocked_llvm


@dataclass(frozen=True)
class Geometry(blocked_llvm.Correlation):
    """One compiled kernel's constants: the correlation (`blocked_llvm.Correlation`) on nhwc
    images; register blocks of `pb` pixels x `kv` vectors of `lanes` output channels; a task's
    `band` output rows."""

    kv: int
    pb: int
    lanes: int
    band: int
    dtype: str = "float32"
    cpu: str = ""
    gb: int = 1  # groups a task: their channels side by side in its rows (`group_block`)
    images_outer: bool = False  # tasks ordered by image, then block of groups (IMAGES_OUTER_PIXELS)

    entry = "blocked_nhwc"
    mode = "nhwc"

    def ir(self) -> str:
        return kernel_ir(self)

    @property
    def bands(self) -> int:
        return -(-self.p // self.band)

    @property
    def tasks(self) -> int:
        """Tasks of the pass: a block of groups and an image (the block the slower, so that a
        thread copies each block's taps once, unless `images_outer`), a band of output
        rows."""
        return self.g // self.gb * self.n * self.bands

    @property
    def cb(self) -> int:
        """A task's input channels, a pixel's in its rows."""
        return self.gb * self.cg

    @property
    def wp(self) -> int:
        """The scratch's columns: the input columns the output row reaches, pads included."""
        return (self.q - 1) * self.sw + (self.s - 1) * self.dw + 1

    @property
    def rows(self) -> int:
        """The scratch's rows: those a band of output rows reaches."""
        return (self.band - 1) * self.sh + (self.r - 1) * self.dh + 1

    @property
    def scratch_elements(self) -> int:
        """The band's input rows (the groups' taps follow them in a thread's scratch)."""
        return self.rows * self.wp * self.cb

    @property
    def thread_elements(self) -> int:
        """A thread's scratch: the band's input rows and its groups' taps."""
        return self.scratch_elements + self.gb * self.r * self.s * self.cg * self.kg


#: Bytes of a task's zero-bordered input rows at most: bands of output rows keep them in L2
#: beside the filter on large images.
BAND_BYTES = 256 << 10
#: The fewest bytes of a pixel's input channels a task copies: a group of 8 channels (32 bytes)
#: alone would read each 64-byte line of x once per group, twice or more in all, from DRAM on
#: large layers.
ROW_BYTES = 128
#: The fewest output pixels of a kernel whose tasks go image by image (`images_outer`): a
#: thread then copies each block of groups' taps once per image, scalar copies of about
#: 1/(P·Q) of its multiply-adds' vectors' lanes, and reads x image by image, where groups first
#: read the same lines of x across all images (faster on 56x56 and larger outputs, slower on
#: 14x14 and with 64 channels a group: docs/pages/cpu-algorithms.md).
IMAGES_OUTER_PIXELS = 512
#: The most pixels a block takes, by vector width and vectors of output channels (kv, at most
#: 4 with 32 registers, 2 with 16): beyond these LLVM spilled sums or broadcasts to the stack
#: on a 3x3 filter (2 vectors x 12 pixels, 4 x 6; 1 x 10 and 1 x 8 on AVX2), since it keeps
#: the broadcast inputs that two taps share live beside the sums. 14 fills a 14- or 28-wide row.
PIXELS = {512: {1: 14, 2: 10, 3: 6, 4: 5}, 256: {1: 7, 2: 4}, 128: {1: 7, 2: 4}}


def lanes_for(kg: int, bits: int, dtype) -> int:
    """The widest vector (at most the host's `bits`) whose lanes divide the kg output channels
    of a group, or 0 where none of at least 4 lanes does."""
    lanes = bits // (8 * np.dtype(dtype).itemsize)
    while lanes >= 4:
        if kg % lanes == 0:
            return lanes
        lanes //= 2
    return 0


def block(kg: int, q: int, lanes: int, bits: int) -> tuple[int, int]:
    """(kv, pb): kv, the most vectors of the group's output channels that divide them (so a
    block has no channel tail) and PIXELS allows; pb, at most PIXELS[bits][kv] pixels of a row,
    evened out over the row so that its last block is not a small one."""
    vectors = kg // lanes
    most = PIXELS[bits]
    kv = max(d for d in most if vectors % d == 0)
    blocks_ = -(-q // most[kv])
    return kv, -(-q // blocks_)


def group_block(groups: int, cg: int, dtype) -> int:
    """Groups a task takes: the fewest, dividing the groups, whose input channels fill
    ROW_BYTES of a pixel (all of them where none does)."""
    want = -(-ROW_BYTES // (cg * np.dtype(dtype).itemsize))
    return min(d for d in range(1, groups + 1) if groups % d == 0 and (d >= want or d == groups))


def _kernel_shape(p: ConvProblem, pass_: str) -> tuple[int, int]:
    """(input channels, output channels) of a group in the kernel: bwd_data runs on dy."""
    cg, kg = p.c // p.groups, p.k // p.groups
    return (kg, cg) if pass_ == "bwd_data" else (cg, kg)


def applies(p: ConvProblem, pass_: str, bits: int | None = None, dtype=np.float32) -> bool:
    """Every pass `blocked_llvm` runs (bwd_data as the forward on dy, or its phases), of at
    most MAX_TAPS taps, where a group's output channels in the kernel fill vectors of 4 lanes
    or more (`lanes_for`)."""
    if not blocked_llvm.applies(p, pass_):
        return False
    bits = bits or blocked_llvm.vector_bits()
    return lanes_for(_kernel_shape(p, pass_)[1], bits, dtype) > 0


def _banded(gm: Geometry, threads_: int) -> Geometry:
    """`gm` with its output rows in bands: as many as the scratch fits BAND_BYTES, and fewer
    where images x groups give under two tasks a thread."""
    itemsize = np.dtype(gm.dtype).itemsize
    band = gm.p
    while band > 1 and (dataclasses.replace(gm, band=band).scratch_elements * itemsize
                        > BAND_BYTES):
        band = -(-band // 2)
    while band > 1 and gm.n * gm.g // gm.gb * -(-gm.p // band) < 2 * threads_:
        band = -(-band // 2)
    return dataclasses.replace(gm, band=band)


def geometries(p: ConvProblem, pass_: str, dtype, bits: int, cpu: str = "",
               threads_: int = 1) -> list[Geometry | Gradient | None]:
    """The kernels of a pass (`applies`): one, or a strided bwd_data's per phase (None where
    no tap reaches the phase), rows first as `blocked_llvm.geometries`; bwd_filter's
    `Gradient`."""
    if pass_ == "bwd_filter":
        return [gradient_geometry(p, dtype, bits, cpu)]
    cin, kout = _kernel_shape(p, pass_)
    lanes = lanes_for(kout, bits, dtype)
    name = np.dtype(dtype).name
    g = p.groups

    def made(*fields, **more) -> Geometry:
        q = fields[15]
        kv, pb = block(kout, q, lanes, bits)
        gm = Geometry(*fields, kv, pb, lanes, 1, name, cpu, **more,
                      gb=group_block(g, cin, dtype),
                      images_outer=fields[14] * q >= IMAGES_OUTER_PIXELS)
        return _banded(gm, threads_)
    if pass_ == "fwd":
        return [made(p.n, g, cin, kout, p.h, p.w, p.r, p.s, p.stride_h, p.stride_w, p.dil_h,
                     p.dil_w, p.pad_top, p.pad_left, p.p, p.q)]
    if not blocked_llvm.phased(p, pass_):
        return [made(p.n, g, cin, kout, p.p, p.q, p.r, p.s, 1, 1, p.dil_h, p.dil_w,
                     (p.r - 1) * p.dil_h - p.pad_top, (p.s - 1) * p.dil_w - p.pad_left,
                     p.h, p.w)]
    out: list[Geometry | None] = []
    for a, b in blocked_llvm._phase_pairs(p):
        if a is None or b is None:
            out.append(None)
            continue
        out.append(made(p.n, g, cin, kout, p.p, p.q, a.taps, b.taps, 1, 1, 1, 1, a.pad, b.pad,
                        a.count, b.count, oh=p.h, ow=p.w, osh=p.stride_h, osw=p.stride_w,
                        oa=a.phase, ob=b.phase))
    return out


# --- the IR ---------------------------------------------------------------------------------------

def row_taps(gm: Geometry) -> list[tuple[int, int, tuple[int, ...]]]:
    """The output rows as runs [first, last) whose taps' rows r reach the same rows of the
    input (not its zero border): a run's code multiplies by those alone, so border rows skip
    the products of zeros (a 3x3 filter padded 1 on 7x7: 2 of 7 rows lose a third)."""
    runs: list[tuple[int, int, tuple[int, ...]]] = []
    for oi in range(gm.p):
        taps = tuple(r for r in range(gm.r) if 0 <= oi * gm.sh - gm.pt + r * gm.dh < gm.h)
        if runs and runs[-1][2] == taps:
            runs[-1] = (runs[-1][0], oi + 1, taps)
        else:
            runs.append((oi, oi + 1, taps))
    return runs


def column_blocks(gm: Geometry) -> list[tuple[int, int, int, frozenset | None]]:
    """A row's blocks of pixels: (start, end, pixels, inside). Runs of whole blocks whose
    every tap reads inside the input: one loop, `inside` None; the others one by one, each
    with the (pixel, tap column) pairs that read inside the input."""
    out: list[tuple[int, int, int, frozenset | None]] = []
    for start in range(0, gm.q, gm.pb):
        count = min(gm.pb, gm.q - start)
        inside = frozenset((i, s) for i in range(count) for s in range(gm.s)
                           if 0 <= (start + i) * gm.sw - gm.pl + s * gm.dw < gm.w)
        if count == gm.pb and len(inside) == count * gm.s:
            if out and out[-1][3] is None and out[-1][1] == start:
                out[-1] = (out[-1][0], start + count, count, None)
            else:
                out.append((start, start + count, count, None))
        else:
            out.append((start, start + count, count, inside))
    return out


def kernel_ir(gm: Geometry) -> str:
    """LLVM IR of `void blocked_nhwc(x, w, y, scratch, strides, i64 t0, i64 t1)`: tasks t0..t1-1
    of `gm` (x: n x h x w x G·cg, y: n x oh x ow x G·kg, contiguous; w: the filter as
    (G, kg, cg, r, s) by its `strides`, five int64s in elements; scratch: the thread's,
    `gm.scratch_elements` of input rows, then its block of groups' taps, each group's as
    `group_taps` lays them out)."""
    from llvmlite import ir

    ft, vec, vptr = blocked_llvm.vector_types(gm)
    i32 = ir.IntType(32)
    L = gm.lanes
    fn = blocked_llvm.entry_function(gm, [ft.as_pointer()] * 4 + [ir.IntType(64).as_pointer()])
    x, w, y, pad, strides, t0, t1 = fn.args
    e = blocked_llvm._Emitter(fn)
    C = e.const
    zeros = ir.Constant(vec, [0.0] * L)
    zero = ir.Constant(ft, 0.0)
    splat = ir.Constant(ir.VectorType(i32, L), [0] * L)
    cin, cout = gm.g * gm.cg, gm.g * gm.kg
    oh, ow = gm.out_plane
    wp, cg, cb = gm.wp, gm.cg, gm.cb
    c_lo, c_hi = min(gm.pl, wp), max(min(wp, gm.pl + gm.w), min(gm.pl, wp))

    add, mul, smaller = e.add, e.mul, e.smaller

    def branch_if(cond, then, otherwise, name: str):
        yes, no, after = e.block(name), e.block(name + "_else"), e.block(name + "_end")
        e.b.cbranch(cond, yes, no)
        for where, body in ((yes, then), (no, otherwise)):
            e.b = ir.IRBuilder(where)
            body()
            e.b.branch(after)
        e.b = ir.IRBuilder(after)

    def task(t):
        band, t = e.b.urem(t, C(gm.bands)), e.b.udiv(t, C(gm.bands))
        blocks_ = gm.g // gm.gb
        if gm.images_outer:
            n, g0 = e.b.udiv(t, C(blocks_)), mul(e.b.urem(t, C(blocks_)), gm.gb)
        else:
            n, g0 = e.b.urem(t, C(gm.n)), mul(e.b.udiv(t, C(gm.n)), gm.gb)
        o_lo = mul(band, gm.band)
        o_hi = smaller(add(o_lo, C(gm.band)), C(gm.p))
        first = e.b.sub(mul(o_lo, gm.sh), C(gm.pt))  # the input row of the scratch's row 0
        xg = e.b.gep(x, [add(mul(n, gm.h * gm.w * cin), mul(g0, cg))])
        branch_if(e.b.icmp_signed("!=", g0, e.b.load(held)), lambda: weights(g0),
                  lambda: None, "newgroup")

        def fill_row(rr):
            src = add(first, rr)
            dst = e.b.gep(pad, [mul(rr, wp * cb)])

            def zero_span(lo: int, hi: int, name: str):
                if hi > lo:
                    e.loop(C(lo * cb), C(hi * cb), 1,
                           lambda i: e.b.store(zero, e.b.gep(dst, [i])), name)

            def copy():
                zero_span(0, c_lo, "zl")
                if c_hi > c_lo:
                    row = e.b.gep(xg, [mul(src, gm.w * cin)])

                    def column(cc):
                        s_at = e.b.gep(row, [mul(e.b.sub(cc, C(gm.pl)), cin)])
                        d_at = e.b.gep(dst, [mul(cc, cb)])
                        e.loop(C(0), C(cb), 1, lambda i: e.b.store(
                            e.b.load(e.b.gep(s_at, [i])), e.b.gep(d_at, [i])), "cc")
                    e.loop(C(c_lo), C(c_hi), 1, column, "col")
                zero_span(c_hi, wp, "zr")

            inside = e.b.icmp_unsigned("<", src, C(gm.h))  # 0 <= src < h
            branch_if(inside, copy, lambda: zero_span(0, wp, "zrow"), "fill")
        e.loop(C(0), C(gm.rows), 1, fill_row, "rows")

        def group(j):
            wg = e.b.gep(taps, [mul(j, gm.r * gm.s * cg * gm.kg)])
            yg = e.b.gep(y, [add(mul(n, oh * ow * cout), mul(add(g0, j), gm.kg))])
            xj = e.b.gep(pad, [mul(j, cg)])

            def rows(k0):
                def out_row(oi, taps_r):
                    local = mul(e.b.sub(oi, o_lo), gm.sh)
                    xrow = e.b.gep(xj, [mul(local, wp * cb)])
                    yrow = e.b.gep(yg, [mul(add(mul(oi, gm.osh), C(gm.oa)), ow * cout)])
                    for start, end, count, inside in column_blocks(gm):
                        if inside is None:  # whole blocks, every tap inside: a loop
                            e.loop(C(start), C(end), gm.pb, lambda at: pixels(
                                xrow, yrow, at, gm.pb, wg, k0, taps_r, None), "pix")
                        else:
                            pixels(xrow, yrow, C(start), count, wg, k0, taps_r, inside)
                for first, last, taps_r in row_taps(gm):  # rows [first, last) of the band
                    e.loop(e.b.select(e.b.icmp_signed("<", o_lo, C(first)), C(first), o_lo),
                           smaller(o_hi, C(last)), 1,
                           lambda oi, taps_r=taps_r: out_row(oi, taps_r), "orow", guard=True)
            e.loop(C(0), C(gm.kg // L), gm.kv, rows, "kbo")  # a block's weights stay in L2
        e.loop(C(0), C(gm.gb), 1, group, "group")

    def pixels(xrow, yrow, j, count: int, wg, k0, taps_r, inside):
        """A block of `count` pixels from j, output channels from vector k0: the taps of
        rows `taps_r`, and of those, where `inside` is given, pixel i's tap (r, s) only if
        (i, s) is in it (the rest read the zero border)."""
        xb = e.b.gep(xrow, [mul(j, gm.sw * cb)])
        yb = e.b.gep(yrow, [add(mul(j, gm.osw * cout), C(gm.ob * cout))])

        def kblock(k0):
            body, c, sums = e.sums(count, gm.kv, zeros, "sums")
            b = e.b
            xc = b.gep(xb, [c])
            wc = b.gep(wg, [mul(add(mul(e.b.udiv(k0, C(gm.kv)), cg), c),
                                gm.r * gm.s * gm.kv * L)])
            now = [list(row) for row in sums]
            for r in taps_r:
                for s in range(gm.s):
                    reach = [i for i in range(count) if inside is None or (i, s) in inside]
                    if not reach:
                        continue
                    tap = (r * gm.s + s) * gm.kv * L
                    wv = [b.load(b.bitcast(b.gep(wc, [C(tap + k * L)]), vptr), align=4)
                          for k in range(gm.kv)]
                    for i in reach:
                        at = (r * gm.dh * wp + s * gm.dw + i * gm.sw) * cb
                        v = b.load(b.gep(xc, [C(at)]))
                        bv = b.shuffle_vector(
                            b.insert_element(ir.Constant(vec, ir.Undefined), v,
                                             ir.Constant(i32, 0)),
                            ir.Constant(vec, ir.Undefined), splat)
                        for k in range(gm.kv):
                            now[i][k] = b.fadd(b.fmul(bv, wv[k], flags=["contract"]),
                                               now[i][k], flags=["contract"])
            e.close_sums(body, c, sums, now, cg, "store")
            b = e.b
            for i in range(count):
                for k in range(gm.kv):
                    at = b.gep(yb, [add(C(i * gm.osw * cout + k * L), mul(k0, L))])
                    b.store(now[i][k], b.bitcast(at, vptr), align=4)
        kblock(k0)

    def weights(g0):
        """Groups g0.. g0 + gb - 1's taps into the thread's (gb, R, S, cg, kg) copy, from w's
        strides."""
        e.b.store(g0, held)
        e.loop(C(0), C(gm.gb), 1, lambda j: group_taps(add(g0, j), mul(j, gm.r * gm.s * cg
                                                                          * gm.kg)), "wg")

    def group_taps(g, at):
        """Group g's taps at `at` of the thread's copy, as (kg / (kv·L), cg, R·S, kv·L): a
        block's weights for one input channel, all taps, are contiguous, read in order."""
        base = e.b.mul(g, stride[0])
        width = gm.kv * L

        def out_block(kb):
            def channel(c):
                at_c = add(base, e.b.mul(mul(kb, width), stride[1]),
                           e.b.mul(c, stride[2]))
                dst_c = add(at, mul(add(mul(kb, cg), c), gm.r * gm.s * width))

                def tap(rs):
                    r, s_ = e.b.udiv(rs, C(gm.s)), e.b.urem(rs, C(gm.s))
                    at_tap = add(at_c, e.b.mul(r, stride[3]), e.b.mul(s_, stride[4]))
                    dst_tap = add(dst_c, mul(rs, width))

                    def out_channel(k):
                        v = e.b.load(e.b.gep(w, [add(at_tap, e.b.mul(k, stride[1]))]))
                        e.b.store(v, e.b.gep(taps, [add(dst_tap, k)]))
                    e.loop(C(0), C(width), 1, out_channel, "wk")
                e.loop(C(0), C(gm.r * gm.s), 1, tap, "wt")
            e.loop(C(0), C(cg), 1, channel, "wc")
        e.loop(C(0), C(gm.kg // width), 1, out_block, "wb")

    held = e.b.alloca(e.i64)  # the group whose taps the thread holds
    e.b.store(C(-1), held)
    stride = [e.b.load(e.b.gep(strides, [C(i)])) for i in range(5)]
    taps = e.b.gep(pad, [C(gm.scratch_elements)])
    return e.tasks(t0, t1, task)


# --- bwd_filter ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Gradient(blocked_llvm.Correlation):
    """One compiled bwd_filter kernel's constants: the forward correlation (`Correlation`) whose
    filter gradient it sums, from nhwc x and dy; register blocks of `pb` input channels x `kv`
    vectors of `lanes` output channels, at one tap."""

    kv: int
    pb: int
    lanes: int
    dtype: str = "float32"
    cpu: str = ""

    entry = "blocked_nhwc_bwf"
    mode = "nhwc_bwf"

    def ir(self) -> str:
        return gradient_ir(self)

    @property
    def tasks(self) -> int:
        """A task per group, block of kv vectors of its output channels and row of taps: each
        writes its own taps of dw, so no two threads add into the same sums."""
        return self.g * (self.kg // (self.kv * self.lanes)) * self.r

    @property
    def thread_elements(self) -> int:
        """A thread's scratch: a task's float64 sums (a row of taps x cg x kv·L)."""
        return self.s * self.cg * self.kv * self.lanes


#: bwd_filter's register blocks: the most input channels (broadcast inputs) a block takes by
#: vector width and vectors of output channels (dy's, loaded), kv·pb sums with kv + 1 more
#: registers in the file (32 vectors with AVX-512, 16 below): no input is shared between two
#: sums' rows here, so none is kept live beside them.
CHANNELS = {512: {1: 16, 2: 12, 4: 6}, 256: {1: 12, 2: 6}, 128: {1: 12, 2: 6}}


def gradient_block(cg: int, kg: int, lanes: int, bits: int) -> tuple[int, int]:
    """(kv, pb) of bwd_filter: the most sums kv·pb, kv vectors dividing the group's output
    channels and pb input channels dividing its cg (so no block has a tail), CHANNELS allowing;
    of equal sums the most vectors, which load the fewest values a multiply-add."""
    best = (0, 0, 0)
    for kv, most in CHANNELS[bits].items():
        if (kg // lanes) % kv:
            continue
        pb = max(d for d in range(1, min(most, cg) + 1) if cg % d == 0)
        best = max(best, (kv * pb, kv, pb))
    return best[1], best[2]


def gradient_geometry(p: ConvProblem, dtype, bits: int, cpu: str = "") -> Gradient:
    """bwd_filter's kernel of `p` (`applies`)."""
    cg, kg = p.c // p.groups, p.k // p.groups
    lanes = lanes_for(kg, bits, dtype)
    kv, pb = gradient_block(cg, kg, lanes, bits)
    return Gradient(p.n, p.groups, cg, kg, p.h, p.w, p.r, p.s, p.stride_h, p.stride_w,
                    p.dil_h, p.dil_w, p.pad_top, p.pad_left, p.p, p.q, kv, pb, lanes,
                    np.dtype(dtype).name, cpu)


def gradient_ir(gm: Gradient) -> str:
    """LLVM IR of `void blocked_nhwc_bwf(x, dy, dw, sums, strides, i64 t0, i64 t1)`: tasks
    t0..t1-1 of `gm` (x: n x h x w x G·cg, dy: n x p x q x G·kg, contiguous; dw: the filter
    gradient as (G, kg, cg, r, s) by its `strides`, five int64s in elements, written; sums:
    the thread's `gm.thread_elements` float64s).

    A task (a group g, kv vectors of its output channels from kb, a row of taps r) sums, per
    image, each tap (r, s) and block of pb input channels, over the output pixels that tap
    reaches inside x (`blocked_llvm.reach`: the border's zeros are never multiplied): per
    pixel kv vectors of dy are loaded and pb inputs broadcast, kv·pb FMAs into register sums,
    which are added into the task's float64 sums after each image (as the other kernels sum
    an image in the working precision, the images in float64); the sums go to dw once, at the
    task's end."""
    from llvmlite import ir

    ft, vec, vptr = blocked_llvm.vector_types(gm)
    f64 = ir.DoubleType()
    L, kv, pb = gm.lanes, gm.kv, gm.pb
    dvec = ir.VectorType(f64, L)
    fn = blocked_llvm.entry_function(gm, [ft.as_pointer()] * 3 + [f64.as_pointer(),
                                                                  ir.IntType(64).as_pointer()])
    x, dy, dw, sums, strides, t0, t1 = fn.args
    e = blocked_llvm._Emitter(fn)
    C = e.const
    i32 = ir.IntType(32)
    add, mul = e.add, e.mul
    zeros = ir.Constant(vec, [0.0] * L)
    splat = ir.Constant(ir.VectorType(i32, L), [0] * L)
    cin, cout = gm.g * gm.cg, gm.g * gm.kg
    width = kv * L
    blocks_k = gm.kg // width
    acc = e.b.alloca(vec, size=kv * pb)  # the register sums (promoted by LLVM's SROA)
    stride = [e.b.load(e.b.gep(strides, [C(i)])) for i in range(5)]
    rows = [blocked_llvm.reach(r * gm.dh, gm.sh, gm.pt, gm.h, gm.p) for r in range(gm.r)]

    def chosen(r, values):
        """values[r] of a runtime r, as selects."""
        out = C(values[-1])
        for i in range(len(values) - 2, -1, -1):
            out = e.b.select(e.b.icmp_unsigned("==", r, C(i)), C(values[i]), out)
        return out

    def slot(i: int, k: int):
        return e.b.gep(acc, [ir.Constant(i32, i * kv + k)])

    def task(t):
        r = e.b.urem(t, C(gm.r))
        t = e.b.udiv(t, C(gm.r))
        kb, g = e.b.urem(t, C(blocks_k)), e.b.udiv(t, C(blocks_k))
        p_lo, p_hi = chosen(r, [lo for lo, _ in rows]), chosen(r, [hi for _, hi in rows])
        total = gm.s * gm.cg * width
        e.loop(C(0), C(total), 1, lambda i: e.b.store(ir.Constant(f64, 0.0),
                                                       e.b.gep(sums, [i])), "zero")
        row_at = e.b.sub(mul(r, gm.dh), C(gm.pt))  # x's row of output row 0 under tap r
        k_at = add(mul(g, gm.kg), mul(kb, width))  # dy's first channel of the task

        def image(n):
            for s in range(gm.s):
                q_lo, q_hi = blocked_llvm.reach(s * gm.dw, gm.sw, gm.pl, gm.w, gm.q)
                if q_lo >= q_hi:
                    continue
                e.loop(C(0), C(gm.cg), pb, lambda c0, s=s, q_lo=q_lo, q_hi=q_hi:
                       channels(n, s, q_lo, q_hi, c0), f"cb{s}")

        def channels(n, s: int, q_lo: int, q_hi: int, c0):
            for i in range(pb):
                for k in range(kv):
                    e.b.store(zeros, slot(i, k))
            x0 = add(mul(g, gm.cg), c0, C((s * gm.dw - gm.pl) * cin))

            def out_row(p):
                xrow = e.b.gep(x, [add(x0, mul(add(mul(n, gm.h), mul(p, gm.sh), row_at),
                                                gm.w * cin))])
                yrow = e.b.gep(dy, [add(k_at, mul(add(mul(n, gm.p), p), gm.q * cout))])

                def pixel(q):
                    b = e.b
                    yq = b.gep(yrow, [mul(q, cout)])
                    dv = [b.load(b.bitcast(b.gep(yq, [C(k * L)]), vptr), align=4)
                          for k in range(kv)]
                    xq = b.gep(xrow, [mul(q, gm.sw * cin)])
                    for i in range(pb):
                        v = b.load(b.gep(xq, [C(i)]))
                        bv = b.shuffle_vector(b.insert_element(ir.Constant(vec, ir.Undefined),
                                                               v, ir.Constant(i32, 0)),
                                              ir.Constant(vec, ir.Undefined), splat)
                        for k in range(kv):
                            at = slot(i, k)
                            b.store(b.fadd(b.fmul(bv, dv[k], flags=["contract"]), b.load(at),
                                           flags=["contract"]), at)
                e.loop(C(q_lo), C(q_hi), 1, pixel, "q")
            e.loop(p_lo, p_hi, 1, out_row, "p", guard=True)
            b = e.b
            base = add(mul(c0, width), C(s * gm.cg * width))
            for i in range(pb):
                for k in range(kv):
                    at = b.bitcast(b.gep(sums, [add(base, C(i * width + k * L))]),
                                   dvec.as_pointer())
                    part = b.load(slot(i, k))
                    if gm.dtype != "float64":
                        part = b.fpext(part, dvec)
                    b.store(b.fadd(b.load(at, align=8), part), at, align=8)
        e.loop(C(0), C(gm.n), 1, image, "image")

        def out_tap(sc):  # sums (s, c, k) -> dw[g, kb·width + k, c, r, s]
            s_, c = e.b.udiv(sc, C(gm.cg)), e.b.urem(sc, C(gm.cg))
            at = add(e.b.mul(g, stride[0]), e.b.mul(mul(kb, width), stride[1]),
                     e.b.mul(c, stride[2]), e.b.mul(r, stride[3]), e.b.mul(s_, stride[4]))

            def out_channel(k):
                v = e.b.load(e.b.gep(sums, [add(mul(sc, width), k)]))
                if gm.dtype != "float64":
                    v = e.b.fptrunc(v, ft)
                e.b.store(v, e.b.gep(dw, [add(at, e.b.mul(k, stride[1]))]))
            e.loop(C(0), C(width), 1, out_channel, "ok")
        e.loop(C(0), C(gm.s * gm.cg), 1, out_tap, "out")

    return e.tasks(t0, t1, task)


# --- the kernels -----------------------------------------------------------------------------------

class Kernel:
    """A pass of geometry `gm` on `threads_` threads: `kernel(a, w, out)`, a and out contiguous
    nhwc arrays of its dtype, w the filter as a (G, kg, cg, R, S) array of its dtype, a view
    of any strides (each thread copies its groups' taps from it)."""

    views = True  # `blocked_llvm.PhasedKernel` passes its phases' taps as views
    view_at = 1  # the operand that is the (G, kg, cg, R, S) view of any strides
    sums = None  # the dtype of the threads' scratch where not the kernel's

    def __init__(self, gm: Geometry | Gradient, threads_: int):
        self.gm, self.call = gm, blocked_llvm.compiled(gm)
        self.ranges = threads.shares(gm.tasks, threads_)
        self.scratch = [np.empty(gm.thread_elements, self.sums or gm.dtype)
                        for _ in self.ranges]
        self.strides = np.zeros(5, np.int64)

    def __call__(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
        gm, arrays = self.gm, (a, b, c)
        view = arrays[self.view_at]
        for arr in arrays:
            if arr.dtype != gm.dtype or (arr is not view and not arr.flags.c_contiguous):
                raise ValueError("blocked_nhwc: operands must be contiguous nhwc arrays of "
                                 f"{gm.dtype}, the filter's view of {gm.dtype}")
        if view.shape != (gm.g, gm.kg, gm.cg, gm.r, gm.s):
            raise ValueError(f"blocked_nhwc: filter of shape {view.shape}, not "
                             f"{(gm.g, gm.kg, gm.cg, gm.r, gm.s)}")
        self.strides[:] = [st // view.itemsize for st in view.strides]
        ptrs = tuple(arr.ctypes.data for arr in arrays)
        blocked_llvm.run(self.call, [(*ptrs, s.ctypes.data, self.strides.ctypes.data, t0, t1)
                                     for s, (t0, t1) in zip(self.scratch, self.ranges)])


class GradientKernel(Kernel):
    """bwd_filter of a `Gradient`: `kernel(x, dy, dw)`, x and dy contiguous nhwc arrays of its
    dtype, dw the filter gradient as a (G, kg, cg, R, S) view of any strides, written whole;
    the threads' scratch float64 sums."""

    views = False
    view_at = 2
    sums = np.float64


NAME = "llvm nhwc"


def make(p: ConvProblem, pass_: str, dtype, flipped: bool = True, cpu: str = "",
         threads_: int | None = None):
    """The pass as this module's kernel (`applies`): a `Kernel`, or a strided bwd_data's
    `blocked_llvm.PhasedKernel` of them (nhwc; `flipped` saying which filter it takes), or
    bwd_filter's `GradientKernel`."""
    count = threads_ or threads.count()
    made = [gm and (GradientKernel if isinstance(gm, Gradient) else Kernel)(gm, count)
            for gm in geometries(p, pass_, dtype, blocked_llvm.vector_bits(), cpu, count)]
    return made[0] if len(made) == 1 else blocked_llvm.PhasedKernel(p, made, flipped, "nhwc")


def scratch_bytes(p: ConvProblem, pass_: str, dtype) -> int:
    """Bytes `make`'s kernels hold: each thread's scratch (input rows and a group's taps, per
    phase; bwd_filter's float64 sums)."""
    count = threads.count()
    size = 8 if pass_ == "bwd_filter" else np.dtype(dtype).itemsize
    total = sum(min(count, gm.tasks) * gm.thread_elements
                for gm in geometries(p, pass_, dtype, blocked_llvm.vector_bits(), "", count)
                if gm)
    return total * size
