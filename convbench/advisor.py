"""The advisor: results -> advice -> a Plan, and a plan applied to a PyTorch model.

    from convbench import advisor
    plan = advisor.tune(model, example_input)   # measure the model's conv layers (or reuse)
    advisor.apply(model, plan)                  # run each pass as the plan says

Advice reads a results table (`runner.COLUMNS`, a run folder or a live measurement) and never
times anything itself: per layer and pass, the fastest `ok` (algo, backend, layout) whose error
is within its tolerance and the constraints; its margin over the runner-up and whether that
margin is within noise (the two interquartile ranges overlap); and the heuristic regret — how
much slower cuDNN's own heuristic pick (`cudnn`) is than the best. Layouts are then chosen for
the network as a whole (`layoutplan`), paying measured NCHW<->NHWC conversions between layers.

`tune` finds a model's conv layers with forward hooks, so any `nn.Module` works; it measures
them with the runner (CPU input: backend `numpy`; CUDA input: `cuda`), after looking each
(problem, pass) up in the plan store. `apply` makes the model run the plan (`convbench.nn`).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from . import layoutplan, registry, report, runner
from .measurement import Measurement
from .memory import format_size
from .plan import (
    TORCH_ALGOS,
    Choice,
    Constraints,
    LayerPlan,
    NetworkTotals,
    Plan,
    PlanError,
    PlanStore,
    Unplanned,
    current_env_key,
    entry_from_row,
    env_key,
    row_from_entry,
    stale_fields,
)
from .problem import LAYOUTS, PASSES, PRECISION_OF_DTYPE, ConvProblem, check_choice
from .runner import PROBLEM_FIELDS
from .threads import CPU_THREAD_ENV  # the environment a CPU plan with NumPy passes wants

#: Algorithms whose results may differ bitwise from run to run. cuDNN's own choice (benchmark
#: off or on) may be one of its algorithms that accumulate with atomics (several bwd_data and
#: bwd_filter ones do); torch's `cudnn.deterministic` would rule those out, but the rows were
#: not measured that way. Every other algorithm is taken as deterministic: the NumPy ones and
#: torch's CPU convolution reduce in a fixed order for a fixed thread count, and convbench's
#: CUDA kernels use no floating-point atomics (a kernel that adds them must be listed here).
NONDETERMINISTIC_ALGOS = ("cudnn", "cudnn-autotune")
#: Seconds of timed repetitions per NCHW<->NHWC conversion: they are memory-bound copies whose
#: times hardly vary, so a tenth of a second of repetitions is plenty on CPU and GPU.
CONVERSION_BUDGET_S = 0.1
NO_CONSTRAINTS = Constraints()


def is_deterministic(algo: str, backend: str) -> bool:
    """Whether `algo` on `backend` gives bitwise-equal results run to run (see
    NONDETERMINISTIC_ALGOS for what is assumed)."""
    return algo not in NONDETERMINISTIC_ALGOS


# --- advice from results --------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """One `ok` measurement, with the quartiles its noise is judged by."""

    algo: str
    backend: str
    layout: str
    median_ms: float
    iqr_ms: float
    q1: float
    q3: float

    @classmethod
    def from_row(cls, r) -> Candidate:
        if r["times_ms"]:
            m = Measurement.from_text(r["times_ms"])
            q1, q3 = m.q1, m.q3
        else:  # no raw times: the IQR centred on the median
            q1, q3 = r["median_ms"] - r["iqr_ms"] / 2, r["median_ms"] + r["iqr_ms"] / 2
        return cls(r["algo"], r["backend"], r["layout"], float(r["median_ms"]),
                   float(r["iqr_ms"]), q1, q3)

    def choice(self) -> Choice:
        return Choice(self.algo, self.backend, self.median_ms, self.iqr_ms)


@dataclass(frozen=True)
class PassAdvice:
    """The choice for one pass of one layer."""

    layer: str
    problem: ConvProblem
    pass_: str
    by_layout: dict[str, Candidate]  # the fastest candidate in each layout
    runner_up: Candidate | None  # the second fastest (algo, backend, layout) of all
    regret: float | None  # cudnn's median / the best's - 1, in the best's layout

    @property
    def best(self) -> Candidate:
        return min(self.by_layout.values(), key=lambda c: c.median_ms)

    @property
    def margin(self) -> float | None:
        """How much slower the runner-up is, as a fraction of the best's time."""
        return None if self.runner_up is None else self.runner_up.median_ms / self.best.median_ms - 1

    @property
    def within_noise(self) -> bool | None:
        """Whether the runner-up's interquartile range reaches the best's: the order of the two
        may not hold on another run."""
        return None if self.runner_up is None else self.runner_up.q1 <= self.best.q3


@dataclass
class Advice:
    """The advice for a results table: per (layer, pass) that has a candidate, its choice."""

    backend: str
    precision: str
    constraints: Constraints
    #: (layer, problem) in the order of the results: the network's order for the layout plan.
    layers: list[tuple[str, ConvProblem]]
    passes: dict[tuple[str, str], PassAdvice]
    #: The (layer, pass) pairs the results have rows for, candidates or not.
    measured: set[tuple[str, str]]
    #: Why `ok` rows were not candidates: reason -> count.
    excluded: Counter


def _exclusions(ok: pd.DataFrame, c: Constraints) -> list[tuple[str, pd.Series]]:
    """(why, which `ok` rows it rules out), in the order the rules apply."""
    rules = [("above their tolerance", ~(ok["rel_error"] <= ok["tolerance"]))]
    if c.max_error is not None:
        rules.append((f"above --max-error {c.max_error:g}", ~(ok["rel_error"] <= c.max_error)))
    if c.workspace_budget is not None:
        # What a pass declares, else what it was seen to allocate beyond its operands (cuDNN's
        # and torch's own choices declare nothing); a row with neither does not fit.
        used = ok["workspace_bytes"].fillna(ok["peak_bytes"])
        rules.append((f"over the workspace budget of {format_size(c.workspace_budget)}",
                      ~(used <= c.workspace_budget)))
    if c.deterministic:
        fixed = [is_deterministic(a, b) for a, b in zip(ok["algo"], ok["backend"])]
        rules.append(("not deterministic", ~pd.Series(fixed, index=ok.index, dtype=bool)))
    return rules


def choose_precision(df: pd.DataFrame, precision: str | None = None) -> str:
    """`precision` if the results have it, else fp32 if they do, else the first they have."""
    have = list(dict.fromkeys(df["precision"]))
    if precision is not None:
        if precision not in have:
            raise ValueError(f"the results have no {precision} rows; they have "
                             f"{', '.join(have) or 'none'}")
        return precision
    if not have:
        raise ValueError("the results are empty")
    return "fp32" if "fp32" in have else have[0]


def advise(df: pd.DataFrame, constraints: Constraints = NO_CONSTRAINTS,
           precision: str | None = None) -> Advice:
    """Per layer and pass of a results DataFrame (`report.frame`), the fastest admissible
    candidate in each layout, the runner-up, and the heuristic regret."""
    precision = choose_precision(df, precision)
    df = df[df["precision"] == precision]
    backends = list(dict.fromkeys(df["backend"]))
    if len(backends) != 1:
        raise ValueError(f"a plan is for one backend; the results have {', '.join(backends)}")
    ok = df[df["status"] == "ok"]
    keep = pd.Series(True, index=ok.index)
    excluded: Counter = Counter()
    for reason, mask in _exclusions(ok, constraints):
        excluded[reason] = int((keep & mask).sum())
        keep &= ~mask
    df = df.assign(candidate=False)
    df.loc[keep[keep].index, "candidate"] = True
    key = ["layer", *PROBLEM_FIELDS]
    layers = [(r["layer"], _problem(r)) for _, r in df[key].drop_duplicates().iterrows()]
    names = Counter(name for name, _ in layers)
    if any(n > 1 for n in names.values()):
        name = next(name for name, n in names.items() if n > 1)
        raise ValueError(f"layer {name} appears with several problems (batches "
                         f"{', '.join(str(p.n) for lay, p in layers if lay == name)}); a plan "
                         "has one problem per layer: choose a batch")
    passes = {}
    for (layer, *_, pass_), rows in df.groupby([*key, "pass"], sort=False):
        ranked = [Candidate.from_row(r)
                  for _, r in rows[rows["candidate"]].sort_values("median_ms").iterrows()]
        if not ranked:
            continue
        by_layout: dict[str, Candidate] = {}
        for cand in ranked:
            by_layout.setdefault(cand.layout, cand)
        best = ranked[0]
        cudnn = rows[(rows["algo"] == "cudnn") & (rows["status"] == "ok")
                     & (rows["layout"] == best.layout)]
        regret = float(cudnn["median_ms"].min()) / best.median_ms - 1 if len(cudnn) else None
        passes[layer, pass_] = PassAdvice(layer, _problem(rows.iloc[0]), pass_, by_layout,
                                          ranked[1] if len(ranked) > 1 else None, regret)
    measured = set(zip(df["layer"], df["pass"]))
    return Advice(backends[0], precision, constraints, layers, passes, measured, excluded)


def _problem(row) -> ConvProblem:
    return ConvProblem(**{f: int(row[f]) for f in PROBLEM_FIELDS})


# --- the network layout plan ----------------------------------------------------------------
def layer_costs(advice: Advice, default_layout: str = "nchw") -> list[dict[str, float]]:
    """Per layer, each layout in which every pass with a candidate has one, and the sum of
    those passes' best times in it. A layer with no such layout has nothing to plan: it stays
    in `default_layout` at no cost."""
    costs = []
    for layer, _ in advice.layers:
        advised = [a for p in PASSES if (a := advice.passes.get((layer, p)))]
        common = set(LAYOUTS).intersection(*(a.by_layout for a in advised)) if advised else set()
        costs.append({lay: sum(a.by_layout[lay].median_ms for a in advised)
                      for lay in LAYOUTS if lay in common} or {default_layout: 0.0})
    return costs


@dataclass(frozen=True)
class Boundary:
    """The activation entering a layer (or leaving the last): its NCHW dims, and whether its
    gradient crosses back (then a conversion is paid both ways)."""

    shape: tuple[int, int, int, int]
    grad: bool


def boundaries(advice: Advice) -> list[Boundary]:
    """Boundary i is layer i's input, converted when layer i's layout differs from the one
    before; its gradient crosses back when layer i computes bwd_data (a pass measured is a pass
    needed). The last boundary is the network's output, whose gradient reaches the last layer
    when that layer has a backward pass."""
    out = [Boundary(problem.x_shape(), (layer, "bwd_data") in advice.measured)
           for layer, problem in advice.layers]
    if advice.layers:
        layer, problem = advice.layers[-1]
        grad = any((layer, p) in advice.measured for p in ("bwd_data", "bwd_filter"))
        out.append(Boundary(problem.y_shape(), grad))
    return out


ConversionKey = tuple[tuple[int, ...], str, str]


def needed_conversions(costs: list[dict[str, float]], bounds: list[Boundary], input_layout: str,
                       output_layout: str) -> set[ConversionKey]:
    """The (shape, from, to) conversions some choice of layouts could pay."""
    sides = [{input_layout}, *(set(c) for c in costs), {output_layout}]
    need = set()
    for i, b in enumerate(bounds):
        for src in sides[i]:
            for dst in sides[i + 1] - {src}:
                need.add((b.shape, src, dst))
                if b.grad:
                    need.add((b.shape, dst, src))
    return need


def transition(bounds: list[Boundary], conversions: dict[ConversionKey, float]):
    """The DP's transition cost from measured conversion times."""
    def cost(i: int, src: str, dst: str) -> float:
        if src == dst:
            return 0.0
        b = bounds[i]
        return conversions[b.shape, src, dst] + (conversions[b.shape, dst, src] if b.grad else 0)

    return cost


def conversion_table(entries: list[dict]) -> dict[ConversionKey, float]:
    """Conversion entries (a plan's `conversions`) as the DP's lookup table."""
    return {(tuple(e["shape"]), e["from"], e["to"]): e["median_ms"] for e in entries}


def measure_conversions(keys, backend: str, precision: str) -> list[dict]:
    """Time each (shape, from, to) conversion; the plan's conversion entries."""
    out = []
    for shape, src, dst in sorted(keys):
        m = layoutplan.conversion_time(shape, src, dst, backend, precision, CONVERSION_BUDGET_S)
        out.append({"shape": list(shape), "from": src, "to": dst, "median_ms": m.median,
                    "iqr_ms": m.iqr})
    return out


def build_plan(advice: Advice, env: dict, conversions: list[dict] | None, *,
               measurements: list[dict], unplanned: list[Unplanned] = (),
               input_layout: str = "nchw", output_layout: str = "nchw") -> Plan:
    """The plan: layouts from the network DP over measured `conversions` (each layer's own
    best layout when they are None: they could not be measured), then each pass's best in its
    layer's layout."""
    costs = layer_costs(advice, input_layout)
    network = None
    if conversions is None or not advice.layers:
        layouts = [min(c, key=c.get) for c in costs]
    else:
        cost = transition(boundaries(advice), conversion_table(conversions))
        chosen = layoutplan.plan_layouts(costs, cost, input_layout, output_layout)
        greedy = layoutplan.per_layer_best(costs, cost, input_layout, output_layout)
        layouts = list(chosen.layouts)
        network = NetworkTotals(chosen.total_ms, chosen.conversion_ms, list(greedy.layouts),
                                greedy.total_ms)
    layers = []
    for (layer, problem), layout in zip(advice.layers, layouts):
        passes = {}
        for p in PASSES:
            a = advice.passes.get((layer, p))
            cand = a.by_layout.get(layout) if a else None
            passes[p] = cand.choice() if cand else None
        layers.append(LayerPlan(layer, problem, layout, passes))
    # One global cudnn.benchmark: the mode most cuDNN passes chose (apply gives the others
    # theirs per pass).
    modes = Counter(c.algo for lp in layers for c in lp.passes.values()
                    if c is not None and TORCH_ALGOS.get(c.algo) is not None)
    cudnn = {"benchmark": modes["cudnn-autotune"] > modes["cudnn"],
             "deterministic": advice.constraints.deterministic}
    return Plan(env=env, backend=advice.backend, precision=advice.precision,
                constraints=advice.constraints, cudnn=cudnn, input_layout=input_layout,
                output_layout=output_layout, layers=layers, network=network,
                unplanned=list(unplanned), measurements=measurements,
                conversions=conversions or [])


# --- tables ---------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "" if x is None else f"+{100 * x:.0f}%" if x >= 0 else f"{100 * x:.0f}%"


def advice_table(advice: Advice) -> str:
    """Per layer and pass: the best, its runner-up and margin, noise, cuDNN's regret."""
    rows = []
    for layer, _ in advice.layers:
        for p in PASSES:
            a = advice.passes.get((layer, p))
            if a is None:
                none = "(none admissible)" if (layer, p) in advice.measured else "(not measured)"
                rows.append([layer, p, none, "", "", "", "", "", ""])
                continue
            best, up = a.best, a.runner_up
            rows.append([layer, p, best.algo, best.layout, report.fmt_ms(best.median_ms),
                         f"{up.algo} {up.layout}" if up else "", _pct(a.margin),
                         "within noise" if a.within_noise else "", _pct(a.regret)])
    return tabulate(rows, headers=["layer", "pass", "best", "layout", "median ms", "runner-up",
                                   "margin", "noise", "cudnn regret"],
                    tablefmt="github", disable_numparse=True)


def plan_table(plan: Plan) -> str:
    """Per layer: the layout the network plan chose (and each layer's own best), the algorithm
    of each pass, and the layer's time in that layout."""
    best = plan.network.per_layer_best_layouts if plan.network else [""] * len(plan.layers)
    rows = []
    for lp, own in zip(plan.layers, best):
        chosen = [c for c in lp.passes.values() if c is not None]
        rows.append([lp.layer, own, lp.layout,
                     *[c.algo if c else "torch default" for c in lp.passes.values()],
                     report.fmt_ms(sum(c.median_ms for c in chosen)) if chosen else ""])
    headers = ["layer", "per-layer best layout", "network plan layout", *PASSES, "ms"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def plan_text(plan: Plan, advice: Advice) -> str:
    """What `convbench advise` prints: the advice, the plan, totals, exclusions."""
    out = [f"## Per-layer best ({advice.backend}, {advice.precision})", "", advice_table(advice),
           "", ("margin: how much slower the runner-up is; within noise: their interquartile "
                "ranges overlap; cudnn regret: how much slower cuDNN's heuristic pick is than "
                "the best, in the same layout."), ""]
    dropped = [f"{n} {reason}" for reason, n in advice.excluded.items() if n]
    if dropped:
        out += ["Not candidates: " + "; ".join(dropped) + ".", ""]
    out += ["## Network layout plan", "", plan_table(plan), ""]
    if plan.network:
        n = plan.network
        out.append(f"Network plan: {n.total_ms:.4g} ms per step of conv passes, "
                   f"{n.conversion_ms:.4g} ms of it NCHW<->NHWC conversions. Each layer's own "
                   f"best layout ({', '.join(n.per_layer_best_layouts)}) would cost "
                   f"{n.per_layer_best_ms:.4g} ms with its conversions.")
    for u in plan.unplanned:
        out.append(f"- {u.layer}: left as it is ({u.reason})")
    return "\n".join(out)


def plan_total_ms(plan: Plan) -> float:
    """A training step's conv passes under the plan: the network total (conversions included)
    where there is one, else the sum of the chosen passes."""
    if plan.network:
        return plan.network.total_ms
    return sum(c.median_ms for lp in plan.layers for c in lp.passes.values() if c is not None)


def constraint_cost(plan: Plan, free: Plan) -> str:
    """One line: what the constraints cost a training step, against the unconstrained `free`
    plan of the same results (a pass left without a choice counts as nothing, and is named)."""
    ours, best = plan_total_ms(plan), plan_total_ms(free)
    line = (f"The constraints ({plan.constraints.describe()}) cost {ours - best:.4g} ms per step "
            f"of conv passes: {ours:.4g} ms against {best:.4g} ms unconstrained "
            f"({_pct((ours - best) / best) if best else 'n/a'}).")
    lost = [f"{lp.layer} {p}" for lp in plan.layers for p, c in lp.passes.items() if c is None]
    if lost:
        line += (f" No choice fits for {', '.join(lost)}: torch's default runs them, not counted "
                 "in the total.")
    return line


# --- tune: measure a model's own layers -----------------------------------------------------
@dataclass(frozen=True)
class Site:
    """A conv layer as the model calls it: its module name, problem and the passes training
    needs (bwd_data only when its input requires grad, bwd_filter when its weight does)."""

    name: str
    problem: ConvProblem
    passes: tuple[str, ...]


def find_convs(model, example_input) -> tuple[list[Site], list[Unplanned]]:
    """The `nn.Conv2d` layers of `model` in the order a forward pass on `example_input` calls
    them, found by forward hooks, and those no `ConvProblem` describes, with why. Runs the model
    once in eval mode (batch-norm statistics stay as they are), with autograd on so each layer
    sees whether its input requires grad."""
    import torch

    from . import nn as cbnn

    names = {id(m): name for name, m in model.named_modules()}
    sites: dict[str, Site] = {}
    refused: dict[str, str] = {}

    def hook(module, args, output):
        name, x = names[id(module)], args[0]
        if name in refused:
            return
        try:
            if x.dtype != example_input.dtype:
                raise ValueError(f"input dtype {x.dtype}, the model's input is "
                                 f"{example_input.dtype}")
            problem = cbnn.problem_of(module, tuple(x.shape))
            if name in sites and sites[name].problem != problem:
                raise ValueError("called with several input shapes; a plan has one problem "
                                 "per layer")
        except ValueError as exc:
            refused[name] = str(exc)
            sites.pop(name, None)
            return
        passes = ("fwd", *(("bwd_data",) if x.requires_grad else ()),
                  *(("bwd_filter",) if module.weight.requires_grad else ()))
        sites.setdefault(name, Site(name, problem, passes))

    modes = {m: m.training for m in model.modules()}
    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, torch.nn.Conv2d)]
    try:
        model.eval()
        with torch.enable_grad():
            model(example_input)
    finally:
        for h in handles:
            h.remove()
        for m, training in modes.items():
            m.training = training
    return list(sites.values()), [Unplanned(n, r) for n, r in refused.items()]


def _backend_precision(example_input) -> tuple[str, str]:
    backend = {"cpu": "numpy", "cuda": "cuda"}.get(example_input.device.type)
    if backend is None:
        raise ValueError(f"convbench measures on cpu or cuda, not {example_input.device.type}")
    dtype = str(example_input.dtype).removeprefix("torch.")
    if dtype not in PRECISION_OF_DTYPE:
        raise ValueError(f"dtype {dtype} has no convbench precision")
    return backend, PRECISION_OF_DTYPE[dtype]


def tune(model, example_input, *, algos: str = "all", layouts: tuple[str, ...] = LAYOUTS,
         budget_s: float | None = None, constraints: Constraints = NO_CONSTRAINTS,
         store: PlanStore | str | Path | None = None, input_layout: str = "nchw",
         output_layout: str = "nchw", log: Callable[[str], None] | None = None) -> Plan:
    """Measure the conv layers of `model` as `example_input` exercises them, and plan them.

    Measurements the plan store holds for this environment are reused; the rest are made by the
    runner on the input's device (`algos`: a comma list as on the command line; `budget_s`:
    seconds of timed repetitions per measurement, the device's default if None), and so are the
    NCHW<->NHWC conversions the layout plan weighs. The plan is saved in the store (`store`: a
    PlanStore or its folder; None: the default one) and returned. `log` receives a line per
    step (store hits, what is measured, where the plan went)."""
    log = log or (lambda line: None)
    for what, value in [*(("layout", lay) for lay in layouts), ("input layout", input_layout),
                        ("output layout", output_layout)]:
        check_choice(what, value, LAYOUTS)
    backend, precision = _backend_precision(example_input)
    algo_list = registry.expand_algos(algos, backend)
    store = store if isinstance(store, PlanStore) else PlanStore(store)
    sites, unplanned = find_convs(model, example_input)
    env = current_env_key(backend)
    stored = store.lookup(env, backend, precision)
    for path, changed in stored.stale:
        log(f"stale plan {path.name} not used: {', '.join(changed)} changed")
    net = type(model).__name__
    entries: dict[tuple[ConvProblem, str], list[dict]] = {}
    cases = []
    for site in sites:
        for pass_ in site.passes:
            key = (site.problem, pass_)
            if key in entries:
                continue
            entries[key] = [e for e in stored.measurements.get(key, [])
                            if e["algo"] in algo_list and e["layout"] in layouts]
            have = {(e["algo"], e["layout"]) for e in entries[key]}
            cases += [runner.Case(net, site.name, site.problem, algo, backend, pass_, layout,
                                  precision)
                      for layout in layouts for algo in algo_list if (algo, layout) not in have]
    log(f"{sum(map(len, entries.values()))} measurements from the plan store {store.folder}, "
        f"{len(cases)} to make")
    budget = budget_s or next(d.budget_s for d in runner.DEVICES.values() if d.backend == backend)

    made: list[dict] = []

    def measured(row: dict) -> None:
        entries[_problem(row), row["pass"]].append(entry_from_row(row))
        made.append(row)
        if len(made) % 20 == 0:
            log(f"measured {len(made)} of {len(cases)}")

    runner.run(cases, budget, on_row=measured)
    rows = [row_from_entry(e, site.name, net, precision)
            for site in sites for p in site.passes for e in entries[site.problem, p]]
    advice = (advise(report.frame(rows), constraints, precision) if rows else
              Advice(backend, precision, constraints, [], {}, set(), Counter()))
    keys = needed_conversions(layer_costs(advice, input_layout), boundaries(advice),
                              input_layout, output_layout)
    conversions = [stored.conversions[k] for k in sorted(keys & stored.conversions.keys())]
    conversions += measure_conversions(keys - stored.conversions.keys(), backend, precision)
    plan = build_plan(advice, env, conversions,
                      measurements=[e for es in entries.values() for e in es],
                      unplanned=unplanned, input_layout=input_layout, output_layout=output_layout)
    log(f"plan saved to {store.save(plan)}")
    return plan


# --- apply: make a model run its plan -------------------------------------------------------

@dataclass(frozen=True)
class Change:
    """What `apply` did to one layer of the plan."""

    layer: str
    action: str  # "replaced" (by convbench.nn.Conv2d), "kept" (torch runs it as planned), "skipped"
    layout: str
    passes: dict[str, str]
    reason: str


@dataclass
class Summary:
    """What `apply` changed: per layer, and the global cuDNN flags."""

    changes: list[Change]
    cudnn: dict[str, bool]
    backend: str

    @property
    def replaced(self) -> list[str]:
        return [c.layer for c in self.changes if c.action == "replaced"]

    def __str__(self) -> str:
        rows = [[c.layer, c.action, c.layout, *[c.passes.get(p, "") for p in PASSES], c.reason]
                for c in self.changes]
        table = tabulate(rows, headers=["layer", "action", "layout", *PASSES, "why"],
                         tablefmt="github", disable_numparse=True)
        flags = ", ".join(f"cudnn.{k}={v}" for k, v in self.cudnn.items())
        text = f"{table}\n\nset torch.backends.{flags}"
        if self.backend != "numpy":
            return text
        text += " (no effect on the CPU)"
        ours = any(a not in TORCH_ALGOS and a != "torch default"
                   for c in self.changes for a in c.passes.values())
        unset = {k: v for k, v in CPU_THREAD_ENV.items() if k not in os.environ}
        if ours and unset:
            text += ("\nNumPy passes share the cores with torch's threads: start Python with "
                     + " ".join(f"{k}={v}" for k, v in unset.items()) + " so idle threads sleep")
        return text


def _torch_runs_it(lp: LayerPlan, arriving: str, benchmark: bool) -> bool:
    """Whether torch alone runs the layer as planned: every pass torch's own, in the mode of
    the global cudnn.benchmark, in the planned layout. torch runs a convolution NHWC when its
    weight or its input is channels_last: a channels_last weight gives NHWC, but an NCHW layer
    fed a channels_last activation would run NHWC as well."""
    for c in lp.passes.values():
        if c is not None and (c.algo not in TORCH_ALGOS
                              or TORCH_ALGOS[c.algo] not in (None, benchmark)):
            return False
    return lp.layout == "nhwc" or arriving == "nchw"


def _why_not(model, lp: LayerPlan):
    """(the module the plan's layer names, None) or (None, why it cannot take the plan)."""
    import torch

    from . import nn as cbnn

    if not lp.layer:
        return None, "the model itself is the conv; wrap it in a module to plan it"
    try:
        module = model.get_submodule(lp.layer)
    except AttributeError:
        return None, "the model has no such module"
    if not isinstance(module, torch.nn.Conv2d):
        return None, f"is a {type(module).__name__}, not an nn.Conv2d"
    try:
        geometry = cbnn.conv_geometry(module)
    except ValueError as exc:
        return None, str(exc)
    p = lp.problem
    if (module.in_channels, module.out_channels, *module.kernel_size, *geometry.values()) != \
            (p.c, p.k, p.r, p.s, p.stride, p.pad, p.dilation, p.groups):
        return None, "its channels, filter or geometry differ from the plan's"
    return module, None


def apply(model, plan: Plan | str | Path) -> Summary:
    """Make `model` run `plan` (a Plan or a plan file): set the cuDNN flags, give each planned
    layer its layout (channels_last weights for NHWC), and replace each layer that torch alone
    would not run as planned by a `convbench.nn.Conv2d` holding the same parameters.

    TF32 is left as the model's owner set it; the cuDNN passes of an fp32 plan were measured
    with it off (`torch.backends.cudnn.allow_tf32 = False` runs them as measured)."""
    import torch

    from . import nn as cbnn

    plan = plan if isinstance(plan, Plan) else Plan.load(plan)
    _check_device(model, plan)
    torch.backends.cudnn.benchmark = plan.cudnn["benchmark"]
    torch.backends.cudnn.deterministic = plan.cudnn["deterministic"]
    changes, arriving = [], plan.input_layout
    for lp in plan.layers:
        passes = {p: c.algo if c else "torch default" for p, c in lp.passes.items()}
        module, why_not = _why_not(model, lp)
        if why_not:
            changes.append(Change(lp.layer, "skipped", lp.layout, passes, why_not))
            continue
        ours = sorted({c.algo for c in lp.passes.values()
                       if c is not None and c.algo not in TORCH_ALGOS})
        for algo in ours:  # an algorithm this build lacks fails here, not mid-training
            registry.get(algo, plan.backend)
        module.to(memory_format=cbnn.MEMORY_FORMAT[lp.layout])
        if _torch_runs_it(lp, arriving, plan.cudnn["benchmark"]):
            changes.append(Change(lp.layer, "kept", lp.layout, passes,
                                  "torch runs every pass as planned"))
        else:
            algos = {p: (c.algo, c.backend) if c else None for p, c in lp.passes.items()}
            parent, _, child = lp.layer.rpartition(".")
            setattr(model.get_submodule(parent), child,
                    cbnn.Conv2d.from_conv(module, lp.layout, algos))
            why = (f"runs {', '.join(ours)}" if ours else
                   "converts its channels_last input to NCHW" if lp.layout == "nchw" else
                   "sets cudnn.benchmark per pass")
            changes.append(Change(lp.layer, "replaced", lp.layout, passes, why))
        arriving = lp.layout
    changes += [Change(u.layer, "skipped", "", {}, u.reason) for u in plan.unplanned]
    return Summary(changes, dict(plan.cudnn), plan.backend)


def _check_device(model, plan: Plan) -> None:
    """The plan must be for the device the model is on. A plan made with other versions still
    applies, with a warning that its times may not hold."""
    devices = {p.device.type for p in model.parameters()}
    want = {"numpy": "cpu", "cuda": "cuda"}.get(plan.backend)
    if devices and devices != {want}:
        raise PlanError(f"the plan is for backend {plan.backend} ({want}); the model is on "
                        f"{', '.join(sorted(devices))}")
    changed = stale_fields(plan.env, current_env_key(plan.backend))
    if changed:
        warnings.warn(f"plan made with another {', '.join(changed)}: its times may not hold "
                      "here; tune again to re-measure", stacklevel=3)


# --- the command line -----------------------------------------------------------------------
def advise_run(folder: str | Path, constraints: Constraints = NO_CONSTRAINTS,
               precision: str | None = None, batch: int | None = None,
               input_layout: str = "nchw",
               output_layout: str = "nchw") -> tuple[Plan, Advice, str | None]:
    """The plan of a run folder (of its rows at `batch`, if given), and a note when its layouts
    are each layer's own best because the conversions cannot be measured here: they must be
    measured on the run's device with the run's versions."""
    df, env = report.load_run(folder)
    if batch is not None:
        df = df[df["n"] == batch]
    advice = advise(df, constraints, precision)
    key, conversions, note = env_key(env), None, None
    unavailable = registry.available(advice.backend)
    changed = [] if unavailable else stale_fields(key, current_env_key(advice.backend))
    if unavailable or changed:
        why = unavailable or f"this machine differs from the run's in {', '.join(changed)}"
        note = f"no network layout plan: conversions cannot be measured here ({why})"
    else:
        keys = needed_conversions(layer_costs(advice, input_layout), boundaries(advice),
                                  input_layout, output_layout)
        conversions = measure_conversions(keys, advice.backend, advice.precision)
    records = df[df["precision"] == advice.precision].to_dict("records")
    plan = build_plan(advice, key, conversions,
                      measurements=[entry_from_row(r) for r in records],
                      input_layout=input_layout, output_layout=output_layout)
    return plan, advice, note


def cmd_advise(args) -> int:
    from .cli import UsageError  # cli imports this module to add the commands

    constraints = Constraints(args.workspace_budget, args.deterministic, args.max_error)
    started = time.monotonic()
    try:
        plan, advice, note = advise_run(args.run, constraints, args.precision, args.batch)
        free = (None if constraints == NO_CONSTRAINTS
                else advise_run(args.run, NO_CONSTRAINTS, args.precision, args.batch)[0])
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
            print("\n" + constraint_cost(plan, free))
        if note:
            print(f"\nNote: {note}.")
    for path in written:
        print(f"convbench: plan written to {path}", file=sys.stderr)
    print(f"convbench: advised in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


def add_cli(subparsers) -> None:
    """Add `advise` and `train-step` to `convbench`'s subcommands."""
    from .cli import _positive, _size  # cli imports this module to add the commands

    p = subparsers.add_parser("advise", help="the plan of a run folder: per-layer best, "
                              "margins, network layout plan (written to the plan store)")
    p.add_argument("run", metavar="RUN", help="run folder (convbench bench --out RUN)")
    p.add_argument("--precision", help="precision to plan for (default fp32 if the run has "
                   "it, else its first)")
    p.add_argument("--batch", type=_positive(int), help="plan the run's rows of this batch size (for a "
                   "run that holds several)")
    p.add_argument("--workspace-budget", type=_size, metavar="SIZE",
                   help="most workspace a pass may use: bytes, or 256MiB, 1GiB, 2GB")
    p.add_argument("--deterministic", action="store_true",
                   help="only algorithms with bitwise-reproducible results (not cudnn, "
                        "cudnn-autotune)")
    p.add_argument("--max-error", type=_positive(float), metavar="REL",
                   help="most relative error against the float64 reference")
    p.add_argument("--out", help="also write the plan JSON to this file")
    p.add_argument("--store", help="plan store folder (default $CONVBENCH_PLAN_DIR, else "
                   "~/.cache/convbench/plans)")
    p.add_argument("--no-store", action="store_true", help="do not write to the plan store")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_advise)
    from . import trainstep  # trainstep builds on this module's tune and apply

    trainstep.add_parser(subparsers)
