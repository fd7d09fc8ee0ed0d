"""Ranking competing measurements: which is fastest, and which are a tie within noise with it.

The rule of the whole project (docs/pages/design.md §5): a time beats another only where the
interval of their ratio excludes 1 (`stats.ratio`, paired by round where the two were timed in the
same interleaved rounds); otherwise they are a tie, and a tie-break the user chose decides among the
tied (`plan.TIE_BREAKS`). Advice chooses by it, and the report marks its tables by it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..core import stats
from ..core.measurement import Measurement
from ..core.results import TIMED


def busy(r) -> bool:
    """Whether a row was measured on a busy machine: its CPU threads kept off their cores
    (`contended`) or its GPU's clocks held down (`throttled`)."""
    throttled = r.get("throttled")
    return r.get("contended") is True or (isinstance(throttled, str) and throttled != "")


def busy_mask(df: pd.DataFrame) -> pd.Series:
    """`busy` of every row of a results table, as a boolean Series on its index."""
    return pd.Series([busy(r) for r in df.to_dict("records")], index=df.index, dtype=bool)


def rank(rows: pd.DataFrame, baseline: bool = False) -> list[Candidate]:
    """The `ok` rows as candidates, fastest median first (ties in order of the rows); with
    `baseline`, the `inexact` ones too: a baseline is what users run, exact or not, while a
    winner is an `ok` row."""
    ok = rows[rows["status"].isin(TIMED if baseline else ("ok",))]
    return [Candidate.from_row(r) for r in ok.sort_values("median_ms", kind="stable")
            .to_dict("records")]


@dataclass(frozen=True)
class Candidate:
    """One timed measurement (`ok`, or `inexact` where a baseline may be): its times (to judge
    noise by), the rounds it was timed in, and what a tie is broken by. `shift_ms`: what the
    pass costs beyond its measured time where it runs (advice's cost of a swapped pass in a
    model); every comparison, its intervals too, is of the times shifted by it, so a constant
    cost moves the candidate without changing its noise."""

    algo: str
    backend: str
    layout: str
    median_ms: float
    iqr_ms: float
    q1: float
    q3: float
    times: tuple[float, ...] = ()
    round_group: str = ""
    workspace: float = 0.0
    rel_error: float = 0.0
    inexact: bool = False
    shift_ms: float = 0.0

    @property
    def cost_ms(self) -> float:
        """The median as compared: the measured one plus `shift_ms`."""
        return self.median_ms + self.shift_ms

    @classmethod
    def from_row(cls, r, shift_ms: float = 0.0) -> Candidate:
        times: tuple[float, ...] = ()
        if r["times_ms"]:
            m = Measurement.from_text(r["times_ms"])
            q1, q3, times = m.q1, m.q3, m.times_ms
        else:  # no raw times: the IQR centred on the median
            q1, q3 = r["median_ms"] - r["iqr_ms"] / 2, r["median_ms"] + r["iqr_ms"] / 2
        used = next((float(v) for v in (r.get("workspace_bytes"), r.get("peak_bytes"))
                     if v is not None and not pd.isna(v)), 0.0)
        error = r.get("rel_error")
        group = r.get("round_group")
        return cls(r["algo"], r["backend"], r["layout"], float(r["median_ms"]),
                   float(r["iqr_ms"]), q1, q3, times, group if isinstance(group, str) else "",
                   used, 0.0 if error is None or pd.isna(error) else float(error),
                   r.get("status") == "inexact", shift_ms)

    def shifted(self) -> tuple[float, ...]:
        """The repetitions' times plus `shift_ms`."""
        return tuple(t + self.shift_ms for t in self.times)

    def ratio_to(self, other: Candidate) -> stats.Ratio:
        """This one's cost over `other`'s, with its interval (of the shifted times): paired by
        round where the two were timed in the same rounds."""
        if not self.times or not other.times:
            return stats.Ratio(self.cost_ms / other.cost_ms, None, None, False)
        paired = (bool(self.round_group) and self.round_group == other.round_group
                  and len(self.times) == len(other.times))
        return stats.ratio(self.shifted(), other.shifted(), paired)


def preferred(tied: list[Candidate], tie_break: str) -> Candidate:
    """The candidate a tie-break takes among `tied` (the least cost breaks its own ties)."""
    key = {"workspace": lambda c: (c.workspace, c.cost_ms),
           "error": lambda c: (c.rel_error, c.cost_ms),
           "time": lambda c: c.cost_ms}[tie_break]
    return min(tied, key=key)


def tied(ranked: list[Candidate]) -> list[Candidate]:
    """The fastest and every candidate not decidedly slower than it (the interval of its
    ratio to the fastest reaches 1)."""
    fastest = ranked[0]
    return [fastest] + [c for c in ranked[1:] if not c.ratio_to(fastest).decided]
