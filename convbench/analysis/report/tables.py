"""The report's tables, each a pure function of the results frame (`results.frame`) returning a
DataFrame: which (algorithm, layout) wins each layer and pass, the times, the busy and
host-bound rows, the operation counts, workspace, peak memory, accuracy, what did not run, the
phase breakdown and a network's cost.

Tables are data so they can be tested, compared and rendered apart from the prose (`prose`
turns them into report.md). Rows measured on a busy machine do not compete for a win, nor do
`inexact` ones (a library's result beyond its tolerance): those are shown with their time and
mark wherever times are, and a baseline (an algorithm's own total) keeps them, but no fastest,
win or best is theirs. Every (layer, pass) measured has its row, a pair with nothing to
compete `not decided` and why, so none goes missing unsaid.
"""

from __future__ import annotations

import math

import pandas as pd

from ...algos.phases import APART, CONVOLUTION, FUSED
from ...core.fmt import fmt_error, fmt_gflop, fmt_mib, fmt_ms, fmt_ratio
from ...core.measurement import CONTENDED_SHARE, Measurement
from ...core.problem import PASSES
from ...core.results import KEY, TIMED, parse_phases
from .. import ranking, speedup
from ..inexact import INEXACT
from .cells import BEST, TIED, algo_order, flag, host_bound, layer_order, marks, order


def host_bound_table(df: pd.DataFrame) -> pd.DataFrame:
    """The host-bound measurements: their device and host medians."""
    ok = df[df["status"].isin(TIMED)]
    rows = ok[[host_bound(r) for _, r in ok.iterrows()]] if len(ok) else ok
    return pd.DataFrame({"median ms": rows["median_ms"].map(fmt_ms).values,
                         "host ms": rows["host_ms"].map(fmt_ms).values},
                        index=pd.MultiIndex.from_frame(
                            rows[["layer", "algo", "pass", "layout"]]))


def _standing(ok: pd.DataFrame) -> dict:
    """Row index -> BEST for a fastest that wins beyond noise, TIED for the fastest and each
    time tied with it where it does not (rows measured on a busy machine do not compete)."""
    fair = ok[~ranking.busy_mask(ok)]
    if fair.empty:
        return {}
    order = fair.sort_values("median_ms", kind="stable")
    ranked = ranking.rank(order)
    if len(ranked) == 1:
        return {order.index[0]: BEST}
    tied = ranking.tied(ranked)
    if len(tied) == 1:
        return {order.index[0]: BEST}
    ids = {id(c) for c in tied}
    return {i: TIED for i, c in zip(order.index, ranked) if id(c) in ids}


def time_table(df: pd.DataFrame) -> pd.DataFrame:
    """Rows algo, columns layer, cells the median ms, the fastest `ok` time per column marked
    as a win or a tie, times that may be wrong (an `inexact` result's too) prefixed, for the
    rows of one pass, layout and precision."""
    cells = pd.DataFrame("", index=pd.Index(algo_order(df), name="algo"), columns=layer_order(df))
    for layer, rows in df.groupby("layer", sort=False):
        standing = _standing(rows[rows["status"] == "ok"])
        for i, r in rows.iterrows():
            if r["status"] not in TIMED:
                cells.loc[r["algo"], layer] = r["status"]
                continue
            cells.loc[r["algo"], layer] = (marks(r) + fmt_ms(r["median_ms"])
                                           + standing.get(i, ""))
    return cells


def _not_run(rows: pd.DataFrame) -> str:
    """The algorithms with no timed row among `rows`, grouped by status: `fft, winograd-2x2
    unsupported`."""
    ran = set(rows.loc[rows["status"].isin(TIMED), "algo"])
    by_status: dict[str, list[str]] = {}
    for algo, status in zip(rows["algo"], rows["status"]):
        if algo not in ran and status not in TIMED:
            by_status.setdefault(status, [])
            if algo not in by_status[status]:
                by_status[status].append(algo)
    return "; ".join(f"{', '.join(algos)} {status}" for status, algos in by_status.items())


#: The verdict of a (layer, pass) whose verified times were all measured on a busy machine,
#: and of one with no verified time at all.
UNDECIDED_BUSY = "not decided: measured on a busy machine"
UNDECIDED_NONE = "not decided: nothing ran verified"
#: The verdict of a (layer, pass) whose torch convolution (the baseline every other time is
#: read against) was measured on a busy machine only: the fastest of the rest wins nothing.
UNDECIDED_BASELINE = "not decided: torch's convolution measured on a busy machine only"


def _baseline_set_aside(ok: pd.DataFrame) -> bool:
    """Whether torch's convolution (`speedup.is_torchs`) ran verified among `ok` but only on
    a busy machine: set aside, it may be faster than whatever is left."""
    torch = ok[ok["algo"].map(speedup.is_torchs)]
    return bool(len(torch)) and bool(ranking.busy_mask(torch).all())


def winner_table(df: pd.DataFrame, peak_gflops: float | None = None,
                 peak_name: str = "peak") -> pd.DataFrame:
    """Per layer and pass (of one precision), across algorithms and layouts: the fastest, its
    median and interval, the runner-up, the ratio of their medians with its interval, whether
    the fastest wins or ties (and with what), its GFLOP/s and share of the device's peak
    (`peak_gflops`, where known; `peak_name` says which), and the algorithms that did not run,
    by status. Rows measured on a busy machine do not compete, nor `inexact` ones (named in the
    verdict with their time); every (layer, pass) measured has its row, a pair with nothing to
    compete `not decided` and why, so none goes missing from the table unsaid. Where torch's
    convolution was set aside as busy, the fastest of what remains wins nothing
    (`UNDECIDED_BASELINE`): the time every other is read against is not known."""
    out = []
    for (layer, pass_), rows in df.groupby(["layer", "pass"], sort=False):
        ok = rows[rows["status"] == "ok"]
        fair = ok[~ranking.busy_mask(ok)]
        ranked = ranking.rank(fair)
        inexact = rows[rows["status"] == "inexact"]
        apart = ("; not competing (inexact): " + ", ".join(
            f"{a} {lay} {INEXACT}{fmt_ms(ms)}"
            for a, lay, ms in zip(inexact["algo"], inexact["layout"], inexact["median_ms"]))
            if len(inexact) else "")
        if not ranked:
            out.append({"layer": layer, "pass": pass_, "verdict": (UNDECIDED_BUSY if len(ok)
                        else UNDECIDED_NONE) + apart, "did not run": _not_run(rows)})
            continue
        busy = ok[ranking.busy_mask(ok)]
        set_aside = _baseline_set_aside(ok)
        ok = fair
        first = ranked[0]
        row = ok.sort_values("median_ms", kind="stable").iloc[0]
        interval = Measurement(first.times).interval if len(first.times) else None
        gflops = row["gflops"]
        cell = {"layer": layer, "pass": pass_, "fastest": f"{first.algo} {first.layout}",
                "median ms": fmt_ms(first.median_ms)
                + (f" [{fmt_ms(interval[0])}, {fmt_ms(interval[1])}]" if interval else ""),
                "GFLOP/s": "" if pd.isna(gflops) else f"{gflops:.4g}"
                + (f" ({gflops / peak_gflops:.0%} of {peak_name})" if peak_gflops else ""),
                "runner-up": "", "runner-up / fastest": "", "verdict": "only candidate"}
        if len(ranked) > 1:
            up = ranked[1]
            tied = ranking.tied(ranked)
            cell.update({"runner-up": f"{up.algo} {up.layout}",
                         "runner-up / fastest": up.ratio_to(first).text(),
                         "verdict": "wins" if len(tied) == 1 else "tie within noise with "
                         + ", ".join(f"{c.algo} {c.layout}" for c in tied[1:])})
        if set_aside:
            cell["verdict"] = UNDECIDED_BASELINE
        if len(busy):
            cell["verdict"] += "; not competing (busy machine): " + ", ".join(
                f"{a} {lay}" for a, lay in zip(busy["algo"], busy["layout"]))
        cell["verdict"] += apart
        cell["did not run"] = _not_run(rows)
        out.append(cell)
    if not out:
        return pd.DataFrame()
    columns = ["layer", "pass", "fastest", "median ms", "GFLOP/s", "runner-up",
               "runner-up / fastest", "verdict", "did not run"]
    return pd.DataFrame([{c: cell.get(c, "") for c in columns} for cell in out],
                        columns=columns).set_index(["layer", "pass"])


def flagged_by(r) -> str:
    """Which rule flagged a busy row, so none looks flagged for nothing: `Measurement.contended`'s
    (median share below `CONTENDED_SHARE`; the hypervisor's steal taking it below; else, noisy,
    its lower quartile below), or throttled GPU clocks. The row does not record the rule: it is
    read back from the row's share, stolen and noisy columns."""
    why = []
    share = r.get("cpu_share")
    share = None if share is None or pd.isna(share) else float(share)
    stolen = r.get("stolen")
    stolen = 0.0 if stolen is None or pd.isna(stolen) else float(stolen)
    if r.get("contended") is True:
        kept = 1 - stolen  # what the hypervisor left this machine
        if share is not None and share < CONTENDED_SHARE:
            why.append(f"cores shared (share {share:.2f})"
                       + (f", {stolen:.0%} stolen" if stolen else ""))
        elif (1.0 if share is None else share) * kept < CONTENDED_SHARE:
            why.append(f"stolen {stolen:.0%}" + ("" if share is None else
                       f" (share {share:.2f} x {kept:.2f} left = {share * kept:.2f})"))
        elif flag(r.get("noisy")):
            why.append("a quarter of its repetitions or more ran on a busy machine (noisy; "
                       f"its lower-quartile share x what was left below {CONTENDED_SHARE:.2f})")
        else:
            why.append("contended (which rule is not recorded)")
    throttled = r.get("throttled")
    if isinstance(throttled, str) and throttled:
        why.append(f"GPU clocks held down ({throttled})")
    return "; ".join(why)


def busy_table(df: pd.DataFrame) -> pd.DataFrame:
    """The rows measured on a busy machine: their median, the share of their threads' ready
    time they spent on a core and the share of the machine's busy time the hypervisor stole
    (CPU), or why the GPU's clocks were held down, and which rule flagged each (`flagged_by`)."""
    ok = df[df["status"].isin(TIMED)]
    rows = ok[ranking.busy_mask(ok)]
    share = (lambda v: "" if pd.isna(v) else f"{v:.2f}")
    # a run folder from before the column has none
    stolen = rows["stolen"] if "stolen" in rows else pd.Series(math.nan, index=rows.index)
    return pd.DataFrame({"median ms": rows["median_ms"].map(fmt_ms).values,
                         "cpu share": rows["cpu_share"].map(share).values,
                         "stolen": stolen.map(share).values,
                         "throttled": rows["throttled"].values,
                         "flagged by": [flagged_by(r) for r in rows.to_dict("records")]},
                        index=pd.MultiIndex.from_frame(rows[["layer", "algo", "pass", "layout"]]))


def _per_algo_pass(df: pd.DataFrame, value: str, fmt) -> pd.DataFrame:
    """Rows (algo, pass), columns layer: `value` (the worst over layouts), formatted."""
    agg = df.groupby(["algo", "pass", "layer"], sort=False)[value].max()
    index = pd.MultiIndex.from_tuples(
        [(a, p) for a in algo_order(df) for p in order(df["pass"]) if (a, p) in
         agg.index.droplevel("layer")], names=["algo", "pass"])
    return pd.DataFrame({layer: [fmt(agg.get((a, p, layer), math.nan)) for a, p in index]
                         for layer in layer_order(df)}, index=index)


def op_table(df: pd.DataFrame) -> pd.DataFrame:
    """Theoretical GFLOP of each algorithm per layer and pass (n/a: no count, or the algorithm
    cannot run the layer)."""
    can = df[df["status"] != "unsupported"]
    return _per_algo_pass(df.assign(algo_ops=can["algo_ops"]), "algo_ops", fmt_gflop)


def workspace_table(df: pd.DataFrame) -> pd.DataFrame:
    """Workspace in MiB of the measured cases (the larger over layouts)."""
    return _per_algo_pass(df[df["status"].isin(TIMED)], "workspace_bytes", fmt_mib)


def peak_table(df: pd.DataFrame) -> pd.DataFrame:
    """Measured peak MiB beyond the operands of the measured cases (the larger over layouts)."""
    return _per_algo_pass(df[df["status"].isin(TIMED)], "peak_bytes", fmt_mib)


def error_table(df: pd.DataFrame) -> pd.DataFrame:
    """Relative error against the float64 reference (the larger over layouts), for the rows of
    one precision: errors at different precisions are not comparable."""
    return _per_algo_pass(df[df["rel_error"].notna()], "rel_error", fmt_error)


def error_ratios(df: pd.DataFrame, algo: str, baseline: str) -> pd.Series:
    """`algo`'s relative error over `baseline`'s on every row key (less the algo) where both
    have a finite error and the baseline's is not zero."""
    key = [c for c in KEY if c != "algo"]
    errors = df[df["rel_error"].abs() < math.inf]  # neither NaN nor inf
    a, b = (errors[errors["algo"] == name].set_index(key)["rel_error"]
            for name in (algo, baseline))
    b = b[b > 0]
    return (a / b).dropna()


def where(cases: list[tuple[str, str, str]], per_layer: int) -> str:
    """(layer, pass, layout) triples in few words: a layer all of whose `per_layer` cases are
    listed is named alone, others with their passes and layouts."""
    by_layer: dict[str, list[str]] = {}
    for layer, pass_, layout in cases:
        by_layer.setdefault(layer, []).append(f"{pass_} {layout}")
    return "; ".join(layer if len(what) == per_layer else f"{layer} {', '.join(what)}"
                     for layer, what in by_layer.items())


def not_measured(df: pd.DataFrame) -> pd.DataFrame:
    """Each distinct (status, algo, reason) once, with where it applied: the rows not timed
    (an `inexact` row was: `prose` says its error apart)."""
    per_layer = len(df[["pass", "layout", "precision"]].drop_duplicates())
    bad = df[~df["status"].isin(TIMED)]
    groups = bad.groupby(["status", "algo", "reason"], sort=False)
    return groups.apply(lambda g: where(list(zip(g["layer"], g["pass"], g["layout"])),
                                        per_layer)).to_frame("where")


#: The phase that is the product; every other phase is a transform (inputs or output).
PRODUCT = "product"


def phase_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The measured rows whose algorithm has phases, with `phases` (the parsed {phase: ms})
    added. A library's call and the copy of its result (torch's, `_aten`) is no breakdown of an
    algorithm: its copy is in the row's note."""
    rows = df[df["status"].isin(TIMED) & (df["phases_ms"] != "")]
    rows = rows.assign(phases=rows["phases_ms"].map(parse_phases))
    return rows[[not set(p) <= {CONVOLUTION, *APART} for p in rows["phases"]]]


def product_share(phases: dict[str, float]) -> float:
    total = sum(phases.values())
    return phases.get(PRODUCT, 0.0) / total if total > 0 else 0.0


def _dominant(phases: dict[str, float]) -> str:
    """Which takes more of the phases' time, the transforms together or the product, and its
    share; for a fused kernel, its share (its transforms and product are not apart)."""
    if FUSED in phases:
        total = sum(phases.values())
        return f"{FUSED} {phases[FUSED] / total:.0%}" if total > 0 else FUSED
    share = product_share(phases)
    return f"{PRODUCT} {share:.0%}" if share > 0.5 else f"transforms {1 - share:.0%}"


def phase_table(rows: pd.DataFrame) -> pd.DataFrame:
    """For the rows of one algo, pass and precision from `phase_frame`: rows (layer, layout),
    each phase's median ms and share of the phases' sum, the sum, the whole pass's median, and
    whether the transforms or the product dominate."""
    names = order(name for phases in rows["phases"] for name in phases)
    index = pd.MultiIndex.from_tuples(list(zip(rows["layer"], rows["layout"])),
                                      names=["layer", "layout"])
    cells = []
    for _, r in rows.iterrows():
        phases, total = r["phases"], sum(r["phases"].values())
        cells.append([f"{fmt_ms(phases[n])} ({phases[n] / total:.0%})" if n in phases and total
                      else "" for n in names]
                     + [fmt_ms(total), fmt_ms(r["median_ms"]), _dominant(phases)])
    return pd.DataFrame(cells, index=index,
                        columns=[*names, "phases ms", "pass ms", "dominant"])


def _fastest(ok: pd.DataFrame) -> pd.DataFrame:
    """The fastest verified row of each (layer, pass), any algo and layout."""
    return ok.loc[ok.groupby(["layer", "pass"], sort=False)["median_ms"].idxmin()]


def cost_table(df: pd.DataFrame, occurrences: dict[str, int]) -> pd.DataFrame:
    """Per problem (layer): how often the network has it, its fastest verified (`ok`) algorithm
    and layout per pass, and what it costs the network (time x occurrences, summed over the
    passes), the costliest first."""
    fastest = _fastest(df[df["status"] == "ok"])
    rows = []
    for layer, best in fastest.groupby("layer", sort=False):
        count = occurrences.get(layer, 1)
        cells = {r["pass"]: f"{fmt_ms(r['median_ms'])} {r['algo']} {r['layout']}"
                 for _, r in best.iterrows()}
        rows.append({"layer": layer, "occurrences": count,
                     **{p_: cells.get(p_, "") for p_ in PASSES if p_ in set(df["pass"])},
                     "network ms": best["median_ms"].sum() * count})
    table = pd.DataFrame(rows).sort_values("network ms", ascending=False, kind="stable")
    total = table["network ms"].sum()
    table["share"] = (table["network ms"] / total).map(lambda v: f"{v:.0%}")
    table["network ms"] = table["network ms"].map(fmt_ms)
    return table.set_index("layer")


def choice_totals(df: pd.DataFrame, occurrences: dict[str, int]) -> pd.DataFrame:
    """The network's total (every measured pass of every problem, times its occurrences) for
    each algorithm used throughout, each layer in its faster layout, and for the fastest
    verified (`ok`) choice per layer and pass; an algorithm that cannot run some problem has no
    total, only a count of what it lacks. An algorithm's own total keeps its `inexact` times
    (torch's, as it runs), marked: it is a baseline, not a choice."""
    timed = df[df["status"].isin(TIMED)]
    needed = df[["layer", "pass"]].drop_duplicates()
    weight = needed["layer"].map(lambda layer: occurrences.get(layer, 1))
    fastest = _fastest(timed[timed["status"] == "ok"])
    best_total = float((fastest["median_ms"] * fastest["layer"].map(
        lambda layer: occurrences.get(layer, 1))).sum())
    rows = [{"choice": "fastest per layer and pass", "network ms": fmt_ms(best_total),
             "x fastest": fmt_ratio(1.0), "covers": f"{len(fastest)} of {len(needed)}"}]
    for algo in algo_order(df):
        mine = timed[timed["algo"] == algo]
        own = mine.groupby(["layer", "pass"], sort=False)["median_ms"].min()
        mark = INEXACT if (mine["status"] == "inexact").any() else ""
        covered = len(own)
        if covered < len(needed):
            rows.append({"choice": algo, "network ms": "", "x fastest": "",
                         "covers": f"{covered} of {len(needed)}"})
            continue
        total = float(sum(own[layer, p_] * w for (layer, p_), w
                          in zip(needed.itertuples(index=False), weight)))
        rows.append({"choice": algo, "network ms": mark + fmt_ms(total),
                     "x fastest": fmt_ratio(total / best_total), "covers": f"{covered} of "
                     f"{len(needed)}"})
    return pd.DataFrame(rows).set_index("choice")


def many_problems(df: pd.DataFrame) -> bool:
    """Whether a run has problems enough for the sorted speed-up picture."""
    return df["layer"].nunique() >= speedup.MIN_PROBLEMS


def baseline_of(df: pd.DataFrame, env: dict, baseline: str | None) -> str:
    """The baseline given, else cuDNN autotune on a GPU run, torch-cpu on a CPU run."""
    return baseline or speedup.default_baseline(env.get("run", {}).get("backend")
                                                or order(df["backend"])[0])


def _interval(r) -> str:
    """`0.61 [0.58, 0.62]`: a time ratio and its 95% interval, two decimals (the README's)."""
    if pd.isna(r["ratio"]):
        return ""
    return f"{r['ratio']:.2f}" + ("" if pd.isna(r["low"]) else
                                  f" [{r['low']:.2f}, {r['high']:.2f}]")


def _pick(r, side: str) -> str:
    """`winograd-4x4 nhwc 1.23 ms`: one side's fastest algorithm, its layout and median,
    marked where torch's is `inexact`."""
    if not r[side]:
        return ""
    mark = INEXACT if side == "torch" and flag(r.get("torch_inexact")) else ""
    return f"{r[side]} {r[f'{side}_layout']} {mark}{fmt_ms(r[f'{side}_ms'])} ms"


def torch_table(vs: pd.DataFrame, wide: bool) -> pd.DataFrame:
    """`speedup.against_torch`'s rows of one precision as a table. `wide` (a run of few
    layers), the README's shape: a row per pass of ratios, columns the layers, then per pass a
    row naming our best and torch's fastest; else a row per (layer, pass)."""
    if not wide:
        return _side_by_side(vs, list(vs["outcome"]), "faster")
    layers, passes = order(vs["layer"]), order(vs["pass"])
    torch = order(a for a in vs["torch"] if a)
    corner = f"best own / {torch[0] if len(torch) == 1 else 'torch'} [95% interval]"
    by = {(r["layer"], r["pass"]): r for _, r in vs.iterrows()}

    def line(pass_: str, cell) -> list[str]:
        return [cell(by[layer, pass_]) if (layer, pass_) in by else "" for layer in layers]

    out = {p: line(p, _interval) for p in passes}
    for p in passes:
        out[f"{p}: best own"] = line(p, lambda r: _pick(r, "own"))
        out[f"{p}: torch's"] = line(p, lambda r: _pick(r, "torch"))
    return pd.DataFrame.from_dict(out, orient="index", columns=layers).rename_axis(corner)


def _side_by_side(vs: pd.DataFrame, outcome: list[str], name: str) -> pd.DataFrame:
    """A row per (layer, pass) of `speedup.against_torch`'s `vs`: our best and torch's fastest,
    the ratio with its interval, and `outcome` in a column called `name`."""
    cells = {"best own": [_pick(r, "own") for _, r in vs.iterrows()],
             "torch's": [_pick(r, "torch") for _, r in vs.iterrows()],
             "own / torch [95% interval]": [_interval(r) for _, r in vs.iterrows()],
             name: outcome}
    return pd.DataFrame(cells, index=pd.MultiIndex.from_frame(vs[["layer", "pass"]]))


#: A verdict of ours against torch's, by `speedup.against_torch`'s outcome.
VERDICTS = {"ours": "ours faster", "torch": "torch's faster", "tie": "tie within noise"}
#: The start of every verdict where no comparison was left.
NOT_DECIDED = "not decided"


def _undecided(rows: pd.DataFrame) -> str:
    """Why one (layer, pass)'s rows set none of ours against torch's: the side with no fair
    verified time, taken by a busy machine or by its statuses (`oom`, `failed`, ...)."""
    why = []
    for side, belongs in (("ours", speedup.is_ours), ("torch's", speedup.is_torchs)):
        mine = rows[rows["algo"].map(belongs)]
        ok = mine[mine["status"] == "ok"]
        if ok.empty:
            why.append(f"{side} did not run ({_not_run(mine)})")
        elif ranking.busy_mask(ok).all():
            why.append(f"{side} measured on a busy machine only")
    if len(why) == 2 and all(w.endswith("busy machine only") for w in why):
        why = ["both measured on a busy machine only"]
    return f"{NOT_DECIDED}: " + "; ".join(why)


def verdict_table(df: pd.DataFrame) -> pd.DataFrame:
    """The answer `convbench layer` ends on, for the rows of one precision: per (layer, pass),
    the fastest of ours against torch's fastest, each in its faster layout, the ratio of their
    medians with its 95% interval and who is faster (`speedup.against_torch`, the report's "Best
    of ours against torch"), or `NOT_DECIDED` and why where either side has no fair verified
    time: a faster time a busy machine spoiled would make any winner named there a guess. Empty
    where the run measured only one side."""
    vs = speedup.against_torch(df)
    groups = dict(list(df.groupby(["layer", "pass"], sort=False)))
    verdicts = [VERDICTS.get(r["outcome"]) or _undecided(groups[r["layer"], r["pass"]])
                for _, r in vs.iterrows()]
    return _side_by_side(vs, verdicts, "verdict")
