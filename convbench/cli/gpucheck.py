"""`convbench gpu-check`: the first GPU check in one command (`convbench.gpucheck`)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from .. import gpucheck, layers, registry, runs
from ..devices import DEVICES
from .common import EXIT_FAULT, choices, device_option, positive, time_budget_option, usage_errors
from .measure import device as resolve_device


def cmd_gpu_check(args) -> int:
    device = resolve_device(args.device)
    names = [layer.name for layer in layers.net_layers(args.net)]
    folder = (Path(args.out) if args.out
              else runs.default_folder(args.net, device.backend, "-gpu-check"))
    with usage_errors():
        chosen = choices(args.layers, "layer", tuple(names)) if args.layers else None
        registry.expand_algos(args.algos, device.backend)
        pytest_args = tuple(shlex.split(args.pytest_args))
    done = gpucheck.check(
        folder, device, net=args.net, layers=chosen, algos=args.algos, batch=args.batch,
        budget_s=args.time_budget, tests=not args.no_tests, pytest_args=pytest_args,
        tests_timeout_s=args.tests_timeout,
        command=" ".join(["convbench", *getattr(args, "argv", [])]))
    print(done.text.rstrip("\n"))
    print(f"convbench: {gpucheck.SUMMARY_MD}, {gpucheck.RUN}/, "
          f"{'' if args.no_tests else gpucheck.TESTS_LOG + ', '}env.json in {folder}",
          file=sys.stderr)
    if done.outcome.fault:
        print(f"convbench: error: {done.outcome.fault}; run the same command again to continue "
              "after it", file=sys.stderr)
    return 0 if done.ok else EXIT_FAULT


def add_parsers(sub) -> None:
    p = sub.add_parser("gpu-check", help="the first GPU check in one command: env, every "
                       "algo × pass × layout of a net, the ratios, the gpu tests' log")
    p.add_argument("--out", help="folder for everything (default results/<date>-<device>-"
                   "<net>-gpu-check); a folder holding a run is resumed")
    device_option(p, "default cuda where a GPU is, else cpu (the dry form)", tuple(DEVICES))
    p.add_argument("--net", default="alexnet", choices=layers.NETS)
    p.add_argument("--layers", help="comma list of layers of --net (default: all)")
    p.add_argument("--algos", default="all", help="comma list of algos (default all)")
    p.add_argument("--batch", type=positive(int),
                   help="batch size (default: the catalog's on cuda, the study's 256 for "
                        f"alexnet; {DEVICES['cpu'].batch} on cpu)")
    time_budget_option(p, "seconds of timed repetitions per measurement (default "
                          f"{DEVICES['cuda'].budget_s} on cuda)")
    p.add_argument("--no-tests", action="store_true", help="skip the gpu tests")
    p.add_argument("--pytest-args", default=" ".join(gpucheck.PYTEST_ARGS),
                   help="what the tests are run with (default: %(default)s)")
    p.add_argument("--tests-timeout", type=positive(float), default=240, metavar="S",
                   help="seconds the tests may take (default 240)")
    p.set_defaults(func=cmd_gpu_check)
