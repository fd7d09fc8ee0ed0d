"""Formatting and plotting helpers every renderer shares (as PyTorch keeps them in
`torch/utils/benchmark/utils/common.py`): data and formatting low, renderers that only render.

Cells: `fmt_ms`, `fmt_mib`, `fmt_gflop`, `fmt_error`, `fmt_ratio` (a missing value is an empty
cell); `first_line` (an exception's message for one line of output). Tables: `tabulate`
(`tabulate.tabulate`, or a plain github table where the package is missing) and `md_table` (a
DataFrame as a github table). Plots: `pyplot` (matplotlib on Agg, or None where it is missing,
said by `NO_MATPLOTLIB`) and `save_figure`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def is_missing(x) -> bool:
    """Whether a cell's value is absent (None, NaN, pandas' NA). pandas is imported here, not
    above: the layers that only want `first_line` (the registry, the kernels) stay free of it."""
    import pandas as pd

    return x is None or bool(pd.isna(x))


def fmt_ms(ms: float) -> str:
    return "" if is_missing(ms) else f"{ms:.0f}" if ms >= 1000 else f"{ms:.4g}"


def fmt_mib(nbytes: float | None, places: int | None = None) -> str:
    """Bytes as MiB: four significant digits, or `places` decimals; "" where missing."""
    if is_missing(nbytes):
        return ""
    return f"{nbytes / 2**20:.4g}" if places is None else f"{nbytes / 2**20:.{places}f}"


def fmt_gflop(x: float) -> str:
    return "n/a" if is_missing(x) else f"{x / 1e9:.4g}"


def fmt_error(x: float) -> str:
    return "" if is_missing(x) else "inf" if math.isinf(x) else f"{x:.2g}"


def fmt_ratio(x: float, digits: int = 2) -> str:
    """A ratio to `digits` significant digits: `1.3×`."""
    return f"{x:.{digits}g}×"


def fmt_duration(s: float) -> str:
    """Seconds as minutes and seconds, `3m06s`: how a run's summary line and report say it."""
    return f"{int(s // 60)}m{int(s % 60):02d}s"


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message ("" for none): what one line of output says."""
    return (str(exc).strip().splitlines() or [""])[0]


# --- tables: `tabulate` takes what `tabulate.tabulate` takes and passes it on unchanged (its
# defaults stay tabulate's), so a call site reads and prints as before; when the package is not
# installed the same rows are drawn as a github pipe table, whatever format was asked for, and a
# missing package costs its formats and alignment niceties, never a report or a GPU check.
def tabulate(data, headers=(), **options) -> str:
    """`tabulate.tabulate(data, headers, **options)`; a plain github table without the package.
    `data`: a DataFrame, a list of rows (lists or dicts) or a dict of columns; `headers`: a
    list, or "keys" for the columns' names (a DataFrame's index is left out)."""
    try:
        from tabulate import tabulate as real
    except ImportError:
        return _github(*_rows(data, headers), options.get("colalign"))
    return real(data, headers=headers, **options)


def _rows(data, headers) -> tuple[list[str], list[list]]:
    if hasattr(data, "columns") and hasattr(data, "values"):  # a DataFrame
        keys, rows = list(data.columns), data.values.tolist()
    elif isinstance(data, dict):
        keys, rows = list(data), [list(r) for r in zip(*data.values())]
    else:
        rows = list(data)
        if rows and isinstance(rows[0], dict):
            keys = list(dict.fromkeys(k for r in rows for k in r))
            rows = [[r.get(k, "") for k in keys] for r in rows]
        else:
            keys, rows = [], [list(r) for r in rows]
    heads = keys if headers == "keys" else list(headers)
    return [str(h) for h in heads], rows


def _github(heads: list[str], rows: list[list], colalign) -> str:
    cells = [["" if v is None else str(v) for v in r] for r in rows]
    ncol = max([len(heads)] + [len(r) for r in cells])
    heads = heads + [""] * (ncol - len(heads))
    cells = [r + [""] * (ncol - len(r)) for r in cells]
    width = [max(3, *(len(r[i]) for r in [heads, *cells])) for i in range(ncol)]
    align = list(colalign or ["left"] * ncol) + ["left"] * ncol

    def line(values) -> str:
        return "| " + " | ".join(v.rjust(w) if a == "right" else v.ljust(w)
                                 for v, w, a in zip(values, width, align)) + " |"

    rule = "|" + "|".join((":" + "-" * (w + 1) if a != "right" else "-" * (w + 1) + ":")
                          for w, a in zip(width, align)) + "|"
    return "\n".join([line(heads), rule, *(line(r) for r in cells)])


def md_table(df: pd.DataFrame) -> str:
    """A github-style (markdown pipe) table, index as the first column, values right-aligned."""
    names = [str(n) for n in df.index.names]
    align = ("left",) * len(names) + ("right",) * len(df.columns)
    return tabulate(df.reset_index(), headers=names + [str(c) for c in df.columns],
                    tablefmt="github", showindex=False, disable_numparse=True, colalign=align)


NO_MATPLOTLIB = "Plots skipped: matplotlib is not installed (pip install 'convbench[plot]')."


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display), or None if missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plain_log(ax, axes: str = "y") -> None:
    """Log scale on `axes` ("x", "y" or "xy") of `ax`, its ticks labelled in plain numbers (60,
    0.5), not matplotlib's default 6x10^1: the ticks it labels are the default's (which minor
    ones too, by how many decades the axis spans)."""
    import numpy as np
    from matplotlib import ticker

    class Plain(ticker.LogFormatter):
        def __call__(self, x, pos=None):
            if not super().__call__(x, pos):
                return ""
            return np.format_float_positional(float(f"{x:.3g}"), trim="-")

    for name in axes:
        axis = ax.xaxis if name == "x" else ax.yaxis
        (ax.set_xscale if name == "x" else ax.set_yscale)("log")
        axis.set_major_formatter(Plain())
        axis.set_minor_formatter(Plain(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def legend_entry(ax, color, label: str) -> None:
    """A legend entry on `ax` for a series of bars in `color`, drawn as no data: a bar series'
    own entry takes the style of its first bar, which a mark may have hatched or faded."""
    ax.plot([], [], linestyle="", marker="s", markersize=9, color=color, label=label)


def save_figure(fig, path: Path, legend: bool = True) -> None:
    """One legend for all panels, outside them (unless the panels carry their own); write the
    PNG and free the figure."""
    import matplotlib.pyplot as plt

    if legend:
        fig.legend(*fig.axes[0].get_legend_handles_labels(), loc="outside right upper",
                   fontsize="small")
    fig.savefig(path, dpi=100)
    plt.close(fig)
