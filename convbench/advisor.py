"""The advisor, as training code meets it: results -> advice -> a Plan, and a plan applied.

    from convbench import advisor
    plan = advisor.tune(model, example_input)   # measure the model's conv layers (or reuse)
    advisor.apply(model, plan)                  # run each pass as the plan says

Three parts, each with one job, in the order the data flows:

- `convbench.planning.advice`: a results table -> per-pass advice and a Plan; pure, it never times;
- `convbench.planning.tune`: a model's conv layers (or a run folder) -> what the plan store lacks,
  measured by the runner -> advice;
- `convbench.planning.apply`: a model changed to run a plan.

This module only gathers their public names, so `advisor.tune`, `advisor.apply` and the
rest keep one address.
"""

from .machine.threads import CPU_THREAD_ENV
from .planning.advice import (
    NO_CONSTRAINTS,
    NONDETERMINISTIC_ALGOS,
    Advice,
    Boundary,
    Candidate,
    PassAdvice,
    advice_table,
    advise,
    boundaries,
    build_plan,
    choose_precision,
    constraint_cost,
    is_deterministic,
    layer_costs,
    needed_conversions,
    plan_table,
    plan_text,
    plan_total_ms,
)
from .planning.apply import Change, Summary, apply
from .planning.models import Site, find_convs
from .planning.plan import Constraints, Plan, PlanError, PlanStore, current_env_key
from .planning.tune import advise_run, measure_conversions, tune

__all__ = [
    "CPU_THREAD_ENV", "NONDETERMINISTIC_ALGOS", "NO_CONSTRAINTS", "Advice", "Boundary",
    "Candidate", "Change", "Constraints", "PassAdvice", "Plan", "PlanError", "PlanStore", "Site",
    "Summary", "advice_table", "advise", "advise_run", "apply", "boundaries", "build_plan",
    "choose_precision", "constraint_cost", "current_env_key", "find_convs", "is_deterministic",
    "layer_costs", "measure_conversions", "needed_conversions", "plan_table", "plan_text",
    "plan_total_ms", "tune",
]
