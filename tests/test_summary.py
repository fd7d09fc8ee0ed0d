"""The GPU summary's ratios, from synthetic rows of a run (no GPU needed to check the sums)."""

import pytest

from convbench.analysis import summary
from convbench.catalogs.layers import Layer
from convbench.core import results
from convbench.core.measurement import Measurement
from convbench.core.problem import ConvProblem
from convbench.measure import runner, verify

P = ConvProblem(n=2, c=8, h=8, w=8, k=8, r=3, s=3, pad=1)
L1, L2 = Layer("net", "l1", P), Layer("net", "l2", P.with_batch(4))


def rows(times: dict) -> list[dict]:
    """{(algo, layer, pass, layout): median ms} as `ok` rows (three repetitions, flat)."""
    out = []
    for (algo, layer, pass_, layout), ms in times.items():
        problem = {"l1": L1, "l2": L2}[layer].problem
        case = runner.Case("net", layer, problem, algo, "cuda", pass_, layout, "fp32")
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
    assert text.count("(no rows to compare in this run)") == 5
    assert "the device's FP32 peak is not known here" in text
    assert "## Own SGEMM / cuBLAS" in text and "## Achieved FP32 TFLOP/s" in text
    full = summary.markdown(results.frame(rows(TIMES)), {"gpu": {"fp32_peak_tflops": 66.9}})
    assert "(no rows to compare" not in full and "66.9 TFLOP/s" in full


@pytest.mark.parametrize("cc, sms, khz, peak", [
    ("90", 132, 1_980_000, 66.9), ("80", 108, 1_410_000, 19.5), ("90", 132, None, None),
    ("61", 10, 1_000_000, None)])
def test_fp32_peak_from_the_device(cc, sms, khz, peak):
    from convbench.measure.envinfo import fp32_peak_tflops

    got = fp32_peak_tflops(cc, sms, khz)
    assert got == pytest.approx(peak, rel=1e-3) if peak else got is None
