"""The CPU's compute roof, measured: fp32 multiply-adds with nothing else in the loop, on the
widest vectors the CPU runs, on every thread at once, at the clock that actually runs.

A library's SGEMM is not the roof: it loads, packs and stores, and a convolution library's own
kernels can beat it (docs/pages/measurement.md has the measured case), while a peak computed from the clock /proc reports (a VM's nominal clock, not its turbo)
can be lower than both. So the roof is measured the way the hardware is specified: a loop of
independent vector FMAs (`ACCUMULATORS` chains, more than latency x FMA units needs, so the
units never wait) built as LLVM IR with llvmlite (Numba's own compiler, so nothing to install)
for the host CPU's name and features, run on `threads` threads at once (a ctypes call releases
the GIL), best of a few calls of ~`CALL_SECONDS` each. Every vector width up to the CPU's widest
is tried and the fastest kept: on a CPU that splits 512-bit FMAs into halves (Zen 4) 256 bits
is as fast, on one with a slower 512-bit clock it can be faster.

The result is what the FMA units do at the clock that ran: the flops no real kernel exceeds.
"""

from __future__ import annotations

import ctypes
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache

import numpy as np

from ...machine import llvm as llvm_machine

#: Independent accumulator chains per thread: FMA latency (4-5 cycles) x 2 units needs 8-10;
#: 12 vectors and the two operands fit in 16 registers (AVX2) and leave 32 (AVX-512) free.
ACCUMULATORS = 12
#: FMAs per chain per loop trip: the loop's increment and branch are 1 in ~50 instructions.
UNROLL = 4
#: Seconds a timed call takes (all threads together): long enough for a clock to settle and
#: the pool's hand-over to be noise, short enough that three calls per width take a second.
CALL_SECONDS = 0.05
#: fp32 lanes per vector tried: 128, 256 and 512 bits.
WIDTHS = (4, 8, 16)
_FN = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.POINTER(ctypes.c_float), ctypes.c_float,
                       ctypes.c_float)


def fma_loop_ir(width: int, accumulators: int = ACCUMULATORS, unroll: int = UNROLL) -> str:
    """LLVM IR of `void fma_loop(i64 trips, float *out, float m, float c)`: `accumulators`
    vectors of `width` fp32 lanes, each `a = a * m + c` (`contract`: one FMA where the CPU has
    FMA) `unroll` times per trip, summed into `out[0:width]` at the end so nothing is dead."""
    from llvmlite import ir

    f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
    vec = ir.VectorType(f32, width)
    module = ir.Module(name=f"fma_{width}x{accumulators}")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [i64, f32.as_pointer(), f32, f32]),
                     name="fma_loop")
    trips, out, m, c = fn.args
    entry, loop, done = (fn.append_basic_block(n) for n in ("entry", "loop", "done"))

    b = ir.IRBuilder(entry)
    lanes = ir.Constant(ir.VectorType(i32, width), [0] * width)

    def splat(x):
        return b.shuffle_vector(b.insert_element(ir.Constant(vec, ir.Undefined), x,
                                                 ir.Constant(i32, 0)),
                                ir.Constant(vec, ir.Undefined), lanes)

    vm, vc = splat(m), splat(c)
    b.branch(loop)

    b = ir.IRBuilder(loop)
    trip = b.phi(i64)
    chains = [b.phi(vec) for _ in range(accumulators)]
    now = list(chains)
    for _ in range(unroll):
        now = [b.fadd(b.fmul(a, vm, flags=["contract"]), vc, flags=["contract"]) for a in now]
    following = b.add(trip, ir.Constant(i64, 1))
    trip.add_incoming(ir.Constant(i64, 0), entry)
    trip.add_incoming(following, loop)
    for j, (chain, last) in enumerate(zip(chains, now)):
        chain.add_incoming(ir.Constant(vec, [1e-3 * (j + lane) for lane in range(width)]), entry)
        chain.add_incoming(last, loop)
    b.cbranch(b.icmp_unsigned("<", following, trips), loop, done)

    b = ir.IRBuilder(done)
    total = now[0]
    for a in now[1:]:
        total = b.fadd(total, a)
    b.store(total, b.bitcast(out, vec.as_pointer()), align=4)
    b.ret_void()
    return str(module)


@dataclass(frozen=True)
class Kernel:
    """A compiled FMA loop: the callable, its shape and the instruction it compiled to."""

    call: object
    width: int
    accumulators: int
    instruction: str  # e.g. "vfmadd231ps zmm", "mulps+addps xmm" where the CPU has no FMA

    @property
    def flops_per_trip(self) -> int:
        return 2 * self.width * self.accumulators * UNROLL


def _instruction(asm: str) -> str:
    """The loop's arithmetic instruction and register class, read from its assembly."""
    m = re.search(r"\b(v?fn?madd\w*)\s+%?([xyz]mm|[vq]\d+)", asm)
    if m:
        register = re.sub(r"\d+$", "", m[2])
        return f"{m[1]} {register}"
    m = re.search(r"\b(v?mulps)\s+%?([xyz]mm)", asm)
    return f"{m[1]}+add {m[2]} (no FMA)" if m else "unrecognised"


@cache
def kernel(width: int, accumulators: int = ACCUMULATORS) -> Kernel:
    """The FMA loop compiled for this CPU (its name and features, as Numba does), once per
    process and shape."""
    import llvmlite.binding as llvm

    machine = llvm_machine.target_machine(opt=2)
    module = llvm.parse_assembly(fma_loop_ir(width, accumulators))
    module.verify()
    asm = machine.emit_assembly(module)  # before the engine owns the module
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    call = _FN(engine.get_function_address("fma_loop"))
    call._engine = engine  # the code lives as long as the engine: keep it with the callable
    return Kernel(call, width, accumulators, _instruction(asm))


def parallel_call(k: Kernel, trips: int, threads: int, pool: ThreadPoolExecutor):
    """A call running `trips` trips of `k` on each of `threads` threads of `pool` at once (a
    ctypes call releases the GIL), returning when all are done."""
    outs = [np.zeros(k.width, np.float32) for _ in range(threads)]
    ptrs = [o.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) for o in outs]

    def call():
        for f in [pool.submit(k.call, trips, p, 0.9999, 1e-4) for p in ptrs]:
            f.result()
    return call


def trips_for(k: Kernel, threads: int, pool: ThreadPoolExecutor,
              seconds: float = CALL_SECONDS) -> int:
    """Trips per thread for a call of about `seconds` (from one probe call, after a warm-up)."""
    parallel_call(k, 1000, threads, pool)()
    probe = 20000
    start = time.perf_counter()
    parallel_call(k, probe, threads, pool)()
    return max(1000, int(probe * seconds / max(time.perf_counter() - start, 1e-6)))


def describe(k: Kernel, threads: int, by_width: dict[int, float], reps: int,
             seconds: float) -> str:
    """How the measured peak was obtained, for the ceilings' `methods`."""
    tried = ", ".join(f"{w * 32} bits {g:.4g}" for w, g in by_width.items())
    return (f"a compiled loop of {k.accumulators} independent fp32 FMA chains "
            f"({k.instruction}, {k.width * 32}-bit vectors; LLVM IR built by llvmlite for "
            f"this CPU's name and features) on {threads} threads at once, best of {reps} "
            f"calls of ~{seconds * 1e3:g} ms, widths interleaved; tried: {tried} GFLOP/s")
