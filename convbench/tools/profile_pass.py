"""One case's pass run a few times between the CUDA profiler's start and stop, for Nsight
Compute to read its kernels and nothing else (module loads, compiles, the warm-up call and the
check stay outside):

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        python3 -m convbench.tools.profile_pass alexnet:conv4 winograd-fused-4x4 fwd nhwc

The pass is first checked against the float64 reference (a wrong kernel is not worth a
profile), then run `--reps` times inside `cudaProfilerStart`/`Stop`. A tool for people reading
a kernel's limits, not a measurement: the times are the harness's (`convbench layer`).
"""

from __future__ import annotations

import argparse
import sys

from ..algos import reference, registry
from ..catalogs import layers
from ..measure import verify


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m convbench.tools.profile_pass",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("layer", help="a layer, net:layer or text spec (alexnet:conv4)")
    p.add_argument("algo")
    p.add_argument("pass_", metavar="pass", choices=("fwd", "bwd_data", "bwd_filter"))
    p.add_argument("layout", choices=("nchw", "nhwc"))
    p.add_argument("--batch", type=int, default=256, help="default %(default)s, the study's")
    p.add_argument("--reps", type=int, default=1, help="calls profiled (default %(default)s)")
    p.add_argument("--backend", default="cuda", choices=("cuda", "emu"),
                   help="emu: the same steps on the emulator, without a profiler (a dry run)")
    args = p.parse_args(argv)
    try:
        layer = layers.resolve(args.layer, "alexnet")
    except ValueError as exc:
        print(f"profile_pass: error: {exc}", file=sys.stderr)
        return 2
    problem = layer.problem.with_batch(args.batch)
    registry.load()
    impl = registry.get(args.algo, args.backend)
    why = registry.impl_available(impl) or registry.supports(impl, problem, args.pass_,
                                                             args.layout, "fp32")
    if why:
        print(f"profile_pass: error: {args.algo} cannot run it: {why}", file=sys.stderr)
        return 2
    xp = reference.array_module(args.backend)
    a, b = reference.random_operands(problem, args.pass_, args.layout)
    out = reference.nan_output(problem, args.pass_, args.layout, xp=xp)
    impl.compile(problem, args.pass_, args.layout, "fp32")
    fn = impl.prepare(problem, args.pass_, args.layout, "fp32")
    fn(xp.asarray(a), xp.asarray(b), out)
    ref = reference.reference(problem, args.pass_, args.layout, a, b)
    chk = verify.check(out, ref, args.algo, "fp32", problem, args.pass_)
    print(f"profile_pass: {layer.name} {args.algo} {args.pass_} {args.layout} batch "
          f"{args.batch}: rel error {chk.rel_error:.3g} (tolerance {chk.tolerance:.3g})")
    if not chk.ok:
        print(f"profile_pass: error: {chk.reason}", file=sys.stderr)
        return 1
    a, b = xp.asarray(a), xp.asarray(b)
    if args.backend == "emu":
        return 0
    import cupy

    cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStart()
    for _ in range(args.reps):
        fn(a, b, out)
    cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
