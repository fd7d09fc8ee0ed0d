"""Many problems at a glance: each algorithm's speed-up over a baseline on every problem, sorted
(the ConvBench study's picture, Alvarenga et al. 2024), with the share of problems it wins, and
per class of problem (`selection`) a summary.

Per problem (layer), pass and precision, each algorithm in its faster layout is set against the
baseline in its faster layout: speed-up = baseline's median / the algorithm's, with the 95% interval
of that ratio (`ranking.Candidate.ratio_to`, paired by round where they were timed side by side).
The algorithm *wins* a problem only where the interval lies above 1, *loses* where it lies below,
and ties otherwise (docs/pages/design.md §5: a tie is not a win). Rows measured on a busy
machine do not compete; a problem where the algorithm or the baseline has no fair verified time (unsupported,
failed, busy) is counted apart (`not compared`), never drawn.
"""

from __future__ import annotations

import math

import pandas as pd

from ..catalogs import selection
from ..core.problem import ConvProblem
from . import ranking

#: Fewest problems for which a run's report draws the picture.
MIN_PROBLEMS = 8
DEFAULT_BASELINE = {"cuda": "cudnn-autotune"}
CPU_BASELINE = "torch-cpu"
OUTCOMES = {"win": "wins", "tie": "ties", "loss": "losses"}
#: The outcome where the algorithm or the baseline has no fair verified time.
NOT_COMPARED = "not compared"


def default_baseline(backend: str | None) -> str:
    """cuDNN's autotuned choice on a GPU, torch's on the CPU."""
    return DEFAULT_BASELINE.get(backend or "", CPU_BASELINE)


def _problem(r) -> ConvProblem:
    return ConvProblem(int(r["n"]), int(r["c"]), int(r["h"]), int(r["w"]), int(r["k"]),
                       int(r["r"]), int(r["s"]), r["stride"], r["pad"], r["dilation"],
                       int(r["groups"]))


def speedups(df: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """One row per (layer, pass, precision, algo other than the baseline): the class of the
    problem, the speed-up over the baseline with its interval (`low`, `high`), the `outcome`
    (win, tie, loss), or `NOT_COMPARED` with NaN speed-up where either side has no fair `ok`
    row (not run, failed, or measured on a busy machine)."""
    out = []
    for (layer, pass_, precision), rows in df.groupby(["layer", "pass", "precision"],
                                                      sort=False):
        ok = rows[(rows["status"] == "ok") & ~ranking.busy_mask(rows)]
        best = {c.algo: c for c in reversed(ranking.rank(ok))}  # each algo's fastest layout
        cls = selection.classify(_problem(rows.iloc[0]))
        base = best.get(baseline)
        for algo in dict.fromkeys(rows["algo"]):
            if algo == baseline:
                continue
            cell = {"layer": layer, "pass": pass_, "precision": precision, "class": cls,
                    "algo": algo, "speedup": math.nan, "low": math.nan, "high": math.nan,
                    "outcome": NOT_COMPARED}
            mine = best.get(algo)
            if base is not None and mine is not None:
                r = mine.ratio_to(base)  # mine / baseline: below 1 is faster
                cell.update(speedup=1 / r.value,
                            low=math.nan if r.high is None else 1 / r.high,
                            high=math.nan if r.low is None else 1 / r.low,
                            outcome="tie" if not r.decided else "win" if r.value < 1
                            else "loss")
            out.append(cell)
    return pd.DataFrame(out, columns=["layer", "pass", "precision", "class", "algo",
                                      "speedup", "low", "high", "outcome"])


def _gmean(x: pd.Series) -> float:
    x = x.dropna()
    return float(math.exp(sum(math.log(v) for v in x) / len(x))) if len(x) else math.nan


def summary(sp: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per group of `by` (e.g. ["algo"] or ["class", "algo"]): problems compared, the share won,
    tied and lost, the geometric mean and median speed-up, and how many were not run."""
    rows = []
    for key, g in sp.groupby(by, sort=False):
        ran = g[g["outcome"] != NOT_COMPARED]
        n = len(ran)
        cell = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        cell.update({"problems": n,
                     **{name: f"{(ran['outcome'] == o).sum() / n:.0%}" if n else ""
                        for o, name in OUTCOMES.items()},
                     "geomean speed-up": f"{_gmean(ran['speedup']):.3g}×" if n else "",
                     "median speed-up": f"{ran['speedup'].median():.3g}×" if n else "",
                     NOT_COMPARED: len(g) - n})
        rows.append(cell)
    return pd.DataFrame(rows).set_index(by) if rows else pd.DataFrame()


def class_order(sp: pd.DataFrame) -> pd.DataFrame:
    """`sp` with its classes in `selection.CLASSES` order (for the per-class table)."""
    rank = {c: i for i, c in enumerate(selection.CLASSES)}
    return sp.sort_values("class", key=lambda col: col.map(rank), kind="stable")


def draw(plt, sp: pd.DataFrame, baseline: str, title: str, path) -> None:
    """The picture for one pass and precision: per algorithm, its speed-ups sorted ascending
    over the problems both ran (x: the share of those problems), its 95% intervals shaded, a
    line at 1; the legend gives each one's share of wins and ties."""
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    drawn = 0
    for i, (algo, g) in enumerate(sp.groupby("algo", sort=False)):
        ran = g[g["outcome"] != NOT_COMPARED].sort_values("speedup", kind="stable")
        if ran.empty:
            continue
        drawn += 1
        x = [(j + 0.5) / len(ran) * 100 for j in range(len(ran))]
        wins, ties = ((ran["outcome"] == o).mean() for o in ("win", "tie"))
        ax.plot(x, ran["speedup"], color=f"C{i}", marker="." if len(ran) < 60 else None,
                label=f"{algo}: wins {wins:.0%}, ties {ties:.0%} of {len(ran)}")
        ax.fill_between(x, ran["low"].fillna(ran["speedup"]),
                        ran["high"].fillna(ran["speedup"]), color=f"C{i}", alpha=0.2,
                        linewidth=0)
    ax.axhline(1, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xlim(0, 100)
    ax.set_xlabel("problems, sorted by speed-up (%)")
    ax.set_ylabel(f"speed-up over {baseline} (log)")
    ax.set_title(title)
    if drawn:
        ax.legend(loc="upper left", fontsize="small")
    else:  # an empty picture says why, as the report's table does
        ax.text(50, 1, f"no problem compared with {baseline}: every time here was taken on a "
                "busy machine,\nfailed or was not run (the report's tables say which)",
                ha="center", va="bottom", fontsize="small")
    fig.savefig(path, dpi=100)
    plt.close(fig)
