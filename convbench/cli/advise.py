"""`convbench advise RUN`: the plan of a run folder, printed and written to the plan store."""

from __future__ import annotations

import sys
import time

from ..planning.advice import constraint_cost, plan_text
from ..planning.plan import Constraints, PlanStore
from ..planning.tune import advise_runs
from .common import UsageError, positive, tie_options, workspace_budget_option


def cmd_advise(args) -> int:
    constraints = Constraints(args.workspace_budget, args.deterministic, args.max_error,
                              args.tie_break, args.include_busy)
    started = time.monotonic()
    try:
        unconstrained = Constraints(tie_break=args.tie_break, include_busy=args.include_busy)
        asked = [constraints] + ([unconstrained] if constraints != unconstrained else [])
        (plan, advice, note), *rest = advise_runs(args.run, asked, args.precision, args.batch)
        free = rest[0][0] if rest else None
        written = [] if args.no_store else [PlanStore(args.store).save(plan)]
        if args.out:
            written.append(plan.save(args.out))
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from None
    if args.format == "json":
        print(plan.to_json(), end="")
    else:
        print(plan_text(plan, advice))
        if free is not None:
            print("\n" + constraint_cost(plan, free, advice.occurrences))
        if note:
            print(f"\nNote: {note}.")
    for path in written:
        print(f"convbench: plan written to {path}", file=sys.stderr)
    print(f"convbench: advised in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("advise", help="the plan of a run folder: per-layer best, "
                       "margins, network layout plan (written to the plan store)")
    p.add_argument("run", metavar="RUN", help="run folder (convbench bench --out RUN)")
    p.add_argument("--precision", help="precision to plan for (default fp32 if the run has "
                   "it, else its first)")
    p.add_argument("--batch", type=positive(int), help="plan the run's rows of this batch size "
                   "(for a run that holds several)")
    workspace_budget_option(p)
    p.add_argument("--deterministic", action="store_true",
                   help="only algorithms with bitwise-reproducible results (not cudnn, "
                        "cudnn-autotune)")
    p.add_argument("--max-error", type=positive(float), metavar="REL",
                   help="most relative error against the float64 reference")
    tie_options(p)
    p.add_argument("--out", help="also write the plan JSON to this file")
    p.add_argument("--store", help="plan store folder (default $CONVBENCH_PLAN_DIR, else "
                   "~/.cache/convbench/plans)")
    p.add_argument("--no-store", action="store_true", help="do not write to the plan store")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_advise)
