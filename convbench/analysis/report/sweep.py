"""A batch sweep's report: the studies' batch-size figures. Per pass and layout, rows are
(layer, algo) and columns batch sizes, with the time per image, the peak memory, and where each
series ran out of memory; plotted per layer against the batch size. It reads the results table
only, as `report` does, and shares its header and notes; `report.write` picks it for a run
folder whose results are one.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...core.fmt import NO_MATPLOTLIB, fmt_mib, fmt_ms, md_table, pyplot, save_figure
from ...core.results import TIMED
from ...measure import memory
from ..inexact import INEXACT
from .cells import BEST, algo_order, layer_order, order
from .prose import header, memory_methods
from .tables import not_measured


def is_batch_sweep(df: pd.DataFrame) -> bool:
    """Whether the results hold some layer at several batch sizes."""
    return bool(len(df)) and int(df.groupby("layer")["n"].nunique().max()) > 1


def _per_batch(df: pd.DataFrame, cell) -> pd.DataFrame:
    """Rows (layer, algo), columns batch size: `cell(row)` for each results row of one pass,
    layout and precision; blank where a batch was not tried."""
    batches = sorted(int(n) for n in df["n"].unique())
    index = pd.MultiIndex.from_tuples(
        [(layer, a) for layer in layer_order(df) for a in algo_order(df[df["layer"] == layer])],
        names=["layer", "algo"])
    out = pd.DataFrame("", index=index, columns=batches)
    for _, r in df.iterrows():
        out.loc[(r["layer"], r["algo"]), int(r["n"])] = cell(r)
    return out


def per_image_table(df: pd.DataFrame) -> pd.DataFrame:
    """ms per image (median / batch) for one pass, layout and precision, the fastest verified
    (`ok`) algorithm of each layer and batch marked, an `inexact` time with its mark."""
    ok = df[df["status"] == "ok"]
    per_image = ok["median_ms"] / ok["n"]
    best = set(per_image.groupby([ok["layer"], ok["n"]]).idxmin())
    return _per_batch(df, lambda r: r["status"] if r["status"] not in TIMED else
                      (INEXACT if r["status"] == "inexact" else "")
                      + fmt_ms(r["median_ms"] / r["n"]) + (BEST if r.name in best else ""))


def peak_batch_table(df: pd.DataFrame) -> pd.DataFrame:
    """Measured peak MiB for one pass, layout and precision, or the status."""
    return _per_batch(df, lambda r: fmt_mib(r["peak_bytes"]) if r["status"] in TIMED
                      else r["status"])


def oom_table(df: pd.DataFrame) -> pd.DataFrame:
    """Each series' first batch out of memory, the largest that fitted, and why."""
    keys = ["layer", "algo", "pass", "layout", "precision"]
    oom = df[df["status"] == "oom"].sort_values("n", kind="stable").drop_duplicates(keys)
    fitted = df[df["status"].isin(TIMED)].groupby(keys)["n"].max()
    places = {k: {v: i for i, v in enumerate(vs)} for k, vs in
             (("layer", layer_order(df)), ("algo", algo_order(df)), ("pass", order(df["pass"])))}
    oom = oom.sort_values(["layer", "algo", "pass"], kind="stable",
                          key=lambda col: col.map(places[col.name]))
    rows = [{**{k: r[k] for k in keys}, "oom at batch": int(r["n"]),
             "largest that ran": fitted.get(tuple(r[k] for k in keys), ""),
             "reason": r["reason"]} for _, r in oom.iterrows()]
    return pd.DataFrame(rows, columns=[*keys, "oom at batch", "largest that ran",
                                       "reason"]).set_index(keys[:2])


def sweep_markdown(df: pd.DataFrame, env: dict, plots: list[str] | str = ()) -> str:
    """report.md of a batch sweep: time per image and peak memory against batch size per pass
    and layout, where each series ran out of memory, what else was not measured, plots."""
    out = header(df, env)
    groups = list(df.groupby(["precision", "pass", "layout"], sort=False))
    out += ["## Time per image", "",
            (f"Median ms per image (time of the batch / batch size); `{BEST.strip()}` marks the "
             "fastest algorithm of each layer at each batch. A series that ran out of memory "
             "is not tried at larger batches (blank)."), ""]
    for (precision, pass_, layout), rows in groups:
        out += [f"### {pass_}, {layout}, {precision}", "", md_table(per_image_table(rows)), ""]
    out += ["## Peak memory", "",
            "MiB allocated beyond inputs and output while the pass ran (measured):",
            *memory_methods(df), ""]
    limit = env.get("run", {}).get("memory_limit_bytes")
    if limit:
        out += [f"Memory limit: {memory.format_size(limit)} per case, operands included.", ""]
    for (precision, pass_, layout), rows in groups:
        out += [f"### {pass_}, {layout}, {precision}", "", md_table(peak_batch_table(rows)), ""]
    if (df["status"] == "oom").any():
        out += ["## Out of memory", "", md_table(oom_table(df)), ""]
    other = df[~df["status"].isin([*TIMED, "oom"])]
    if len(other):  # once per layer, pass and layout, whatever the batch
        other = other.drop_duplicates(["layer", "algo", "pass", "layout", "precision", "reason"])
        out += ["## Not measured", "", md_table(not_measured(other)), ""]
    out += ["## Plots", ""]
    out += [plots] if isinstance(plots, str) else [f"![{Path(p).stem}]({p})" for p in plots]
    return "\n".join(out) + "\n"


def sweep_plot(df: pd.DataFrame, folder: str | Path) -> list[str] | str:
    """Per layer, one PNG: a row of panels per pass, time per image and peak memory against
    batch size (log-log), a line per algorithm and layout, and a dotted vertical line in the
    algorithm's colour on the memory panel at the batch where a series ran out of memory."""
    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    folder, names = Path(folder), []
    styles = dict(zip(order(df["layout"], ("nchw", "nhwc")), ("-", "--")))
    for layer, rows in df.groupby("layer", sort=False):
        passes = order(rows["pass"])
        fig, axes = plt.subplots(len(passes), 2, figsize=(11, 3.2 * len(passes) + 0.5),
                                 squeeze=False, layout="constrained")
        for (time_ax, mem_ax), pass_ in zip(axes, passes):
            sub = rows[rows["pass"] == pass_]
            for i, algo in enumerate(algo_order(sub)):
                color = f"C{i}"
                for layout, style in styles.items():
                    series = sub[(sub["algo"] == algo) & (sub["layout"] == layout)]
                    ok = series[series["status"].isin(TIMED)].sort_values("n")
                    label = algo if len(styles) == 1 else f"{algo} {layout}"
                    time_ax.plot(ok["n"], ok["median_ms"] / ok["n"], style, marker="o",
                                 color=color, label=label)
                    mem_ax.plot(ok["n"], ok["peak_bytes"] / 2**20, style, marker="o",
                                color=color)
                    for n in series.loc[series["status"] == "oom", "n"]:
                        mem_ax.axvline(n, color=color, linestyle=":")
            batches = sorted(int(n) for n in sub["n"].unique())
            for ax, what in ((time_ax, "ms per image"), (mem_ax, "peak MiB (dotted: oom)")):
                ax.set_xscale("log", base=2)
                ax.set_xticks(batches, [str(n) for n in batches])
                ax.set_yscale("log")
                ax.set_xlabel("batch size")
                ax.set_ylabel(what)
                ax.set_title(f"{layer} {pass_}: {what}")
        name = f"sweep_{layer}.png"
        save_figure(fig, folder / name)
        names.append(name)
    return names
