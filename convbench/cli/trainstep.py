"""`convbench train-step`: a whole training step timed three ways (`convbench.trainstep`)."""

from __future__ import annotations

import json
import sys

from .. import envinfo, layers, results, trainstep
from ..devices import DEVICES, default_device
from ..registry import available
from .common import FORMATS, UsageError, positive, step_options, usage_errors


def cmd_train_step(args) -> int:
    device = args.device or default_device()
    backend = DEVICES[device].backend
    unavailable = available(backend)
    if unavailable:
        raise UsageError(f"--device {device}: {unavailable}")
    batch = args.batch or (trainstep.CPU_STEP_BATCH if backend == "numpy" else
                           layers.net_layers(args.net)[0].problem.n)
    tune_budget = args.tune_budget or (trainstep.CPU_TUNE_BUDGET_S if backend == "numpy"
                                       else None)
    with usage_errors():
        rows, plan, tuning_s = trainstep.compare(
            args.net, batch, device, budget_s=args.budget, tune_budget_s=tune_budget,
            algos=args.algos, store=args.store,
            log=lambda line: print(f"convbench: {line}", file=sys.stderr))
    env = envinfo.collect(backend)
    text = trainstep.markdown(rows, plan, args.net, batch, env["device"], backend, tuning_s,
                              default_batch=not args.batch)
    if args.out:
        command = " ".join(["convbench", *getattr(args, "argv", [])])
        meta = {"net": args.net, "batch": batch, "device": device, "budget_s": args.budget,
                "tuning_s": tuning_s, "command": command}
        trainstep.write(args.out, rows, plan, text, env, meta)
        print(f"convbench: train-step results in {args.out}", file=sys.stderr)
    frame = trainstep.summary_frame(rows)
    print({"table": lambda: text, "csv": lambda: results.to_csv(frame).rstrip("\n"),
           "json": lambda: json.dumps(rows, indent=1)}[args.format]())
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("train-step", help="time a training step of an AlexNet-shaped "
                       "model: defaults, cudnn.benchmark, the advisor's plan")
    step_options(p, "catalog whose conv layers the model has (default alexnet)")
    p.add_argument("--batch", type=positive(int),
                   help=f"images per step (default {trainstep.CPU_STEP_BATCH} on cpu, the "
                        "catalog's on cuda)")
    p.add_argument("--budget", type=positive(float), default=trainstep.STEP_BUDGET_S,
                   help="seconds of timed steps per configuration (default "
                        f"{trainstep.STEP_BUDGET_S})")
    p.add_argument("--tune-budget", type=positive(float),
                   help=f"seconds of timed repetitions per tuning measurement (default "
                        f"{trainstep.CPU_TUNE_BUDGET_S} on cpu, the device's default on cuda)")
    p.add_argument("--algos", default="all", help="algorithms the advisor may choose from")
    p.add_argument("--store", help="plan store folder (default $CONVBENCH_PLAN_DIR, else "
                   "~/.cache/convbench/plans)")
    p.add_argument("--out", help="folder for trainstep.csv/.json/.md, plan.json, env.json")
    p.add_argument("--format", choices=FORMATS, default="table")
    p.set_defaults(func=cmd_train_step)
