"""The advisor, as training code meets it: results -> advice -> a Plan, and a plan applied.

    from convbench import advisor
    plan = advisor.tune(model, example_input)   # measure the model's conv layers (or reuse)
    advisor.apply(model, plan)                  # run each pass as the plan says

Three parts, each with one job, in the order the data flows:

- `convbench.planning.advice`: a results table -> per-pass advice and a Plan; pure, it never times;
- `convbench.planning.tune`: a model's conv layers (or a run folder) -> what the plan store lacks,
  measured by the runner -> advice;
- `convbench.planning.apply`: a model changed to run a plan.

This module gathers what training code needs of them — `tune`, `apply`, `advise_run`, the plan
and its store, the constraints, `plan_text`, and `CPU_THREAD_ENV` (the environment NumPy passes
want) — so they keep one address; the rest stays with the part it belongs to.
"""

from .machine.threads import CPU_THREAD_ENV
from .planning.advice import NO_CONSTRAINTS, plan_text
from .planning.apply import Summary, apply
from .planning.plan import Constraints, Plan, PlanError, PlanStore
from .planning.tune import advise_run, tune

__all__ = ["CPU_THREAD_ENV", "NO_CONSTRAINTS", "Constraints", "Plan", "PlanError", "PlanStore",
           "Summary", "advise_run", "apply", "plan_text", "tune"]
