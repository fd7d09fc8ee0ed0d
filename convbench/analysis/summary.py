"""The ratios a GPU run is read by: convbench's kernels against cuBLAS and cuDNN, and against the
device's peak.

From one run's fp32 rows (`results.frame`), each ratio is of medians measured side by side in
that run, every pass and layer taken in the layout where it ran fastest unless the ratio is
about layouts:

- own SGEMM / cuBLAS: `gemm` over `gemm-cublas`, per layer, pass and layout (the same lowering,
  so the ratio is the GEMM's);
- best own kernel / cudnn-autotune, per layer and pass, naming the kernel;
- each FFT and Winograd kernel / cudnn-autotune, per layer and pass (the study's comparison);
- cudnn / cudnn-autotune: what cuDNN's heuristic gives away against its own search (the
  study's "up to 2x from algorithm options");
- NCHW / NHWC per algorithm, the geometric mean over layers and passes;
- achieved FP32 TFLOP/s (direct-convolution flops over the median) of the best own kernel and
  of cudnn-autotune, as a share of the device's FP32 peak where env.json knows it.

A ratio above 1 means the first is slower. A cell is empty where either side has no `ok` row.
"""

from __future__ import annotations

import math

import pandas as pd

from ..algos import registry
from ..core.fmt import fmt_ratio, md_table

#: Implementations of other people: everything else in a run is convbench's own kernel.
LIBRARIES = ("gemm-cublas", "cudnn", "cudnn-autotune", "torch-cpu", *registry.OPT_IN)
#: The FFT and Winograd kernels, compared one by one with cuDNN's autotuned pick.
TRANSFORM_ALGOS = ("fft", "fft-tiled", "winograd-2x2", "winograd-4x4", "winograd-5x5",
                   "winograd-6x6", "winograd-fused-2x2", "winograd-fused-4x4")
AUTOTUNE = "cudnn-autotune"


def ratio_text(x: float) -> str:
    """A ratio in the summary's tables: three significant digits (they compare closer times)."""
    return fmt_ratio(x, 3)


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["status"] == "ok") & (df["precision"] == "fp32")]


def best(df: pd.DataFrame, algos) -> pd.DataFrame:
    """Per (layer, pass), the fastest `ok` fp32 row of `algos`, any layout."""
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


def own_vs_autotune(df: pd.DataFrame) -> pd.DataFrame:
    """Best own kernel / cudnn-autotune per layer and pass, naming the kernel and its layout."""
    own = best(df, [a for a in dict.fromkeys(df["algo"]) if a not in LIBRARIES])
    lib = best(df, [AUTOTUNE])
    return _grid(df, lambda layer, p: _ratio(own, lib, (layer, p), with_algo=True))


def transforms_vs_autotune(df: pd.DataFrame) -> pd.DataFrame:
    """Each FFT and Winograd kernel / cudnn-autotune, rows (algo, pass), columns layer."""
    lib = best(df, [AUTOTUNE])
    layers = list(dict.fromkeys(df["layer"]))
    rows = {}
    for algo in (a for a in TRANSFORM_ALGOS if a in set(_ok(df)["algo"])):
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
    their share of the FP32 peak when it is known."""
    own = best(df, [a for a in dict.fromkeys(df["algo"]) if a not in LIBRARIES])
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


def markdown(df: pd.DataFrame, env: dict) -> str:
    """The summary's sections, each a table, or a line saying what the run lacks for it."""
    gpu = env.get("gpu") or {}
    peak = gpu.get("fp32_peak_tflops")
    sections = [
        ("Own SGEMM / cuBLAS", "gemm / gemm-cublas median, the same im2col lowering",
         sgemm_vs_cublas(df)),
        ("Best own kernel / cudnn-autotune", "per layer and pass, each in its fastest layout",
         own_vs_autotune(df)),
        ("FFT and Winograd / cudnn-autotune", "each in its fastest layout",
         transforms_vs_autotune(df)),
        ("cudnn / cudnn-autotune", "cuDNN's heuristic pick against its own search",
         heuristic_vs_autotune(df)),
        ("NCHW / NHWC", "per algorithm, over the layers and passes both layouts ran",
         layouts(df)),
        ("Achieved FP32 TFLOP/s",
         (f"direct-convolution flops over the median; in brackets the share of the FP32 peak, "
          f"{peak:.4g} TFLOP/s" if peak else "the device's FP32 peak is not known here"),
         tflops(df, peak)),
    ]
    out = []
    for title, what, table in sections:
        out += [f"## {title}", "", f"{what}.", ""]
        filled = not table.empty and (table != "").to_numpy().any()
        out += [md_table(table) if filled else "(no rows to compare in this run)", ""]
    return "\n".join(out)
