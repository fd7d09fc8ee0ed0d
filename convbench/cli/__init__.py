"""`convbench`: the command line. It parses, calls the library, prints, and turns bad input into
one line on stderr and exit code 2. Nothing in the library imports it.

    convbench layer conv2 --algos all --batch 2 --format json          (cli.measure)
    convbench bench --model MODULE:CALLABLE --input N,C,H,W            (cli.measure)
    convbench bench [--net alexnet] [--device cpu|cuda|emu] [--out DIR] [--resume]
    convbench bench --resume --out DIR --remeasure busy    (times spoiled by a busy machine, again)
    convbench sweep [--net alexnet] [--layers conv2,conv3] [--batch 1,2,4,8] [--memory-limit 2GiB]
    convbench report RUN;  convbench compare RUN_A RUN_B                (cli.report)
    convbench memprofile [--net alexnet] [--batch 2] [--budget 8GiB] [--run RUN] [--out DIR]
    convbench list                                                      (cli.listing)
    convbench machine [--refresh]   the device's ceilings, cached       (cli.machine)
    convbench kernels ...           the CUDA compile gate               (cli.kernels)
    convbench advise RUN [--workspace-budget 256MiB]                    (cli.advise)
    convbench tune --model MODULE:CALLABLE --input N,C,H,W [--out plan.json] (cli.tune)
    convbench train-step                                                (cli.trainstep)
    convbench gpu-check [--out DIR]   the first GPU check, one command  (cli.gpucheck)
    convbench memplan --budget 8GiB   batch and speed per memory strategy (cli.memplan)
    convbench scale --world-sizes 1,2,4 --batch 128,256,512   data-parallel scaling (cli.scale)

Bad input — an unknown layer, net, algo, pass, layout or precision, a malformed layer spec, a
device this machine lacks — is one line on stderr naming what is wrong and what is valid, and
exit code 2. Ctrl-C during a sweep keeps every row measured so far (and, with a run folder,
writes its report), then exits 130; `--resume` finishes the folder, and where there is no run to
resume says so.
"""

from __future__ import annotations

from .. import __version__
from ..core.fmt import first_line
from ..machine import coretype
from ..machine.threads import sleep_idle_threads

sleep_idle_threads()  # before NumPy or torch loads: see convbench.machine.threads
coretype.apply()  # OpenBLAS reads its core type when it loads: see convbench.machine.coretype

import os  # after the thread settings above
import sys

from . import (
    advise,
    gpucheck,
    kernels,
    listing,
    machine,
    measure,
    memplan,
    memprofile,
    report,
    scale,
    trainstep,
    tune,
)
from .common import EXIT_INTERRUPTED, EXIT_PIPE, EXIT_USAGE, Parser, Progress, UsageError

__all__ = ["Progress", "UsageError", "build_parser", "main"]

#: The subcommands, in the order `convbench --help` lists them.
_COMMANDS = (measure, report, memprofile, memplan, scale, listing, machine, kernels, advise,
             tune, trainstep, gpucheck)


def build_parser() -> Parser:
    parser = Parser(prog="convbench", description="Which convolution algorithm and layout is "
                    "fastest for this layer on this device.")
    parser.add_argument("--version", action="version", version=f"convbench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in _COMMANDS:
        module.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["kernels"]:  # the gate parses its own arguments
            return kernels.main(argv[1:])
        args = build_parser().parse_args(argv)
        args.argv = argv
        args.build_parser = build_parser  # `--resume` reads a run's own options with it
        code = args.func(args)
        sys.stdout.flush()  # a reader that left is met here, not in Python's flush at exit
        return code
    except UsageError as exc:
        print(f"convbench: error: {first_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # Ctrl-C outside a run's own handling (its rows are kept there)
        print("convbench: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `convbench ... | head`: the reader left; so do we, quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit must not fail again
        return EXIT_PIPE
