"""Advice: a results table -> per layer and pass, the best (algo, layout), and a Plan.

Advice reads results only (`results.frame` of a run folder, or of rows the tuner measured) and
never times anything: per layer and pass, among the `ok` (algo, backend, layout) candidates
whose error is within its tolerance and the constraints (and, unless asked, not measured on a
busy machine), the fastest in a model (`in_model_ms`: a swapped pass pays the module's
overhead per call, torch's own pass does not; an `inexact` row, a library's result beyond its
tolerance, is a candidate only where the constraints name an error it is within: `_exclusions`,
and a pass whose every candidate is decidedly slower than torch's inexact pick is left to
torch: `_left_to_torch`); the runner-up and the ratio of their costs with its interval
(`stats.ratio`, paired by round where they were timed in the same rounds). The fastest wins only
where that interval excludes 1; otherwise it is a tie within noise, and among the candidates
tied with the fastest the advice takes the one the user's tie-break prefers (the least
workspace by default). And the heuristic regret — how much slower cuDNN's own heuristic pick
(`cudnn`) is than the best: the baseline is what torch runs, so an `inexact` pick is its
baseline all the same, and `plan_text` says its error. Layouts are then chosen for
the network as a whole (`layoutplan`), paying NCHW<->NHWC conversions between layers, from
conversion times it is handed (`tune` measures them). The tables `convbench advise` prints
are made here too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from ..algos import registry
from ..algos.cudnn_pinned import Pin
from ..algos.registry import TORCH_ALGOS
from ..analysis.inexact import INEXACT, sentence
from ..analysis.ranking import Candidate, busy_mask, preferred, tied
from ..core import stats
from ..core.fmt import fmt_ms, tabulate
from ..core.problem import LAYOUTS, PASSES, ConvProblem
from ..core.results import PROBLEM_FIELDS, TIMED, problem_from_row
from ..measure.memory import format_size
from . import layoutplan
from .plan import Choice, Constraints, LayerPlan, NetworkTotals, Plan, Unplanned

NO_CONSTRAINTS = Constraints()

#: What a swapped pass (one not torch's own, which `convbench.nn.Conv2d` runs) costs per call in
#: a model beyond its time alone, per backend: the module's Python, its autograd Function, its
#: result in fresh memory, none of which torch's own pass pays. Derived from the in-place
#: overheads measured (docs/pages/advisor.md): on the CPU a layer's three passes cost 0.20-0.31
#: ms more in place than alone, about 0.08 ms a pass; on a GPU the host pays the module's Python
#: per call alike (its operator's wrappers about 0.17 ms of CPU time a layer's step, the Function
#: 0.01-0.03 ms more), about 0.06 ms a pass. `advise(overhead_ms=...)` takes another.
SWAP_OVERHEAD_MS = {"numpy": 0.08, "emu": 0.08, "cuda": 0.06}


def in_model_ms(r, overhead_ms: float) -> float:
    """What a result row's pass costs in a model: torch's own (`TORCH_ALGOS`) its time as
    measured, the model calling it as the harness did; a swapped one pays `overhead_ms` on the
    host per call, so on the CPU, where its time is the host's, its time plus that, and on a
    GPU, where the host issues while the device runs, the larger of its device time and the
    host's issue time (`host_ms`, 0 where the row has none) plus that. Without it a plan of
    many small swapped layers looks free where each costs a module call."""
    median = float(r["median_ms"])
    if r["algo"] in TORCH_ALGOS:
        return median
    if r["backend"] != "cuda":
        return median + overhead_ms
    host = r.get("host_ms")
    return max(median, (0.0 if host is None or pd.isna(host) else float(host)) + overhead_ms)


def is_deterministic(algo: str) -> bool:
    """Whether `algo` gives bitwise-equal results run to run, as it declares where it registers
    (`traits.Algorithm.deterministic`)."""
    return registry.algorithm(algo).deterministic


# --- advice from results --------------------------------------------------------------------
@dataclass(frozen=True)
class PassAdvice:
    """The choice for one pass of one layer."""

    layer: str
    problem: ConvProblem
    pass_: str
    by_layout: dict[str, Candidate]  # the choice in each layout
    runner_up: Candidate | None  # the second fastest (algo, backend, layout) of all
    regret: float | None  # cudnn's median / the best's cost - 1, in the best's layout
    best: Candidate  # the choice: the least cost, or the tie-break's among those tied with it
    fastest: Candidate
    ratio: stats.Ratio | None  # runner-up / fastest (their costs), with its interval
    tied: tuple[Candidate, ...]  # the candidates tied with the fastest, it included

    @property
    def within_noise(self) -> bool | None:
        """Whether the fastest and the runner-up are a tie: the interval of their ratio
        reaches 1 (or there are too few repetitions for one)."""
        return None if self.ratio is None else not self.ratio.decided


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
    #: Why timed rows (`ok`, `inexact`) were not candidates: reason -> count.
    excluded: Counter
    #: How many conv layers of the network have each layer's problem (a `--model` or problem
    #: file run measures each distinct problem once): the plan's totals weigh each by it, as the
    #: report's network cost does. A layer not named occurs once.
    occurrences: dict[str, int] = field(default_factory=dict)
    #: The `inexact` rows (records): libraries' results beyond their tolerance, said plainly.
    inexact: list[dict] = field(default_factory=list)
    #: The (layer, pass) pairs left to torch: (its `inexact` pick, the best candidate, which is
    #: decidedly slower: `_left_to_torch`).
    left_to_torch: dict[tuple[str, str], tuple[Candidate, Candidate]] = field(
        default_factory=dict)
    #: What a swapped pass was charged per call (`SWAP_OVERHEAD_MS`, or the caller's).
    overhead_ms: float = 0.0

    def count(self, layer: str) -> int:
        return self.occurrences.get(layer, 1)


#: Why an `inexact` row is no candidate without `--max-error`.
INEXACT_EXCLUDED = ("inexact (libraries' results above their tolerance, kept as the baseline; "
                    "--max-error admits one within it)")


def _exclusions(ok: pd.DataFrame, c: Constraints) -> list[tuple[str, pd.Series]]:
    """(why, which timed rows it rules out), in the order the rules apply. A row above its
    tolerance is no candidate, and an `inexact` one (a library's result, timed because it is
    what torch runs) is one only where `max_error` is given and its error within it: a plan
    never swaps a pass for a less accurate one the user did not allow, and an error bound the
    user named admits every row within it, as it bounds every other row's."""
    inexact = ok["status"] == "inexact"
    rules = [("above their tolerance", ~(ok["rel_error"] <= ok["tolerance"]) & ~inexact)]
    if c.max_error is None and inexact.any():
        rules.append((INEXACT_EXCLUDED, inexact))
    once = [registry.algorithm(a).weights_once for a in ok["algo"]]
    if any(once):  # their filter transformed once: a training step changes the weights
        rules.append(("inference variants (weights transformed once)",
                      pd.Series(once, index=ok.index, dtype=bool)))
    if c.max_error is not None:
        rules.append((f"above --max-error {c.max_error:g}", ~(ok["rel_error"] <= c.max_error)))
    if c.workspace_budget is not None:
        # What a pass declares, else what it was seen to allocate beyond its operands (cuDNN's
        # and torch's own choices declare nothing); a row with neither does not fit.
        used = ok["workspace_bytes"].fillna(ok["peak_bytes"])
        rules.append((f"over the workspace budget of {format_size(c.workspace_budget)}",
                      ~(used <= c.workspace_budget)))
    if c.deterministic:
        fixed = [is_deterministic(a) for a in ok["algo"]]
        rules.append(("not deterministic", ~pd.Series(fixed, index=ok.index, dtype=bool)))
    if not c.include_busy:
        rules.append((("measured on a busy machine (contended or throttled: --include-busy to "
                      "use them)"), busy_mask(ok)))
    return rules


def _left_to_torch(rows: pd.DataFrame, best: Candidate, c: Constraints) -> Candidate | None:
    """torch's own `inexact` pick of a pass (origin `torch`; busy rows only with
    `include_busy`) where `best` is decidedly slower than it, else None. The pass is then left
    to torch: no plan takes an inexact row without `max_error`, and none replaces the pass
    torch runs with a slower one (as torch's fp32 weight gradient of a 5x5 layer, run as
    cuDNN's Winograd, can be: inexact, and faster than every exact choice)."""
    theirs = rows[(rows["status"] == "inexact")
                  & rows["algo"].map(lambda a: registry.algorithm(a).origin == "torch")]
    if not c.include_busy:
        theirs = theirs[~busy_mask(theirs)]
    if theirs.empty:
        return None
    pick = Candidate.from_row(theirs.loc[theirs["median_ms"].idxmin()])
    ratio = best.ratio_to(pick)
    return pick if ratio.decided and ratio.value > 1 else None


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
           precision: str | None = None, occurrences: dict[str, int] | None = None,
           overhead_ms: float | None = None) -> Advice:
    """Per layer and pass of a results DataFrame (`results.frame`), the fastest admissible
    candidate in each layout, the runner-up, and the heuristic regret, each candidate at its
    cost in a model (`in_model_ms`); `occurrences`: how many conv layers of the network have
    each layer's problem (env.json's run has them); `overhead_ms`: a swapped pass's cost per
    call (None: the backend's `SWAP_OVERHEAD_MS`). A machine's property, not a constraint on the
    choice, so it is no part of `Constraints`."""
    precision = choose_precision(df, precision)
    df = df[df["precision"] == precision]
    backends = list(dict.fromkeys(df["backend"]))
    if len(backends) != 1:
        raise ValueError(f"a plan is for one backend; the results have {', '.join(backends)}")
    if overhead_ms is None:
        overhead_ms = SWAP_OVERHEAD_MS[backends[0]]
    ok = df[df["status"].isin(TIMED)]
    keep = pd.Series(True, index=ok.index)
    excluded: Counter = Counter()
    for reason, mask in _exclusions(ok, constraints):
        excluded[reason] = int((keep & mask).sum())
        keep &= ~mask
    df = df.assign(candidate=False)
    df.loc[keep[keep].index, "candidate"] = True
    key = ["layer", *PROBLEM_FIELDS]
    layers = [(r["layer"], problem_from_row(r)) for _, r in df[key].drop_duplicates().iterrows()]
    names = Counter(name for name, _ in layers)
    if any(n > 1 for n in names.values()):
        name = next(name for name, n in names.items() if n > 1)
        raise ValueError(f"layer {name} appears with several problems (batches "
                         f"{', '.join(str(p.n) for lay, p in layers if lay == name)}); a plan "
                         "has one problem per layer: choose a batch")
    passes, left = {}, {}
    for (layer, *_, pass_), rows in df.groupby([*key, "pass"], sort=False):
        ranked = sorted((Candidate.from_row(r, in_model_ms(r, overhead_ms) - r["median_ms"])
                         for r in rows[rows["candidate"]]
                         .sort_values("median_ms", kind="stable").to_dict("records")),
                        key=lambda c: c.cost_ms)
        if not ranked:
            continue
        tie_break = constraints.tie_break
        by_layout = {lay: preferred(tied([c for c in ranked if c.layout == lay]), tie_break)
                     for lay in dict.fromkeys(c.layout for c in ranked)}
        ties = tied(ranked)
        best = preferred(ties, tie_break)
        torchs = _left_to_torch(rows, best, constraints)
        if torchs is not None:
            left[layer, pass_] = torchs, best
            continue
        runner_up = ranked[1] if len(ranked) > 1 else None
        cudnn = rows[(rows["algo"] == "cudnn") & rows["status"].isin(TIMED)
                     & (rows["layout"] == best.layout)]
        regret = float(cudnn["median_ms"].min()) / best.cost_ms - 1 if len(cudnn) else None
        passes[layer, pass_] = PassAdvice(
            layer, problem_from_row(rows.iloc[0]), pass_, by_layout, runner_up, regret, best,
            ranked[0], runner_up.ratio_to(ranked[0]) if runner_up else None, tuple(ties))
    measured = set(zip(df["layer"], df["pass"]))
    return Advice(backends[0], precision, constraints, layers, passes, measured, excluded,
                  dict(occurrences or {}), df[df["status"] == "inexact"].to_dict("records"), left,
                  overhead_ms)

# --- the network layout plan ----------------------------------------------------------------
def layer_costs(advice: Advice, default_layout: str = "nchw") -> list[dict[str, float]]:
    """Per layer, each layout in which every pass with a candidate has one, and the sum of
    those passes' best costs in a model in it, times the layer's occurrences: layouts are
    chosen by what the choices cost where they run, as the choices are. A layer with no such
    layout has nothing to plan: it stays in `default_layout` at no cost."""
    costs = []
    for layer, _ in advice.layers:
        advised = [a for p in PASSES if (a := advice.passes.get((layer, p)))]
        common = set(LAYOUTS).intersection(*(a.by_layout for a in advised)) if advised else set()
        costs.append({lay: advice.count(layer) * sum(a.by_layout[lay].cost_ms
                                                      for a in advised)
                      for lay in LAYOUTS if lay in common} or {default_layout: 0.0})
    return costs


@dataclass(frozen=True)
class Boundary:
    """The activation entering a layer (or leaving the last): its NCHW dims, whether its
    gradient crosses back (then a conversion is paid both ways), and how many times the network
    has it (the layer's occurrences: each is entered on its own)."""

    shape: tuple[int, int, int, int]
    grad: bool
    count: int = 1


def boundaries(advice: Advice) -> list[Boundary]:
    """Boundary i is layer i's input, converted when layer i's layout differs from the one
    before, once per occurrence of the layer; its gradient crosses back when layer i computes
    bwd_data (a pass measured is a pass needed). The last boundary is the network's output, whose gradient reaches the last layer
    when that layer has a backward pass."""
    out = [Boundary(problem.x_shape(), (layer, "bwd_data") in advice.measured,
                    advice.count(layer)) for layer, problem in advice.layers]
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
        return b.count * (conversions[b.shape, src, dst]
                          + (conversions[b.shape, dst, src] if b.grad else 0))

    return cost


def conversion_table(entries: list[dict]) -> dict[ConversionKey, float]:
    """Conversion entries (a plan's `conversions`) as the DP's lookup table."""
    return {(tuple(e["shape"]), e["from"], e["to"]): e["median_ms"] for e in entries}

def build_plan(advice: Advice, env: dict, conversions: list[dict] | None, *,
               measurements: list[dict], unplanned: list[Unplanned] = (),
               input_layout: str = "nchw", output_layout: str = "nchw") -> Plan:
    """The plan: layouts from the network DP over measured `conversions` (each layer's own
    best layout when they are None: they could not be measured), then each pass's best in its
    layer's layout. A choice keeps its measured time (`Choice.median_ms`, what the store and
    the plan's totals without a network read); the network's totals are costs in a model."""
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
    notes = {(e["problem"], e["pass"], e["algo"], e["layout"]): e.get("note", "")
             for e in measurements}
    layers = []
    for (layer, problem), layout in zip(advice.layers, layouts):
        passes = {}
        for p in PASSES:
            a = advice.passes.get((layer, p))
            cand = a.by_layout.get(layout) if a else None
            pin = cand and Pin.of(cand.algo, p, advice.precision,
                                  notes.get((problem, p, cand.algo, layout), ""),
                                  env.get("cudnn"))
            passes[p] = (Choice(cand.algo, cand.backend, cand.median_ms, cand.iqr_ms, pin)
                         if cand else None)
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


def verdict(a: PassAdvice, tie_break: str) -> str:
    """Whether the fastest wins, and if not, which tie-break chose among whom."""
    if a.runner_up is None:
        return "only candidate"
    if not a.within_noise:
        return "wins"
    others = [f"{c.algo} {c.layout}" for c in a.tied if c is not a.best]
    how = "" if a.best is a.fastest else f", {tie_break} tie-break"
    return f"tie within noise with {', '.join(others)}{how}"


def compared(a: PassAdvice) -> tuple[Candidate, str, stats.Ratio | None]:
    """The choice, what it is compared with, and the ratio of the slower's median to the
    faster's with its interval: the runner-up where the choice is the fastest, else (a
    tie-break chose another of the tied) the fastest itself."""
    if a.best is a.fastest:
        up = a.runner_up
        return a.best, f"{up.algo} {up.layout}" if up else "", a.ratio
    f = a.fastest
    return a.best, f"{f.algo} {f.layout} (the fastest)", a.best.ratio_to(f)


def _regret_shown(advice: Advice) -> bool:
    """cuDNN's regret is a GPU's: on the CPU there is no cuDNN to regret."""
    return advice.backend == "cuda"


def _regret_cell(advice: Advice, a: PassAdvice) -> str:
    """The regret, marked `INEXACT` where the heuristic's pick it is of was `inexact`."""
    inexact = any(r["algo"] == "cudnn" and r["layer"] == a.layer and r["pass"] == a.pass_
                  and r["layout"] == a.best.layout for r in advice.inexact)
    text = _pct(a.regret)
    return f"{INEXACT}{text}" if inexact and text else text


def inexact_lines(advice: Advice) -> list[str]:
    """A sentence per `inexact` row: a library's result beyond its tolerance, timed and kept as
    the baseline, and why no plan takes it (or that `--max-error` let it compete)."""
    if not advice.inexact:
        return []
    allowed = advice.constraints.max_error
    why = ("a candidate only within --max-error" if allowed is not None else
           "kept as the baseline and never chosen (--max-error admits one within it)")
    left = [f"- {layer} {p}: left to torch, whose inexact pick {t.algo} {t.layout} "
            f"({fmt_ms(t.median_ms)} ms) is decidedly faster than the best admissible choice, "
            f"{b.algo} {b.layout} ({fmt_ms(b.cost_ms)} ms in a model)."
            for (layer, p), (t, b) in advice.left_to_torch.items()]
    return [f"`{INEXACT}` inexact, timed but above its tolerance, {why}:",
            *(f"- {sentence(r)}." for r in advice.inexact), *left, ""]


def advice_table(advice: Advice) -> str:
    """Per layer and pass: the choice, its measured time and its cost in a model (what it was
    chosen by), the runner-up and the ratio of their costs with its interval, whether the
    fastest wins or ties, and on a GPU cuDNN's regret."""
    regret = _regret_shown(advice)
    rows = []
    for layer, _ in advice.layers:
        for p in PASSES:
            a = advice.passes.get((layer, p))
            if a is None:
                none = ("(left to torch: its inexact pick is faster)"
                        if (layer, p) in advice.left_to_torch else
                        "(none admissible)" if (layer, p) in advice.measured else "(not measured)")
                rows.append([layer, p, none, "", "", "", "", "", "", *([""] if regret else [])])
                continue
            best, other, ratio = compared(a)
            rows.append([layer, p, best.algo, best.layout, fmt_ms(best.median_ms),
                         fmt_ms(best.cost_ms), other, ratio.text() if ratio else "",
                         verdict(a, advice.constraints.tie_break),
                         *([_regret_cell(advice, a)] if regret else [])])
    return tabulate(rows, headers=["layer", "pass", "best", "layout", "median ms",
                                   "in a model ms", "compared with", "slower / faster", "verdict",
                                   *(["cudnn regret"] if regret else [])],
                    tablefmt="github", disable_numparse=True)


def plan_table(plan: Plan, occurrences: dict[str, int] | None = None) -> str:
    """Per layer: the layout the network plan chose (and each layer's own best), the algorithm
    of each pass, and the layer's time in that layout; with `occurrences` (a network whose
    problems repeat), how many times the network has each."""
    best = plan.network.per_layer_best_layouts if plan.network else [""] * len(plan.layers)
    rows = []
    for lp, own in zip(plan.layers, best):
        chosen = [c for c in lp.passes.values() if c is not None]
        rows.append([lp.layer, *([occurrences.get(lp.layer, 1)] if occurrences else []), own,
                     lp.layout, *[c.algo if c else "torch default" for c in lp.passes.values()],
                     fmt_ms(sum(c.median_ms for c in chosen)) if chosen else ""])
    headers = ["layer", *(["occurrences"] if occurrences else []), "per-layer best layout",
               "network plan layout", *PASSES, "ms" + (" (one occurrence)" if occurrences
                                                       else "")]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def plan_text(plan: Plan, advice: Advice) -> str:
    """What `convbench advise` prints: the advice, the plan, totals, exclusions."""
    out = [f"## Per-layer best ({advice.backend}, {advice.precision})", "", advice_table(advice),
           "", ("in a model ms: the choice's predicted cost in a model, which advice compares: "
                f"a swapped pass (not torch's own) pays {fmt_ms(advice.overhead_ms)} ms a call "
                "for the module, "
                + ("the larger of its device time and its host's issue time plus that"
                   if advice.backend == "cuda" else "on top of its time")
                + "; torch's own pass its time as measured. "
                "compared with: the runner-up, or the fastest where a tie-break chose another "
                "of those tied with it; slower / faster: the ratio of their costs with its 95% "
                "interval (bootstrap, paired by round where they were timed side by side); the "
                "fastest wins only where the interval excludes 1, else it is a tie within noise "
                f"and the {advice.constraints.tie_break} tie-break chooses among the tied"
                + ("; cudnn regret: how much slower cuDNN's heuristic pick is than the best, in "
                   "the same layout." if _regret_shown(advice) else ".")),
           ""]
    dropped = [f"{n} {reason}" for reason, n in advice.excluded.items() if n]
    if dropped:
        out += ["Not candidates: " + "; ".join(dropped) + ".", ""]
    out += inexact_lines(advice)
    out += ["## Network layout plan", "", plan_table(plan, advice.occurrences), ""]
    if advice.occurrences:
        out += [(f"{sum(map(advice.count, dict(advice.layers)))} conv layers, "
                 f"{len(advice.layers)} distinct problems: each problem's passes and the "
                 "conversions into it count once per occurrence in the totals, as the run's "
                 "report weighs them."), ""]
    if plan.network:
        n = plan.network
        out.append(f"Network plan: {n.total_ms:.4g} ms per step of conv passes in a model, "
                   f"{n.conversion_ms:.4g} ms of it NCHW<->NHWC conversions. Each layer's own "
                   f"best layout ({', '.join(n.per_layer_best_layouts)}) would cost "
                   f"{n.per_layer_best_ms:.4g} ms with its conversions.")
    for u in plan.unplanned:
        out.append(f"- {u.layer}: left as it is ({u.reason})")
    for check in plan.checks:
        out += ["", f"Measured on the model's whole {check.text()}."
                + (f" Dropped, the step not faster with them"
                   f"{' (torch runs them in the layouts kept)' if check.layouts_kept else ''}"
                   f": {', '.join(check.dropped)}." if check.dropped else "")]
    return "\n".join(out)


def plan_total_ms(plan: Plan, occurrences: dict[str, int] | None = None) -> float:
    """A training step's conv passes under the plan: the network total (conversions included,
    each layer weighed by its occurrences) where there is one, else the sum of the chosen passes
    times their layer's `occurrences`."""
    if plan.network:
        return plan.network.total_ms
    occurrences = occurrences or {}
    return sum(occurrences.get(lp.layer, 1) * c.median_ms for lp in plan.layers
               for c in lp.passes.values() if c is not None)


def constraint_cost(plan: Plan, free: Plan, occurrences: dict[str, int] | None = None) -> str:
    """One line: what the constraints cost a training step, against the unconstrained `free`
    plan of the same results (a pass left without a choice counts as nothing, and is named)."""
    ours, best = plan_total_ms(plan, occurrences), plan_total_ms(free, occurrences)
    line = (f"The constraints ({plan.constraints.describe()}) cost {ours - best:.4g} ms per step "
            f"of conv passes: {ours:.4g} ms against {best:.4g} ms unconstrained "
            f"({_pct((ours - best) / best) if best else 'n/a'}).")
    lost = [f"{lp.layer} {p}" for lp in plan.layers for p, c in lp.passes.items() if c is None]
    if lost:
        line += (f" No choice fits for {', '.join(lost)}: torch's default runs them, not counted "
                 "in the total.")
    return line

