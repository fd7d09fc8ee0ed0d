"""The ratios a GPU run is read by: convbench's kernels against cuBLAS and cuDNN, and against the
device's peak.

From one precision's rows of a run (`results.frame`), each ratio is of medians measured side
by side in that run, every pass and layer taken in the layout where it ran fastest unless the
ratio is about layouts; `markdown` gives each precision the run measured its own tables, under
its setting (`SETTINGS`: fp32 with TF32 off, tf32 with cuDNN's allow_tf32 on, ...), which every
caption names, since a ratio across settings compares the math, not the kernels:

- own SGEMM / cuBLAS: `gemm` over `gemm-cublas`, per layer, pass and layout (the same lowering,
  so the ratio is the GEMM's);
- best own kernel / cudnn-autotune, per layer and pass, naming the kernel;
- each FFT and Winograd kernel / cudnn-autotune, per layer and pass (the study's comparison);
- cudnn / cudnn-autotune: what cuDNN's heuristic gives away against its own search (the
  study's "up to 2x from algorithm options");
- NCHW / NHWC per algorithm, the geometric mean over layers and passes;
- achieved TFLOP/s (direct-convolution flops over the median) of the best own kernel and
  of cudnn-autotune, in fp32 as a share of the device's FP32 peak where env.json knows it.

And the study's tables, each built from rows alone (so tested on the CPU with made-up rows):

- cuDNN's algorithms one by one (`cudnn_algorithms`, the ISPASS-style table): per layer, pass
  and layout, each `cudnn-find-*` algorithm's time and workspace, the kernel family the
  heuristic (`cudnn`) and the search (`cudnn-autotune`) ran with their times, and our best
  kernel beside them, and whether a pick ran on tensor cores (the row's `tensor_cores`);
- the heuristic's regret (`regret`): per layer, pass and layout, `cudnn` and `cudnn-autotune`
  over the fastest verified algorithm measured (cuDNN's one by one and ours), with the paired
  interval (`ranking.Candidate.ratio_to`), flagged where over `REGRET_FLAG` with an interval
  that excludes 1; rows timed on a busy machine are left out, as the verdicts leave them;
- tuning cost (`tuning_cost`): the first call with `cudnn.benchmark` (plan and search, from the
  row's note, `algos.cudnn`) against the steady state, and the calls after which the search
  pays: (search's first call − its steady call − the heuristic's first-call overhead) / (the
  heuristic's steady time − the search's).

A ratio above 1 means the first is slower. A cell is empty where either side has no timed row
(`ok`, or `inexact`: a library's result beyond its tolerance, which is what its users run, so
torch's picks keep it as the baseline; the regret's fastest is an `ok` row, and an inexact pick's
regret is marked).
"""

from __future__ import annotations

import math
import re

import pandas as pd

from ..algos import registry
from ..core.fmt import fmt_ratio, md_table
from ..core.problem import PRECISIONS
from ..core.results import TIMED
from .inexact import INEXACT
from .ranking import Candidate, busy_mask
from .speedup import is_ours, is_torchs

#: The families whose kernels of ours are compared one by one with cuDNN's autotuned pick.
TRANSFORM_FAMILIES = ("fft", "winograd")
AUTOTUNE = "cudnn-autotune"
HEURISTIC = "cudnn"
FIND_PREFIX = "cudnn-find-"
#: The regret flagged: more than 5% slower than the fastest, the interval excluding 1.
REGRET_FLAG = 1.05
#: Each precision's math as the tables' captions name it: fp32 is IEEE single precision (TF32
#: off for cuDNN and cuBLAS, `algos.cudnn`), tf32 lets cuDNN run fp32 data in TF32 on tensor
#: cores, fp16 and bf16 compute in their storage type.
SETTINGS = {"fp64": "fp64", "fp32": "fp32 (TF32 off)", "tf32": "tf32 (cuDNN allow_tf32 on)",
            "fp16": "fp16", "bf16": "bf16"}
#: The first call's wall time in a cudnn row's note (`algos.cudnn.FIRST_CALL_NOTE`).
_FIRST_CALL = re.compile(r"first call ([0-9.eE+-]+) ms")


def ratio_text(x: float) -> str:
    """A ratio in the summary's tables: three significant digits (they compare closer times)."""
    return fmt_ratio(x, 3)


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    """The rows with a time (`results.TIMED`), every precision's."""
    return df[df["status"].isin(TIMED)]


def best(df: pd.DataFrame, algos) -> pd.DataFrame:
    """Per (layer, pass), the fastest `ok` row of `algos`, any layout."""
    rows = _ok(df)
    rows = rows[rows["algo"].isin(list(algos))]
    if rows.empty:
        return rows.set_index(["layer", "pass"])
    fastest = rows.loc[rows.groupby(["layer", "pass"], sort=False)["median_ms"].idxmin()]
    return fastest.set_index(["layer", "pass"])


def _grid(df: pd.DataFrame, cell) -> pd.DataFrame:
    """Rows layer, columns pass (in the run's order); `cell(layer, pass)` or "" each."""
    layers = list(dict.fromkeys(df["layer"]))
    passes = list(dict.fromkeys(df["pass"]))
    out = pd.DataFrame("", index=pd.Index(layers, name="layer"), columns=passes)
    for layer in layers:
        for pass_ in passes:
            out.loc[layer, pass_] = cell(layer, pass_)
    return out


def _ratio(num: pd.DataFrame, den: pd.DataFrame, key, with_algo: bool = False) -> str:
    if key not in num.index or key not in den.index:
        return ""
    a, b = num.loc[key], den.loc[key]
    text = ratio_text(a["median_ms"] / b["median_ms"])
    return f"{text} ({a['algo']} {a['layout']})" if with_algo else text


def sgemm_vs_cublas(df: pd.DataFrame) -> pd.DataFrame:
    """gemm / gemm-cublas medians, rows (layer, pass), columns layout."""
    ok = _ok(df)
    ours = ok[ok["algo"] == "gemm"].set_index(["layer", "pass", "layout"])["median_ms"]
    theirs = ok[ok["algo"] == "gemm-cublas"].set_index(["layer", "pass", "layout"])["median_ms"]
    keys = ours.index.intersection(theirs.index)
    if keys.empty:
        return pd.DataFrame()
    ratio = (ours[keys] / theirs[keys]).map(ratio_text)
    return ratio.unstack("layout").fillna("")


def transform_algos() -> list[str]:
    """Our FFT and Winograd kernels (`TRANSFORM_FAMILIES`, `is_ours`), in the registry's
    order."""
    return [a.name for a in registry.algorithms()
            if is_ours(a.name) and a.family in TRANSFORM_FAMILIES]


def own_vs_autotune(df: pd.DataFrame) -> pd.DataFrame:
    """Best own kernel / cudnn-autotune per layer and pass, naming the kernel and its layout."""
    own = best(df, [a for a in dict.fromkeys(df["algo"]) if is_ours(a)])
    lib = best(df, [AUTOTUNE])
    return _grid(df, lambda layer, p: _ratio(own, lib, (layer, p), with_algo=True))


def transforms_vs_autotune(df: pd.DataFrame) -> pd.DataFrame:
    """Each FFT and Winograd kernel / cudnn-autotune, rows (algo, pass), columns layer."""
    lib = best(df, [AUTOTUNE])
    layers = list(dict.fromkeys(df["layer"]))
    rows = {}
    for algo in (a for a in transform_algos() if a in set(_ok(df)["algo"])):
        mine = best(df, [algo])
        for pass_ in dict.fromkeys(df["pass"]):
            cells = [_ratio(mine, lib, (layer, pass_)) for layer in layers]
            if any(cells):
                rows[algo, pass_] = cells
    if not rows:
        return pd.DataFrame()
    return pd.DataFrame(list(rows.values()), columns=layers,
                        index=pd.MultiIndex.from_tuples(list(rows), names=["algo", "pass"]))


def heuristic_vs_autotune(df: pd.DataFrame) -> pd.DataFrame:
    """cudnn / cudnn-autotune per layer and pass, each in its fastest layout."""
    heuristic, search = best(df, ["cudnn"]), best(df, [AUTOTUNE])
    return _grid(df, lambda layer, p: _ratio(heuristic, search, (layer, p)))


def layouts(df: pd.DataFrame) -> pd.DataFrame:
    """NCHW / NHWC per algorithm: the geometric mean, and the range, over layers and passes."""
    ok = _ok(df)
    times = ok.set_index(["algo", "layer", "pass", "layout"])["median_ms"].unstack("layout")
    if not {"nchw", "nhwc"} <= set(times.columns):
        return pd.DataFrame()
    ratio = (times["nchw"] / times["nhwc"]).dropna()
    rows = []
    for algo, r in ratio.groupby(level="algo", sort=False):
        gmean = math.exp(sum(math.log(v) for v in r) / len(r))
        rows.append((algo, ratio_text(gmean), f"{ratio_text(r.min())}–{ratio_text(r.max())}",
                     len(r)))
    return pd.DataFrame(rows, columns=["algo", "geometric mean", "range", "cases"]).set_index(
        "algo")


def tflops(df: pd.DataFrame, peak_tflops: float | None) -> pd.DataFrame:
    """Per (layer, pass): achieved TFLOP/s of the best own kernel and of cudnn-autotune, with
    their share of `peak_tflops` when it is given (the FP32 peak, for fp32 rows)."""
    own = best(df, [a for a in dict.fromkeys(df["algo"]) if is_ours(a)])
    lib = best(df, [AUTOTUNE])

    def cell(table: pd.DataFrame, key) -> str:
        if key not in table.index:
            return ""
        r = table.loc[key]
        achieved = r["gflops"] / 1e3
        share = f" ({achieved / peak_tflops:.0%})" if peak_tflops else ""
        return f"{achieved:.3g}{share} {r['algo']}"

    keys = list(dict.fromkeys(zip(df["layer"], df["pass"])))
    return pd.DataFrame({"best own": [cell(own, k) for k in keys],
                         AUTOTUNE: [cell(lib, k) for k in keys]},
                        index=pd.MultiIndex.from_tuples(keys, names=["layer", "pass"]))


def _keyed(df: pd.DataFrame) -> pd.DataFrame:
    """The `ok` rows not timed on a busy machine."""
    ok = _ok(df)
    return ok[~busy_mask(ok)] if len(ok) else ok


def _family(note) -> str:
    """The kernel family a cudnn row's note names (`cudnn.classify_kernels`), without the
    kernel and the first call."""
    if not isinstance(note, str) or not note:
        return ""
    return note.split(" (kernel")[0].split(";")[0].strip()


def _mib(nbytes) -> str:
    return "" if nbytes is None or pd.isna(nbytes) else f"{nbytes / 2**20:.3g} MiB"


#: The workspace cuDNN's find reported, in a cudnn-find row's note (`cudnn_find.note`).
_FIND_WORKSPACE = re.compile(r"workspace (\d+) B")


def find_workspace(r) -> float | None:
    """A cudnn-find row's workspace in bytes: its `workspace_bytes`, else what the find
    reported in its note (cuDNN allocates it, so no prediction of ours holds it)."""
    ws = r.get("workspace_bytes")
    if ws is not None and not pd.isna(ws):
        return ws
    m = _FIND_WORKSPACE.search(r["note"]) if isinstance(r.get("note"), str) else None
    return float(m.group(1)) if m else None


def _on_tensor_cores(r) -> str:
    """", on tensor cores" where a row's kernels ran on them (`tensor_cores`), else ""."""
    return ", on tensor cores" if str(r.get("tensor_cores")) == "True" else ""


def cudnn_algorithms(df: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, pass, layout): each cudnn-find algorithm's median ms and workspace, what
    the heuristic and the search ran (family, ms, whether on tensor cores), our best kernel
    (algo, ms)."""
    ok = _ok(df)
    finds = [a for a in dict.fromkeys(ok["algo"]) if a.startswith(FIND_PREFIX)]
    if not finds:
        return pd.DataFrame()
    rows = {}
    for key, group in ok.groupby(["layer", "pass", "layout"], sort=False):
        by = group.set_index("algo")
        cells = {a.removeprefix(FIND_PREFIX): (f"{by.loc[a, 'median_ms']:.3g} ms"
                                               + (f" ({_mib(find_workspace(by.loc[a]))})"
                                                  if _mib(find_workspace(by.loc[a])) else ""))
                 if a in by.index else "" for a in finds}
        for algo in (HEURISTIC, AUTOTUNE):
            cells[algo] = (f"{by.loc[algo, 'median_ms']:.3g} ms {_family(by.loc[algo, 'note'])}"
                           .strip() + _on_tensor_cores(by.loc[algo]) if algo in by.index
                           else "")
        own = group[group["algo"].map(is_ours).astype(bool)]
        cells["best own"] = ("" if own.empty else
                             "{1:.3g} ms {0}".format(*own.loc[own["median_ms"].idxmin(),
                                                              ["algo", "median_ms"]]))
        rows[key] = cells
    out = pd.DataFrame(list(rows.values()),
                       index=pd.MultiIndex.from_tuples(list(rows),
                                                       names=["layer", "pass", "layout"]))
    return out.fillna("")


def regret(df: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, pass, layout): the fastest verified (`ok`) algorithm measured other than
    torch's picks, and `cudnn` and `cudnn-autotune` over it with their interval, `⚑` where the
    regret is over `REGRET_FLAG` and its interval excludes 1, `†` where the pick is
    `inexact` (it is what torch runs, so its regret stands)."""
    ok = _keyed(df)
    rows = {}
    for key, group in ok.groupby(["layer", "pass", "layout"], sort=False):
        picks = group[group["algo"].isin([HEURISTIC, AUTOTUNE])]
        others = group[~group["algo"].map(is_torchs).astype(bool) & (group["status"] == "ok")]
        if picks.empty or others.empty:
            continue
        fastest = Candidate.from_row(others.loc[others["median_ms"].idxmin()])
        cells = {"fastest": f"{fastest.algo} {fastest.median_ms:.3g} ms"}
        for algo in (HEURISTIC, AUTOTUNE):
            row = picks[picks["algo"] == algo]
            if row.empty:
                cells[algo] = ""
                continue
            pick = Candidate.from_row(row.iloc[0])
            r = pick.ratio_to(fastest)
            flag = r.value > REGRET_FLAG and r.low is not None and r.low > 1
            cells[algo] = (INEXACT if pick.inexact else "") + r.text() + (" ⚑" if flag else "")
        rows[key] = cells
    if not rows:
        return pd.DataFrame()
    return pd.DataFrame(list(rows.values()), index=pd.MultiIndex.from_tuples(
        list(rows), names=["layer", "pass", "layout"])).fillna("")


def first_call(note) -> float | None:
    """The first call's ms a cudnn row's note holds, or None."""
    m = _FIRST_CALL.search(note) if isinstance(note, str) else None
    return float(m.group(1)) if m else None


def tuning_cost(df: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, pass, layout) where both cudnn modes ran and said their first call: the
    first calls and steady medians (ms), and the calls after which the search pays ("never"
    where the search's pick is not faster)."""
    ok = _ok(df)
    rows = {}
    for key, group in ok.groupby(["layer", "pass", "layout"], sort=False):
        by = group.set_index("algo")
        if not {HEURISTIC, AUTOTUNE} <= set(by.index):
            continue
        h, a = by.loc[HEURISTIC], by.loc[AUTOTUNE]
        first_h, first_a = first_call(h["note"]), first_call(a["note"])
        if first_a is None:
            continue
        search = first_a - a["median_ms"] - (0.0 if first_h is None
                                             else max(0.0, first_h - h["median_ms"]))
        saved = h["median_ms"] - a["median_ms"]
        calls = (f"{math.ceil(max(search, 0.0) / saved):,}" if saved > 0 else "never")
        rows[key] = {"search's first call": f"{first_a:.4g} ms",
                     "heuristic's first call": "" if first_h is None else f"{first_h:.4g} ms",
                     "steady (search / heuristic)":
                         f"{a['median_ms']:.3g} / {h['median_ms']:.3g} ms",
                     "calls to break even": calls}
    if not rows:
        return pd.DataFrame()
    return pd.DataFrame(list(rows.values()), index=pd.MultiIndex.from_tuples(
        list(rows), names=["layer", "pass", "layout"]))


def markdown(df: pd.DataFrame, env: dict) -> str:
    """The summary's sections for each precision the run measured, in `PRECISIONS`' order
    (fp32 alone for a run without rows), each under its setting (`SETTINGS`): a table, or a
    line saying what the run lacks for it."""
    present = set(df["precision"]) if "precision" in df else set()
    out = []
    for precision in [p for p in PRECISIONS if p in present] or ["fp32"]:
        out += [f"## {SETTINGS[precision]}", ""]
        out += _sections(df[df["precision"] == precision] if present else df, env, precision)
    return "\n".join(out)


def _sections(df: pd.DataFrame, env: dict, precision: str) -> list[str]:
    """The lines of one precision's sections, from its rows `df`; every caption names the
    precision's setting. The device's FP32 peak bounds only fp32 rows."""
    gpu = env.get("gpu") or {}
    peak = gpu.get("fp32_peak_tflops") if precision == "fp32" else None
    setting = SETTINGS[precision]
    sections = [
        ("Own SGEMM / cuBLAS" if precision in ("fp32", "tf32") else "Own GEMM / cuBLAS",
         ("gemm / gemm-cublas median, the same im2col lowering (cuBLAS's NCHW bwd_filter: one "
          "product over N·P·Q, dy copied)"), sgemm_vs_cublas(df)),
        ("Best own kernel / cudnn-autotune", "per layer and pass, each in its fastest layout",
         own_vs_autotune(df)),
        ("FFT and Winograd / cudnn-autotune", "each in its fastest layout",
         transforms_vs_autotune(df)),
        ("cudnn / cudnn-autotune", "cuDNN's heuristic pick against its own search",
         heuristic_vs_autotune(df)),
        ("NCHW / NHWC", "per algorithm, over the layers and passes both layouts ran",
         layouts(df)),
        (f"Achieved {precision.upper()} TFLOP/s",
         ("direct-convolution flops over the median; "
          + (f"in brackets the share of the FP32 peak, {peak:.4g} TFLOP/s" if peak else
             "the device's FP32 peak is not known here" if precision == "fp32" else
             "the FP32 peak does not bound them")),
         tflops(df, peak)),
        ("cuDNN's algorithms one by one",
         ("per layer, pass and layout: each cudnn-find algorithm's median and workspace, the "
          "family and time of the heuristic's pick (cudnn) and the search's (cudnn-autotune), "
          "whether it ran on tensor cores, and our fastest kernel"), cudnn_algorithms(df)),
        ("The heuristic's regret",
         ("cudnn and cudnn-autotune over the fastest verified algorithm measured (cuDNN's one "
          "by one and ours, same layout; busy rows left out), with the interval, paired where "
          f"timed in the same rounds; ⚑: over {REGRET_FLAG:g}× with an interval above 1"),
         regret(df)),
        ("Tuning cost",
         ("cudnn.benchmark's first call (its plan and search) against the steady state, and "
          "the calls after which searching pays for itself against the heuristic"),
         tuning_cost(df)),
    ]
    out = []
    for title, what, table in sections:
        out += [f"### {title}", "", f"{setting}: {what}.", ""]
        filled = not table.empty and (table != "").to_numpy().any()
        out += [md_table(table) if filled else "(no rows to compare in this run)", ""]
    return out
