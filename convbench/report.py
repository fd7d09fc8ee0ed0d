"""Results table -> what people read: markdown tables, CSV, JSON, plots, and run-to-run deltas.

The tables are the study's view of the data: for each pass and layout, rows are algorithms and
columns are layers, the fastest in each column marked with `*` (as PyTorch's `Compare` marks
the best); cases that did not run say why in one word (`unsupported`, `failed`, `oom`), with the
reasons listed once below. Beside the times: the theoretical operation counts (the study's
"kernel operation counts" figure), the workspace, and the error against the float64 reference.

Everything here reads the results table only (a DataFrame of `runner.COLUMNS`), so a run folder
can be re-rendered any time (`convbench report RUN`). Plots need matplotlib (the `plot` extra);
without it the report says so and carries on.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from . import registry
from .measurement import NOISE_THRESHOLD, Measurement
from .runner import COLUMNS, CPU_BATCH, KEY, PROBLEM_FIELDS, RESULTS_CSV, read_rows

ENV_JSON = "env.json"
REPORT_MD = "report.md"
_NUMERIC = (*PROBLEM_FIELDS, "median_ms", "iqr_ms", "reps", "gflops", "rel_error",
            "workspace_bytes", "min_ms", "algo_ops", "max_abs_error", "tolerance")
_INTEGER = (*PROBLEM_FIELDS, "reps", "workspace_bytes", "algo_ops")
BEST = " *"
#: Prefix of a noisy measurement's time (IQR/median above the threshold).
NOISY = "~"


# --- loading --------------------------------------------------------------------------------
def frame(rows: list[dict]) -> pd.DataFrame:
    """Rows (from the runner, or strings from the CSV) as a typed results DataFrame."""
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    for col in _NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df["noisy"] = df["noisy"].map({True: True, False: False, "True": True, "False": False})
    for col in ("reason", "note", "times_ms"):
        df[col] = df[col].fillna("")
    return df


def load_run(folder: str | Path) -> tuple[pd.DataFrame, dict]:
    """A run folder's results and environment; ValueError if it holds no results."""
    folder = Path(folder)
    csv_path = folder / RESULTS_CSV
    if not csv_path.is_file():
        raise ValueError(f"{folder} is not a run folder: it has no {RESULTS_CSV}")
    env_path = folder / ENV_JSON
    env = json.loads(env_path.read_text()) if env_path.is_file() else {}
    return frame(read_rows(csv_path)), env


# --- cells ----------------------------------------------------------------------------------
def fmt_ms(ms: float) -> str:
    return "" if pd.isna(ms) else f"{ms:.0f}" if ms >= 1000 else f"{ms:.4g}"


def fmt_mib(nbytes: float) -> str:
    return "" if pd.isna(nbytes) else f"{nbytes / 2**20:.4g}"


def fmt_gflop(x: float) -> str:
    return "n/a" if pd.isna(x) else f"{x / 1e9:.4g}"


def fmt_error(x: float) -> str:
    return "" if pd.isna(x) else "inf" if math.isinf(x) else f"{x:.2g}"


def _order(values, reference: tuple[str, ...] = ()) -> list[str]:
    """Distinct values: those in `reference` in its order, then the rest as first seen."""
    seen = list(dict.fromkeys(values))
    return [v for v in reference if v in seen] + [v for v in seen if v not in reference]


def _algos(df: pd.DataFrame) -> list[str]:
    return _order(df["algo"], registry.ALGOS)


def _layers(df: pd.DataFrame) -> list[str]:
    return _order(df["layer"])


def _flag(v) -> bool:
    """A boolean cell that may be missing (None/NaN) as a plain bool."""
    return bool(pd.notna(v) and v)


def _table(df: pd.DataFrame) -> str:
    """A github-style (markdown pipe) table, index as the first column, values right-aligned."""
    names = [str(n) for n in df.index.names]
    align = ("left",) * len(names) + ("right",) * len(df.columns)
    return tabulate(df.reset_index(), headers=names + [str(c) for c in df.columns],
                    tablefmt="github", showindex=False, disable_numparse=True, colalign=align)


# --- tables ---------------------------------------------------------------------------------
def time_table(df: pd.DataFrame) -> pd.DataFrame:
    """Rows algo, columns layer, cells the median ms, the fastest per column marked (and noisy
    ones prefixed), for the rows of one pass, layout and precision."""
    cells = pd.DataFrame("", index=pd.Index(_algos(df), name="algo"), columns=_layers(df))
    for layer, rows in df.groupby("layer", sort=False):
        ok = rows[rows["status"] == "ok"]
        best = ok["median_ms"].idxmin() if len(ok) else None
        for i, r in rows.iterrows():
            if r["status"] != "ok":
                cells.loc[r["algo"], layer] = r["status"]
                continue
            cells.loc[r["algo"], layer] = ((NOISY if _flag(r["noisy"]) else "")
                                           + fmt_ms(r["median_ms"]) + (BEST if i == best else ""))
    return cells


def _per_algo_pass(df: pd.DataFrame, value: str, fmt) -> pd.DataFrame:
    """Rows (algo, pass), columns layer: `value` (the worst over layouts), formatted."""
    agg = df.groupby(["algo", "pass", "layer"], sort=False)[value].max()
    index = pd.MultiIndex.from_tuples(
        [(a, p) for a in _algos(df) for p in _order(df["pass"]) if (a, p) in
         agg.index.droplevel("layer")], names=["algo", "pass"])
    return pd.DataFrame({layer: [fmt(agg.get((a, p, layer), math.nan)) for a, p in index]
                         for layer in _layers(df)}, index=index)


def op_table(df: pd.DataFrame) -> pd.DataFrame:
    """Theoretical GFLOP of each algorithm per layer and pass (n/a: no count)."""
    return _per_algo_pass(df, "algo_ops", fmt_gflop)


def workspace_table(df: pd.DataFrame) -> pd.DataFrame:
    """Workspace in MiB of the measured cases (the larger over layouts)."""
    return _per_algo_pass(df[df["status"] == "ok"], "workspace_bytes", fmt_mib)


def error_table(df: pd.DataFrame) -> pd.DataFrame:
    """Relative error against the float64 reference (the larger over layouts)."""
    return _per_algo_pass(df[df["rel_error"].notna()], "rel_error", fmt_error)


def where(cases: list[tuple[str, str, str]], per_layer: int) -> str:
    """(layer, pass, layout) triples in few words: a layer all of whose `per_layer` cases are
    listed is named alone, others with their passes and layouts."""
    by_layer: dict[str, list[str]] = {}
    for layer, pass_, layout in cases:
        by_layer.setdefault(layer, []).append(f"{pass_} {layout}")
    return "; ".join(layer if len(what) == per_layer else f"{layer} {', '.join(what)}"
                     for layer, what in by_layer.items())


def not_measured(df: pd.DataFrame) -> pd.DataFrame:
    """Each distinct (status, algo, reason) once, with where it applied."""
    per_layer = len(df[["pass", "layout", "precision"]].drop_duplicates())
    bad = df[df["status"] != "ok"]
    groups = bad.groupby(["status", "algo", "reason"], sort=False)
    return groups.apply(lambda g: where(list(zip(g["layer"], g["pass"], g["layout"])),
                                        per_layer)).to_frame("where")


def layer_table(df: pd.DataFrame) -> str:
    """One line per measurement, for `convbench layer`'s terminal output."""
    cols = {"median ms": df["median_ms"].map(fmt_ms), "iqr ms": df["iqr_ms"].map(fmt_ms),
            "GFLOP/s": df["gflops"].map(lambda v: "" if pd.isna(v) else f"{v:.4g}"),
            "rel error": df["rel_error"].map(fmt_error),
            "workspace MiB": df["workspace_bytes"].map(fmt_mib),
            "reason / note": df["reason"].where(df["status"] != "ok", df["note"])}
    body = df[["layer", "algo", "pass", "layout", "precision", "status"]].assign(**cols)
    return tabulate(body, headers="keys", tablefmt="github", showindex=False,
                    disable_numparse=True)


# --- machine-readable output ----------------------------------------------------------------
def to_csv(df: pd.DataFrame) -> str:
    return df.to_csv(index=False)


def to_records(df: pd.DataFrame) -> list[dict]:
    """Rows as JSON-ready dicts: NaN and inf as None, the raw times as a list of floats."""
    def clean(k, v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return int(v) if k in _INTEGER and v is not None else v

    records = []
    for r in df.astype(object).to_dict("records"):
        r = {k: clean(k, v) for k, v in r.items()}
        if "times_ms" in r:
            r["times_ms"] = [float(t) for t in (r["times_ms"] or "").split()]
        records.append(r)
    return records


def to_json(df: pd.DataFrame) -> str:
    return json.dumps(to_records(df), indent=1)


# --- the run report -------------------------------------------------------------------------
def _header(df: pd.DataFrame, env: dict) -> list[str]:
    run = env.get("run", {})
    batches = sorted({int(n) for n in df["n"].dropna()})
    batch = ", ".join(map(str, batches))
    if run.get("backend") == "numpy" and batches == [CPU_BATCH]:
        batch += (" (the default CPU batch, small enough for the whole sweep to finish in 15 "
                  "minutes on 2 cores; the study used 256)")
    torch = env.get("torch", {})
    blas = env.get("numpy", {}).get("blas", {})
    title = (f"# convbench: {run.get('net', ', '.join(_order(df['net'])))} on "
             f"{env.get('device', 'unknown device')}")
    lines = [title, ""]
    facts = [("batch", batch),
             ("backend", ", ".join(_order(df["backend"]))),
             ("precision", ", ".join(_order(df["precision"]))),
             ("timing budget", f"{run['budget_s']} s per measurement" if "budget_s" in run
              else None),
             ("threads", f"torch {torch.get('threads')}, NumPy BLAS ({blas.get('name')}) "
                         f"{blas.get('threads')}" if torch else None),
             ("versions", f"convbench {env.get('convbench')}, NumPy "
                          f"{env.get('numpy', {}).get('version')}, torch {torch.get('version')}"
              if env else None),
             ("git commit", env.get("git_commit")),
             ("date", env.get("date")),
             ("command", run.get("command"))]
    lines += [f"- {k}: {v}" for k, v in facts if v]
    counts = df["status"].value_counts()
    lines += ["- measurements: " + ", ".join(f"{counts[s]} {s}" for s in counts.index), ""]
    return lines


def markdown(df: pd.DataFrame, env: dict, plots: list[str] | str = ()) -> str:
    """report.md: the header, time tables per pass and layout, op counts, workspace, errors,
    what was not measured and why, noisy measurements, and the plots (`plots`: file names, or
    the note saying why there are none)."""
    out = _header(df, env)
    out += ["## Time per layer", "",
            (f"Median ms per pass; `{BEST.strip()}` marks the fastest algorithm of each layer, "
             f"`{NOISY}` a noisy measurement."), ""]
    for (precision, pass_, layout), rows in df.groupby(["precision", "pass", "layout"],
                                                       sort=False):
        out += [f"### {pass_}, {layout}, {precision}", "", _table(time_table(rows)), ""]
    out += ["## Operation counts", "",
            ("Theoretical GFLOP per pass (`opcount.py`); n/a where the kernel is the library's "
             "choice or the algorithm does not apply."), "", _table(op_table(df)), ""]
    if df["workspace_bytes"].notna().any():
        out += ["## Workspace", "", "MiB beyond inputs and output, as measured cases declared.",
                "", _table(workspace_table(df)), ""]
    if df["rel_error"].notna().any():
        out += ["## Error", "",
                ("Relative error ‖out − ref‖/‖ref‖ against the float64 reference (the larger "
                 "of the two layouts)."), "", _table(error_table(df)), ""]
    if (df["status"] != "ok").any():
        out += ["## Not measured", "", _table(not_measured(df)), ""]
    noisy = df["noisy"].map(_flag).sum()
    if noisy:
        out += ["## Noisy measurements", "",
                (f"{noisy} of {(df['status'] == 'ok').sum()} measurements have IQR/median > "
                 f"{NOISE_THRESHOLD}: marked `{NOISY}` in the time tables, `noisy` in "
                 f"{RESULTS_CSV}."), ""]
    out += ["## Plots", ""]
    out += [plots] if isinstance(plots, str) else [f"![{Path(p).stem}]({p})" for p in plots]
    return "\n".join(out) + "\n"


def plot(df: pd.DataFrame, folder: str | Path) -> list[str] | str:
    """PNG plots in `folder`: per pass, grouped bars of time per layer per algorithm (a panel
    per layout), and the op counts per layer per algorithm. Returns the file names, or a note
    when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "Plots skipped: matplotlib is not installed (pip install 'convbench[plot]')."
    folder, names = Path(folder), []
    single = df["precision"].nunique() == 1
    for (precision, pass_), rows in df.groupby(["precision", "pass"], sort=False):
        name = f"time_{pass_}.png" if single else f"time_{pass_}_{precision}.png"
        layouts = _order(rows["layout"])
        fig, axes = plt.subplots(1, len(layouts), figsize=(5 * len(layouts) + 1.5, 4),
                                 squeeze=False, layout="constrained")
        for ax, layout in zip(axes[0], layouts):
            sub = rows[(rows["layout"] == layout) & (rows["status"] == "ok")]
            _bars(ax, sub, "median_ms", _algos(rows), _layers(df))
            ax.set_title(f"{pass_}, {layout}, {precision}")
            ax.set_ylabel("median time (ms, log)")
        _save(fig, folder / name)
        names.append(name)
    passes = _order(df["pass"])
    counted = _algos(df[df["algo_ops"].notna()])
    fig, axes = plt.subplots(1, len(passes), figsize=(5 * len(passes) + 1.5, 4), squeeze=False,
                             layout="constrained")
    for ax, pass_ in zip(axes[0], passes):
        sub = df[df["pass"] == pass_].drop_duplicates(["layer", "algo"])
        _bars(ax, sub.assign(gflop=sub["algo_ops"] / 1e9), "gflop", counted, _layers(df),
              log=False)
        ax.set_title(f"theoretical operations, {pass_}")
        ax.set_ylabel("GFLOP")
    _save(fig, folder / "opcount.png")
    return names + ["opcount.png"]


def _save(fig, path: Path) -> None:
    """One legend for all panels, outside them; write the PNG and free the figure."""
    import matplotlib.pyplot as plt

    fig.legend(*fig.axes[0].get_legend_handles_labels(), loc="outside right upper",
               fontsize="small")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _bars(ax, rows: pd.DataFrame, value: str, algos: list[str], layers: list[str],
          log: bool = True) -> None:
    """Grouped bars: one group per layer, one bar per algorithm (absent where no value)."""
    width = 0.8 / max(1, len(algos))
    values = rows.set_index(["layer", "algo"])[value]
    for i, algo in enumerate(algos):
        heights = [values.get((layer, algo), math.nan) for layer in layers]
        ax.bar([j + (i - (len(algos) - 1) / 2) * width for j in range(len(layers))], heights,
               width, label=algo)
    ax.set_xticks(range(len(layers)), layers)
    if log and values.notna().any():
        ax.set_yscale("log")


def write(folder: str | Path, df: pd.DataFrame, env: dict) -> str:
    """Render report.md and the plots into a run folder; returns the markdown."""
    folder = Path(folder)
    text = markdown(df, env, plot(df, folder))
    (folder / REPORT_MD).write_text(text)
    return text


# --- compare --------------------------------------------------------------------------------
def _quartiles(times: str) -> tuple[float, float]:
    m = Measurement.from_text(times)
    return m.q1, m.q3


def compare(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per row key: B's median over A's, and whether the change is beyond noise — the two
    interquartile ranges do not overlap — or a change of status."""
    key = [c for c in KEY if c not in PROBLEM_FIELDS or c == "n"]
    cols = [*KEY, "status", "median_ms", "times_ms"]
    both = a[cols].merge(b[cols], on=list(KEY), how="outer", suffixes=("_a", "_b"),
                         indicator=True)
    change = []
    for _, r in both.iterrows():
        if r["_merge"] != "both":
            change.append("only in A" if r["_merge"] == "left_only" else "only in B")
        elif r["status_a"] != r["status_b"]:
            change.append(f"{r['status_a']} -> {r['status_b']}")
        elif r["status_a"] != "ok":
            change.append("")
        else:
            (q1a, q3a), (q1b, q3b) = _quartiles(r["times_ms_a"]), _quartiles(r["times_ms_b"])
            change.append("faster" if q3b < q1a else "slower" if q1b > q3a else "")
    both["ratio"] = both["median_ms_b"] / both["median_ms_a"]
    both["change"] = change
    return both[[*key, "median_ms_a", "median_ms_b", "ratio", "change"]]


def compare_table(cmp: pd.DataFrame) -> str:
    """The comparison as a table, with the geometric-mean ratio over rows timed in both."""
    shown = cmp.assign(median_ms_a=cmp["median_ms_a"].map(fmt_ms),
                       median_ms_b=cmp["median_ms_b"].map(fmt_ms),
                       ratio=cmp["ratio"].map(lambda v: "" if pd.isna(v) else f"{v:.3f}"))
    text = tabulate(shown, headers="keys", tablefmt="github", showindex=False,
                    disable_numparse=True)
    ratios = cmp["ratio"].dropna()
    ratios = ratios[ratios > 0]
    if len(ratios):
        gmean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        counts = cmp["change"].value_counts()
        text += (f"\n\nB/A median ratio, geometric mean over {len(ratios)} rows: {gmean:.3f}; "
                 f"beyond noise: {counts.get('faster', 0)} faster, {counts.get('slower', 0)} "
                 "slower.")
    return text
