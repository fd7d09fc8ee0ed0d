"""Results table -> what people read: markdown tables and plots (the CSV and JSON forms are
`results`'s; two runs side by side are `compare`'s; a run of many problems adds `speedup`'s
sorted speed-ups over a baseline).

The tables are the study's view of the data: for each pass and layout, rows are algorithms and
columns are layers, the fastest in each column marked with `*` where it wins beyond noise (as
PyTorch's `Compare` marks the best; `ranking`'s rule: the interval of its ratio to the runner-up
excludes 1), else `=` on it and on each time tied with it; a number that may be wrong carries
its mark (`~` noisy, `!` host-bound, `#` busy machine); cases that did not run say why in one word
(`unsupported`, `failed`, `oom`), with the reasons listed once below. First of all, which
(algorithm, layout) wins each layer and pass, by how much, with the ratio's interval. Beside the times: the theoretical operation counts (the study's
"kernel operation counts" figure), the workspace declared and the peak memory measured, the
accuracy against the float64 reference (with the error ratios the algorithms' math predicts,
such as Winograd F(4x4) against F(2x2), computed from the data), and, for the algorithms with
phases (FFT, Winograd), where each pass's time goes — each phase's share, as NNPACK's benchmark
prints it, so a reader sees per layer whether the transforms or the product are the bottleneck.

Against the device's ceilings (env.json's `ceilings`, `measure.ceilings`), stated in the
header: each verified fp32 row's rate as a share of the attainable fp32 ceiling, in direct
flops and in the algorithm's own operations, and whether its intensity puts it under the
compute or the memory roof (How far from the roof, and `roofline.png`). A run folder from
before the ceilings renders as before, saying they were not measured.

A batch sweep (several batch sizes of a layer) reads differently: `sweepreport` renders it
with this module's header and notes; `runs.write_report` picks which renders a run folder.

Everything here reads the results table only (`results.frame` of a run's rows), so a run folder
can be re-rendered any time (`convbench report RUN`). Plots need matplotlib (the `plot` extra);
without it the report says so and carries on.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..algos import registry
from ..algos.phases import APART, CONVOLUTION, FUSED
from ..core.fmt import (
    NO_MATPLOTLIB,
    fmt_error,
    fmt_gflop,
    fmt_mib,
    fmt_ms,
    fmt_ratio,
    md_table,
    pyplot,
    save_figure,
    tabulate,
)
from ..core.measurement import CONTENDED_SHARE, NOISE_THRESHOLD, Measurement, is_host_bound
from ..core.problem import PASSES
from ..core.results import KEY, RESULTS_CSV, parse_phases, problem_from_row
from ..machine import contention
from ..machine.devices import DEVICES
from ..measure import ceilings as ceilings_
from ..measure import memory
from . import ranking, speedup

REPORT_MD = "report.md"
#: Suffix of a column's fastest time where it wins beyond noise, and of every time tied with
#: the fastest where it does not.
BEST, TIED = " *", " ="
#: Prefix of a noisy measurement's time (IQR/median above the threshold).
NOISY = "~"
#: Prefix of a GPU time the host may have set (`measurement.is_host_bound`).
HOST_BOUND = "!"
#: Prefix of a time measured on a busy machine (contended cores, throttled GPU clocks).
BUSY = "#"


# --- cells ----------------------------------------------------------------------------------
def _order(values, reference: tuple[str, ...] = ()) -> list[str]:
    """Distinct values: those in `reference` in its order, then the rest as first seen."""
    seen = list(dict.fromkeys(values))
    return [v for v in reference if v in seen] + [v for v in seen if v not in reference]


def _algos(df: pd.DataFrame) -> list[str]:
    return _order(df["algo"], registry.ALGOS)


def _layers(df: pd.DataFrame) -> list[str]:
    return _order(df["layer"])


def _flag(v) -> bool:
    """A boolean cell that may be missing (None/NaN) as a plain bool."""
    return bool(pd.notna(v) and v)


def _host_bound(r) -> bool:
    """Whether a row's GPU may have waited for its host: its own flag, or for rows from before
    it, the host took a sizeable share of the device's time to issue the pass."""
    if pd.notna(r.get("host_bound")):
        return bool(r["host_bound"])
    return is_host_bound(None if pd.isna(r["host_ms"]) else r["host_ms"], r["median_ms"])


def host_bound_table(df: pd.DataFrame) -> pd.DataFrame:
    """The host-bound measurements: their device and host medians."""
    ok = df[df["status"] == "ok"]
    rows = ok[[_host_bound(r) for _, r in ok.iterrows()]] if len(ok) else ok
    return pd.DataFrame({"median ms": rows["median_ms"].map(fmt_ms).values,
                         "host ms": rows["host_ms"].map(fmt_ms).values},
                        index=pd.MultiIndex.from_frame(
                            rows[["layer", "algo", "pass", "layout"]]))


# --- tables ---------------------------------------------------------------------------------
def _marks(r) -> str:
    """The prefix marks of a row's time: noisy, host-bound, busy machine."""
    return ((NOISY if _flag(r["noisy"]) else "") + (HOST_BOUND if _host_bound(r) else "")
            + (BUSY if ranking.busy(r) else ""))


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
    """Rows algo, columns layer, cells the median ms, the fastest per column marked as a win or
    a tie, times that may be wrong prefixed, for the rows of one pass, layout and precision."""
    cells = pd.DataFrame("", index=pd.Index(_algos(df), name="algo"), columns=_layers(df))
    for layer, rows in df.groupby("layer", sort=False):
        standing = _standing(rows[rows["status"] == "ok"])
        for i, r in rows.iterrows():
            if r["status"] != "ok":
                cells.loc[r["algo"], layer] = r["status"]
                continue
            cells.loc[r["algo"], layer] = (_marks(r) + fmt_ms(r["median_ms"])
                                           + standing.get(i, ""))
    return cells


def _not_run(rows: pd.DataFrame) -> str:
    """The algorithms with no `ok` row among `rows`, grouped by status: `fft, winograd-2x2
    unsupported`."""
    ran = set(rows.loc[rows["status"] == "ok", "algo"])
    by_status: dict[str, list[str]] = {}
    for algo, status in zip(rows["algo"], rows["status"]):
        if algo not in ran and status != "ok":
            by_status.setdefault(status, [])
            if algo not in by_status[status]:
                by_status[status].append(algo)
    return "; ".join(f"{', '.join(algos)} {status}" for status, algos in by_status.items())


#: The verdict of a (layer, pass) whose verified times were all measured on a busy machine,
#: and of one with no verified time at all.
UNDECIDED_BUSY = "not decided: measured on a busy machine"
UNDECIDED_NONE = "not decided: nothing ran verified"


def winner_table(df: pd.DataFrame, peak_gflops: float | None = None,
                 peak_name: str = "peak") -> pd.DataFrame:
    """Per layer and pass (of one precision), across algorithms and layouts: the fastest, its
    median and interval, the runner-up, the ratio of their medians with its interval, whether
    the fastest wins or ties (and with what), its GFLOP/s and share of the device's peak
    (`peak_gflops`, where known; `peak_name` says which), and the algorithms that did not run, by status. Rows measured
    on a busy machine do not compete; every (layer, pass) measured has its row, a pair with
    nothing to compete `not decided` and why, so none goes missing from the table unsaid."""
    out = []
    for (layer, pass_), rows in df.groupby(["layer", "pass"], sort=False):
        ok = rows[rows["status"] == "ok"]
        fair = ok[~ranking.busy_mask(ok)]
        ranked = ranking.rank(fair)
        if not ranked:
            out.append({"layer": layer, "pass": pass_, "verdict": UNDECIDED_BUSY if len(ok)
                        else UNDECIDED_NONE, "did not run": _not_run(rows)})
            continue
        busy = ok[ranking.busy_mask(ok)]
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
        if len(busy):
            cell["verdict"] += "; not competing (busy machine): " + ", ".join(
                f"{a} {lay}" for a, lay in zip(busy["algo"], busy["layout"]))
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
        elif _flag(r.get("noisy")):
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
    ok = df[df["status"] == "ok"]
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
        [(a, p) for a in _algos(df) for p in _order(df["pass"]) if (a, p) in
         agg.index.droplevel("layer")], names=["algo", "pass"])
    return pd.DataFrame({layer: [fmt(agg.get((a, p, layer), math.nan)) for a, p in index]
                         for layer in _layers(df)}, index=index)


def op_table(df: pd.DataFrame) -> pd.DataFrame:
    """Theoretical GFLOP of each algorithm per layer and pass (n/a: no count, or the algorithm
    cannot run the layer)."""
    can = df[df["status"] != "unsupported"]
    return _per_algo_pass(df.assign(algo_ops=can["algo_ops"]), "algo_ops", fmt_gflop)


def workspace_table(df: pd.DataFrame) -> pd.DataFrame:
    """Workspace in MiB of the measured cases (the larger over layouts)."""
    return _per_algo_pass(df[df["status"] == "ok"], "workspace_bytes", fmt_mib)


def peak_table(df: pd.DataFrame) -> pd.DataFrame:
    """Measured peak MiB beyond the operands of the measured cases (the larger over layouts)."""
    return _per_algo_pass(df[df["status"] == "ok"], "peak_bytes", fmt_mib)


def _methods(df: pd.DataFrame) -> list[str]:
    """One line per memory method the rows used, saying what it reads."""
    return [f"- `{m}`: {memory.METHODS.get(m, '')}" for m in _order(df["memory_method"]) if m]


def error_table(df: pd.DataFrame) -> pd.DataFrame:
    """Relative error against the float64 reference (the larger over layouts), for the rows of
    one precision: errors at different precisions are not comparable."""
    return _per_algo_pass(df[df["rel_error"].notna()], "rel_error", fmt_error)


#: (algo, baseline) pairs whose error ratio the accuracy section states, each expected above 1:
#: F(4x4, 3x3)'s transform matrices have larger coefficients than F(2x2, 3x3)'s, and amplify
#: rounding more.
ERROR_RATIOS = (("winograd-4x4", "winograd-2x2"), ("winograd-fused-4x4", "winograd-fused-2x2"))


def error_ratios(df: pd.DataFrame, algo: str, baseline: str) -> pd.Series:
    """`algo`'s relative error over `baseline`'s on every row key (less the algo) where both
    have a finite error and the baseline's is not zero."""
    key = [c for c in KEY if c != "algo"]
    errors = df[df["rel_error"].abs() < math.inf]  # neither NaN nor inf
    a, b = (errors[errors["algo"] == name].set_index(key)["rel_error"]
            for name in (algo, baseline))
    b = b[b > 0]
    return (a / b).dropna()


def error_ratio_line(df: pd.DataFrame, algo: str, baseline: str) -> str | None:
    """One sentence on how much larger `algo`'s error is than `baseline`'s, from the data, or
    None when no row has both."""
    ratios = error_ratios(df, algo, baseline)
    if ratios.empty:
        return None
    larger = int((ratios > 1).sum())
    return (f"{algo} / {baseline} error ratio: median {fmt_ratio(ratios.median())} "
            f"(min {fmt_ratio(ratios.min())}, max {fmt_ratio(ratios.max())}) over "
            f"{len(ratios)} (layer, pass, layout) cases; {algo}'s error is the larger in "
            f"{larger} of {len(ratios)}.")


def accuracy_section(df: pd.DataFrame) -> list[str]:
    """The accuracy tables, one per precision (rows algo and pass, columns layers), and the
    error ratios of `ERROR_RATIOS` where both algorithms were checked; [] when no row has an
    error."""
    checked = df[df["rel_error"].notna()]
    if checked.empty:
        return []
    out = ["## Accuracy", "",
           ("Relative error ‖out − ref‖/‖ref‖ against the float64 reference, per layer and pass "
            "(the larger of the two layouts), at the precision each table names; a case above "
            "its tolerance is `failed` (see Not measured)."), ""]
    for precision, rows in checked.groupby("precision", sort=False):
        out += [f"### {precision}", "", md_table(error_table(rows)), ""]
    lines = [error_ratio_line(df, algo, baseline) for algo, baseline in ERROR_RATIOS]
    out += [f"- {line}" for line in lines if line]
    return out + ([""] if any(lines) else [])


def where(cases: list[tuple[str, str, str]], per_layer: int) -> str:
    """(layer, pass, layout) triples in few words: a layer all of whose `per_layer` cases are
    listed is named alone, others with their passes and layouts."""
    by_layer: dict[str, list[str]] = {}
    for layer, pass_, layout in cases:
        by_layer.setdefault(layer, []).append(f"{pass_} {layout}")
    return "; ".join(layer if len(what) == per_layer else f"{layer} {', '.join(what)}"
                     for layer, what in by_layer.items())


def not_measured(df: pd.DataFrame) -> pd.DataFrame:
    """Each distinct (status, algo, reason) once, with where it applied."""
    per_layer = len(df[["pass", "layout", "precision"]].drop_duplicates())
    bad = df[df["status"] != "ok"]
    groups = bad.groupby(["status", "algo", "reason"], sort=False)
    return groups.apply(lambda g: where(list(zip(g["layer"], g["pass"], g["layout"])),
                                        per_layer)).to_frame("where")


def layer_table(df: pd.DataFrame) -> str:
    """One line per measurement, for `convbench layer`'s terminal output."""
    interval = [f"{fmt_ms(lo)}–{fmt_ms(hi)}" if pd.notna(lo) else ""
                for lo, hi in zip(df["ci_low_ms"], df["ci_high_ms"])]
    cols = {"median ms": [_marks(r) + fmt_ms(r["median_ms"]) if r["status"] == "ok" else ""
                          for r in df.to_dict("records")],
            "95% interval": interval,
            "GFLOP/s": df["gflops"].map(lambda v: "" if pd.isna(v) else f"{v:.4g}"),
            "rel error": df["rel_error"].map(fmt_error),
            "workspace MiB": df["workspace_bytes"].map(fmt_mib),
            "reason / note": df["reason"].where(df["status"] != "ok", df["note"])}
    body = df[["layer", "algo", "pass", "layout", "precision", "status"]].assign(**cols)
    return tabulate(body, headers="keys", tablefmt="github", showindex=False,
                    disable_numparse=True)


# --- phase breakdown ------------------------------------------------------------------------
#: The phase that is the product; every other phase is a transform (inputs or output).
PRODUCT = "product"


def phase_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The measured rows whose algorithm has phases, with `phases` (the parsed {phase: ms})
    added. A library's call and the copy of its result (torch's, `_aten`) is no breakdown of an
    algorithm: its copy is in the row's note."""
    rows = df[(df["status"] == "ok") & (df["phases_ms"] != "")]
    rows = rows.assign(phases=rows["phases_ms"].map(parse_phases))
    return rows[[not set(p) <= {CONVOLUTION, *APART} for p in rows["phases"]]]


def _product_share(phases: dict[str, float]) -> float:
    total = sum(phases.values())
    return phases.get(PRODUCT, 0.0) / total if total > 0 else 0.0


def _dominant(phases: dict[str, float]) -> str:
    """Which takes more of the phases' time, the transforms together or the product, and its
    share; for a fused kernel, its share (its transforms and product are not apart)."""
    if FUSED in phases:
        total = sum(phases.values())
        return f"{FUSED} {phases[FUSED] / total:.0%}" if total > 0 else FUSED
    share = _product_share(phases)
    return f"{PRODUCT} {share:.0%}" if share > 0.5 else f"transforms {1 - share:.0%}"


def phase_table(rows: pd.DataFrame) -> pd.DataFrame:
    """For the rows of one algo, pass and precision from `phase_frame`: rows (layer, layout),
    each phase's median ms and share of the phases' sum, the sum, the whole pass's median, and
    whether the transforms or the product dominate."""
    names = _order(name for phases in rows["phases"] for name in phases)
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


def _algo_major(df: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by algorithm (in `registry.ALGOS` order), otherwise as they were."""
    rank = {a: i for i, a in enumerate(_algos(df))}
    return df.sort_values("algo", key=lambda col: col.map(rank), kind="stable")


def phase_section(df: pd.DataFrame) -> list[str]:
    """The phase breakdown: a table per algorithm, pass and precision, and per algorithm how
    often the transforms or the product dominate."""
    phased = phase_frame(df)
    if phased.empty:
        return []
    out = ["## Phase breakdown", "",
           ("Median ms of each phase and its share of their sum, for the algorithms whose passes "
            "have phases. The phases are timed apart from the whole pass, each repetition "
            "running all of them in order with a timestamp between them (CUDA events on the "
            "GPU, the host clock elsewhere); `pass ms` is the whole pass's median (the time "
            "tables'), which the phases' sum approximates. `dominant`: the transforms (inputs' "
            "and output's together) or the product, whichever takes more; for a fused kernel, "
            "its share."), ""]
    groups = _algo_major(phased).groupby(["algo", "pass", "precision"], sort=False)
    for (algo, pass_, precision), rows in groups:
        out += [f"### {algo}, {pass_}, {precision}", "", md_table(phase_table(rows)), ""]
    for algo, rows in phased.groupby("algo", sort=False):
        fused = [p for p in rows["phases"] if FUSED in p]
        if fused and len(fused) == len(rows) and any(len(p) > 1 for p in fused):
            shares = [p[FUSED] / sum(p.values()) for p in fused if sum(p.values()) > 0]
            out.append(f"- {algo}: one fused kernel (input transform, product, output "
                       f"transform) takes {min(shares):.0%}–{max(shares):.0%} of the phases' "
                       f"time in {len(rows)} (layer, pass, layout) cases; the rest is the "
                       "filter transform.")
            continue
        apart = [p for p in rows["phases"] if FUSED not in p]
        product = sum(_product_share(p) > 0.5 for p in apart)
        line = (f"- {algo}: the transforms dominate in {len(apart) - product} of {len(rows)} "
                f"(layer, pass, layout) cases, the product in {product}")
        if fused:
            line += (f"; in {len(fused)} the transform and the product alternate block by "
                     f"block, one phase (`{FUSED}`)")
        out.append(line + ".")
    return out + [""]


# --- the run report -------------------------------------------------------------------------
def _header(df: pd.DataFrame, env: dict) -> list[str]:
    run = env.get("run", {})
    batches = sorted({int(n) for n in df["n"].dropna()})
    batch = ", ".join(map(str, batches))
    if run.get("backend") == "numpy" and batches == [DEVICES["cpu"].batch]:
        batch += (" (the default CPU batch, small enough for the whole sweep to finish in 15 "
                  "minutes on 2 cores; the study used 256)")
    torch = env.get("torch", {})
    blas = env.get("numpy", {}).get("blas", {})
    title = (f"# convbench: {run.get('net', ', '.join(_order(df['net'])))} on "
             f"{env.get('device', 'unknown device')}")
    lines = [title, ""]
    facts = [("batch", batch),
             ("backend", ", ".join(_order(df["backend"]))),
             ("precision", ", ".join(_order(df["precision"]))),
             ("timing budget", f"{run['budget_s']} s per measurement" if "budget_s" in run
              else None),
             ("threads", _threads(env, torch, blas)),
             ("timing", "competing cases (every algo and layout of a problem, pass and "
                        "precision) timed in shuffled interleaved rounds, until each median is "
                        f"known to within {run.get('target_noise', 0.02):.0%} or the budget "
                        "is spent" if env.get("statistics") else None),
             ("machine load", "; ".join(f"{r['when']}: {contention.load_text(r)}"
                                        for r in env.get("load", [])) or None),
             ("versions", f"convbench {env.get('convbench')}, NumPy "
                          f"{env.get('numpy', {}).get('version')}, torch {torch.get('version')}"
              if env else None),
             ("git commit", env.get("git_commit")),
             ("date", env.get("date")),
             ("command", run.get("command"))]
    lines += [f"- {k}: {v}" for k, v in facts if v]
    lines += ceilings_lines(env)
    counts = df["status"].value_counts()
    lines += ["- measurements: " + ", ".join(f"{counts[s]} {s}" for s in counts.index), ""]
    return lines


#: What the report says where a run's env.json has no ceilings (a run from before them).
NO_CEILINGS = "not measured for this run (a run folder from before the ceilings were measured)"


def _product(c: ceilings_.Ceilings, shape: str) -> str:
    """The product a ceiling's shape names, as its `methods` describes it (`square
    (2048x2048)@(2048x2048)`), or the name alone."""
    m = re.search(rf"(?:products: |; ){re.escape(shape)} ([^;]+)", c.methods.get("gflops", ""))
    return f"{shape} {m[1].strip()}" if m else shape


def _rate(x: float | None, unit: str) -> str:
    return "n/a" if x is None else f"{x:.4g} {unit}"


def ceilings_lines(env: dict | None) -> list[str]:
    """The header's lines on the device's ceilings: the attainable fp32 rate and which library
    on which product gave it, the theoretical peak and how it was reckoned, the bandwidth
    beyond and within cache (and how), the GPU's clock while timed; or why there are none."""
    env = env or {}
    c = ceilings_.from_env(env)
    note = env.get("ceilings_note")
    if c is None:
        why = (f"not measured for this run ({note})" if note else NO_CEILINGS
               if "ceilings" not in env else "not measured for this run")
        return [f"- ceilings: {why}"] if env else []
    backend, _, shape = c.methods.get("attainable", c.gemm_backend).partition(" on ")
    out = [f"- ceilings of {c.model} ({c.device}, {c.threads} threads, measured "
           f"{c.measured_at}" + (f"; {note}" if note else "") + "):",
           (f"  - attainable fp32: {_rate(c.gflops_attainable, 'GFLOP/s')}, {backend or '?'}"
            + (f" on {_product(c, shape)}" if shape else "")
            + " (the fastest SGEMM of the libraries here)"),
           (f"  - theoretical peak: {_rate(c.gflops_peak_theoretical, 'GFLOP/s')} "
            f"({c.peak_method})"),
           (f"  - bandwidth: {_rate(c.bandwidth_gbs_dram, 'GB/s')} beyond cache, "
            f"{_rate(c.bandwidth_gbs_cache, 'GB/s')} within"
            + (f" ({c.methods['bandwidth']})" if c.methods.get("bandwidth") else ""))]
    if c.clock_mhz is not None:
        out.append(f"  - SM clock while the products ran: {c.clock_mhz:.0f} MHz")
    if c.contended:
        out.append(f"  - contended, so low: {c.methods['contended']}")
    return out


def _threads(env: dict, torch: dict, blas: dict) -> str | None:
    policy = env.get("threads")
    if isinstance(policy, dict):
        return (f"{policy['threads']} for every algorithm ({policy.get('set_by')}; "
                f"{policy.get('available_cores')} cores available)")
    return (f"torch {torch.get('threads')}, NumPy BLAS ({blas.get('name')}) "
            f"{blas.get('threads')}" if torch else None)


# --- a network's cost: layers weighted by how often they occur --------------------------------
def _fastest(ok: pd.DataFrame) -> pd.DataFrame:
    """The fastest verified row of each (layer, pass), any algo and layout."""
    return ok.loc[ok.groupby(["layer", "pass"], sort=False)["median_ms"].idxmin()]


def cost_table(df: pd.DataFrame, occurrences: dict[str, int]) -> pd.DataFrame:
    """Per problem (layer): how often the network has it, its fastest algorithm and layout per
    pass, and what it costs the network (time x occurrences, summed over the passes), the
    costliest first."""
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
    each algorithm used throughout, each layer in its faster layout, and for the fastest choice
    per layer and pass; an algorithm that cannot run some problem has no total, only a count
    of what it lacks."""
    ok = df[df["status"] == "ok"]
    needed = df[["layer", "pass"]].drop_duplicates()
    weight = needed["layer"].map(lambda layer: occurrences.get(layer, 1))
    fastest = _fastest(ok)
    best_total = float((fastest["median_ms"] * fastest["layer"].map(
        lambda layer: occurrences.get(layer, 1))).sum())
    rows = [{"choice": "fastest per layer and pass", "network ms": fmt_ms(best_total),
             "x fastest": fmt_ratio(1.0), "covers": f"{len(fastest)} of {len(needed)}"}]
    for algo in _algos(df):
        own = ok[ok["algo"] == algo].groupby(["layer", "pass"], sort=False)["median_ms"].min()
        covered = len(own)
        if covered < len(needed):
            rows.append({"choice": algo, "network ms": "", "x fastest": "",
                         "covers": f"{covered} of {len(needed)}"})
            continue
        total = float(sum(own[layer, p_] * w for (layer, p_), w
                          in zip(needed.itertuples(index=False), weight)))
        rows.append({"choice": algo, "network ms": fmt_ms(total),
                     "x fastest": fmt_ratio(total / best_total), "covers": f"{covered} of "
                     f"{len(needed)}"})
    return pd.DataFrame(rows).set_index("choice")


def network_section(df: pd.DataFrame, env: dict) -> list[str]:
    """The report of a model's or a problem file's run: its problems weighted by how often the
    network has each (`occurrences` in env.json's run), and the network total per choice."""
    occurrences = env.get("run", {}).get("occurrences")
    if not occurrences or not (df["status"] == "ok").any():
        return []
    source = env["run"].get("model") or env["run"].get("problems") or "the network"
    out = ["## Network cost", "",
           (f"{source}: {sum(occurrences.values())} conv layers, {len(occurrences)} distinct "
            "problems. Each problem's median ms per pass in its fastest verified algorithm and "
            "layout, times how often the network has it; the costliest first. Layouts are each "
            "pass's own best here: the conversions between them are not counted (`convbench "
            "advise` weighs them)."), ""]
    unmeasured = env["run"].get("unmeasured") or {}
    if unmeasured:
        out += ["Not measured (convbench cannot run them): " + "; ".join(
            f"{layer} ({why})" for layer, why in unmeasured.items()) + ".", ""]
    skipped = env["run"].get("skipped") or []
    if skipped:
        shown = "; ".join(skipped[:3]) + ("; ..." if len(skipped) > 3 else "")
        out += [(f"Skipped: {len(skipped)} lines of the file are convolutions convbench "
                 f"cannot hold (env.json lists them all): {shown}."), ""]
    for precision, rows in df.groupby("precision", sort=False):
        out += [f"### {precision}", "", md_table(cost_table(rows, occurrences)), "",
                ("Network total per choice: one algorithm for every problem and pass, each in "
                 "its faster layout; `covers` counts the problem-passes it ran verified."), "",
                md_table(choice_totals(rows, occurrences)), ""]
    return out


# --- how far from the roof ---------------------------------------------------------------------
#: Bytes per element of the roof's byte count: the ceilings are fp32's, so are the rows read.
ROOF_PRECISION, ROOF_ELEMENT_BYTES = "fp32", 4
#: Most rows the roof's table lists one by one; a larger run lists each (algo, pass, layout)'s
#: row nearest its roof.
ROOF_MAX_ROWS = 60
ROOF_COLUMNS = ("median ms", "GFLOP/s (direct flops)", "% of ceiling (direct flops)",
                "GFLOP/s (own ops)", "% of ceiling (own ops)", "flop/byte (own ops)", "bound",
                "% of roof")


def min_bytes(r) -> int:
    """The fewest bytes a row's pass can move: its two inputs and its output once each, fp32
    (`ROOF_ELEMENT_BYTES`), and its declared workspace where it has one."""
    moved = memory.operand_bytes(problem_from_row(r), r["pass"], np.float32)
    ws = r.get("workspace_bytes")
    return int(moved + (0 if ws is None or pd.isna(ws) else ws))


def roof_frame(df: pd.DataFrame, ceilings: ceilings_.Ceilings) -> pd.DataFrame:
    """The verified fp32 rows with their standing against `ceilings`: `direct_share` (GFLOP/s
    over the attainable ceiling), `own_gflops` and `own_share` (the algorithm's own operations,
    `algo_ops`, over the median; for a row without a count of its own, the direct flops,
    `own_counted` False), `bytes` (`min_bytes`), `intensity` (own ops per byte), and which roof
    is lower there (`bound`: compute or memory, against the DRAM bandwidth) with `roof_share`,
    the share of that roof attained."""
    rows = df[(df["status"] == "ok") & (df["precision"] == ROOF_PRECISION)
              & df["median_ms"].notna() & (df["median_ms"] > 0)]
    out = []
    for r in rows.to_dict("records"):
        counted = r.get("algo_ops") is not None and pd.notna(r["algo_ops"]) and r["algo_ops"] > 0
        ops = float(r["algo_ops"]) if counted else float(problem_from_row(r).flops)
        seconds, nbytes = r["median_ms"] / 1e3, min_bytes(r)
        point = ceilings_.roofline_point(ops, nbytes, seconds)
        try:
            b = ceilings_.bound(point, ceilings)
            kind, share = b.kind, b.share
        except ValueError:  # no DRAM bandwidth measured
            kind, share = "", math.nan
        out.append({**r, "own_counted": counted, "own_gflops": point.gflops,
                    "direct_share": r["gflops"] / ceilings.gflops_attainable,
                    "own_share": point.gflops / ceilings.gflops_attainable,
                    "bytes": nbytes, "intensity": point.intensity, "bound": kind,
                    "roof_share": share})
    return pd.DataFrame(out, columns=[*df.columns, "own_counted", "own_gflops", "direct_share",
                                      "own_share", "bytes", "intensity", "bound", "roof_share"])


def _pct(x: float) -> str:
    return "" if x is None or pd.isna(x) else f"{100 * x:.3g}%"


def roof_table(roof: pd.DataFrame) -> pd.DataFrame:
    """Rows (layer, pass, algo, layout) of `roof_frame`: the median, the attained GFLOP/s in
    direct flops and in own ops with their shares of the ceiling, the intensity, the bound and
    the share of that roof. A row without an op count of its own has no own-op figures (its
    intensity and bound are read with the direct flops, marked `d`)."""
    own = roof["own_counted"].astype(bool)
    cells = {"median ms": roof["median_ms"].map(fmt_ms),
             "GFLOP/s (direct flops)": roof["gflops"].map(lambda v: f"{v:.4g}"),
             "% of ceiling (direct flops)": roof["direct_share"].map(_pct),
             "GFLOP/s (own ops)": [f"{v:.4g}" if c else "" for v, c in
                                   zip(roof["own_gflops"], own)],
             "% of ceiling (own ops)": [_pct(v) if c else "" for v, c in
                                        zip(roof["own_share"], own)],
             "flop/byte (own ops)": [f"{v:.3g}" + ("" if c else " d") for v, c in
                                     zip(roof["intensity"], own)],
             "bound": roof["bound"], "% of roof": roof["roof_share"].map(_pct)}
    return pd.DataFrame({k: list(v) for k, v in cells.items()},
                        index=pd.MultiIndex.from_frame(roof[["layer", "pass", "algo", "layout"]]),
                        columns=list(ROOF_COLUMNS))


def roof_section(df: pd.DataFrame, env: dict | None) -> list[str]:
    """How far from the roof: each verified fp32 row's share of the device's attainable
    ceiling, in direct flops and in its own operations, and whether it is compute- or
    memory-bound by the minimum bytes its pass moves; each (algo, pass, layout)'s row nearest
    its roof where the run has more than `ROOF_MAX_ROWS`. Where env.json has no ceilings,
    says so. [] where no row ran verified."""
    if not (df["status"] == "ok").any():
        return []
    out = ["## How far from the roof", ""]
    ceilings = ceilings_.from_env(env)
    if ceilings is None:
        note = (env or {}).get("ceilings_note")
        return out + [("The device's ceilings were not measured for this run"
                       + (f" ({note})" if note else "") + ": no row's share of them can be "
                       "stated."), ""]
    roof = roof_frame(df, ceilings)
    if roof.empty:
        return out + [(f"No verified {ROOF_PRECISION} row: the ceilings are {ROOF_PRECISION}'s, "
                       "and rows of other precisions are not read against them."), ""]
    ridge = (f", the ridge at {ceilings.gflops_attainable / ceilings.bandwidth_gbs_dram:.3g} "
             "flop/byte" if ceilings.bandwidth_gbs_dram else "")
    out += [(f"Each verified {ROOF_PRECISION} row against {ceilings.model}'s ceilings (in the "
             f"header): its rate as a share of the attainable {ROOF_PRECISION} ceiling, "
             f"{ceilings.gflops_attainable:.4g} GFLOP/s, counted two ways: in direct-convolution "
             "flops over its median (`% of ceiling (direct flops)`: above 100% only where the "
             "algorithm does fewer operations than the direct convolution, FFT and Winograd), "
             "and in the algorithm's own operations (`algo_ops`, the Operation counts; `% of "
             "ceiling (own ops)`: the share of the hardware's rate its own arithmetic used). "
             "`flop/byte`: its own operations over the fewest bytes its pass can move (its two "
             f"inputs and its output once each, {ROOF_ELEMENT_BYTES} bytes an element, plus the "
             "workspace it declares; caches and re-reads move more, so this intensity is an "
             "upper bound). `bound`: the lower roof at that intensity, the attainable compute "
             f"or the DRAM bandwidth ({_rate(ceilings.bandwidth_gbs_dram, 'GB/s')}{ridge}), and "
             "`% of roof` the share of it attained. A library's choice of kernel has no "
             "operation count of its own: its intensity is read in direct flops (`d`). Any "
             f"row faster than the device can go was failed by the runner's guard (see Not "
             f"measured). The picture is `roofline.png`."), ""]
    if len(roof) > ROOF_MAX_ROWS:
        best = roof.loc[roof.groupby(["algo", "pass", "layout"], sort=False)["own_share"]
                        .idxmax()]
        out += [(f"{len(roof)} rows: each (algo, pass, layout)'s row nearest the ceiling in "
                 "its own operations."), "", md_table(roof_table(_algo_major(best))), ""]
    else:
        out += [md_table(roof_table(roof)), ""]
    bound = roof["bound"].value_counts()
    if len(bound):
        out += ["Bound: " + ", ".join(f"{bound[k]} {k}" for k in bound.index)
                + f" of {len(roof)} rows (against the DRAM roof).", ""]
    return out


def roofline_plot(plt, df: pd.DataFrame, env: dict | None, folder: Path) -> list[str]:
    """roofline.png: per verified fp32 row, its own operations per byte (x) and own-op GFLOP/s
    (y), log-log, coloured per algorithm (hollow where the count is the direct flops), under
    the compute ceilings (attainable; theoretical peak dashed) and the bandwidth roofs (DRAM;
    within cache dotted). [] without ceilings in env.json or a verified fp32 row."""
    ceilings = ceilings_.from_env(env)
    if ceilings is None:
        return []
    roof = roof_frame(df, ceilings)
    if roof.empty:
        return []
    fig, ax = plt.subplots(figsize=(10.5, 5.5), layout="constrained")
    lo = min(roof["intensity"].min(), 0.1) / 2
    hi = max(roof["intensity"].max(), 100.0) * 2
    x = np.geomspace(lo, hi, 200)
    attain = ceilings.gflops_attainable
    for bw, style, name in ((ceilings.bandwidth_gbs_dram, "-", "DRAM"),
                            (ceilings.bandwidth_gbs_cache, ":", "cache")):
        if bw:
            ax.plot(x, np.minimum(x * bw, attain), color="black", linestyle=style,
                    linewidth=1, label=f"roof: {name} {bw:.4g} GB/s, attainable {attain:.4g} "
                    "GFLOP/s")
    if not (ceilings.bandwidth_gbs_dram or ceilings.bandwidth_gbs_cache):
        ax.axhline(attain, color="black", linewidth=1, label=f"attainable {attain:.4g} GFLOP/s")
    if ceilings.gflops_peak_theoretical:
        ax.axhline(ceilings.gflops_peak_theoretical, color="grey", linestyle="--",
                   linewidth=1, label=f"theoretical peak "
                   f"{ceilings.gflops_peak_theoretical:.4g} GFLOP/s")
    for i, algo in enumerate(_algos(roof)):
        rows = roof[roof["algo"] == algo]
        own = rows["own_counted"].astype(bool)
        for sub, filled in ((rows[own], True), (rows[~own], False)):
            if len(sub):
                ax.scatter(sub["intensity"], sub["own_gflops"], s=24, color=f"C{i % 10}",
                           facecolors=None if filled else "none",
                           label=algo if filled else f"{algo} (direct flops: no own count)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (own operations / minimum bytes, fp32)")
    ax.set_ylabel("attained GFLOP/s (own operations)")
    ax.set_title(f"{ceilings.model}, {ceilings.threads} threads: verified {ROOF_PRECISION} rows")
    save_figure(fig, folder / "roofline.png")
    return ["roofline.png"]


def many_problems(df: pd.DataFrame) -> bool:
    """Whether a run has problems enough for the sorted speed-up picture."""
    return df["layer"].nunique() >= speedup.MIN_PROBLEMS


def baseline_of(df: pd.DataFrame, env: dict, baseline: str | None) -> str:
    """The baseline given, else cuDNN autotune on a GPU run, torch-cpu on a CPU run."""
    return baseline or speedup.default_baseline(env.get("run", {}).get("backend")
                                                or _order(df["backend"])[0])


def speedup_section(df: pd.DataFrame, env: dict, baseline: str | None = None) -> list[str]:
    """For a run of many problems: per algorithm, its share of problems won, tied and lost
    against the baseline and its mean speed-up, overall and per class of problem. [] for a
    run of few problems."""
    if not many_problems(df):
        return []
    baseline = baseline_of(df, env, baseline)
    out = [f"## Speed-up over {baseline}", ""]
    if baseline not in set(df["algo"]):
        return out + [(f"The baseline {baseline} was not measured in this run; re-render with "
                      f"`convbench report RUN --baseline ALGO`, ALGO one of "
                      f"{', '.join(_algos(df))}."), ""]
    sp = speedup.speedups(df, baseline)
    out += [(f"{df['layer'].nunique()} problems. Per problem and pass, each algorithm in its "
             f"faster layout against {baseline} in its faster layout: speed-up = {baseline}'s "
             "median / the algorithm's. It *wins* a problem where the 95% interval of that "
             "ratio lies above 1, loses where it lies below, and ties otherwise (a tie is not "
             "a win); `not compared`: the algorithm or the baseline has no fair verified time there "
             "(not run, failed, or measured on a busy machine). "
             "The sorted curves are in the plots (`speedup_*.png`); `convbench report RUN "
             "--baseline ALGO` sets another baseline."), ""]
    for (pass_, precision), g in sp.groupby(["pass", "precision"], sort=False):
        out += [f"### {pass_}, {precision}", "", md_table(speedup.summary(g, ["algo"])), "",
                "Per class of problem (`--class`):", "",
                md_table(speedup.summary(speedup.class_order(g), ["class", "algo"])), ""]
    return out


def markdown(df: pd.DataFrame, env: dict, plots: list[str] | str = (),
             baseline: str | None = None) -> str:
    """report.md: the header, for many problems the speed-up over a baseline, which wins each
    layer, time tables per pass and layout, op counts, workspace, accuracy, the phase
    breakdown, what was not measured and why, noisy measurements, and the plots (`plots`: file
    names, or the note saying why there are none)."""
    out = _header(df, env)
    out += speedup_section(df, env, baseline)
    host_bound = host_bound_table(df)
    busy = busy_table(df)
    host_note = (f", `{HOST_BOUND}` a time the host may have set (see Host-bound measurements)"
                 if len(host_bound) else "")
    busy_note = (f", `{BUSY}` a time measured on a busy machine (see Busy machine)"
                 if len(busy) else "")
    ceilings = ceilings_.from_env(env)
    fp32_peak = (env.get("gpu") or {}).get("fp32_peak_tflops") if env else None
    for precision, rows in df.groupby("precision", sort=False):
        if ceilings is not None:
            peak, peak_name = (ceilings.gflops_attainable if precision == "fp32" else None,
                               "ceiling")
            share = (f"; in brackets the share of the device's attainable fp32 ceiling, "
                     f"{peak:.4g} GFLOP/s (see How far from the roof)" if peak else
                     f"; the device's ceilings are fp32's, not {precision}'s")
        else:
            peak, peak_name = (fp32_peak * 1e3 if fp32_peak and precision == "fp32" else None,
                               "peak")
            share = (f"; in brackets the share of the device's FP32 peak, {peak:.4g} GFLOP/s"
                     if peak else "; the device's peak is not known here (its ceilings were "
                     "not measured for this run)")
        winners = winner_table(rows, peak, peak_name)
        if winners.empty:
            continue
        out += [f"## Which wins ({precision})", "",
                ("Per layer and pass, across every algorithm and layout: the fastest, its median "
                 "ms with the 95% interval of the median (order statistics), its GFLOP/s "
                 "(direct-convolution flops over the median" + share + "), the "
                 "runner-up and the ratio of their medians with its 95% interval (bootstrap, "
                 "paired by round: they were timed side by side), and the algorithms that did "
                 "not run, by status (their reasons are under Not measured). The fastest wins "
                 "only where that interval excludes 1; otherwise it is a tie within noise with "
                 "the times named. `convbench advise RUN` turns this into a plan: one layout per "
                 "layer across its passes, the NCHW<->NHWC conversions weighed, ties broken by "
                 "workspace (or `--tie-break`)."
                 + (" Times measured on a busy machine do not compete." if len(busy) else "")),
                "", md_table(winners), ""]
    out += ["## Time per layer", "",
            (f"Median ms per pass; `{BEST.strip()}` marks the fastest algorithm of each layer "
             f"where it wins beyond noise, `{TIED.strip()}` the fastest and the times tied with "
             f"it where it does not; `{NOISY}` a noisy measurement{host_note}{busy_note}."), ""]
    for (precision, pass_, layout), rows in df.groupby(["precision", "pass", "layout"],
                                                       sort=False):
        out += [f"### {pass_}, {layout}, {precision}", "", md_table(time_table(rows)), ""]
    out += network_section(df, env)
    out += roof_section(df, env)
    out += ["## Operation counts", "",
            ("Theoretical GFLOP per pass (`opcount.py`); n/a where the kernel is the library's "
             "choice or the algorithm does not apply."), "", md_table(op_table(df)), ""]
    if df["workspace_bytes"].notna().any():
        out += ["## Workspace", "", "MiB beyond inputs and output, as measured cases declared.",
                "", md_table(workspace_table(df)), ""]
    if df["peak_bytes"].notna().any():
        out += ["## Peak memory", "",
                ("MiB allocated beyond inputs and output while the prepared pass ran (its held "
                 "buffers and every temporary), measured on the untimed verifying call:"),
                *_methods(df), "", md_table(peak_table(df)), ""]
    out += accuracy_section(df)
    out += phase_section(df)
    if (df["status"] != "ok").any():
        out += ["## Not measured", "", md_table(not_measured(df)), ""]
    noisy = df["noisy"].map(_flag).sum()
    if noisy:
        out += ["## Noisy measurements", "",
                (f"{noisy} of {(df['status'] == 'ok').sum()} measurements have IQR/median > "
                 f"{NOISE_THRESHOLD}: marked `{NOISY}` in the time tables, `noisy` in "
                 f"{RESULTS_CSV}."), ""]
    if len(busy):
        out += ["## Busy machine", "",
                (f"{len(busy)} of {(df['status'] == 'ok').sum()} times were measured while the "
                 "machine was busy: on the CPU, other processes kept the pass's threads off the "
                 "cores they were ready to run on, or the hypervisor gave the cores to other "
                 f"machines (less than {CONTENDED_SHARE:.0%} of their ready time on a core: "
                 f"`cpu_share` times 1 - `stolen` in {RESULTS_CSV}), on the GPU its clocks "
                 "were held down (`throttled`). They "
                 f"are marked `{BUSY}`, compete for no win here and are left out of advice "
                 "(`--include-busy` takes them); measure them again on a quiet machine."), "",
                md_table(busy), ""]
    if len(host_bound):
        out += ["## Host-bound measurements", "",
                (f"{len(host_bound)} GPU measurements may hold time the GPU spent waiting for "
                 "the host (Python, the launches): in more than a tenth of their repetitions "
                 "the host took longer to issue the pass than the head start the GPU was given "
                 f"(`host_bound` in {RESULTS_CSV}; for rows from before the head start, the host "
                 "took half the GPU's time or more). These times are upper bounds of the "
                 f"kernels' own. Marked `{HOST_BOUND}` in the time tables."), "",
                md_table(host_bound), ""]
    out += ["## Plots", ""]
    out += [plots] if isinstance(plots, str) else [f"![{Path(p).stem}]({p})" for p in plots]
    return "\n".join(out) + "\n"


#: Most layers drawn as bars per layer; a run of more shows the speed-up curves instead.
MAX_BAR_LAYERS = 40


def speedup_plots(plt, df: pd.DataFrame, env: dict, folder: Path,
                  baseline: str | None = None) -> list[str]:
    """speedup_<pass>[_<precision>].png for a run of many problems whose baseline ran."""
    baseline = baseline_of(df, env, baseline)
    if not many_problems(df) or baseline not in set(df["algo"]):
        return []
    sp = speedup.speedups(df, baseline)
    single = sp["precision"].nunique() == 1
    names = []
    for (pass_, precision), g in sp.groupby(["pass", "precision"], sort=False):
        name = f"speedup_{pass_}.png" if single else f"speedup_{pass_}_{precision}.png"
        speedup.draw(plt, g, baseline, f"{g['layer'].nunique()} problems, {pass_}, "
                     f"{precision}: speed-up over {baseline}, sorted", folder / name)
        names.append(name)
    return names


def plot(df: pd.DataFrame, folder: str | Path, env: dict | None = None,
         baseline: str | None = None) -> list[str] | str:
    """PNG plots in `folder`: for a run of many problems the sorted speed-up curves; per pass,
    grouped bars of time per layer per algorithm (a panel per layout) and the op counts per
    layer per algorithm (up to `MAX_BAR_LAYERS` layers), the phase breakdown where rows have
    phases, and the roofline where env.json has the device's ceilings (`roofline_plot`).
    Returns the file names, or a note when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    folder = Path(folder)
    names = speedup_plots(plt, df, env or {}, folder, baseline)
    if df["layer"].nunique() > MAX_BAR_LAYERS:
        return names + roofline_plot(plt, df, env, folder)
    single = df["precision"].nunique() == 1
    for (precision, pass_), rows in df.groupby(["precision", "pass"], sort=False):
        name = f"time_{pass_}.png" if single else f"time_{pass_}_{precision}.png"
        layouts = _order(rows["layout"])
        # one y range for every layout's panel: bars of the same height are the same time
        fig, axes = plt.subplots(1, len(layouts), figsize=(5 * len(layouts) + 1.5, 4),
                                 squeeze=False, layout="constrained", sharey=True)
        for ax, layout in zip(axes[0], layouts):
            sub = rows[rows["layout"] == layout]
            _bars(ax, sub[sub["status"] == "ok"], "median_ms", _algos(rows), _layers(df),
                  missing=sub[sub["status"] != "ok"])
            ax.set_title(f"{pass_}, {layout}, {precision}")
            ax.set_ylabel("median time (ms, log; bars: 95% interval)")
        _mark_legend(axes[0][0], rows[rows["status"] == "ok"])
        save_figure(fig, folder / name)
        names.append(name)
    passes = _order(df["pass"])
    counted = _algos(df[df["algo_ops"].notna()])
    fig, axes = plt.subplots(1, len(passes), figsize=(5 * len(passes) + 1.5, 4), squeeze=False,
                             layout="constrained")
    for ax, pass_ in zip(axes[0], passes):
        # a count is drawn where the algorithm can run the layer: not where it is unsupported
        sub = df[(df["pass"] == pass_) & (df["status"] != "unsupported")]
        sub = sub.drop_duplicates(["layer", "algo"])
        cannot = df[(df["pass"] == pass_) & (df["status"] == "unsupported")]
        cannot = cannot[~cannot.set_index(["layer", "algo"]).index.isin(
            sub.set_index(["layer", "algo"]).index)]
        _bars(ax, sub.assign(gflop=sub["algo_ops"] / 1e9), "gflop", counted, _layers(df),
              log=False, missing=cannot)
        ax.set_title(f"theoretical operations, {pass_}")
        ax.set_ylabel("GFLOP")
    save_figure(fig, folder / "opcount.png")
    return names + ["opcount.png", *_phase_plot(plt, df, folder),
                    *roofline_plot(plt, df, env, folder)]


def _phase_plot(plt, df: pd.DataFrame, folder: Path) -> list[str]:
    """phases.png: a panel per algorithm (rows) and pass (columns), one bar per layer (and
    layout) stacked by phase as shares of the phases' sum, the sum in ms above it, so the
    bottleneck of each layer shows at a glance whatever its size; busy and noisy rows marked as
    in the time plots. [] when no row has phases."""
    phased = phase_frame(df)
    if phased.empty:
        return []
    algos, passes = _algos(phased), _order(phased["pass"])
    several = {c: phased[c].nunique() > 1 for c in ("layout", "precision")}
    fig, axes = plt.subplots(len(algos), len(passes), squeeze=False, layout="constrained",
                             figsize=(5.5 * len(passes), 3.2 * len(algos) + 0.5))
    for ax_row, algo in zip(axes, algos):
        for ax, pass_ in zip(ax_row, passes):
            rows = phased[(phased["algo"] == algo) & (phased["pass"] == pass_)]
            ax.set_title(f"{algo}, {pass_}")
            ax.set_ylim(0, 115)
            ax.set_ylabel("share of phases (%)")
            labels = [r["layer"] + "".join(f"\n{r[c]}" for c in several if several[c])
                      for _, r in rows.iterrows()]
            totals = [sum(p.values()) for p in rows["phases"]]
            bottom = [0.0] * len(rows)
            busy = pd.Series(ranking.busy_mask(rows).values)
            noisy = pd.Series(rows["noisy"].map(_flag).values)
            for i, name in enumerate(_order(n for p in rows["phases"] for n in p)):
                shares = [100 * p.get(name, 0.0) / t if t else 0.0
                          for p, t in zip(rows["phases"], totals)]
                bars = ax.bar(range(len(rows)), shares, 0.6, bottom=bottom, label=name,
                              color=f"C{i}")
                _time_marks(bars, list(range(len(rows))), busy, noisy)
                bottom = [b + v for b, v in zip(bottom, shares)]
            for x, total in enumerate(totals):
                ax.annotate(f"{fmt_ms(total)} ms", (x, 101), ha="center", va="bottom",
                            fontsize="x-small")
            ax.set_xticks(range(len(rows)), labels)
            _mark_legend(ax, rows)
            if len(rows):
                ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="x-small")
    save_figure(fig, folder / "phases.png", legend=False)
    return ["phases.png"]


#: How a bar plot draws a time measured on a busy machine, and a noisy one (with their legend
#: labels): the plots' `#` and `~`.
BUSY_BAR = ({"hatch": "///", "edgecolor": "black", "linewidth": 0.5},
            f"hatched: measured on a busy machine ({BUSY})")
NOISY_BAR = ({"alpha": 0.4, "edgecolor": "black", "linestyle": "--", "linewidth": 0.5},
             f"faded: noisy, IQR/median > {NOISE_THRESHOLD} ({NOISY})")


def _mark_legend(ax, rows: pd.DataFrame) -> None:
    """Legend entries on `ax` (whose handles the figure's legend takes) for the marks that
    `rows` (every panel's) carry: bars of no height, which draw nothing."""
    marked = ((ranking.busy_mask(rows).any(), BUSY_BAR),
              (rows["noisy"].map(_flag).any(), NOISY_BAR))
    for shown, (style, label) in marked:
        if shown:
            ax.bar([0], [math.nan], color="lightgrey", label=label, **style)


def _time_marks(bars, keys: list, busy: pd.Series, noisy: pd.Series) -> None:
    """Style each bar of `bars` (one per key of `keys`, the index of `busy` and `noisy`: a
    (layer, algo), or a row's place) as `BUSY_BAR` and/or `NOISY_BAR` where its row is busy or
    noisy."""
    for patch, key in zip(bars.patches, keys):
        for marked, (style, _) in ((busy, BUSY_BAR), (noisy, NOISY_BAR)):
            if marked.get(key, False):
                patch.set(**style)


#: The mark a plot puts where a case did not run, by status.
NOT_RUN_MARKS = {"unsupported": "u", "failed": "f", "oom": "m"}


def _bars(ax, rows: pd.DataFrame, value: str, algos: list[str], layers: list[str],
          log: bool = True, missing: pd.DataFrame | None = None) -> None:
    """Grouped bars: one group per layer, one bar per algorithm, with the 95% interval of the
    median as an error bar where `value` is the median and rows have one; where a case did not
    run (`missing`), a letter at the foot of its place (u unsupported, f failed, m out of
    memory), explained in the axes' corner. A time that may be wrong looks it, as the tables
    mark it: hatched where measured on a busy machine, faded where noisy (`_time_marks`)."""
    width = 0.8 / max(1, len(algos))
    indexed = rows.set_index(["layer", "algo"])
    values = indexed[value]
    busy = pd.Series(ranking.busy_mask(rows).values, index=indexed.index)
    noisy = indexed["noisy"].map(_flag)
    status = ({} if missing is None or missing.empty else
              missing.drop_duplicates(["layer", "algo"]).set_index(["layer", "algo"])["status"])
    for i, algo in enumerate(algos):
        x = [j + (i - (len(algos) - 1) / 2) * width for j in range(len(layers))]
        heights = [values.get((layer, algo), math.nan) for layer in layers]
        yerr = None
        if value == "median_ms" and {"ci_low_ms", "ci_high_ms"} <= set(indexed.columns):
            low = [indexed["ci_low_ms"].get((la, algo), math.nan) for la in layers]
            high = [indexed["ci_high_ms"].get((la, algo), math.nan) for la in layers]
            yerr = [[h - lo if pd.notna(lo) else 0 for h, lo in zip(heights, low)],
                    [hi - h if pd.notna(hi) else 0 for h, hi in zip(heights, high)]]
        bars = ax.bar(x, heights, width, label=algo, color=f"C{i}", yerr=yerr,
                      error_kw={"elinewidth": 0.8, "capsize": 1.5})
        if value == "median_ms":
            _time_marks(bars, [(layer, algo) for layer in layers], busy, noisy)
        for xi, layer in zip(x, layers):
            mark = NOT_RUN_MARKS.get(status.get((layer, algo), ""))
            if mark:
                ax.annotate(mark, (xi, 0.01), xycoords=("data", "axes fraction"),
                            ha="center", va="bottom", fontsize="x-small", color=f"C{i}")
    if len(status):
        ax.annotate("letters: did not run (u unsupported, f failed, m out of memory)",
                    (0.99, 0.99), xycoords="axes fraction", ha="right", va="top",
                    fontsize="x-small")
    ax.set_xticks(range(len(layers)), layers)
    if log and values.notna().any():
        ax.set_yscale("log")
