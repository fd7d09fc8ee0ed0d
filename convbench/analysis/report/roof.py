"""How far from the roof: each verified fp32 row against the device's ceilings (env.json's
`ceilings`, `measure.ceilings`), as a frame and a table.

A rate means something only against what the device can do (docs/pages/design.md §5): each row's
rate is stated as a share of the fp32 compute roof (`Ceilings.compute_roof`: the larger of the
best library SGEMM and the measured FMA peak), counted in direct-convolution flops
and in the algorithm's own operations, and its intensity (own operations over the fewest bytes
its pass can move) says which roof, compute or memory, bounds it there.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...core.fmt import fmt_ms
from ...core.results import problem_from_row
from ...measure import memory
from ...measure.ceilings.record import Ceilings
from ...measure.ceilings.roofline import bound, roofline_point

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


def roof_frame(df: pd.DataFrame, ceilings: Ceilings) -> pd.DataFrame:
    """The verified fp32 rows with their standing against `ceilings`: `direct_share` (GFLOP/s
    over the compute roof, `Ceilings.compute_roof`), `own_gflops` and `own_share` (the algorithm's own operations,
    `algo_ops`, over the median; for a row without a count of its own, the direct flops,
    `own_counted` False), `bytes` (`min_bytes`), `intensity` (own ops per byte), and which roof
    is lower there (`bound`: compute or memory, against the DRAM bandwidth) with `roof_share`,
    the share of that roof attained."""
    rows = df[(df["status"] == "ok") & (df["precision"] == ROOF_PRECISION)
              & df["median_ms"].notna() & (df["median_ms"] > 0)]
    out, roof = [], ceilings.compute_roof[0]
    for r in rows.to_dict("records"):
        counted = r.get("algo_ops") is not None and pd.notna(r["algo_ops"]) and r["algo_ops"] > 0
        ops = float(r["algo_ops"]) if counted else float(problem_from_row(r).flops)
        seconds, nbytes = r["median_ms"] / 1e3, min_bytes(r)
        point = roofline_point(ops, nbytes, seconds)
        try:
            b = bound(point, ceilings)
            kind, share = b.kind, b.share
        except ValueError:  # no DRAM bandwidth measured
            kind, share = "", math.nan
        out.append({**r, "own_counted": counted, "own_gflops": point.gflops,
                    "direct_share": r["gflops"] / roof, "own_share": point.gflops / roof,
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
