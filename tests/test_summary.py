"""The GPU summary's ratios, from synthetic rows of a run (no GPU needed to check the sums)."""

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from convbench.analysis import summary
from convbench.catalogs.layers import Layer
from convbench.core import results
from convbench.core.measurement import Measurement
from convbench.core.problem import ConvProblem
from convbench.measure import runner, verify

P = ConvProblem(n=2, c=8, h=8, w=8, k=8, r=3, s=3, pad=1)
L1, L2 = Layer("net", "l1", P), Layer("net", "l2", P.with_batch(4))


def rows(times: dict, precision: str = "fp32") -> list[dict]:
    """{(algo, layer, pass, layout): median ms} as `ok` rows of `precision` (three
    repetitions, flat)."""
    out = []
    for (algo, layer, pass_, layout), ms in times.items():
        problem = {"l1": L1, "l2": L2}[layer].problem
        case = runner.Case("net", layer, problem, algo, "cuda", pass_, layout, precision)
        out.append(runner.row(case, "ok", check=verify.Check(True, 1e-7, 1e-6, 1e-5),
                              m=Measurement((ms,) * 3)))
    return out


TIMES = {("gemm", "l1", "fwd", "nchw"): 2.0, ("gemm-cublas", "l1", "fwd", "nchw"): 1.0,
         ("gemm", "l1", "fwd", "nhwc"): 3.0, ("gemm-cublas", "l1", "fwd", "nhwc"): 2.0,
         ("winograd-4x4", "l1", "fwd", "nhwc"): 1.5, ("cudnn", "l1", "fwd", "nchw"): 1.8,
         ("cudnn-autotune", "l1", "fwd", "nchw"): 1.2,
         ("cudnn-autotune", "l1", "fwd", "nhwc"): 0.6,
         ("direct", "l2", "bwd_data", "nchw"): 4.0,
         ("cudnn-autotune", "l2", "bwd_data", "nhwc"): 2.0,
         ("cudnn", "l2", "bwd_data", "nhwc"): 2.0}


def test_ratios_are_of_medians_each_in_its_fastest_layout():
    df = results.frame(rows(TIMES))
    assert summary.sgemm_vs_cublas(df).loc[("l1", "fwd")].to_dict() == {"nchw": "2×",
                                                                         "nhwc": "1.5×"}
    own = summary.own_vs_autotune(df)
    assert own.loc["l1", "fwd"] == "2.5× (winograd-4x4 nhwc)"  # 1.5 against 0.6 (nhwc)
    assert own.loc["l2", "bwd_data"] == "2× (direct nchw)" and own.loc["l2", "fwd"] == ""
    assert summary.transforms_vs_autotune(df).loc[("winograd-4x4", "fwd"), "l1"] == "2.5×"
    heuristic = summary.heuristic_vs_autotune(df)
    assert heuristic.loc["l1", "fwd"] == "3×" and heuristic.loc["l2", "bwd_data"] == "1×"
    layouts = summary.layouts(df)
    assert layouts.loc["gemm", "geometric mean"] == "0.667×"
    assert layouts.loc["cudnn-autotune", "cases"] == 1


def test_an_inexact_pick_is_the_baseline_and_never_the_regret_s_fastest():
    """torch's `inexact` picks keep their ratios (they are what torch runs), the regret
    marked; an inexact algorithm one by one is no regret's fastest."""
    df = results.frame(rows(TIMES))
    chk = verify.Check(False, 5.1e-3, 0.1, 6.75e-4)
    picks = (df["layer"] == "l1") & df["algo"].isin(["cudnn", "cudnn-autotune"])
    df.loc[picks, "status"], df.loc[picks, "reason"] = "inexact", chk.reason
    case = runner.Case("net", "l1", P, "cudnn-find-winograd-nonfused", "cuda", "fwd", "nchw",
                       "fp32")
    quick = runner.row(case, "inexact", chk.reason, check=chk, m=Measurement((0.1,) * 3))
    df = pd.concat([df, results.frame([quick])], ignore_index=True)
    assert summary.own_vs_autotune(df).loc["l1", "fwd"] == "2.5× (winograd-4x4 nhwc)"
    assert summary.heuristic_vs_autotune(df).loc["l1", "fwd"] == "3×"
    regret = summary.regret(df).loc[("l1", "fwd", "nchw")]
    assert regret["fastest"] == "gemm-cublas 1 ms"
    assert regret["cudnn"].startswith("†1.8×")
    assert regret["cudnn-autotune"].startswith("†1.2×")


def test_achieved_tflops_and_the_share_of_the_peak():
    df = results.frame(rows(TIMES))
    table = summary.tflops(df, peak_tflops=0.001)
    flops = P.flops / 1e12 / (0.6e-3)  # cudnn-autotune's l1 fwd, nhwc
    assert table.loc[("l1", "fwd"), "cudnn-autotune"] == \
        f"{flops:.3g} ({flops / 0.001:.0%}) cudnn-autotune"
    assert table.loc[("l1", "fwd"), "best own"].endswith("winograd-4x4")
    assert "(" not in summary.tflops(df, None).loc[("l1", "fwd"), "best own"]


def test_the_markdown_says_what_a_run_lacks():
    df = results.frame(rows({("gemm", "l1", "fwd", "nchw"): 1.0}))
    text = summary.markdown(df, {})
    assert text.count("(no rows to compare in this run)") == 8
    assert "the device's FP32 peak is not known here" in text
    assert "\n### Own SGEMM / cuBLAS\n" in text and "\n### Achieved FP32 TFLOP/s\n" in text
    assert text.startswith("## fp32 (TF32 off)\n") and text.count("\n## ") == 0
    full = summary.markdown(results.frame(rows(TIMES)), {"gpu": {"fp32_peak_tflops": 66.9}})
    # TIMES has no cudnn-find rows and no first calls: those two study tables say so
    assert full.count("(no rows to compare") == 2 and "66.9 TFLOP/s" in full


def _section(text: str, heading: str) -> str:
    """The part of a summary under `heading` (a `## ` line), up to the next such line."""
    return text.split(f"\n{heading}\n" if not text.startswith(heading) else heading, 1)[1] \
        .split("\n## ", 1)[0]


def _heuristic_l1(part: str) -> str:
    """l1's fwd cell of the cudnn / cudnn-autotune table in a part of a summary."""
    table = part.split("### cudnn / cudnn-autotune\n", 1)[1].split("###", 1)[0]
    return re.search(r"^\| l1 +\| +(\S+) +\|", table, re.MULTILINE).group(1)


def test_each_precision_has_its_own_tables_under_its_setting():
    """A run in fp32, tf32 and bf16: each precision's tables from its own rows (a ratio of
    tf32 rows is not mixed with fp32's), in `PRECISIONS`' order, every caption naming the
    setting; the FP32 peak bounds only fp32's; a run without fp32 rows still has its tables."""
    tf32 = {k: ms / 2 if k[0] == "cudnn-autotune" else ms for k, ms in TIMES.items()}
    bf16 = {("cudnn", "l1", "fwd", "nhwc"): 0.3, ("cudnn-autotune", "l1", "fwd", "nhwc"): 0.2}
    df = results.frame(rows(bf16, "bf16") + rows(TIMES) + rows(tf32, "tf32"))
    text = summary.markdown(df, {"gpu": {"fp32_peak_tflops": 66.9}})
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["## fp32 (TF32 off)", "## tf32 (cuDNN allow_tf32 on)", "## bf16"]
    for heading in headings:
        part, setting = _section(text, heading), heading.removeprefix("## ")
        captions = [line for line in part.splitlines()
                    if line and not line.startswith(("#", "|", "("))]
        assert len(captions) == 9 and all(c.startswith(f"{setting}: ") for c in captions)
    fp32, tf32_part = _section(text, headings[0]), _section(text, headings[1])
    # cudnn / cudnn-autotune on l1 fwd: 1.8 / 0.6 in fp32, 1.8 / 0.3 in tf32
    assert _heuristic_l1(fp32) == "3×" and _heuristic_l1(tf32_part) == "6×"
    assert "66.9 TFLOP/s" in fp32 and "### Achieved FP32 TFLOP/s" in fp32
    assert "66.9" not in tf32_part and "the FP32 peak does not bound them" in tf32_part
    bf16_part = _section(text, "## bf16")
    assert "### Own GEMM / cuBLAS" in bf16_part and _heuristic_l1(bf16_part) == "1.5×"
    alone = summary.markdown(results.frame(rows(bf16, "bf16")), {})
    assert alone.startswith("## bf16\n") and _heuristic_l1(alone) == "1.5×"


def test_the_cudnn_table_says_where_a_pick_ran_on_tensor_cores(study):
    _, df = study
    df = df.copy()
    df.loc[df["algo"] == "cudnn-autotune", "tensor_cores"] = True
    df.loc[df["algo"] == "cudnn", "tensor_cores"] = False
    cell = summary.cudnn_algorithms(df).loc[("conv3", "fwd", "nchw")]
    assert cell["cudnn-autotune"].endswith("FFT, on tensor cores")
    assert "tensor cores" not in cell["cudnn"]


@pytest.mark.parametrize("cc, sms, khz, peak", [
    ("90", 132, 1_980_000, 66.9), ("80", 108, 1_410_000, 19.5), ("90", 132, None, None),
    ("61", 10, 1_000_000, None)])
def test_fp32_peak_from_the_device(cc, sms, khz, peak):
    from convbench.measure.envinfo import fp32_peak_tflops

    got = fp32_peak_tflops(cc, sms, khz)
    assert got == pytest.approx(peak, rel=1e-3) if peak else got is None


# --- the study's tables, from a committed CPU-made fixture and synthetic GPU rows -------------
#: Real rows of a CPU run (results/2026-11-26-cpu-2core-xeon-alexnet-ceilings, AlexNet conv2 and
#: conv3 at batch 8): our kernels' times with their rounds, as a GPU run's own kernels would be.
FIXTURE = Path(__file__).parent / "data" / "summary_cpu_rows.csv"
SYNTHETIC = "SYNTHETIC test row, never a measurement"


def synthetic_gpu_rows(cpu: list[dict]) -> list[dict]:
    """Made-up cuDNN rows beside each (layer, pass, layout) of `cpu`, clearly labelled in their
    note: torch-cpu's times scaled, in the same rounds (paired): `cudnn` 1.3x, `cudnn-autotune`
    0.77x, `cudnn-find-gemm` 0.75x with a 64 MiB workspace, `cudnn-find-fft` `unsupported`.
    A find row carries its workspace as real ones do: in its note, as cuDNN's find reported
    it, with `workspace_bytes` empty."""
    out = []
    for r in cpu:
        if r["algo"] != "torch-cpu" or r["status"] != "ok":
            continue
        times = [float(t) for t in r["times_ms"].split()]
        for algo, scale, note, ws in (
                ("cudnn", 1.3, "implicit GEMM (kernel: k1); first call 40 ms", 0),
                ("cudnn-autotune", 0.77, "FFT (kernel: k2); first call 900 ms", 0),
                ("cudnn-find-gemm", 0.75, ("cuDNN find: 0.5 ms (rank 1 of 4), workspace "
                                           f"{64 << 20} B, deterministic, FMA_MATH"), "")):
            t = [x * scale for x in times]
            out.append({**r, "algo": algo, "backend": "cuda", "times_ms": " ".join(
                f"{x:.6g}" for x in t), "median_ms": str(float(np.median(t))),
                "note": f"{SYNTHETIC}: {note}", "workspace_bytes": str(ws)})
        out.append({**r, "algo": "cudnn-find-fft", "backend": "cuda", "status": "unsupported",
                    "median_ms": "", "times_ms": "", "note": SYNTHETIC,
                    "reason": "cuDNN's find: CUDNN_STATUS_NOT_SUPPORTED"})
    return out


@pytest.fixture(scope="module")
def study():
    cpu = results.read_rows(FIXTURE)
    assert {r["backend"] for r in cpu} == {"numpy"} and len(cpu) == 96  # the real rows
    return cpu, results.frame(cpu + synthetic_gpu_rows(cpu))


def test_the_cudnn_algorithm_table_has_each_algorithm_the_picks_and_our_best(study):
    cpu, df = study
    table = summary.cudnn_algorithms(df)
    assert list(table.columns) == ["gemm", "cudnn", "cudnn-autotune", "best own"]
    assert len(table) == 2 * 3 * 2  # conv2, conv3 x 3 passes x 2 layouts
    cell = table.loc[("conv3", "fwd", "nchw")]
    assert cell["gemm"].endswith("ms (64 MiB)") and "implicit GEMM" in cell["cudnn"]
    assert "FFT" in cell["cudnn-autotune"] and "first call" not in cell["cudnn-autotune"]
    own = [r for r in cpu if (r["layer"], r["pass"], r["layout"]) == ("conv3", "fwd", "nchw")
           and r["status"] == "ok" and r["algo"] != "torch-cpu"]
    best = min(own, key=lambda r: float(r["median_ms"]))
    assert cell["best own"] == f"{float(best['median_ms']):.3g} ms {best['algo']}"
    assert summary.cudnn_algorithms(results.frame(cpu)).empty  # no cudnn-find: no table


def test_the_regret_is_paired_against_the_fastest_verified_algorithm(study):
    _, df = study
    table = summary.regret(df)
    assert len(table) == 12
    for key, cells in table.iterrows():
        rows = df[(df["layer"] == key[0]) & (df["pass"] == key[1]) & (df["layout"] == key[2])
                  & (df["status"] == "ok") & ~df["algo"].isin(["cudnn", "cudnn-autotune",
                                                               "torch-cpu"])]
        fastest = rows.loc[rows["median_ms"].idxmin()]
        assert cells["fastest"].startswith(fastest["algo"])
        assert "[" in cells["cudnn"] and "[" in cells["cudnn-autotune"]  # an interval each
    # where cuDNN's GEMM (0.75x torch-cpu) is the fastest, the picks' regrets are exactly
    # 1.3/0.75 and 0.77/0.75, paired round by round: tight, and only the heuristic's (73%)
    # flagged, not the search's (2.7%)
    gemm_fastest = table[table["fastest"].str.startswith("cudnn-find-gemm")]
    assert len(gemm_fastest)
    for _, cells in gemm_fastest.iterrows():
        assert cells["cudnn"].startswith(f"{1.3 / 0.75:.3g}×") and cells["cudnn"].endswith("⚑")
        assert cells["cudnn-autotune"].startswith(f"{0.77 / 0.75:.3g}×")
        assert not cells["cudnn-autotune"].endswith("⚑")
    busy = df.copy()
    busy.loc[busy["algo"] == "cudnn", "throttled"] = "power limit: 60% of its time"
    assert (summary.regret(busy)["cudnn"] == "").all()  # busy rows leave the table


def test_tuning_cost_and_break_even_from_the_notes(study):
    _, df = study
    table = summary.tuning_cost(df)
    cell = table.loc[("conv3", "fwd", "nchw")]
    rows = df[(df["layer"] == "conv3") & (df["pass"] == "fwd") & (df["layout"] == "nchw")]
    h = float(rows[rows["algo"] == "cudnn"]["median_ms"].iloc[0])
    a = float(rows[rows["algo"] == "cudnn-autotune"]["median_ms"].iloc[0])
    search = 900 - a - max(0.0, 40 - h)
    want = f"{math.ceil(max(search, 0) / (h - a)):,}" if h > a else "never"
    assert cell["search's first call"] == "900 ms" and cell["calls to break even"] == want
    assert summary.first_call("FFT (kernel: x); first call 12.5 ms") == 12.5
    assert summary.first_call("FFT (kernel: x)") is None


def test_the_summary_renders_the_study_tables(study):
    _, df = study
    text = summary.markdown(df, {})
    for title in ("### cuDNN's algorithms one by one", "### The heuristic's regret",
                  "### Tuning cost"):
        part = text.split(title)[1].split("### ")[0]
        assert "| layer" in part and "(no rows" not in part
