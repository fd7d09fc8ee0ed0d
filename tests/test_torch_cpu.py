"""`torch-cpu` in bf16: run where the CPU computes bfloat16 itself (its flags say so), refused
with the reason where it would be emulated, labelled as its own precision in the report. The
tests pass on a CPU with or without bf16: the flags are faked both ways, and the real run is
checked against what this CPU's flags say."""

import pytest

from convbench.algos import reference, registry
from convbench.analysis import report
from convbench.catalogs.layers import Layer
from convbench.core import results
from convbench.core.problem import LAYOUTS, PASSES, ConvProblem
from convbench.machine import host
from convbench.measure import runner
from convbench.testing import run_and_check

PROBLEM = ConvProblem(n=2, c=8, h=9, w=7, k=12, r=3, s=3, pad=1)
WITH = {"flags": "fpu sse avx2 avx512f avx512_bf16"}
WITHOUT = {"flags": "fpu sse avx2 avx512f"}


def _impl():
    return registry.get("torch-cpu", "numpy")


def test_the_flags_that_say_a_cpu_computes_bf16():
    assert host.bf16_flag(WITH) == "avx512_bf16"
    assert host.bf16_flag({"flags": "avx512f amx_bf16 amx_tile"}) == "amx_bf16"
    assert host.bf16_flag({"Features": "fp asimd bf16 i8mm"}) == "bf16"  # Arm
    assert host.bf16_flag(WITHOUT) is None and host.bf16_flag({}) is None


@pytest.mark.parametrize("info, runs", [(WITH, True), (WITHOUT, False)])
def test_bf16_is_supported_where_the_cpu_computes_it(monkeypatch, info, runs):
    """#45: `--precision bf16` was unsupported for torch's own convolution on a CPU with
    AVX512_BF16."""
    monkeypatch.setattr(host, "cpuinfo", lambda: info)
    reason = registry.supports(_impl(), PROBLEM, "fwd", "nchw", "bf16")
    if runs:
        assert reason is None
    else:
        assert reason.startswith("bf16 needs a CPU that computes it (avx512_bf16, amx_bf16")
    assert registry.supports(_impl(), PROBLEM, "fwd", "nchw", "fp32") is None
    assert registry.supports(registry.get("gemm", "numpy"), PROBLEM, "fwd", "nchw", "bf16") \
        == "gemm on numpy runs fp64/fp32, not bf16"


@pytest.mark.skipif(host.bf16_flag() is None, reason="this CPU does not compute bf16 itself")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
def test_bf16_runs_in_bf16_against_the_float64_reference(pass_, layout):
    """bfloat16 operands and output, inside bf16's tolerance and well above fp32's rounding
    (the output really is rounded to 8 bits of mantissa)."""
    got = run_and_check(_impl(), PROBLEM, pass_, layout, "bf16")
    assert got.ok, got.reason
    assert 1e-4 < got.rel_error <= got.tolerance
    assert reference.DTYPES["bf16"].itemsize == 2


def test_a_bf16_row_is_labelled_as_its_own_precision():
    """The run's rows and report: a bf16 case runs or is refused as this CPU's flags say, and
    the report gives bf16 its own sections, as a GPU's tf32 or fp16 (the ceilings are fp32's)."""
    cases = runner.sweep([Layer("t", "l", PROBLEM)], ["torch-cpu"], "numpy", ["fwd"], ["nchw"],
                         ["fp32", "bf16"])
    measured = []
    runner.run_groups(runner.competing(cases), 0.002, on_row=measured.append)
    df = results.frame(measured)
    bf16 = df[df["precision"] == "bf16"].iloc[0]
    if host.bf16_flag() is None:
        assert bf16["status"] == "unsupported" and "bf16 needs a CPU" in bf16["reason"]
        return
    assert bf16["status"] == "ok" and f"bf16 on {host.bf16_flag()}" in bf16["note"]
    text = report.markdown(df, {"run": {"backend": "numpy"}})
    assert "## Which wins (bf16)" in text and "### fwd, nchw, bf16" in text
    assert "- precision: fp32, bf16" in text
