"""The rows of inference variants (`traits.Algorithm.weights_once`), reported apart.

An inference variant transforms its filter once and keeps it while the weights stay the same
(Winograd's `*-inference`), so its time leaves out what every per-call algorithm pays in each
call. Its rows therefore take part in none of the report's comparisons (the best of ours, which
wins, the times per layer, the speed-ups, the plots) and have a section of their own: each
beside its per-call twin (the same family and tile) and torch's convolution, in the same
layout, so what transforming the weights once saves is read directly.
"""

from __future__ import annotations

import math

import pandas as pd

from ...algos import registry
from ...core.fmt import fmt_ms, fmt_ratio, md_table
from ...core.results import TIMED
from .. import speedup


def split(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the rows of per-call algorithms, the rows of inference variants)."""
    once = df["algo"].map(speedup.weights_once).astype(bool)
    return df[~once], df[once]


def twin(algo: str, have) -> str | None:
    """The per-call algorithm of `algo`'s family and tile among `have`, or None."""
    mine = registry.algorithm(algo)
    return next((a for a in have if not speedup.weights_once(a)
                 and registry.algorithm(a).family == mine.family
                 and registry.algorithm(a).tile == mine.tile), None)


def _ratio(a: float, b: float) -> str:
    return "" if math.isnan(a) or math.isnan(b) else fmt_ratio(a / b)


def _ms(rows: pd.DataFrame, algo: str | None) -> float:
    """`algo`'s fastest time among `rows`: a baseline's, so an `inexact` one counts."""
    hit = rows[(rows["algo"] == algo) & rows["status"].isin(TIMED)] if algo else rows.iloc[:0]
    return float(hit["median_ms"].min()) if len(hit) else math.nan


def table(once: pd.DataFrame, per_call: pd.DataFrame) -> pd.DataFrame:
    """Per inference row it ran or tried (not the passes and problems it does not take, whose
    reasons are in measurements.csv): its time (or status), its per-call twin's and torch's in
    the same layout, and its ratio to each (below 1: the variant is faster)."""
    have = list(dict.fromkeys(per_call["algo"]))
    torchs = [a for a in have if speedup.is_torchs(a)]
    out = []
    keys = ["layer", "pass", "layout", "precision"]
    tried = once[once["status"] != "unsupported"]
    for (layer, pass_, layout, precision), rows in tried.groupby(keys, sort=False):
        same = per_call[(per_call["layer"] == layer) & (per_call["pass"] == pass_)
                        & (per_call["layout"] == layout) & (per_call["precision"] == precision)]
        torch_ms = min((_ms(same, a) for a in torchs), default=math.nan)
        for _, r in rows.iterrows():
            mine = r["median_ms"] if r["status"] == "ok" else math.nan
            each = twin(r["algo"], have)
            each_ms = _ms(same, each)
            out.append({"layer": layer, "pass": pass_, "layout": layout, "algo": r["algo"],
                        "once ms": fmt_ms(mine) if r["status"] == "ok" else r["status"],
                        "per call": f"{each} {fmt_ms(each_ms)}" if each else "",
                        "once / per call": _ratio(mine, each_ms),
                        "torch's ms": fmt_ms(torch_ms),
                        "once / torch": _ratio(mine, torch_ms)})
    return pd.DataFrame(out).set_index(["layer", "pass", "layout", "algo"]) if out else \
        pd.DataFrame()


def section(once: pd.DataFrame, per_call: pd.DataFrame) -> list[str]:
    rows = table(once, per_call)
    if rows.empty:
        return []
    return ["## Weights transformed once (inference)", "",
            ("The inference variants transform the filter at a pass's first call and keep it "
             "while the weights stay the same (each call compares them, a phase of its own), as "
             "inference engines transform weights once. Their times leave out the filter "
             "transform every per-call algorithm pays, so they are reported here only, beside "
             "their per-call twin and torch's convolution in the same layout (ratios below 1: "
             "the variant is faster), and no table above and no plan takes them: a training "
             "step changes the weights."), "",
            md_table(rows), ""]
