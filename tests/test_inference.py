"""Winograd's inference variants (`winograd-*-inference`, `traits.Algorithm.weights_once`):
the filter transformed once and kept while the weights stay the same, checked against float64
like every algorithm, never run with a stale transform, counted without the filter transform,
and reported apart: in no comparison, no plan and not in `all`, in a section of their own."""

import dataclasses

import numpy as np
import pytest

from convbench import testing
from convbench.algos import reference, registry
from convbench.algos.phases import phase_names
from convbench.algos.winograd import CHECK_W, WINOGRAD, WINOGRAD_INFERENCE
from convbench.analysis import report, speedup
from convbench.catalogs.layers import Layer
from convbench.core import results
from convbench.core.problem import LAYOUTS, PASSES, ConvProblem
from convbench.measure import opcount, runner, verify
from convbench.planning import advice

INFERENCE = [a.name for a in WINOGRAD_INFERENCE.values()]
PROBLEMS = [ConvProblem(n=2, c=3, h=9, w=8, k=4, r=3, s=3, pad=1),
            ConvProblem(n=1, c=2, h=11, w=11, k=3, r=5, s=5, stride=2, pad=2)]  # phase split


@pytest.mark.parametrize("algo", INFERENCE)
def test_it_matches_float64_and_takes_only_the_forward_pass(algo):
    impl = registry.get(algo, "numpy")
    ran = 0
    for p in PROBLEMS:
        for layout in LAYOUTS:
            if registry.supports(impl, p, "fwd", layout, "fp64") is None:
                testing.assert_matches_reference(algo, "numpy", p, "fwd", layout, "fp64")
                ran += 1
        for pass_ in PASSES[1:]:
            assert registry.supports(impl, p, pass_, "nchw", "fp32") == \
                f"{algo} is an inference variant: fwd only"
    assert ran >= 2


@pytest.mark.parametrize("layout", LAYOUTS)
def test_new_weights_are_transformed_again_never_run_stale(layout):
    p = PROBLEMS[0]
    run = registry.get("winograd-4x4-inference", "numpy").prepare(p, "fwd", layout, "fp64")
    x, w = reference.random_operands(p, "fwd", layout, np.float64, seed=0)
    for step, weights in enumerate((w, w.copy() * -2.0, None, w)):
        if weights is None:  # the same array changed in place
            weights = w
            w *= 3.0
        out = reference.nan_output(p, "fwd", layout, np.float64)
        run(x, weights, out)
        ref = reference.reference(p, "fwd", layout, x, weights)
        assert verify.check(out, ref, "winograd-4x4-inference", "fp64", p, "fwd").ok, step


def test_its_phases_replay_and_its_count_leaves_out_the_filter_transform():
    p = PROBLEMS[0]
    impl = registry.get("winograd-2x2-inference", "numpy")
    names = phase_names("fwd")
    assert impl.phases(p, "fwd", "nhwc", "fp32") == [CHECK_W, names[0], names[2], names[3]]
    testing.assert_phases_replay(impl, p, "fwd", "nhwc")
    once = opcount.op_count("winograd-2x2-inference", p, "fwd")
    each = opcount.op_count("winograd-2x2", p, "fwd")
    a = 2 + p.r - 1
    filters = p.k * p.c * (2 * a * a * p.r + 2 * a * p.r * p.r)  # G·w·Gᵀ per filter
    assert (once.products, each.transforms - once.transforms) == (each.products, filters)
    assert impl.workspace_bytes(p, "fwd", "nchw", "fp32") > \
        registry.get("winograd-2x2", "numpy").workspace_bytes(p, "fwd", "nchw", "fp32")


def test_its_traits_and_names():
    for m, algo in WINOGRAD_INFERENCE.items():
        assert algo.weights_once and not WINOGRAD[m].weights_once
        assert dataclasses.replace(algo, name=WINOGRAD[m].name, counts=WINOGRAD[m].counts,
                                   weights_once=False) == WINOGRAD[m]
        assert not speedup.is_ours(algo.name) and speedup.weights_once(algo.name)
    assert registry.expand_algos("winograd-inference", "numpy") == INFERENCE
    assert not set(INFERENCE) & set(registry.expand_algos("all", "numpy"))
    with pytest.raises(TypeError, match="weights_once must be True or False"):
        dataclasses.replace(WINOGRAD[2], weights_once="yes")


def test_its_rows_are_reported_apart_and_no_plan_takes_them():
    layer = Layer("t", "small", ConvProblem(n=1, c=8, h=12, w=12, k=8, r=3, s=3, pad=1))
    algos = ["winograd-2x2", "winograd-2x2-inference", "torch-cpu"]
    cases = runner.sweep([layer], algos, "numpy", ["fwd", "bwd_data"], ["nchw"], ["fp32"])
    df = results.frame(list(runner.run(cases, 0.002)))
    text = report.markdown(df, {}, [])
    head, _, rest = text.partition("## Weights transformed once (inference)")
    assert rest and "winograd-2x2-inference" not in head
    section = rest.split("\n## ")[0]
    assert [[c.strip() for c in line.split("|")[1:5]] for line in section.splitlines()
            if "-inference" in line] == [["small", "fwd", "nchw", "winograd-2x2-inference"]]
    assert "bwd_data" not in section  # a pass it does not take is not a row
    plan = advice.advise(df)
    assert all(c.best.algo != "winograd-2x2-inference" for c in plan.passes.values())
    assert plan.excluded["inference variants (weights transformed once)"] == 1
