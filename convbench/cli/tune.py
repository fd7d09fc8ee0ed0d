"""`convbench tune --model MODULE:CALLABLE --input N,C,H,W`: the advisor's tune, from the shell.

    convbench tune --model torchvision.models:resnet18 --input 8,3,224,224 --out plan.json

Builds the model, finds the convolutions it computes (`models.find_convs`), looks each
(problem, pass) up in the plan store, measures the rest (a progress bar on a terminal), confirms
the plan on the model's whole step (`--step`, `planning.confirm`), and prints the plan
`advisor.apply` makes training code run; the plan goes to the store and to --out if given.
What tune says (`tune.LOG`) and its warnings are `convbench:` lines on stderr.
"""

from __future__ import annotations

import contextlib
import sys
import time
import warnings

from ..core.problem import LAYOUTS, PRECISIONS
from ..machine import threads
from ..planning import confirm, models
from ..planning.advice import plan_text
from ..planning.plan import Constraints
from ..planning.tune import TuneInterrupted, interrupted_text, reporting, tune_advice
from .common import (
    EXIT_INTERRUPTED,
    UsageError,
    choices,
    device_option,
    model_options,
    positive,
    precisions_option,
    resolve_device,
    step_budget_option,
    tie_options,
    time_budget_option,
    usage_errors,
    workspace_budget_option,
)


def cmd_tune(args) -> int:
    import torch

    from ..nn import precision_setting

    device = resolve_device(args.device).name  # tune measures our algorithms there too
    if args.precisions is not None and len(args.precisions) > 1:
        raise UsageError(f"--precisions {','.join(args.precisions)}: a plan is made in one "
                         "precision; give one (tune once per precision)")
    with usage_errors():
        threads.use(threads.check(args.threads))
    started = time.monotonic()
    with usage_errors():
        shape = models.parse_input(args.input)
        model = models.load(args.model).to(device)
        layouts = tuple(choices(args.layouts, "layout", LAYOUTS))
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(device)
        precision = args.precisions[0] if args.precisions else None
        setting = (precision_setting(precision, x.device.type) if precision
                   else contextlib.nullcontext())
        try:
            with setting, reporting(always=True), warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("default")
                plan, advice = tune_advice(
                    model, x, algos=args.algos, layouts=layouts, budget_s=args.time_budget,
                    constraints=Constraints(args.workspace_budget, args.deterministic,
                                            args.max_error, args.tie_break, args.include_busy),
                    store=args.store, step=None if args.step == "none" else args.step,
                    step_budget_s=args.step_budget, cold=args.cold, precision=precision)
        except TuneInterrupted as stop:
            print(f"convbench: interrupted; {interrupted_text(stop)}", file=sys.stderr)
            return EXIT_INTERRUPTED
        for w in said:
            print(f"convbench: warning: {w.message}", file=sys.stderr)
        if args.out:
            print(f"convbench: plan written to {plan.save(args.out)}", file=sys.stderr)
    if args.format == "json":
        print(plan.to_json(), end="")
    else:
        print(plan_text(plan, advice))
    print(f"convbench: tuned in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("tune", help="measure a model's conv layers and plan them (the "
                       "advisor's tune): --model MODULE:CALLABLE --input N,C,H,W")
    model_options(p, "a callable returning the nn.Module, e.g. mymodule:net, or "
                     "torchvision.models:resnet18 with the torchvision built for this torch",
                  "the shape of one input batch, e.g. 8,3,224,224", required=True)
    device_option(p)
    p.add_argument("--algos", default="all", help="comma list of algos to consider (all)")
    p.add_argument("--layouts", default="all", help=f"comma list of {', '.join(LAYOUTS)}; all")
    time_budget_option(p, "seconds of timed repetitions per measurement (the device's "
                          "default)")
    precisions_option(p, f"the precision to measure and plan in, one of {', '.join(PRECISIONS)} "
                         "(default: the input's dtype's)")
    workspace_budget_option(p)
    p.add_argument("--deterministic", action="store_true",
                   help="only algorithms with bitwise-reproducible results")
    p.add_argument("--max-error", type=positive(float), metavar="REL",
                   help="most relative error against the float64 reference")
    tie_options(p)
    p.add_argument("--threads", type=positive(int), metavar="N",
                   help="threads every algorithm may use (default: the cores this process may "
                        "run on)")
    p.add_argument("--step", choices=(*confirm.MODES, "none"), default="train",
                   help="confirm the plan on the model's whole step (train: forward and "
                        "backward; inference): a change stays only where the step is faster "
                        "with it beyond noise (default %(default)s; none: per-layer times only)")
    step_budget_option(p)
    p.add_argument("--cold", action="store_true",
                   help="time each CPU repetition from cold caches (a buffer twice the last "
                        "level cache rewritten before it), as a layer finds them in a model")
    p.add_argument("--out", help="also write the plan JSON to this file")
    p.add_argument("--store", help="plan store folder (default $CONVBENCH_PLAN_DIR, else "
                   "~/.cache/convbench/plans)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_tune)
