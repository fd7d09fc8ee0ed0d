"""`convbench machine`: the device's ceilings, as every run's env.json and report state them.

    convbench machine                      the CPU's (or the GPU's) ceilings, cached per machine
    convbench machine --refresh            measured again
    convbench machine --probe-openblas     NumPy's SGEMM under each OpenBLAS core type the CPU
                                           allows; a faster one that takes is used from then on

The figures come from `measure.ceilings`; a cached record is shown with the date it was
measured, so a stale or contended figure is seen for what it is.
"""

from __future__ import annotations

import json

from ..machine import coretype, threads
from ..measure import ceilings
from .common import device_option, positive, usage_errors


def cmd_machine(args) -> int:
    with usage_errors():
        n = threads.check(args.threads)
        threads.use(n)
    device = args.device or "cpu"
    with usage_errors():
        found = ceilings.measure(device, n, refresh=args.refresh)
    if args.format == "json":
        print(json.dumps(found.to_dict(), indent=2))
    else:
        print(found)
        for figure, how in found.methods.items():
            print(f"  {figure}: {how}")
    if args.probe_openblas:
        probe = ceilings.probe_openblas_coretype(threads=n)
        print(f"\nOpenBLAS core types, NumPy {probe['n']}^3 SGEMM, {probe['threads']} threads "
              f"(now: {probe['current']}):")
        for name, r in probe["results"].items():
            said = (r["error"] if "error" in r else
                    f"{r['gflops']:.4g} GFLOP/s" + ("" if r["took"] else
                                                    f" (did not take: ran {r['reported']})"))
            print(f"  {name}: {said}")
        chosen = coretype.record(probe)
        print(f"fastest that took: {probe['fastest']}; "
              + (f"convbench sets {coretype.ENV}={chosen} before NumPy loads from now on "
                 "(this CPU, this NumPy)" if chosen else "OpenBLAS's own choice is kept"))
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("machine", help="the device's ceilings: attainable fp32 GEMM rate, "
                       "theoretical peak, memory bandwidth (measured once, cached)")
    device_option(p, help="cpu (default) or cuda")
    p.add_argument("--threads", type=positive(int), metavar="N",
                   help="threads the products may use (default: the cores this process may "
                        "run on)")
    p.add_argument("--refresh", action="store_true", help="measure again, not from the cache")
    p.add_argument("--probe-openblas", action="store_true",
                   help="also time NumPy's SGEMM under each OpenBLAS core type the CPU allows, "
                        "each in a child process; the fastest that takes, where it is not "
                        "OpenBLAS's own choice, is set before NumPy loads from then on")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_machine)
