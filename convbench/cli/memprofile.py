"""`convbench memprofile`: one training step's memory by layer, and the largest batch that fits
a budget (`convbench.memprofile`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from .. import layers, memory, memprofile, results, trainstep
from ..plan import Constraints
from ..tune import advise_run
from .common import FORMATS, UsageError, positive, size, step_options, usage_errors
from .measure import device as resolve_device


def _advised(run: str, budget: int | None):
    """The advisor's plan of a run folder, under a workspace budget if given."""
    with usage_errors(f"--run {run}: "):
        return advise_run(run, Constraints(workspace_budget=budget))[0]


def cmd_memprofile(args) -> int:
    """The memory timeline of one training step, and the largest batch that fits `--budget`
    under torch's defaults and (with `--run`) the advisor's fastest and workspace-budgeted
    plans."""
    device = resolve_device(args.device)
    batch = args.batch or (trainstep.CPU_STEP_BATCH if device.backend == "numpy" else
                           layers.net_layers(args.net)[0].problem.n)
    budget = args.budget or memory.capacity(device.backend)
    plans = {"defaults": None}
    if args.run:
        plans["fastest"] = _advised(args.run, None)
        plans["budgeted"] = _advised(args.run, args.workspace_budget)
    if args.config not in plans:
        raise UsageError(f"--config {args.config} needs --run RUN, a bench run folder to "
                         "advise from")
    configs = memprofile.configurations(args.net, plans, args.workspace_budget)
    with usage_errors(f"--config {args.config}: "):  # a plan for another device
        events = memprofile.profile_step(
            args.net, batch, device.name,
            memprofile.declared_workspace(args.net, configs[args.config][0]),
            plan=plans[args.config], measure=True)
    found = memprofile.fits(args.net, configs, budget)
    text = memprofile.markdown(args.net, batch, device.name, args.config, events, found,
                               budget)
    if args.out:
        written = memprofile.write(Path(args.out), text, events, found,
                                   f"{args.net}, batch {batch}, {device.name}, {args.config}")
        print(f"convbench: {', '.join(written)} in {args.out}", file=sys.stderr)
    rows = memprofile.timeline_rows(events)
    print({"table": lambda: text.rstrip("\n"),
           "csv": lambda: results.to_csv(pd.DataFrame(rows)).rstrip("\n"),
           "json": lambda: json.dumps({"timeline": rows,
                                       "largest_batch": memprofile.fit_rows(found)}, indent=1)}
          [args.format]())
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("memprofile", help="memory timeline of a training step by layer, and "
                       "the largest batch that fits a budget")
    step_options(p)
    p.add_argument("--batch", type=positive(int),
                   help=f"images in the profiled step (default {trainstep.CPU_STEP_BATCH} on cpu, "
                        "the catalog's on cuda)")
    p.add_argument("--budget", type=size, metavar="SIZE",
                   help="memory the step may use, e.g. 8GiB (default: the GPU's memory, or the "
                        "host memory available)")
    p.add_argument("--run", help="bench run folder the advisor plans from: adds its fastest "
                   "plan and its plan under --workspace-budget")
    p.add_argument("--workspace-budget", type=size, default=256 << 20, metavar="SIZE",
                   help="workspace budget of the advisor's budgeted plan (default 256MiB)")
    p.add_argument("--config", choices=("defaults", "fastest", "budgeted"), default="defaults",
                   help="configuration whose timeline is measured and shown (default "
                        "defaults; the others need --run)")
    p.add_argument("--out", help="folder for memprofile.md, timeline.csv, largest_batch.csv, "
                   "timeline.png")
    p.add_argument("--format", choices=FORMATS, default="table")
    p.set_defaults(func=cmd_memprofile)
