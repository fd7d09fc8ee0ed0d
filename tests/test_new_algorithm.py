"""A new algorithm is one file: this one. It declares `torch-wrapped`, a plain wrapper of
torch's convolution under a name of its own, with its traits (`traits.Algorithm`), and with no
other file edited the algorithm is listed by `convbench list`, verified with the tolerance it
declares, guarded with its own arithmetic reduction, counted by the operation counts and
reported. An algorithm that leaves a trait out, or states one outside the vocabulary, does not
register; a name that never registered has no traits to borrow.
"""

import dataclasses

import pytest
import torch

from convbench import cli
from convbench.algos import counts, registry
from convbench.algos.traits import TOLERANCES, Algorithm
from convbench.analysis import speedup
from convbench.catalogs.layers import Layer, resolve
from convbench.core import results
from convbench.core.problem import ConvProblem
from convbench.measure import ceilings, opcount, rows, runner, verify

NAME = "torch-wrapped"
#: Its traits: an exact, deterministic algorithm of ours that does the direct convolution's
#: flops.
TRAITS = Algorithm(NAME, family="direct", origin="ours", tolerance="exact", reduction="none",
                   counts=counts.DirectCount(), deterministic=True)
SMALL = ConvProblem(n=2, c=4, h=9, w=9, k=5, r=3, s=3, pad=1)
BUDGET = 0.002


class TorchWrapped(registry.Implementation):
    """torch's convolution called plainly, each pass into the harness's output; `scale` spoils
    it by that factor (a relative error of scale - 1)."""

    precisions = ("fp64", "fp32")
    scale = 1.0

    def supports(self, problem, pass_, layout, precision):
        return None

    def prepare(self, problem, pass_, layout, precision):
        kw = problem.torch_args()

        def view(a):  # nhwc (and krsc) as an NCHW-indexed view, as torch reads it
            t = torch.from_numpy(a)
            return t if layout == "nchw" else t.permute(0, 3, 1, 2)

        def run(a, b, out):
            a, b, y = view(a), view(b), view(out)
            with torch.no_grad():
                if pass_ == "fwd":
                    y.copy_(torch.nn.functional.conv2d(a, b, **kw))
                elif pass_ == "bwd_data":
                    y.copy_(torch.nn.grad.conv2d_input(y.shape, b, a, **kw))
                else:
                    y.copy_(torch.nn.grad.conv2d_weight(a, y.shape, b, **kw))
                y.mul_(self.scale)

        return run


@pytest.fixture
def wrapped():
    """`torch-wrapped` registered on numpy for the test alone (`registry.scratch`)."""
    with registry.scratch():
        registry.register(TRAITS, "numpy")(TorchWrapped)
        yield


def _rows(algos, problem=SMALL, passes=("fwd",), **options) -> list[dict]:
    cases = runner.sweep([Layer("custom", "small", problem)], algos, "numpy", passes, ["nchw"],
                         ["fp32"])
    return runner.run(cases, BUDGET, **options)


def test_it_is_listed_and_all_includes_it(wrapped, capsys):
    assert cli.main(["list"]) == 0
    numpy = capsys.readouterr().out.split("## backend numpy")[1].split("## backend")[0]
    assert f"\n| {NAME} " in numpy
    assert registry.expand_algos("all", "numpy")[-1] == NAME  # after the shipped ones


@pytest.mark.parametrize("column, status", [("exact", "failed"), ("winograd-alpha6", "ok")])
def test_it_is_verified_with_the_tolerance_it_declares(column, status):
    """Off by 3e-5 relative: past the exact column's 1e-5, within Winograd F(4x4)'s 1e-4; so
    the column the algorithm declares decides."""
    spoilt = type("Spoilt", (TorchWrapped,), {"scale": 1 + 3e-5})
    with registry.scratch():
        registry.register(dataclasses.replace(TRAITS, tolerance=column), "numpy")(spoilt)
        (r,) = _rows([NAME])
        assert r["tolerance"] == verify.tolerance(NAME, "fp32", SMALL)
    assert r["status"] == status and r["tolerance"] == TOLERANCES[column]["fp32"]
    assert r["rel_error"] == pytest.approx(3e-5, rel=0.05)


@pytest.mark.parametrize("origin, status", [("ours", "failed"), ("library", "inexact"),
                                            ("torch", "inexact")])
def test_a_result_beyond_its_tolerance_is_failed_if_ours_and_timed_if_a_library_s(origin,
                                                                                  status):
    """Off by 1e-4 relative, past the exact column: ours is `failed` and never timed; a
    library's (what its users run) is `inexact`, timed, its reason the error against the
    tolerance its traits declare."""
    spoilt = type("Spoilt", (TorchWrapped,), {"scale": 1 + 1e-4})
    with registry.scratch():
        registry.register(dataclasses.replace(TRAITS, origin=origin), "numpy")(spoilt)
        (r,) = _rows([NAME])
    assert r["status"] == status and r["rel_error"] == pytest.approx(1e-4, rel=0.05)
    assert f"> tolerance {r['tolerance']:.3g}" in r["reason"]
    assert (r["median_ms"] is not None) == (status == "inexact")


def test_every_pass_is_verified_and_counted_as_the_direct_convolution(wrapped):
    for r in _rows([NAME], passes=("fwd", "bwd_data", "bwd_filter")):
        assert r["status"] == "ok" and r["rel_error"] < r["tolerance"]
        assert r["algo_ops"] == SMALL.flops
    for pass_ in ("fwd", "bwd_data", "bwd_filter"):
        assert opcount.op_count(NAME, SMALL, pass_) == opcount.op_count("direct", SMALL, pass_)
        assert opcount.theoretical_workspace(NAME, SMALL, pass_) == 0


@pytest.mark.parametrize("reduction", ["none", "any"])
def test_it_is_guarded_with_its_own_reduction(reduction):
    """AlexNet's conv3, where Winograd F(4x4) does about half the direct flops: at 1.5x the
    roof in direct flops, an algorithm that declares no reduction is implausible, one that may
    run a transform we do not count (`any`) is allowed the largest counted reduction."""
    conv3 = resolve("alexnet:conv3").problem.with_batch(1)
    with registry.scratch():
        registry.register(dataclasses.replace(TRAITS, reduction=reduction), "numpy")(
            TorchWrapped)
        (case, torch_cpu) = runner.sweep([Layer("alexnet", "conv3", conv3)],
                                         [NAME, "torch-cpu"], "numpy", ["fwd"], ["nchw"],
                                         ["fp32"])
        largest = rows.reduction(torch_cpu, None)
        allowed = rows.reduction(case, conv3.flops)
        roof = dataclasses.replace(ceilings.measure("cpu", 1), gflops_attainable=100.0,
                                   gflops_peak_theoretical=150.0)
        why = rows.plausibility({"gflops": 150 * 1.25 * 1.5}, case, roof)
    assert largest > 1.5
    if reduction == "none":
        assert allowed == 1.0 and "arithmetic reduction 1 x" in why
    else:
        assert allowed == largest and why is None


def test_it_is_reported_as_one_of_ours(wrapped, tmp_path, capsys):
    folder = tmp_path / "run"
    code = cli.main(["layer", "conv3", "--algos", f"torch-cpu,{NAME}", "--passes", "fwd",
                     "--layouts", "nchw", "--batch", "1", "--time-budget", "0.05", "--quiet",
                     "--out", str(folder)])
    capsys.readouterr()
    assert code == 0
    df, _ = results.load_run(folder)
    assert set(df["status"]) == {"ok"} and list(df["algo"]) == ["torch-cpu", NAME]
    report = (folder / "report.md").read_text()
    assert any(line.startswith(f"| {NAME} ") for line in report.splitlines())
    assert "the fastest of our own algorithms against torch's fastest" in report
    # the best of ours against torch's is its (a busy machine's rows, as this suite's may be
    # beside a benchmark, do not compete: read as if quiet)
    quiet = df.assign(contended=False)
    (mine,) = speedup.against_torch(quiet).to_dict("records")
    assert (mine["own"], mine["torch"]) == (NAME, "torch-cpu")


def test_a_trait_left_out_or_unknown_does_not_register():
    with registry.scratch():
        with pytest.raises(TypeError, match="reduction"):
            Algorithm(NAME, family="direct", origin="ours", tolerance="exact",
                      counts=counts.DirectCount(), deterministic=True)
        with pytest.raises(TypeError, match="deterministic"):
            Algorithm(NAME, family="direct", origin="ours", tolerance="exact", reduction="none",
                      counts=counts.DirectCount())
        with pytest.raises(TypeError, match="an algorithm registers with its traits"):
            registry.register(NAME, "numpy")
        for changed, message in ((dict(family="magic"), "unknown family 'magic'"),
                                 (dict(origin="mine"), "unknown origin 'mine'"),
                                 (dict(tolerance="loose"), "unknown tolerance 'loose'"),
                                 (dict(reduction="some"), "unknown reduction 'some'"),
                                 (dict(reduction="counted", counts=None), "needs a count"),
                                 (dict(counts="direct"), "counts must be a traits.Count"),
                                 (dict(deterministic=None), "deterministic must be True or"),
                                 (dict(torch_benchmark=True), "torch_benchmark is for torch"),
                                 (dict(name="winograd"), "a command-line alias"),
                                 (dict(name="a,b"), "without commas")):
            with pytest.raises((TypeError, ValueError), match=message):
                registry.register(dataclasses.replace(TRAITS, **changed), "numpy")(TorchWrapped)
        # one name, one set of traits: gemm-cublas declared again, looser, on another backend
        looser = dataclasses.replace(registry.algorithm("gemm-cublas"), tolerance="fft")
        with pytest.raises(ValueError, match="declared with other traits"):
            registry.register(looser, "emu")(TorchWrapped)
        assert NAME not in registry.names() and ("gemm-cublas", "emu") not in registry._IMPLS


def test_a_name_that_never_registered_has_no_traits_to_borrow():
    """No silent default: before, an unknown name was judged exact and allowed the largest
    reduction."""
    (case,) = runner.sweep([Layer("custom", "small", SMALL)], [NAME], "numpy", ["fwd"], ["nchw"],
                           ["fp32"])
    for call in (lambda: verify.tolerance(NAME, "fp32"), lambda: rows.reduction(case, None),
                 lambda: opcount.op_count(NAME, SMALL, "fwd"), lambda: speedup.is_ours(NAME)):
        with pytest.raises(ValueError, match=f"unknown algo '{NAME}'"):
            call()
