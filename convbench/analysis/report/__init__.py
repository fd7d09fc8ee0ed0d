"""A run folder's results -> what people read: report.md and its plots (the CSV and JSON forms
are `results`'s; two runs side by side are `compare`'s; a run of many problems adds `speedup`'s
sorted speed-ups over a baseline).

The report reads the results table (`results.frame` of a run's rows) and env.json only, so a
run folder can be re-rendered any time (`convbench report RUN --out DIR`), and it chooses its
own form: a batch sweep (several batch sizes of a layer) reads as `sweep`'s batch-size figures,
every other run as the run report. `write` is the one entry point that writes a report and its
plots, into the folder it is given; `text` is the same report for reading, written nowhere: a
committed run folder that is read stays as it was.

The run report's parts: `tables` and `roof` (DataFrames, pure functions of the frame), `prose`
(report.md's text around them, in reading order), `plots` (the figures), `cells` (the marks
and orders they share). The names below are what callers use.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...core.results import REPORT_MD
from ..inexact import INEXACT
from . import sweep
from .cells import BEST, BUSY, HOST_BOUND, NOISY, TIED
from .plots import plot
from .prose import (
    ceilings_lines,
    layer_table,
    layer_verdict,
    markdown,
    speedup_section,
)
from .tables import (
    UNDECIDED_BUSY,
    UNDECIDED_NONE,
    busy_table,
    choice_totals,
    cost_table,
    not_measured,
    time_table,
    where,
    winner_table,
)

__all__ = ["BEST", "BUSY", "HOST_BOUND", "INEXACT", "NOISY", "REPORT_MD", "TIED",
           "UNDECIDED_BUSY", "UNDECIDED_NONE", "busy_table", "ceilings_lines", "choice_totals",
           "cost_table", "layer_table", "layer_verdict", "markdown", "not_measured", "plot",
           "speedup_section", "text", "time_table", "where", "winner_table", "write"]


#: The plots section of a report that was read, not written: plots are files, drawn only where
#: a report is written.
NOT_DRAWN = ("Not drawn: this report was read, not written; `convbench report RUN --out DIR` "
             "writes report.md and its plots into DIR.")


def text(df: pd.DataFrame, env: dict, baseline: str | None = None) -> str:
    """The report `write` would write, in the same form, with `NOT_DRAWN` for its plots:
    reading a run folder (`convbench report RUN`) changes nothing in it."""
    if sweep.is_batch_sweep(df):
        return sweep.sweep_markdown(df, env, NOT_DRAWN)
    return markdown(df, env, NOT_DRAWN, baseline)


def write(folder: str | Path, df: pd.DataFrame, env: dict, baseline: str | None = None) -> str:
    """Render report.md and its plots into a run folder, in the form its results call for (a
    batch sweep's own report, `sweep`, when they are one); returns the markdown.
    `baseline`: the algorithm the speed-ups of a run of many problems are over (default
    `speedup.default_baseline`)."""
    folder = Path(folder)
    if sweep.is_batch_sweep(df):
        text = sweep.sweep_markdown(df, env, sweep.sweep_plot(df, folder))
    else:
        text = markdown(df, env, plot(df, folder, env, baseline), baseline)
    (folder / REPORT_MD).write_text(text)
    return text
