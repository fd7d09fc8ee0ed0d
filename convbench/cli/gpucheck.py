"""`convbench gpu-check`: the first GPU check in two commands (`convbench.runs.gpucheck`): the run
and its summary, then `--tests`, each within a ten-minute command."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from .. import runs
from ..algos import registry
from ..catalogs import layers
from ..machine.devices import DEVICES
from ..runs import gpucheck
from .common import (
    EXIT_FAULT,
    choices,
    device_option,
    positive,
    resolve_device,
    time_budget_option,
    usage_errors,
)


def cmd_gpu_check(args) -> int:
    device = resolve_device(args.device)
    names = [layer.name for layer in layers.net_layers(args.net)]
    folder = (Path(args.out) if args.out
              else runs.default_folder(args.net, device.backend, "-gpu-check"))
    with usage_errors():
        chosen = choices(args.layers, "layer", tuple(names)) if args.layers else None
        registry.expand_algos(args.algos or "all", device.backend)
        pytest_args = tuple(shlex.split(args.pytest_args))
    if args.tests:
        tested = gpucheck.tests(folder, pytest_args, args.tests_timeout)
        print(gpucheck.tests_line(tested))
        print(f"convbench: {gpucheck.TESTS_LOG} in {folder}", file=sys.stderr)
        return 0 if tested.passed else EXIT_FAULT
    done = gpucheck.run_check(
        folder, device, net=args.net, layers=chosen, algos=args.algos, batch=args.batch,
        budget_s=args.time_budget,
        command=" ".join(["convbench", *getattr(args, "argv", [])]))
    print(done.text.rstrip("\n"))
    print(f"convbench: {gpucheck.SUMMARY_MD}, {gpucheck.RUN}/, env.json in {folder}; then "
          f"`convbench gpu-check --tests --out {folder}` for the gpu tests", file=sys.stderr)
    if done.outcome.fault:
        print(f"convbench: error: {done.outcome.fault}; run the same command again to continue "
              "after it", file=sys.stderr)
    return 0 if done.ok else EXIT_FAULT


def add_parsers(sub) -> None:
    p = sub.add_parser("gpu-check", help="the first GPU check in two commands: env, every "
                       "algo × pass × layout of a net and the ratios; then --tests, the gpu "
                       "tests' log")
    p.add_argument("--out", help="folder for everything (default results/<date>-<device>-"
                   "<net>-gpu-check); a folder holding a run is resumed")
    p.add_argument("--tests", action="store_true",
                   help="run the gpu tests (into OUT/tests.log, their line into summary.md) "
                        "instead of the run")
    device_option(p, "default cuda where a GPU is, else cpu (the dry form)", tuple(DEVICES))
    p.add_argument("--net", default="alexnet", choices=layers.NETS)
    p.add_argument("--layers", help="comma list of layers of --net (default: all)")
    p.add_argument("--algos", help="comma list of algos (default: all, and on cuda "
                   "cudnn-find, cuDNN's algorithms one by one)")
    p.add_argument("--batch", type=positive(int),
                   help="batch size (default: the catalog's on cuda, the study's 256 for "
                        f"alexnet; {DEVICES['cpu'].batch} on cpu)")
    time_budget_option(p, "seconds of timed repetitions per measurement (default "
                          f"{DEVICES['cuda'].budget_s} on cuda)")
    p.add_argument("--pytest-args", default=" ".join(gpucheck.PYTEST_ARGS),
                   help="what --tests runs pytest with (default: %(default)s)")
    p.add_argument("--tests-timeout", type=positive(float), default=gpucheck.TESTS_TIMEOUT_S,
                   metavar="S", help="seconds the tests may take (default %(default)s)")
    p.set_defaults(func=cmd_gpu_check)
