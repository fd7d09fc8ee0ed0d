"""`direct`'s forward (and bwd_data of stride 1), register-blocked: LLVM IR generated per
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
`grouped_jit`. bwd_filter is not done here.

Who runs it: `grouped_jit` (groups of up to 32 channels) and `direct`'s dense path (the rest,
above `grouped_jit.BLOCKED_MIN_FLOPS`) probe these kernels beside their own on a pass's first
call (`products.probe`: interleaved rounds, the incumbent kept unless another is clearly
faster), since neither wins everywhere (docs/pages/cpu-algorithms.md).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import gc
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..core.problem import ConvProblem
from ..machine import threads


@dataclass(frozen=True)
class Geometry:
    """One compiled kernel's constants: a forward pass of `n` images, `g` groups of `cg` input
    and `kg` output channels, h x w in, p x q out; pads at the top and left (the bottom and
    right are the planes' zero borders); `kb` x `pb` register blocks of `lanes`-wide vectors."""

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
    kb: int
    pb: int
    lanes: int
    dtype: str = "float32"
    cpu: str = ""  # the CPU name it compiles for ("" the host's)
    part: int = 0  # output channels a task (0: all kg): split so that threads have work

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


def applies(p: ConvProblem, pass_: str) -> bool:
    """fwd, and bwd_data of stride 1 (the forward kernel on dy, its pads the filter's reach less
    the pass's, which must not be negative), on grouped layers (`grouped_jit.applies`)."""
    if pass_ == "fwd":
        return True
    if pass_ == "bwd_data" and p.stride_h == p.stride_w == 1:
        return ((p.r - 1) * p.dil_h >= p.pad_top and (p.s - 1) * p.dil_w >= p.pad_left)
    return False


def geometry(p: ConvProblem, pass_: str, dtype, block: tuple[int, int], bits: int,
             cpu: str = "", threads_: int = 1) -> Geometry:
    """The kernel's constants for pass `pass_` of `p` (`applies`) with register block `block`,
    for `threads_` threads: where the images x groups are fewer than two tasks a thread, each
    one's output channels are split into parts (each part fills the planes again: cheap beside
    its products)."""
    lanes = bits // (8 * np.dtype(dtype).itemsize)
    g = p.groups
    kb, pb = block
    if pass_ == "fwd":
        gm = Geometry(p.n, g, p.c // g, p.k // g, p.h, p.w, p.r, p.s, p.stride_h, p.stride_w,
                      p.dil_h, p.dil_w, p.pad_top, p.pad_left, p.p, p.q, kb, pb, lanes,
                      np.dtype(dtype).name, cpu)
    else:
        gm = Geometry(p.n, g, p.k // g, p.c // g, p.p, p.q, p.r, p.s, 1, 1, p.dil_h, p.dil_w,
                      (p.r - 1) * p.dil_h - p.pad_top, (p.s - 1) * p.dil_w - p.pad_left,
                      p.h, p.w, kb, pb, lanes, np.dtype(dtype).name, cpu)
    wanted = max(1, min(-(-2 * threads_ // (p.n * g)), -(-gm.kg // kb)))
    if wanted == 1:
        return gm
    part = -(-gm.kg // wanted)
    return dataclasses.replace(gm, part=-(-part // kb) * kb)  # whole blocks of kb


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


def kernel_ir(gm: Geometry) -> str:
    """LLVM IR of `void blocked_fwd(x, w, y, planes, wide, i64 t0, i64 t1)`: tasks t0..t1-1 of
    the forward pass `gm` (x: n x C x h x w, w: K x cg x r x s, y: n x K x p x q, all
    contiguous; planes and wide: the thread's scratch, planes zeroed before its first call)."""
    from llvmlite import ir

    ft = ir.FloatType() if gm.dtype == "float32" else ir.DoubleType()
    i32 = ir.IntType(32)
    L = gm.lanes
    vec = ir.VectorType(ft, L)
    vptr = vec.as_pointer()
    module = ir.Module(name="blocked")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ft.as_pointer()] * 5
                                             + [ir.IntType(64)] * 2), name="blocked_fwd")
    for arg in fn.args[:5]:
        arg.add_attribute("noalias")
    x, w, y, planes, wide, t0, t1 = fn.args
    e = _Emitter(fn)
    C = e.const
    zeros = ir.Constant(vec, [0.0] * L)
    splat_lanes = ir.Constant(ir.VectorType(i32, L), [0] * L)
    taps = gm.r * gm.s
    channels_in, channels_out = gm.g * gm.cg, gm.g * gm.kg

    def add(*terms):
        total = terms[0]
        for t in terms[1:]:
            total = e.b.add(total, t)
        return total

    def mul(v, k: int):
        return e.b.mul(v, C(k))

    def rows_of(a: int, stride: int, pad: int, extent: int, size: int) -> tuple[int, int]:
        """The plane indices i of phase a whose source a + stride*i - pad lies in [0, size)."""
        return max(0, -(-(pad - a) // stride)), min(extent, (size - 1 + pad - a) // stride + 1)

    def task(t):
        part, t = e.b.urem(t, C(gm.chunks)), e.b.udiv(t, C(gm.chunks))
        g, n = e.b.urem(t, C(gm.g)), e.b.udiv(t, C(gm.g))
        k_lo = mul(part, gm.chunk)  # this task's output channels: k_lo up to k_hi

        def smaller(a, b):
            return e.b.select(e.b.icmp_signed("<", a, b), a, b)
        k_hi = smaller(add(k_lo, C(gm.chunk)), C(gm.kg))
        xg = e.b.gep(x, [mul(add(mul(n, channels_in), mul(g, gm.cg)), gm.h * gm.w)])
        wg = e.b.gep(w, [mul(g, gm.kg * gm.cg * taps)])
        yg = e.b.gep(y, [mul(add(mul(n, channels_out), mul(g, gm.kg)), gm.p * gm.q)])

        def source_row(c, a, rr):
            return e.b.gep(xg, [add(mul(c, gm.h * gm.w),
                                    mul(add(C(a - gm.pt), mul(rr, gm.sh)), gm.w))])

        def plane_row(c, phase, rr):
            return e.b.gep(planes, [add(mul(c, gm.cstride), C(phase * gm.plane),
                                        mul(rr, gm.wq))])

        def fill_any(c):  # element by element (LLVM vectorises the unit-stride copies)
            for a in range(gm.sh):
                r_lo, r_hi = rows_of(a, gm.sh, gm.pt, gm.rows, gm.h)
                for b in range(gm.sw):
                    c_lo, c_hi = rows_of(b, gm.sw, gm.pl, gm.wq, gm.w)
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
                r_lo, r_hi = rows_of(a, gm.sh, gm.pt, gm.rows, gm.h)
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

        e.loop(C(0), C(gm.cg), 1, fill_pairs if gm.sw == 2 else fill_any, "fill")

        def pixels(j):
            def block(k0, kb: int, name: str):
                pre = e.b.block
                body = e.block("sums" + name)
                e.b.branch(body)
                b = e.b = ir.IRBuilder(body)
                c = b.phi(e.i64)
                c.add_incoming(C(0), pre)
                sums = [[b.phi(vec) for _ in range(gm.pb)] for _ in range(kb)]
                for acc in (a for row in sums for a in row):
                    acc.add_incoming(zeros, pre)
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
                nxt = b.add(c, C(1))
                c.add_incoming(nxt, body)
                for k in range(kb):
                    for i in range(gm.pb):
                        sums[k][i].add_incoming(now[k][i], body)
                store = e.block("store" + name)
                b.cbranch(b.icmp_signed("<", nxt, C(gm.cg)), body, store)
                b = e.b = ir.IRBuilder(store)
                for k in range(kb):
                    row = b.gep(wide, [add(mul(add(e.b.sub(k0, k_lo), C(k)), gm.wide), j)])
                    for i in range(gm.pb):
                        b.store(now[k][i], b.bitcast(b.gep(row, [C(i * L)]), vptr), align=4)
            whole = gm.kg - gm.kg % gm.kb  # the blocks of kb; the tail in the last task
            if whole:
                e.loop(k_lo, smaller(k_hi, C(whole)), gm.kb,
                       lambda k0: block(k0, gm.kb, "_kb"), "kblocks", guard=True)
            if gm.kg % gm.kb:
                tail, after = e.block("tail"), e.block("tail_end")
                e.b.cbranch(e.b.icmp_signed("==", k_hi, C(gm.kg)), tail, after)
                e.b = ir.IRBuilder(tail)
                block(C(whole), gm.kg % gm.kb, "_tail")
                e.b.branch(after)
                e.b = ir.IRBuilder(after)
        e.loop(C(0), C(gm.wide), gm.step, pixels, "pixels")

        def out_channel(k):
            def out_row(pp):
                src = e.b.gep(wide, [add(mul(e.b.sub(k, k_lo), gm.wide), mul(pp, gm.wq))])
                dst = e.b.gep(yg, [add(mul(k, gm.p * gm.q), mul(pp, gm.q))])

                def col(cc):
                    e.b.store(e.b.load(e.b.gep(src, [cc])), e.b.gep(dst, [cc]))
                e.loop(C(0), C(gm.q), 1, col, "ocol")
            e.loop(C(0), C(gm.p), 1, out_row, "orow")
        e.loop(k_lo, k_hi, 1, out_channel, "out")

    tasks, done = e.block("tasks"), e.block("done")
    e.b.cbranch(e.b.icmp_signed("<", t0, t1), tasks, done)
    e.b = ir.IRBuilder(tasks)
    e.loop(t0, t1, 1, task, "task")
    e.b.branch(done)
    ir.IRBuilder(done).ret_void()
    return str(module)


# --- compiled -------------------------------------------------------------------------------------

_PTR = ctypes.c_void_p
_FN = ctypes.CFUNCTYPE(None, _PTR, _PTR, _PTR, _PTR, _PTR, ctypes.c_int64, ctypes.c_int64)


def _target_machine(cpu: str):
    """A target machine for `cpu` ("" the host, with its features): one per engine, which owns
    it (an engine freed with a shared one freed it under the others)."""
    import llvmlite.binding as llvm

    try:
        llvm.initialize()  # llvmlite before 0.45 needs it; later ones raise: they do it alone
    except RuntimeError:
        pass
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    if cpu:
        return target.create_target_machine(cpu=cpu, opt=3)
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                        features=llvm.get_host_cpu_features().flatten(), opt=3)


def _optimised(gm: Geometry):
    """`kernel_ir(gm)` parsed and optimised at O3 for its CPU: (module, target machine)."""
    import llvmlite.binding as llvm

    machine = _target_machine(gm.cpu)
    module = llvm.parse_assembly(kernel_ir(gm))
    module.verify()
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


@functools.lru_cache(maxsize=64)
def compiled(gm: Geometry):
    """The kernel of `gm` compiled (about 0.05-0.5 s), once per process and geometry (no disk
    cache: compiling is cheaper than Numba's); the callable holds its engine."""
    import llvmlite.binding as llvm

    module, machine = _optimised(gm)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    call = _FN(engine.get_function_address("blocked_fwd"))
    call._engine = engine  # the code lives as long as the engine
    gc.collect()  # llvmlite's IR objects are cycles: MBs of garbage otherwise held a while
    return call


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

    @property
    def loads_per_fma(self) -> float:
        return (self.broadcasts + self.vector_loads) / max(self.fmas, 1)


def hot_loop(asm: str) -> HotLoop:
    """`HotLoop` of x86 assembly (AT&T, as LLVM emits it)."""
    best = HotLoop(0, 0, 0, 0, "")
    for body in re.split(r"\n(?=\.LBB\d+_\d+:)", asm):
        fmas = re.findall(r"\bvfn?madd\d+[ps][sd]\s+[^\n]*%([xyz]mm)", body)
        if len(fmas) > best.fmas:
            loads = re.findall(r"\bvmov[ua]p[sd]\s+-?\d*\(%r\w+(?:,%r\w+(?:,\d)?)?\), %[xyz]mm",
                               body)
            folded = re.findall(r"\bvfn?madd\d+[ps][sd]\s+-?\d*\(%r(?!sp)\w*\)(\{1to\d+\})?",
                                body)  # an FMA's memory operand: a vector, or {1toN} a broadcast
            embedded = sum(1 for b in folded if b)
            best = HotLoop(len(fmas), len(re.findall(r"\bvbroadcasts[sd]\b", body)) + embedded,
                           len(loads) + len(folded) - embedded,
                           len(re.findall(r"\(%rsp\)", body)), fmas[0])
    return best


_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _executor(n: int) -> ThreadPoolExecutor:
    """The threads the tasks run on besides the caller's (a ctypes call releases the GIL), `n`
    of them."""
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size != n:
            if _pool is not None:
                _pool.shutdown(wait=True)
            _pool, _pool_size = ThreadPoolExecutor(n, thread_name_prefix="convbench-blocked"), n
        return _pool


class Kernel:
    """A pass of geometry `gm` on `threads` threads: `kernel(a, w, out)` on contiguous nchw
    arrays of its dtype (a: n x C x h x w, w: K x cg x r x s, out: n x K x p x q)."""

    def __init__(self, gm: Geometry, threads_: int):
        self.gm, self.call = gm, compiled(gm)
        self.threads = max(1, min(threads_, gm.n * gm.g * gm.chunks))
        self.planes = [np.zeros(gm.planes_elements, gm.dtype) for _ in range(self.threads)]
        self.wides = [np.empty(gm.wide_elements, gm.dtype) for _ in range(self.threads)]
        tasks = gm.n * gm.g * gm.chunks
        per = -(-tasks // self.threads)
        self.ranges = [(i * per, min((i + 1) * per, tasks)) for i in range(self.threads)]

    def __call__(self, a: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
        for arr in (a, w, out):
            if not arr.flags.c_contiguous or arr.dtype != self.gm.dtype:
                raise ValueError("blocked_llvm: operands must be contiguous "
                                 f"{self.gm.dtype} arrays")
        ptrs = (a.ctypes.data, w.ctypes.data, out.ctypes.data)
        work = [(pl.ctypes.data, wd.ctypes.data, t0, t1)
                for pl, wd, (t0, t1) in zip(self.planes, self.wides, self.ranges)]
        # the calling thread takes the first share itself: a third runnable thread on two
        # cores would wait for one (and read as contention in the timing's scheduler share)
        futures = ([_executor(self.threads - 1).submit(self.call, *ptrs, *job)
                    for job in work[1:]] if len(work) > 1 else [])
        self.call(*ptrs, *work[0])
        for f in futures:
            f.result()


def name(block: tuple[int, int]) -> str:
    """A kernel's name in a probe and a row's note: "llvm 8x3" (kb x pb)."""
    return f"llvm {block[0]}x{block[1]}"


def scratch_bytes(p: ConvProblem, pass_: str, dtype, kept: str | None = None) -> int:
    """Bytes the blocked kernels of a pass hold, all threads' scratch: of every kernel of
    `BLOCKS` (`kernels` compiles them all for the probe), or of the one `kept`."""
    bits, count = vector_bits(), threads.count()
    total = 0
    for block in BLOCKS[bits]:
        if kept is None or kept == name(block):
            gm = geometry(p, pass_, dtype, block, bits, threads_=count)
            total += ((gm.planes_elements + gm.wide_elements)
                      * min(count, gm.n * gm.g * gm.chunks))
    return total * np.dtype(dtype).itemsize


def kernels(p: ConvProblem, pass_: str, dtype, only: str | None = None) -> dict[str, Kernel]:
    """The blocked kernels a pass probes, by name ("llvm 8x3": kb x pb), compiled and their
    scratch allocated; `only`: that one alone (a name not among them: none)."""
    bits = vector_bits()
    out = {}
    for block in BLOCKS[bits]:
        if only is not None and only != name(block):
            continue
        gm = geometry(p, pass_, dtype, block, bits, threads_=threads.count())
        out[name(block)] = Kernel(gm, threads.count())
    return out
