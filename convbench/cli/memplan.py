"""`convbench memplan`: the largest batch each memory strategy trains under a budget, and its
images/s (`convbench.studies.memplan` measures, `memplan_report` writes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from .. import runs
from ..algos import registry
from ..measure import envinfo, memory
from ..planning import models
from ..studies import memplan, memplan_report
from ..studies.workload import Workload
from .common import (
    UsageError,
    command_line,
    emit,
    memory_budget_option,
    model_options,
    positive,
    resolve_device,
    step_options,
    study_output_options,
    time_budget_option,
    usage_errors,
)


def _workload(args, device) -> Workload:
    """What the steps train: `--net`, or `--model` with `--input` (whose N is the common batch
    unless --batch gives one)."""
    if not args.model:
        if args.input:
            raise UsageError("--input goes with --model MODULE:CALLABLE")
        return Workload.parse(args.net or "alexnet")
    if args.net:
        raise UsageError("--model and --net are sources of the network: give one")
    if not args.input:
        raise UsageError("--model needs --input N,C,H,W (N: the common batch)")
    with usage_errors():
        shape = models.parse_input(args.input)
        models.conv_layers(models.load(args.model), shape, device=(
            "cuda" if device.backend == "cuda" else "cpu"))  # the model takes the input
    args.batch = args.batch or shape[0]
    return Workload.of_model(args.model, shape[1:])


def cmd_memplan(args) -> int:
    device = resolve_device(args.device)
    load = _workload(args, device)
    name = models.net_name(args.model) if args.model else load.name
    with usage_errors("--strategies: "):
        strategies = memplan.parse_strategies(args.strategies)
    with usage_errors("--algos: "):
        registry.expand_algos(args.algos, device.backend)
    budget = args.memory_budget or memory.capacity(device.backend)
    log = (lambda line: print(f"convbench: {line}", file=sys.stderr))
    try:
        found, common = memplan.plan(load, device.name, budget, strategies,
                                     time_s=args.time_budget, common_batch=args.batch,
                                     max_batch=args.max_batch, algos=args.algos, log=log)
    except ValueError as exc:  # a budget too small for batch 1
        raise UsageError(f"--memory-budget {memory.format_size(budget)}: {exc}") from None
    env = envinfo.collect(device.backend)
    env["run"] = {"net": load.name, "device": device.name, "budget_bytes": budget,
                  "strategies": strategies, "common_batch": common,
                  "command": command_line(args)}
    text = memplan_report.markdown(load.name, device.name, budget, found, common, env)
    folder = Path(args.out) if args.out else runs.default_folder(name, device.backend,
                                                                 "-memplan")
    written = memplan_report.write(folder, text, found, env,
                            f"{name} on {env['device']}, {memory.format_size(budget)}")
    print(f"convbench: {', '.join(written)} in {folder}", file=sys.stderr)
    rows = memplan_report.rows(found)
    emit(pd.DataFrame(rows), args.format, text.rstrip("\n"), rows)
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("memplan", help="the largest batch each memory strategy (recompute, "
                       "offload) trains under a budget, and its images/s")
    step_options(p, "the catalog net (default alexnet)", net_default=None)
    model_options(p, "a model of your own instead of --net: the callable returns the "
                     "nn.Module (e.g. torchvision.models:resnet18); recomputation wraps its "
                     "top-level children (checkpoint) or its cheap layers (recompute-cheap)",
                  "with --model: one batch's shape; N is the common batch")
    memory_budget_option(p, "memory the whole training step may use, e.g. 8GiB (default: the "
                            "GPU's memory, or the host memory available)")
    p.add_argument("--strategies", default=",".join(memplan.STRATEGIES),
                   help="comma list of " + ", ".join(memplan.STRATEGIES) + " and their "
                        "combinations with + (default: %(default)s)")
    p.add_argument("--batch", type=positive(int),
                   help="the common batch every strategy is also timed at (default: the "
                        "largest batch all of them fit)")
    time_budget_option(p, "seconds of timed steps per probe (at least 3 steps; default 1.0)",
                       default=1.0, old_spelling=False)  # --budget is the memory's here
    p.add_argument("--algos", default="all",
                   help="the algorithms the workspace strategy chooses from (comma list; all)")
    p.add_argument("--max-batch", type=positive(int), default=memplan.MAX_BATCH,
                   help="largest batch the search tries (default %(default)s)")
    study_output_options(p, "memplan", "memplan.png", always=True)
    p.set_defaults(func=cmd_memplan)
