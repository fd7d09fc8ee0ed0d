"""`convbench memprofile`: one training step's memory by layer, and the largest batch that fits
a budget (`convbench.studies.memprofile`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from ..measure import envinfo, memory
from ..planning.plan import Constraints
from ..planning.tune import advise_runs
from ..studies import footprint, memprofile
from ..studies.workload import CPU_STEP_BATCH, Workload
from .common import (
    UsageError,
    command_line,
    emit,
    memory_budget_option,
    positive,
    resolve_device,
    step_options,
    study_output_options,
    usage_errors,
    workspace_budget_option,
)


def _advised(run: str, budget: int | None) -> tuple:
    """The advisor's fastest plan of a run folder, and its plan under a workspace budget."""
    with usage_errors(f"--run {run}: "):
        fastest, budgeted = advise_runs(run, [Constraints(), Constraints(workspace_budget=budget)])
    return fastest[0], budgeted[0]


def cmd_memprofile(args) -> int:
    """The memory timeline of one training step, and the largest batch that fits `--budget`
    under torch's defaults and (with `--run`) the advisor's fastest and workspace-budgeted
    plans."""
    device = resolve_device(args.device)
    load = Workload.parse(args.net)
    batch = args.batch or load.default_batch(device.backend)
    budget = args.memory_budget or memory.capacity(device.backend)
    plans = {"defaults": None}
    if args.run:
        plans["fastest"], plans["budgeted"] = _advised(args.run, args.workspace_budget)
    if args.config not in plans:
        raise UsageError(f"--config {args.config} needs --run RUN, a bench run folder to "
                         "advise from")
    configs = memprofile.configurations(load, plans, args.workspace_budget)
    with usage_errors(f"--config {args.config}: "):  # a plan for another device
        events = footprint.profile_step(
            load, batch, device.name,
            footprint.declared_workspace(load, configs[args.config][0]),
            plan=plans[args.config], measure=True)
    found = memprofile.fits(load, configs, budget)
    text = memprofile.markdown(load.name, batch, device.name, args.config, events, found,
                               budget)
    if args.out:
        env = envinfo.collect(device.backend)
        env["run"] = {"net": load.name, "batch": batch, "device": device.name,
                      "config": args.config, "budget_bytes": budget,
                      "command": command_line(args)}
        written = memprofile.write(Path(args.out), text, events, found, env,
                                   f"{load.name}, batch {batch}, {device.name}, {args.config}")
        print(f"convbench: {', '.join(written)} in {args.out}", file=sys.stderr)
    rows = memprofile.timeline_rows(events)
    emit(pd.DataFrame(rows), args.format, text.rstrip("\n"),
         {"timeline": rows, "largest_batch": memprofile.fit_rows(found)})
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("memprofile", help="memory timeline of a training step by layer, and "
                       "the largest batch that fits a budget")
    step_options(p)
    p.add_argument("--batch", type=positive(int),
                   help=f"images in the profiled step (default {CPU_STEP_BATCH} on cpu, "
                        "the catalog's on cuda)")
    memory_budget_option(p, "memory the step may use, e.g. 8GiB (default: the GPU's memory, "
                            "or the host memory available)")
    p.add_argument("--run", help="bench run folder the advisor plans from: adds its fastest "
                   "plan and its plan under --workspace-budget")
    workspace_budget_option(p, "workspace budget of the advisor's budgeted plan (default "
                               "256MiB)", default=256 << 20)
    p.add_argument("--config", choices=("defaults", "fastest", "budgeted"), default="defaults",
                   help="configuration whose timeline is measured and shown (default "
                        "defaults; the others need --run)")
    study_output_options(p, "memprofile", "largest_batch.csv, timeline.png",
                         csv_says="the timeline")
    p.set_defaults(func=cmd_memprofile)
