"""Two run folders side by side: what differs between the machines and libraries they ran on,
and per row whether B is faster or slower than A beyond noise.

A ratio of two medians from two runs means something only if the runs measured the same
problems on comparable machines, so `environment_differences` lists what differs (device, CPU
or GPU model, driver, CUDA, cuDNN, the libraries, threads, batch) before any number, and
`compare` refuses runs of different problems or batches unless forced. Per row, B's median over
A's with the 95% interval of that ratio (`stats.ratio`, a bootstrap over each run's repetitions
apart: two runs share no rounds); a change beyond noise is one whose interval excludes 1.
`regressions` are the rows slower beyond noise by more than a given share (the interval lies
wholly above it), which
`convbench compare --fail-above PCT` turns into exit code 1 (as pytest-benchmark's
`--benchmark-compare-fail` does).

Beside the rows, the runs' answers: per layer, pass and layout, whether the two name the same
winner (`winners`: agree, one of them a tie within noise, or they disagree), and for every
competitor's time relative to the fastest of its column in A, whether B's ratio falls in A's
interval (`ratio_consistency`): two runs of one machine should agree on both, and where they do
not, noise or a busy machine made the difference. A time taken on a busy machine (contended,
throttled) is marked in its row (`busy`), counted under the table, and leaves its column
without a winner in that run (`busy in B`): a competitor's time that may be wrong does not let
the others win.
"""

from __future__ import annotations

import math

import pandas as pd

from ..core import stats
from ..core.fmt import fmt_ms, tabulate
from ..core.results import KEY, PROBLEM_FIELDS, TIMED
from . import ranking

#: What a row is compared by: its key less the problem fields that its layer name implies
#: (the batch stays: it is what most often differs).
SHOWN_KEY = [c for c in KEY if c not in PROBLEM_FIELDS or c == "n"]


def _get(env: dict, *path):
    for p in path:
        env = env.get(p) if isinstance(env, dict) else None
    return env


#: (what, how to read it from an env.json), in the order differences are listed.
_FACTS = (
    ("device", lambda e: e.get("device")),
    ("CPU", lambda e: _get(e, "cpu", "model")),
    ("cores", lambda e: _get(e, "cpu", "cores")),
    ("GPU driver", lambda e: _get(e, "gpu", "driver")),
    ("CUDA runtime", lambda e: _get(e, "gpu", "cuda_runtime")),
    ("cuDNN", lambda e: _get(e, "torch", "cudnn")),
    ("torch", lambda e: _get(e, "torch", "version")),
    ("NumPy", lambda e: _get(e, "numpy", "version")),
    ("BLAS", lambda e: _get(e, "numpy", "blas", "name")),
    ("CuPy", lambda e: e.get("cupy")),
    ("pyFFTW", lambda e: _get(e, "pyfftw", "version")),
    ("Python", lambda e: e.get("python")),
    ("threads", lambda e: _get(e, "threads", "threads") or _get(e, "torch", "threads")),
    ("convbench", lambda e: e.get("convbench")),
    ("git commit", lambda e: e.get("git_commit")),
)


def environment_differences(env_a: dict, env_b: dict, a: pd.DataFrame | None = None,
                            b: pd.DataFrame | None = None) -> list[tuple[str, str, str]]:
    """(what, A's, B's) for each fact of the two env.json files that differs, and the batch
    sizes where the two tables differ in them."""
    out = []
    for what, read in _FACTS:
        va, vb = read(env_a), read(env_b)
        if va != vb:
            out.append((what, str(va), str(vb)))
    if a is not None and b is not None:
        na, nb = (sorted({int(n) for n in df["n"].dropna()}) for df in (a, b))
        if na != nb:
            out.append(("batch", ", ".join(map(str, na)), ", ".join(map(str, nb))))
    return out


def _problems(df: pd.DataFrame) -> set[tuple]:
    return set(map(tuple, df[["layer", *PROBLEM_FIELDS]].astype(str).drop_duplicates().values))


def check_comparable(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """ValueError, in one line, where the two runs measured different problems or batches."""
    only_a, only_b = _problems(a) - _problems(b), _problems(b) - _problems(a)
    if not only_a and not only_b:
        return
    na, nb = (sorted({int(n) for n in df["n"].dropna()}) for df in (a, b))
    if na != nb:
        raise ValueError(f"the runs measured other batches (A: {', '.join(map(str, na))}; B: "
                         f"{', '.join(map(str, nb))}): their times are not comparable; --force "
                         "compares the rows they share")

    def named(problems: set[tuple]) -> str:
        names = sorted({p[0] for p in problems})
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    parts = [f"{len(only)} only in {side} ({named(only)})"
             for side, only in (("A", only_a), ("B", only_b)) if only]
    raise ValueError(f"the runs measured different problems: {'; '.join(parts)}; --force "
                     "compares the rows they share")


def _times(text) -> list[float]:
    return [float(t) for t in text.split()] if isinstance(text, str) and text else []


def compare(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per row key: B's median over A's with its 95% interval, and the change: `faster` or
    `slower` where the interval excludes 1, empty for a tie within noise (or too few
    repetitions to tell), a change of status, or a row only one run has. `busy` names the runs
    (`A`, `B`, `A+B`) whose time of the row was taken on a busy machine (contended, throttled):
    its change may be the load rather than the code."""
    cols = [*KEY, "status", "median_ms", "times_ms"]
    a, b = (df.assign(_busy=ranking.busy_mask(df)) for df in (a, b))
    both = a[[*cols, "_busy"]].merge(b[[*cols, "_busy"]], on=list(KEY), how="outer",
                                     suffixes=("_a", "_b"), indicator=True)
    change, low, high = [], [], []
    for r in both.to_dict("records"):
        lo = hi = None
        if r["_merge"] != "both":
            change.append("only in A" if r["_merge"] == "left_only" else "only in B")
        elif r["status_a"] != r["status_b"]:
            change.append(f"{r['status_a']} -> {r['status_b']}")
        elif r["status_a"] not in TIMED:  # two `inexact` times compare as two `ok` ones
            change.append("")
        else:
            ta, tb = _times(r["times_ms_a"]), _times(r["times_ms_b"])
            ratio = (stats.ratio(tb, ta) if ta and tb else
                     stats.Ratio(r["median_ms_b"] / r["median_ms_a"], None, None, False))
            lo, hi = ratio.low, ratio.high
            change.append("" if not ratio.decided else "slower" if ratio.low > 1 else "faster")
        low.append(lo)
        high.append(hi)
    both["ratio"] = both["median_ms_b"] / both["median_ms_a"]
    both["ratio_low"], both["ratio_high"] = low, high
    both["change"] = change
    both["busy"] = ["+".join(side for side, flag in (("A", fa), ("B", fb)) if flag is True)
                    for fa, fb in zip(both["_busy_a"], both["_busy_b"])]
    return both[[*SHOWN_KEY, "median_ms_a", "median_ms_b", "ratio", "ratio_low", "ratio_high",
                 "change", "busy"]]


def regressions(cmp: pd.DataFrame, share: float) -> pd.DataFrame:
    """The rows slower beyond noise by more than `share` (0.05: 5%): those whose ratio's
    interval lies wholly above 1 + `share`. A median ratio past the threshold whose interval
    still reaches below it may be noise around a change within the threshold, and is no
    regression to fail on."""
    return cmp[pd.to_numeric(cmp["ratio_low"], errors="coerce") > 1 + share]


def _interval(lo, hi) -> str:
    return "" if lo is None or pd.isna(lo) else f"[{lo:.3f}, {hi:.3f}]"


def compare_table(cmp: pd.DataFrame) -> str:
    """The comparison as a table, with the geometric-mean ratio over rows timed in both."""
    shown = cmp.assign(median_ms_a=cmp["median_ms_a"].map(fmt_ms),
                       median_ms_b=cmp["median_ms_b"].map(fmt_ms),
                       ratio=cmp["ratio"].map(lambda v: "" if pd.isna(v) else f"{v:.3f}"),
                       ratio_low=[_interval(lo, hi) for lo, hi in
                                  zip(cmp["ratio_low"], cmp["ratio_high"])])
    shown = shown.drop(columns="ratio_high").rename(columns={"ratio_low": "95% interval"})
    text = tabulate(shown, headers="keys", tablefmt="github", showindex=False,
                    disable_numparse=True)
    ratios = cmp["ratio"].dropna()
    ratios = ratios[ratios > 0]
    if len(ratios):
        gmean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        counts = cmp["change"].value_counts()
        text += (f"\n\nB/A median ratio, geometric mean over {len(ratios)} rows: {gmean:.3f}; "
                 f"beyond noise: {counts.get('faster', 0)} faster, {counts.get('slower', 0)} "
                 f"slower; {len(ratios) - counts.get('faster', 0) - counts.get('slower', 0)} "
                 "ties within noise.")
        busy = cmp.loc[ratios.index, "busy"]
        if (busy != "").any():
            in_a, in_b = (int(busy.str.contains(side).sum()) for side in ("A", "B"))
            text += (f" Of these rows, {in_a} in A and {in_b} in B were timed on a busy machine "
                     "(column busy: contended or throttled): their changes may be the load, "
                     "not the code.")
    return text


def header(env_a: dict, env_b: dict, differences: list[tuple[str, str, str]]) -> list[str]:
    """The lines a comparison starts with: each run's machine, then what differs."""
    def side(name: str, env: dict) -> str:
        return (f"{name}: {env.get('device', 'unknown device')}, {env.get('date', 'no date')}, "
                f"convbench {env.get('convbench')} ({env.get('git_commit') or 'no commit'})")

    lines = [side("A", env_a), side("B", env_b)]
    if differences:
        lines.append("Differences: " + "; ".join(f"{what}: {va} vs {vb}"
                                                  for what, va, vb in differences))
    else:
        lines.append("Same machine, libraries and batches.")
    return lines


# --- the runs' answers ---------------------------------------------------------------------------
COLUMN = ["layer", "pass", "layout", "precision"]
#: A column's verdict where one of its times was taken on a busy machine.
BUSY = "busy"
ANSWERS = ("same winner", "same tie", "tie in A", "tie in B", "disagree", "busy in A",
           "busy in B", "busy in both")


def _verdict(rows: pd.DataFrame) -> str:
    """A column's answer: the winner's algo, `tie` (naming the tied), `busy` where any of its
    times was taken on a busy machine (a competitor's time that may be wrong leaves the column
    without an answer, not with the answer of the rest), or `` with none ok."""
    ok = rows[rows["status"] == "ok"]
    if ranking.busy_mask(ok).any():
        return BUSY
    ranked = ranking.rank(ok)
    if not ranked:
        return ""
    tied = ranking.tied(ranked)
    return ranked[0].algo if len(tied) == 1 else "tie: " + ", ".join(c.algo for c in tied)


def winners(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per layer, pass, layout and precision both runs have: each run's winner (or its tie) and
    whether they agree (`same winner`, `same tie`), one is a tie (`tie in A`, `tie in B`), or
    they name different winners (`disagree`). A column with a time from a busy machine has no
    answer in that run (`busy in A`, `busy in B`, `busy in both`)."""
    out = []
    ga = dict(list(a.groupby(COLUMN, sort=False)))
    for key, rows_b in b.groupby(COLUMN, sort=False):
        if key not in ga:
            continue
        va, vb = _verdict(ga[key]), _verdict(rows_b)
        if not va or not vb:
            continue
        tie_a, tie_b = va.startswith("tie"), vb.startswith("tie")
        if BUSY in (va, vb):
            answer = ("busy in both" if va == vb else "busy in A" if va == BUSY
                      else "busy in B")
        else:
            answer = ("same tie" if tie_a and tie_b else "tie in A" if tie_a else "tie in B"
                      if tie_b else "same winner" if va == vb else "disagree")
        out.append({**dict(zip(COLUMN, key)), "A": va, "B": vb, "answer": answer})
    return pd.DataFrame(out, columns=[*COLUMN, "A", "B", "answer"])


def ratio_consistency(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """For each competitor of each column of A (every algo of a layer, pass, layout and
    precision but the fastest): its ratio to A's fastest with A's interval, B's ratio of the
    same two (where B measured both, not on a busy machine), and whether it lies in A's
    interval."""
    out = []
    ga = dict(list(a.groupby(COLUMN, sort=False)))
    for key, rows_b in b.groupby(COLUMN, sort=False):
        if key not in ga:
            continue
        ranked = ranking.rank(ga[key][~ranking.busy_mask(ga[key])])
        fair = rows_b[(rows_b["status"] == "ok") & ~ranking.busy_mask(rows_b)]
        times_b = {r["algo"]: r["median_ms"] for r in fair.to_dict("records")}
        if len(ranked) < 2 or ranked[0].algo not in times_b:
            continue
        for other in ranked[1:]:
            if other.algo not in times_b:
                continue
            ra = other.ratio_to(ranked[0])
            rb = times_b[other.algo] / times_b[ranked[0].algo]
            inside = ra.low is not None and ra.low <= rb <= ra.high
            out.append({**dict(zip(COLUMN, key)), "algo": other.algo,
                        "vs": ranked[0].algo, "A": ra.text(), "B": f"{rb:.3g}×",
                        "in A's interval": inside})
    return pd.DataFrame(out, columns=[*COLUMN, "algo", "vs", "A", "B", "in A's interval"])


def answers_text(a: pd.DataFrame, b: pd.DataFrame) -> str:
    """The winners and the ratio consistency as markdown, with their counts."""
    wins, ratios = winners(a, b), ratio_consistency(a, b)
    lines = []
    if len(wins):
        counts = wins["answer"].value_counts()
        lines += ["Winners per layer, pass and layout: " + ", ".join(
            f"{counts.get(k, 0)} {k}" for k in ANSWERS if k in counts or not k.startswith(
                "busy")) + ".", "",
                  tabulate(wins, headers="keys", tablefmt="github", showindex=False,
                           disable_numparse=True), ""]
    if len(ratios):
        inside = int(ratios["in A's interval"].sum())
        lines += [(f"Ratios to each column's fastest: {inside} of {len(ratios)} of B's within "
                  "A's 95% interval."), ""]
    return "\n".join(lines)

