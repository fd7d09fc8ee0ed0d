"""The report's figures (matplotlib, the `plot` extra): the sorted speed-up curves of a run of
many problems; per pass, the time per layer and algorithm (a panel per layout, one y range) and
the operation counts; the phase breakdown; the roofline.

A time that may be wrong looks it, as the tables mark it: hatched where measured on a busy
machine, faded where noisy, crossed where its result was inexact; a case that did not run is a
letter at its place, not a gap. Without matplotlib the report says so and carries on.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ...core.fmt import NO_MATPLOTLIB, fmt_ms, legend_entry, plain_log, pyplot, save_figure
from ...core.measurement import NOISE_THRESHOLD
from ...core.results import TIMED
from ...measure.ceilings.record import from_env
from .. import ranking, speedup
from ..inexact import INEXACT
from . import inference
from .cells import BUSY, NOISY, algo_order, flag, layer_order, order
from .roof import ROOF_PRECISION, roof_frame
from .tables import baseline_of, many_problems, phase_frame

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
    Returns the file names (none for a run without rows: one interrupted before its first),
    or a note when matplotlib is missing."""
    df = inference.split(df)[0]  # inference variants compete in no plot (`inference`)
    if df.empty:
        return []
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
        layouts = order(rows["layout"])
        # one y range for every layout's panel: bars of the same height are the same time
        fig, axes = plt.subplots(1, len(layouts), figsize=(5 * len(layouts) + 1.5, 4),
                                 squeeze=False, layout="constrained", sharey=True)
        for ax, layout in zip(axes[0], layouts):
            sub = rows[rows["layout"] == layout]
            timed = sub["status"].isin(TIMED)
            bar_groups(ax, sub[timed], "median_ms", algo_order(rows), layer_order(df),
                       missing=sub[~timed])
            ax.set_title(f"{pass_}, {layout}, {precision}")
            ax.set_ylabel("median time (ms, log; bars: 95% interval)")
        mark_legend(axes[0][0], rows[rows["status"].isin(TIMED)])
        save_figure(fig, folder / name)
        names.append(name)
    passes = order(df["pass"])
    counted = algo_order(df[df["algo_ops"].notna()])
    fig, axes = plt.subplots(1, len(passes), figsize=(5 * len(passes) + 1.5, 4), squeeze=False,
                             layout="constrained")
    for ax, pass_ in zip(axes[0], passes):
        # a count is drawn where the algorithm can run the layer: not where it is unsupported
        sub = df[(df["pass"] == pass_) & (df["status"] != "unsupported")]
        sub = sub.drop_duplicates(["layer", "algo"])
        cannot = df[(df["pass"] == pass_) & (df["status"] == "unsupported")]
        cannot = cannot[~cannot.set_index(["layer", "algo"]).index.isin(
            sub.set_index(["layer", "algo"]).index)]
        bar_groups(ax, sub.assign(gflop=sub["algo_ops"] / 1e9), "gflop", counted,
                   layer_order(df), log=False, missing=cannot)
        ax.set_title(f"theoretical operations, {pass_}")
        ax.set_ylabel("GFLOP")
    save_figure(fig, folder / "opcount.png")
    return names + ["opcount.png", *phase_plot(plt, df, folder),
                    *roofline_plot(plt, df, env, folder)]


#: How a phase bar's label is laid out: inches a character takes at its size ("small"), and a
#: line's height; the least room a bar takes; the longest line set level (longer ones, a
#: problem file's or a model's layer names, are set upright, where a bar's room is its lines'
#: heights); and the room beside the panels (the y label, and the legend outside on the right).
LABEL_CHAR_IN, LABEL_LINE_IN, BAR_IN, LEVEL_CHARS, PANEL_SIDES_IN = 0.075, 0.17, 0.5, 10, 3.2


def phase_labels(rows: pd.DataFrame, totals: list[float], several: dict[str, bool]) -> list[str]:
    """Each phase bar's label: its layer, its layout and precision where the plot has several,
    and the phases' total in ms (the figure's x label says so; a unit on every bar ran each
    label into the next)."""
    return [r["layer"] + "".join(f"\n{r[c]}" for c in several if several[c])
            + f"\n{fmt_ms(total)}" for (_, r), total in zip(rows.iterrows(), totals)]


def phase_plot(plt, df: pd.DataFrame, folder: Path) -> list[str]:
    """phases.png: a panel per algorithm (rows) and pass (columns), one bar per layer (and
    layout) stacked by phase as shares of the phases' sum, the sum in ms under it, so the
    bottleneck of each layer shows at a glance whatever its size; busy and noisy rows marked as
    in the time plots. Each panel is as wide as its labels need, level where they are short,
    upright where they are long, so no label runs into the next. [] when no row has phases."""
    phased = phase_frame(df)
    if phased.empty:
        return []
    algos, passes = algo_order(phased), order(phased["pass"])
    several = {c: phased[c].nunique() > 1 for c in ("layout", "precision")}
    panels = {}
    for algo in algos:
        for pass_ in passes:
            rows = phased[(phased["algo"] == algo) & (phased["pass"] == pass_)]
            totals = [sum(p.values()) for p in rows["phases"]]
            panels[algo, pass_] = rows, totals, phase_labels(rows, totals, several)
    lines = [line for *_, labels in panels.values() for label in labels
             for line in label.split("\n")]
    longest = max(map(len, lines))
    upright = longest > LEVEL_CHARS
    per_bar = max(BAR_IN, (LABEL_LINE_IN * (2 + sum(several.values())) if upright
                           else LABEL_CHAR_IN * longest) + 0.15)
    bars = max(len(rows) for rows, *_ in panels.values())
    # an upright label's length is height a panel gives it beyond the bars' own
    height = 3.4 + (LABEL_CHAR_IN * longest if upright else 0.0)
    fig, axes = plt.subplots(len(algos), len(passes), squeeze=False, layout="constrained",
                             figsize=(max(5.5, per_bar * bars + PANEL_SIDES_IN) * len(passes),
                                      height * len(algos) + 0.5))
    for ax_row, algo in zip(axes, algos):
        for ax, pass_ in zip(ax_row, passes):
            rows, totals, labels = panels[algo, pass_]
            ax.set_title(f"{algo}, {pass_}")
            ax.set_ylim(0, 100)
            ax.set_ylabel("share of phases (%)")
            bottom = [0.0] * len(rows)
            busy = pd.Series(ranking.busy_mask(rows).values)
            noisy = pd.Series(rows["noisy"].map(flag).values)
            for i, name in enumerate(order(n for p in rows["phases"] for n in p)):
                shares = [100 * p.get(name, 0.0) / t if t else 0.0
                          for p, t in zip(rows["phases"], totals)]
                drawn = ax.bar(range(len(rows)), shares, 0.6, bottom=bottom, color=f"C{i}")
                legend_entry(ax, f"C{i}", name)
                _time_marks(drawn, list(range(len(rows))), busy, noisy)
                bottom = [b + v for b, v in zip(bottom, shares)]
            ax.set_xticks(range(len(rows)), labels, fontsize="small",
                          rotation=90 if upright else 0)
            mark_legend(ax, rows)
            if len(rows):
                ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="x-small")
    fig.supxlabel("under each bar: its layer"
                  + "".join(f", {c}" for c in several if several[c])
                  + " and the phases' total ms", fontsize="small")
    save_figure(fig, folder / "phases.png", legend=False)
    return ["phases.png"]


#: How a bar plot draws a time measured on a busy machine, and a noisy one (with their legend
#: labels): the plots' `#` and `~`. No dashed edges: a bar on a log axis has its foot at minus
#: infinity, and matplotlib lays dashes along that whole edge, a fraction of a second a bar.
BUSY_BAR = ({"hatch": "///", "edgecolor": "black", "linewidth": 0.5},
            f"hatched: measured on a busy machine ({BUSY})")
NOISY_BAR = ({"alpha": 0.4, "edgecolor": "black", "linewidth": 0.5},
             f"faded: noisy, IQR/median > {NOISE_THRESHOLD} ({NOISY})")
#: An `inexact` row's bar: a library's result beyond its tolerance, the tables' `†`.
INEXACT_BAR = ({"hatch": "xx", "edgecolor": "red", "linewidth": 0.8},
               f"crossed: inexact, above its tolerance ({INEXACT})")


def mark_legend(ax, rows: pd.DataFrame) -> None:
    """Legend entries on `ax` (whose handles the figure's legend takes) for the marks that
    `rows` (every panel's) carry: bars of no height, which draw nothing."""
    marked = ((ranking.busy_mask(rows).any(), BUSY_BAR),
              (rows["noisy"].map(flag).any(), NOISY_BAR),
              ((rows["status"] == "inexact").any(), INEXACT_BAR))
    for shown, (style, label) in marked:
        if shown:
            ax.bar([0], [math.nan], color="lightgrey", label=label, **style)


def _time_marks(bars, keys: list, busy: pd.Series, noisy: pd.Series,
                inexact: pd.Series | None = None) -> None:
    """Style each bar of `bars` (one per key of `keys`, the index of `busy`, `noisy` and
    `inexact`: a (layer, algo), or a row's place) as `BUSY_BAR`, `NOISY_BAR` and/or
    `INEXACT_BAR` where its row is busy, noisy or inexact."""
    marks = ((busy, BUSY_BAR), (noisy, NOISY_BAR),
             *(((inexact, INEXACT_BAR),) if inexact is not None else ()))
    for patch, key in zip(bars.patches, keys):
        for marked, (style, _) in marks:
            if marked.get(key, False):
                patch.set(**style)


#: The mark a plot puts where a case did not run, by status, and its size (as large as the
#: axis labels: a mark is read as a bar is).
NOT_RUN_MARKS = {"unsupported": "u", "failed": "f", "oom": "m"}
NOT_RUN_SIZE = "medium"


def bar_groups(ax, rows: pd.DataFrame, value: str, algos: list[str], layers: list[str],
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
    noisy = indexed["noisy"].map(flag)
    inexact = indexed["status"] == "inexact"
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
        # the series is named `_algo`: matplotlib leaves it out of the legend (`legend_entry`)
        bars = ax.bar(x, heights, width, color=f"C{i}", yerr=yerr, label=f"_{algo}",
                      error_kw={"elinewidth": 0.8, "capsize": 1.5})
        legend_entry(ax, f"C{i}", algo)
        if value == "median_ms":
            _time_marks(bars, [(layer, algo) for layer in layers], busy, noisy, inexact)
        for xi, layer in zip(x, layers):
            mark = NOT_RUN_MARKS.get(status.get((layer, algo), ""))
            if mark:
                ax.annotate(mark, (xi, 0.01), xycoords=("data", "axes fraction"),
                            ha="center", va="bottom", fontsize=NOT_RUN_SIZE,
                            fontweight="bold", color=f"C{i}")
    if len(status):
        ax.annotate("letters: did not run (u unsupported, f failed, m out of memory)",
                    (0.99, 0.99), xycoords="axes fraction", ha="right", va="top",
                    fontsize="x-small")
    ax.set_xticks(range(len(layers)), layers)
    if log and values.notna().any():
        plain_log(ax, "y")


def roofline_plot(plt, df: pd.DataFrame, env: dict | None, folder: Path) -> list[str]:
    """roofline.png: per verified fp32 row, its own operations per byte (x) and own-op GFLOP/s
    (y), log-log, coloured per algorithm (hollow where the count is the direct flops), under
    the compute ceilings (the compute roof: the larger of the attainable SGEMM and the measured
    FMA peak; theoretical peak dashed) and the bandwidth roofs (DRAM;
    within cache dotted). [] without ceilings in env.json or a verified fp32 row."""
    ceilings = from_env(env)
    if ceilings is None:
        return []
    roof = roof_frame(df, ceilings)
    if roof.empty:
        return []
    fig, ax = plt.subplots(figsize=(10.5, 5.5), layout="constrained")
    lo = min(roof["intensity"].min(), 0.1) / 2
    hi = max(roof["intensity"].max(), 100.0) * 2
    x = np.geomspace(lo, hi, 200)
    attain = ceilings.compute_roof[0]
    called = "FMA peak" if ceilings.gflops_peak_measured and \
        attain > ceilings.gflops_attainable else "attainable"
    for bw, style, name in ((ceilings.bandwidth_gbs_dram, "-", "DRAM"),
                            (ceilings.bandwidth_gbs_cache, ":", "cache")):
        if bw:
            ax.plot(x, np.minimum(x * bw, attain), color="black", linestyle=style,
                    linewidth=1, label=f"roof: {name} {bw:.4g} GB/s, {called} {attain:.4g} "
                    "GFLOP/s")
    if not (ceilings.bandwidth_gbs_dram or ceilings.bandwidth_gbs_cache):
        ax.axhline(attain, color="black", linewidth=1, label=f"{called} {attain:.4g} GFLOP/s")
    if ceilings.gflops_peak_theoretical:
        ax.axhline(ceilings.gflops_peak_theoretical, color="grey", linestyle="--",
                   linewidth=1, label=f"theoretical peak "
                   f"{ceilings.gflops_peak_theoretical:.4g} GFLOP/s")
    for i, algo in enumerate(algo_order(roof)):
        rows = roof[roof["algo"] == algo]
        own = rows["own_counted"].astype(bool)
        for sub, filled in ((rows[own], True), (rows[~own], False)):
            if len(sub):
                ax.scatter(sub["intensity"], sub["own_gflops"], s=24, color=f"C{i % 10}",
                           facecolors=None if filled else "none",
                           label=algo if filled else f"{algo} (direct flops: no own count)")
    plain_log(ax, "xy")
    ax.set_xlabel("arithmetic intensity (own operations / minimum bytes, fp32)")
    ax.set_ylabel("attained GFLOP/s (own operations)")
    ax.set_title(f"{ceilings.model}, {ceilings.threads} threads: verified {ROOF_PRECISION} rows")
    save_figure(fig, folder / "roofline.png")
    return ["roofline.png"]
