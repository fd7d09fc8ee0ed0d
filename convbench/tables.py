"""Tables: `tabulate`'s, or, where the package is missing, a plain github pipe table.

`tabulate` here takes what `tabulate.tabulate` takes and passes it on unchanged (its defaults
stay tabulate's), so a call site reads and prints as before; when the package is not installed
the same rows are drawn as a github pipe table, whatever format was asked for, and a missing
package costs its formats and alignment niceties, never a report, a summary or a GPU check.
"""

from __future__ import annotations


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
