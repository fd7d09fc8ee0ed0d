"""`convbench kernels`: the CUDA compile gate (`convbench.cuda.gate`) on the command line.

Every declared kernel configuration, or the files given, compiled with NVRTC for each arch (no
GPU needed); registers, shared memory and spills as a table. Exit 1 on a compile error, a
spill or a kernel file without declared configurations; 2 where NVRTC is missing.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ..algos import registry
from ..cuda import gate, kernels
from .common import EXIT_INTERRUPTED, EXIT_USAGE


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="convbench kernels",
        description="Compile every declared kernel configuration with NVRTC (no GPU needed) and "
                    "report registers, shared memory and spills; fail on errors and spills.")
    parser.add_argument("files", nargs="*", type=Path,
                        help="check these .cu files (with the -D defines) instead of the "
                             "declared configurations")
    parser.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--arch", action="append",
                        help=f"default: {' '.join(gate.GATE_ARCHS)}")
    args = parser.parse_args(argv)
    if reason := kernels.nvrtc_available():
        print(f"convbench kernels: {reason}", file=sys.stderr)
        return EXIT_USAGE
    if reason := _bad_input(args):
        print(f"convbench kernels: {reason}", file=sys.stderr)
        return EXIT_USAGE
    defines = kernels.normalize_defines(dict(d.partition("=")[::2] for d in args.defines))
    if args.files:
        jobs, undeclared = [(f, defines) for f in args.files], []
    else:
        registry.load()  # every algorithm module declares its configurations at import
        jobs, undeclared = gate.declared_jobs()
    try:
        rows = gate.gate(jobs, args.arch or gate.GATE_ARCHS)
    except KeyboardInterrupt:
        print("convbench kernels: interrupted; nothing was checked to the end", file=sys.stderr)
        return EXIT_INTERRUPTED
    rows += [gate.GateRow(name, (), "-", None, "no configuration declared (kernels.declare)")
             for name in undeclared]
    print(gate.render(rows))
    for row in rows:
        if row.log and row.error:
            print(f"\n--- {row.file} {dict(row.defines)} {row.arch}\n{row.log}", file=sys.stderr)
    failed = sum(not r.ok for r in rows)
    print(f"\n{len(rows)} kernels (entry point × defines × arch) checked, {failed} failed")
    return 1 if failed else 0


def _bad_input(args) -> str | None:
    """One line naming what is wrong with the arguments (a file that is not there, an arch
    NVRTC does not compile for), or None."""
    from cupy.cuda import nvrtc

    for path in args.files:
        if not path.is_file():
            return f"no kernel file {str(path)!r}"
    # NVRTC 11.2 and later say which archs they compile for; an older one is left to say so
    supported = nvrtc.getSupportedArchs() if hasattr(nvrtc, "getSupportedArchs") else None
    for arch in args.arch or ():
        m = re.fullmatch(r"sm_(\d+)[a-z]?", arch)
        if not m or (supported is not None and int(m.group(1)) not in supported):
            names = "sm_NN" if supported is None else ", ".join(f"sm_{a}" for a in supported)
            return f"--arch {arch}: this NVRTC compiles for {names}"
    return None


def add_parsers(sub) -> None:
    """The gate parses its own arguments (`main`); this entry is for `convbench --help`."""
    sub.add_parser("kernels", help="CUDA kernel tools: compile check, resources "
                   "(convbench kernels --help)", add_help=False)
