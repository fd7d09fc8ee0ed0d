"""Markdown (github pipe) tables: `tabulate`'s, or, where the package is missing, a plain one.

Every table convbench prints or writes is a github pipe table of strings (numbers formatted
before, `disable_numparse`), so when `tabulate` is not installed the same table is drawn here
and a missing package costs its alignment niceties, never a report, a summary or a GPU check.
"""

from __future__ import annotations


def tabulate(data, headers=(), tablefmt: str = "github", showindex: bool = False,
             disable_numparse: bool = True, colalign=None) -> str:
    """`tabulate.tabulate` with the arguments convbench uses; a plain github table without
    the package. `data`: a DataFrame, a list of rows (lists or dicts) or a dict of columns;
    `headers`: a list, or "keys" for the columns' names."""
    try:
        from tabulate import tabulate as real
    except ImportError:
        return _github(*_rows(data, headers), colalign)
    kw = {"colalign": colalign} if colalign is not None else {}
    return real(data, headers=headers, tablefmt=tablefmt, showindex=showindex,
                disable_numparse=disable_numparse, **kw)


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
