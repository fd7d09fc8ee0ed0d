"""The `workspace` strategy's choice: advice under a budget. The model's conv passes are
measured once, every algorithm and layout, verified, at `REFERENCE_BATCH` (`measure_choices`);
at any batch, the advisor's plan (`advice.advise`) takes the fastest algorithms (as ranked at
the reference batch) whose workspaces, as they declare them at that batch, all fit together in
the room given (`budgeted_plan`): convbench holds a planned pass's workspace from its first
call on (`held_workspace`), so it is their sum that must fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..algos import registry
from ..core import results
from ..core.problem import LAYOUTS
from ..machine import devices
from ..machine.devices import backend_of
from ..measure import opcount, runner, verify
from ..planning.advice import advise, build_plan
from ..planning.models import find_convs
from ..planning.plan import Constraints, Plan, current_env_key
from .footprint import plan_algos
from .workload import CPU_TUNE_BUDGET_S, Workload

#: The batch the conv passes are measured at for the `workspace` strategy's choices.
REFERENCE_BATCH = 2


@dataclass
class Choices:
    """The rows of every algorithm and layout of the model's conv passes, measured and verified
    at batch `reference` on `backend`: what the `workspace` strategy chooses from."""

    rows: list[dict]
    reference: int
    backend: str


def measure_choices(load: Workload, device: str, algos: str = "all",
                    budget_s: float | None = None,
                    log: Callable[[str], None] = lambda line: None) -> Choices:
    """Every algorithm × layout of each conv pass the model's training step runs (`find_convs`:
    no bwd_data for the first layer), measured by the runner at `REFERENCE_BATCH` (for
    `budget_s` seconds each: by default the device's, on the CPU train-step's tuning budget,
    so the ranking is made in seconds, not minutes)."""
    backend = backend_of(device)
    algo_list = registry.expand_algos(algos, backend)
    run = load.prepare(REFERENCE_BATCH, device)
    sites, _ = find_convs(run.model, run.x)
    cases = [runner.Case(load.name, site.name, site.problem, algo, backend, pass_, layout, "fp32")
             for site in sites for pass_ in site.passes for layout in LAYOUTS
             for algo in algo_list]
    log(f"workspace: measuring {len(cases)} conv passes at batch {REFERENCE_BATCH}")
    rows: list[dict] = []
    default = (CPU_TUNE_BUDGET_S if backend == "numpy"
               else devices.of_backend(backend).budget_s)
    runner.run(cases, budget_s or default, on_row=rows.append)
    return Choices(rows, REFERENCE_BATCH, backend)


def _at_batch(row: dict, batch: int, choices: Choices) -> dict:
    """A reference row as the choice at `batch` sees it: its problem at that batch, its
    workspace as the implementation declares it there (a measured peak, for an algorithm that
    declares none, grown in proportion to the batch); its time stays the reference's."""
    problem = results.problem_from_row(row).with_batch(batch)
    out = {**row, **problem.axis_fields()}
    if row["status"] in results.TIMED:  # a candidate's (`inexact` within --max-error too)
        impl = registry.get(row["algo"], choices.backend)
        out["workspace_bytes"] = opcount.workspace_bytes(impl, problem, row["pass"],
                                                         row["layout"], row["precision"])
        if out["workspace_bytes"] is None and row.get("peak_bytes") is not None:
            out["peak_bytes"] = float(row["peak_bytes"]) * batch / choices.reference
    return out


def held_workspace(plan: Plan) -> int:
    """Bytes of workspace the plan's convbench passes hold together (each from its first call
    on: `functional.run` keeps a prepared pass with its buffers)."""
    problems = {lp.layer: lp.problem for lp in plan.layers}
    return sum(opcount.workspace_bytes(registry.get(algo, backend), problems[layer], pass_,
                                       layout, plan.precision) or 0
               for (layer, pass_), (algo, backend, layout)
               in plan_algos(plan).items())


def budgeted_plan(choices: Choices, batch: int, room: int) -> tuple[Plan, int]:
    """The advisor's plan at `batch` whose held workspace fits `room`: the largest per-pass
    workspace limit (bisected over the workspaces the choices have) under which the plan's
    passes fit together; (the plan, the bytes it holds). A limit of 0 always fits: every pass
    then needs no workspace, or is left to torch."""
    df = results.frame([_at_batch(r, batch, choices) for r in choices.rows])
    used = df["workspace_bytes"].fillna(df["peak_bytes"]).dropna()
    limits = sorted({0, *(int(v) for v in used)})
    env = current_env_key(choices.backend)

    def planned(limit: int) -> tuple[Plan, int]:
        chosen = build_plan(advise(df, Constraints(limit, False, None), "fp32"), env, None,
                            measurements=[])
        return chosen, held_workspace(chosen)

    lo, hi = 0, len(limits) - 1  # limits[lo] fits; find the largest that does
    best = planned(limits[lo])
    while lo < hi:
        mid = (lo + hi + 1) // 2
        candidate = planned(limits[mid])
        if candidate[1] <= room:
            lo, best = mid, candidate
        else:
            hi = mid - 1
    return best


def plan_summary(plan: Plan) -> str:
    """`conv1 nchw: gemm, -, direct; ...`: each layer's layout and its passes' algorithms."""
    return "; ".join(f"{lp.layer} {lp.layout}: " + ", ".join(
        c.algo if c else "torch" for c in lp.passes.values()) for lp in plan.layers)


def plan_tolerance(plan: Plan, floor: float) -> float:
    """The loosest verification tolerance among the plan's passes, and at least `floor`: what
    its gradients may differ by from the plain step's (FFT and Winograd round differently from
    direct sums)."""
    return max([floor, *(verify.tolerance(c.algo, plan.precision, lp.problem, p)
                                      for lp in plan.layers for p, c in lp.passes.items()
                                      if c is not None)])
