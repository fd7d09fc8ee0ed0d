"""Many problems at a glance: each algorithm's speed-up over a baseline on every problem, sorted
(the ConvBench study's picture, Alvarenga et al. 2024), with the share of problems it wins, and
per class of problem (`selection`) a summary.

Per problem (layer), pass and precision, each algorithm in its faster layout is set against the
baseline in its faster layout: speed-up = baseline's median / the algorithm's, with the 95% interval
of that ratio (`ranking.Candidate.ratio_to`, paired by round where they were timed side by side).
The algorithm *wins* a problem only where the interval lies above 1, *loses* where it lies below,
and ties otherwise (docs/pages/design.md §5: a tie is not a win). Rows measured on a busy
machine do not compete; a problem where the algorithm or the baseline has no fair verified time (unsupported,
failed, busy) is counted apart (`not compared`), never drawn. The baseline is what users run,
so its `inexact` time (a library's result beyond its tolerance) is its time all the same; an
algorithm compared with it needs an `ok` one.

"Best of ours" (`BEST_OF_OURS`) is one more line per problem: the fastest of our own algorithms
there (every algorithm but the libraries' own convolutions, `is_ours`), set against the
baseline the same way, its interval that algorithm's; `winner` names it, so the tables say
which of ours wins each class. The summaries give each geometric mean speed-up a 95% interval
over the problems (a percentile bootstrap, the problems resampled: how far the mean of a
sample of a catalog's problems may be from the whole class's).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..algos import registry
from ..catalogs import selection
from ..core.fmt import plain_log
from ..core.problem import ConvProblem
from . import ranking

#: Fewest problems for which a run's report draws the picture.
MIN_PROBLEMS = 8
DEFAULT_BASELINE = {"cuda": "cudnn-autotune"}
CPU_BASELINE = "torch-cpu"
OUTCOMES = {"win": "wins", "tie": "ties", "loss": "losses"}
#: The outcome where the algorithm or the baseline has no fair verified time.
NOT_COMPARED = "not compared"
#: The line of the fastest of our own algorithms on each problem.
BEST_OF_OURS = "best of ours"
#: Bootstrap resamples of a geometric mean's interval, and their seed (the same table each
#: time it is rendered).
BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED = 2000, 0


def is_ours(algo: str) -> bool:
    """Our own algorithms (origin `ours` in their traits): not a library's convolution
    (torch-cpu, cudnn, cudnn-find-*), nor our lowering around a library's product
    (gemm-cublas), nor an inference variant (`weights_once`), whose time leaves out the filter
    transform the others pay in every call."""
    a = registry.algorithm(algo)
    return a.origin == "ours" and not a.weights_once


def weights_once(algo: str) -> bool:
    """An inference variant, whose filter is transformed once (`traits.Algorithm`): its rows
    are reported apart (`report.inference`)."""
    return registry.algorithm(algo).weights_once


def default_baseline(backend: str | None) -> str:
    """cuDNN's autotuned choice on a GPU, torch's on the CPU."""
    return DEFAULT_BASELINE.get(backend or "", CPU_BASELINE)


def _problem(r) -> ConvProblem:
    return ConvProblem(int(r["n"]), int(r["c"]), int(r["h"]), int(r["w"]), int(r["k"]),
                       int(r["r"]), int(r["s"]), r["stride"], r["pad"], r["dilation"],
                       int(r["groups"]))


def speedups(df: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """One row per (layer, pass, precision, algo other than the baseline), and one for
    `BEST_OF_OURS`: the class of the problem, the speed-up over the baseline with its interval
    (`low`, `high`), the `outcome` (win, tie, loss), or `NOT_COMPARED` with NaN speed-up where
    either side has no fair timed row (not run, failed, or measured on a busy machine; the
    algorithm's `ok`, the baseline's `ok` or `inexact`); `winner`, on the best-of-ours rows,
    the algorithm that was fastest of ours."""
    out = []
    for (layer, pass_, precision), rows in df.groupby(["layer", "pass", "precision"],
                                                      sort=False):
        fair = rows[~ranking.busy_mask(rows)]
        best = {c.algo: c for c in reversed(ranking.rank(fair))}  # each algo's fastest layout
        cls = selection.classify(_problem(rows.iloc[0]))
        base = next(iter(ranking.rank(fair[fair["algo"] == baseline], baseline=True)), None)
        ours = [a for a in dict.fromkeys(rows["algo"]) if a != baseline and is_ours(a)]
        fastest = min((best[a] for a in ours if a in best), key=lambda c: c.median_ms,
                      default=None)
        lines = [(a, best.get(a), "") for a in dict.fromkeys(rows["algo"]) if a != baseline]
        if ours:
            lines.append((BEST_OF_OURS, fastest, fastest.algo if fastest else ""))
        for algo, mine, winner in lines:
            cell = {"layer": layer, "pass": pass_, "precision": precision, "class": cls,
                    "algo": algo, "speedup": math.nan, "low": math.nan, "high": math.nan,
                    "outcome": NOT_COMPARED, "winner": winner}
            if base is not None and mine is not None:
                r = mine.ratio_to(base)  # mine / baseline: below 1 is faster
                cell.update(speedup=1 / r.value,
                            low=math.nan if r.high is None else 1 / r.high,
                            high=math.nan if r.low is None else 1 / r.low,
                            outcome="tie" if not r.decided else "win" if r.value < 1
                            else "loss")
            out.append(cell)
    return pd.DataFrame(out, columns=["layer", "pass", "precision", "class", "algo",
                                      "speedup", "low", "high", "outcome", "winner"])


def is_torchs(algo: str) -> bool:
    """torch's own convolution, as a model runs it: `torch-cpu` (oneDNN) on the CPU, cuDNN's
    picks through torch on a GPU (`cudnn`, `cudnn-autotune`); not cuDNN's algorithms one by one
    (`cudnn-find-*`), which torch does not choose: origin `torch` in their traits."""
    return registry.algorithm(algo).origin == "torch"


#: The columns of `against_torch`: the best of ours and torch's fastest, each in its faster
#: layout, with their medians (and whether torch's is `inexact`), the ratio of our time to
#: torch's and its interval, who wins.
AGAINST_TORCH = ("layer", "pass", "precision", "own", "own_layout", "own_ms", "torch",
                 "torch_layout", "torch_ms", "torch_inexact", "ratio", "low", "high", "outcome")


def against_torch(df: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, pass, precision), in the run's order, the fastest of our own algorithms
    (`is_ours`) against torch's fastest convolution (`is_torchs`), each in its faster layout:
    their medians and the ratio of ours to torch's (below 1: ours is faster) with its 95%
    interval (`ranking.Candidate.ratio_to`, paired by round: they were timed side by side).
    `outcome`: `ours` or `torch` where the interval excludes 1, else `tie`; every cell empty
    (NaN) where either side has no fair verified time (not run, failed, busy: the fastest left
    would not be the best). torch's side is what torch runs, its `inexact` pick included
    (`torch_inexact` says so); ours is `ok`. Rows only for the problems where both sides were
    asked for."""
    out = []
    for (layer, pass_, precision), rows in df.groupby(["layer", "pass", "precision"],
                                                      sort=False):
        algos = set(rows["algo"])
        if not any(map(is_ours, algos)) or not any(map(is_torchs, algos)):
            continue
        fair = rows[~ranking.busy_mask(rows)]
        own = next((c for c in ranking.rank(fair) if is_ours(c.algo)), None)
        torch = next((c for c in ranking.rank(fair, baseline=True) if is_torchs(c.algo)), None)
        cell = dict.fromkeys(AGAINST_TORCH, "")
        cell.update(layer=layer, precision=precision, ratio=math.nan, low=math.nan,
                    high=math.nan, own_ms=math.nan, torch_ms=math.nan, torch_inexact=False,
                    **{"pass": pass_})
        if own is not None and torch is not None:  # one side alone would name a pick that
            for side, c in (("own", own), ("torch", torch)):  # a busy faster one may beat
                cell.update({side: c.algo, f"{side}_layout": c.layout,
                             f"{side}_ms": c.median_ms})
            r = own.ratio_to(torch)
            cell.update(torch_inexact=torch.inexact, ratio=r.value,
                        low=math.nan if r.low is None else r.low,
                        high=math.nan if r.high is None else r.high,
                        outcome="tie" if not r.decided else "ours" if r.value < 1
                        else "torch")
        out.append(cell)
    return pd.DataFrame(out, columns=list(AGAINST_TORCH))


def _gmean(x: pd.Series) -> float:
    x = x.dropna()
    return float(math.exp(sum(math.log(v) for v in x) / len(x))) if len(x) else math.nan


def gmean_interval(x: pd.Series) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of the geometric mean of `x` over the problems
    (resampled with replacement, `BOOTSTRAP_SAMPLES` times, seeded); NaN for fewer than 2."""
    logs = np.log(x.dropna().to_numpy(dtype=float))
    if len(logs) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    means = logs[rng.integers(0, len(logs), (BOOTSTRAP_SAMPLES, len(logs)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(math.exp(low)), float(math.exp(high))


def _winners(g: pd.DataFrame) -> str:
    """Which of ours was fastest on how many of the problems compared, most first."""
    won = g.loc[g["outcome"] != NOT_COMPARED, "winner"] if "winner" in g else pd.Series()
    counts = won[won != ""].value_counts()
    return ", ".join(f"{a} {n}" for a, n in counts.items())


def summary(sp: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per group of `by` (e.g. ["algo"] or ["class", "algo"]): problems compared, the share won,
    tied and lost, the geometric mean speed-up with its 95% interval over the problems
    (`gmean_interval`), the median, how many were not run, and on `BEST_OF_OURS`'s rows which
    of ours was fastest how often."""
    rows = []
    for key, g in sp.groupby(by, sort=False):
        ran = g[g["outcome"] != NOT_COMPARED]
        n = len(ran)
        low, high = gmean_interval(ran["speedup"]) if n else (math.nan, math.nan)
        cell = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        cell.update({"problems": n,
                     **{name: f"{(ran['outcome'] == o).sum() / n:.0%}" if n else ""
                        for o, name in OUTCOMES.items()},
                     "geomean speed-up": f"{_gmean(ran['speedup']):.3g}×" if n else "",
                     "95% interval": (f"[{low:.3g}, {high:.3g}]" if not math.isnan(low)
                                      else ""),
                     "median speed-up": f"{ran['speedup'].median():.3g}×" if n else "",
                     NOT_COMPARED: len(g) - n,
                     "fastest of ours": _winners(g)})
        rows.append(cell)
    if not rows:
        return pd.DataFrame()
    table = pd.DataFrame(rows).set_index(by)
    if not table["fastest of ours"].any():
        table = table.drop(columns="fastest of ours")
    return table


def class_order(sp: pd.DataFrame) -> pd.DataFrame:
    """`sp` with its classes in `selection.CLASSES` order (for the per-class table)."""
    rank = {c: i for i, c in enumerate(selection.CLASSES)}
    return sp.sort_values("class", key=lambda col: col.map(rank), kind="stable")


def _curve(ax, ran: pd.DataFrame, color, label: str, **style) -> None:
    """Speed-ups sorted ascending over x = the share of the problems, the 95% intervals
    shaded."""
    ran = ran.sort_values("speedup", kind="stable")
    x = [(j + 0.5) / len(ran) * 100 for j in range(len(ran))]
    ax.plot(x, ran["speedup"], color=color, marker="." if len(ran) < 60 else None,
            label=label, **style)
    ax.fill_between(x, ran["low"].fillna(ran["speedup"]), ran["high"].fillna(ran["speedup"]),
                    color=color, alpha=0.2, linewidth=0)


def _label(name: str, ran: pd.DataFrame) -> str:
    wins, ties = ((ran["outcome"] == o).mean() for o in ("win", "tie"))
    return f"{name}: wins {wins:.0%}, ties {ties:.0%} of {len(ran)}"


def _axes(ax, baseline: str, title: str) -> None:
    ax.axhline(1, color="black", linewidth=0.8)
    plain_log(ax, "y")
    ax.set_xlim(0, 100)
    ax.set_xlabel("problems, sorted by speed-up (%)")
    ax.set_ylabel(f"speed-up over {baseline} (log)")
    ax.set_title(title)


def draw(plt, sp: pd.DataFrame, baseline: str, title: str, path) -> None:
    """The picture for one pass and precision. Left: per algorithm, its speed-ups sorted
    ascending over the problems both ran (x: the share of those problems), its 95% intervals
    shaded, a line at 1, and "best of ours" (the fastest of our algorithms on each problem) in
    black; the legend gives each one's share of wins and ties. Right: best of ours per class
    of problem, one colour each."""
    fig, (ax, by_class) = plt.subplots(1, 2, figsize=(13, 4.8), layout="constrained")
    drawn = 0
    for i, (algo, g) in enumerate(sp.groupby("algo", sort=False)):
        ran = g[g["outcome"] != NOT_COMPARED]
        if ran.empty:
            continue
        drawn += 1
        if algo == BEST_OF_OURS:
            _curve(ax, ran, "black", _label(algo, ran), linewidth=2.2, zorder=3)
        else:
            _curve(ax, ran, f"C{i}", _label(algo, ran))
    _axes(ax, baseline, title)
    ours = sp[(sp["algo"] == BEST_OF_OURS) & (sp["outcome"] != NOT_COMPARED)]
    for i, cls in enumerate(c for c in selection.CLASSES if c in set(ours["class"])):
        ran = ours[ours["class"] == cls]
        _curve(by_class, ran, f"C{i}",
               f"{_label(cls, ran)}, geomean {_gmean(ran['speedup']):.2f}×")
    _axes(by_class, baseline, f"best of ours, per class of problem ({len(ours)} problems)")
    if drawn:
        ax.legend(loc="upper left", fontsize="small")
        if len(ours):
            by_class.legend(loc="upper left", fontsize="small")
    else:  # an empty picture says why, as the report's table does
        ax.text(50, 1, f"no problem compared with {baseline}: every time here was taken on a "
                "busy machine,\nfailed or was not run (the report's tables say which)",
                ha="center", va="bottom", fontsize="small")
    fig.savefig(path, dpi=100)
    plt.close(fig)
