import dataclasses
import json

import pytest

from convbench.analysis import report
from convbench.core import results
from convbench.core.fmt import fmt_ms
from convbench.core.measurement import Measurement
from convbench.core.problem import ConvProblem
from convbench.measure import runner, verify
from convbench.planning import advice
from convbench.planning.plan import Choice, Constraints

BUSY = "measured on a busy machine (contended or throttled: --include-busy to use them)"
P1 = ConvProblem(n=2, c=3, h=8, w=8, k=4, r=3, s=3, pad=1)
P2 = ConvProblem(n=2, c=4, h=8, w=8, k=4, r=3, s=3, pad=1)
#: What a swapped pass costs per call in a model on the CPU, beyond its time alone.
O = advice.SWAP_OVERHEAD_MS["numpy"]


def times(median: float, spread: float = 0.01) -> Measurement:
    """Seven repetitions spread evenly ±`spread` around `median`: enough for intervals."""
    return Measurement(tuple(median * (1 + spread * k / 3) for k in range(-3, 4)))


def synthetic(table: dict, backend: str = "numpy", layers=(("l1", P1), ("l2", P2))) -> list:
    """Rows from {(layer, pass, algo, layout): Measurement | status | (Measurement, options)}:
    options may set `rel_error` and `workspace`."""
    rows = []
    for (layer, pass_, algo, layout), spec in table.items():
        problem = dict(layers)[layer]
        case = runner.Case("net", layer, problem, algo, backend, pass_, layout, "fp32")
        if isinstance(spec, str):
            rows.append(runner.row(case, spec, f"{spec} because"))
            continue
        m, opts = spec if isinstance(spec, tuple) else (spec, {})
        chk = verify.Check(True, opts.get("rel_error", 1e-7), 1e-6, 1e-5)
        rows.append(runner.row(case, "ok", check=chk, m=m,
                               workspace=opts.get("workspace", 1024)))
    return rows



# --- advice from results --------------------------------------------------------------------
def test_best_runner_up_margin_and_noise():
    df = results.frame(synthetic({
        ("l1", "fwd", "gemm", "nchw"): times(1.0),
        ("l1", "fwd", "direct", "nchw"): times(1.5),
        ("l1", "fwd", "gemm", "nhwc"): times(2.0),
        ("l1", "fwd", "fft", "nhwc"): "unsupported",
        ("l2", "fwd", "gemm", "nchw"): times(1.0, spread=0.2),
        ("l2", "fwd", "winograd-2x2", "nhwc"): times(1.1, spread=0.2),
    }))
    adv = advice.advise(df)
    a = adv.passes["l1", "fwd"]
    assert (a.best.algo, a.best.layout) == ("gemm", "nchw")
    assert (a.runner_up.algo, a.runner_up.layout) == ("direct", "nchw")
    assert a.runner_up.median_ms / a.best.median_ms == pytest.approx(1.5)
    assert a.within_noise is False
    assert set(a.by_layout) == {"nchw", "nhwc"} and a.by_layout["nhwc"].median_ms == 2.0
    b = adv.passes["l2", "fwd"]
    assert b.best.algo == "gemm" and b.within_noise is True
    assert b.runner_up.median_ms / b.best.median_ms == pytest.approx(1.1)
    assert adv.layers == [("l1", P1), ("l2", P2)]
    table = advice.advice_table(adv)
    assert "tie within noise with winograd-2x2 nhwc" in table and "(not measured)" in table
    # the ratio is of their costs in a model, both ours: each pays the module's overhead
    assert "| wins " in table and f"{(1.5 + O) / (1.0 + O):.3g}× [" in table


def test_heuristic_regret_compares_cudnn_with_the_best_in_its_layout():
    df = results.frame(synthetic({
        ("l1", "fwd", "cudnn-autotune", "nhwc"): times(1.0),
        ("l1", "fwd", "cudnn", "nhwc"): times(1.8),
        ("l1", "fwd", "cudnn", "nchw"): times(1.1),
        ("l1", "bwd_data", "cudnn", "nchw"): times(1.0),
        ("l1", "bwd_data", "direct", "nchw"): times(2.0),
        ("l2", "fwd", "direct", "nchw"): times(1.0),
    }, backend="cuda"))
    adv = advice.advise(df)
    assert adv.passes["l1", "fwd"].regret == pytest.approx(0.8)
    assert adv.passes["l1", "bwd_data"].regret == 0
    assert adv.passes["l2", "fwd"].regret is None
    assert "+80%" in advice.advice_table(adv)


def test_constraints_rule_out_candidates_and_say_how_many():
    table = {
        ("l1", "fwd", "cudnn-autotune", "nchw"): times(1.0),
        ("l1", "fwd", "gemm", "nchw"): (times(1.5), {"workspace": 1 << 30}),
        ("l1", "fwd", "winograd-4x4", "nchw"): (times(2.0), {"rel_error": 5e-6}),
        ("l1", "fwd", "direct", "nchw"): times(3.0),
        ("l1", "fwd", "fft", "nchw"): (times(0.5), {"rel_error": 1e-3}),  # above tolerance
    }
    df = results.frame(synthetic(table, backend="cuda"))
    best = lambda c: advice.advise(df, c).passes["l1", "fwd"].best.algo
    assert best(Constraints()) == "cudnn-autotune"
    assert best(Constraints(deterministic=True)) == "gemm"
    assert best(Constraints(deterministic=True, workspace_budget=1 << 20)) == "winograd-4x4"
    strict = Constraints(deterministic=True, workspace_budget=1 << 20, max_error=1e-6)
    assert best(strict) == "direct"
    excluded = advice.advise(df, strict).excluded
    assert excluded == {"above their tolerance": 1, "above --max-error 1e-06": 1,
                        "over the workspace budget of 1 MiB": 1,
                        "not deterministic": 1, BUSY: 0}
    assert not advice.is_deterministic("cudnn") and not advice.is_deterministic("cudnn-autotune")
    assert advice.is_deterministic("direct") and advice.is_deterministic("gemm")


def test_a_row_that_declares_no_workspace_is_judged_by_its_measured_peak():
    rows = synthetic({("l1", "fwd", "cudnn", "nchw"): times(1.0),
                      ("l1", "fwd", "cudnn-autotune", "nchw"): times(1.5),
                      ("l1", "fwd", "direct", "nchw"): times(2.0)}, backend="cuda")
    rows[0].update(workspace_bytes=None, peak_bytes=2 << 30)  # seen to allocate 2 GiB
    rows[1].update(workspace_bytes=None, peak_bytes=None)  # nothing known: does not fit
    adv = advice.advise(results.frame(rows), Constraints(workspace_budget=1 << 30))
    assert adv.passes["l1", "fwd"].best.algo == "direct"
    assert adv.excluded == {"above their tolerance": 0,
                            "over the workspace budget of 1 GiB": 2, BUSY: 0}
    rows[0]["peak_bytes"] = 1 << 20
    adv = advice.advise(results.frame(rows), Constraints(workspace_budget=1 << 30))
    assert adv.passes["l1", "fwd"].best.algo == "cudnn"


def test_advice_refuses_mixed_backends_and_several_batches():
    rows = synthetic({("l1", "fwd", "gemm", "nchw"): times(1.0)})
    other = synthetic({("l1", "fwd", "cudnn", "nchw"): times(1.0)}, backend="cuda")
    with pytest.raises(ValueError, match="one backend"):
        advice.advise(results.frame(rows + other))
    batch = synthetic({("l1", "fwd", "gemm", "nchw"): times(1.0)},
                      layers=(("l1", P1.with_batch(4)),))
    with pytest.raises(ValueError, match="layer l1 appears with several problems"):
        advice.advise(results.frame(rows + batch))
    with pytest.raises(ValueError, match="no fp16 rows; they have fp32"):
        advice.advise(results.frame(rows), precision="fp16")


def test_layer_costs_and_boundaries():
    df = results.frame(synthetic({
        ("l1", "fwd", "gemm", "nchw"): times(1.0),
        ("l1", "fwd", "gemm", "nhwc"): times(2.0),
        ("l1", "bwd_filter", "gemm", "nchw"): times(3.0),  # no nhwc bwd_filter: nhwc is out
        ("l2", "fwd", "gemm", "nchw"): "failed",
        ("l2", "bwd_data", "gemm", "nhwc"): times(1.0),
    }))
    adv = advice.advise(df)
    assert advice.layer_costs(adv) == [{"nchw": pytest.approx(4.0 + 2 * O)},
                                       {"nhwc": pytest.approx(1.0 + O)}]
    bounds = advice.boundaries(adv)
    assert bounds == [advice.Boundary((2, 3, 8, 8), False), advice.Boundary((2, 4, 8, 8), True),
                      advice.Boundary((2, 4, 8, 8), True)]
    need = advice.needed_conversions(advice.layer_costs(adv), bounds, "nchw", "nchw")
    assert need == {((2, 4, 8, 8), "nchw", "nhwc"), ((2, 4, 8, 8), "nhwc", "nchw")}


def test_build_plan_takes_the_network_layouts_and_the_majority_cudnn_mode():
    df = results.frame(synthetic({
        ("l1", "fwd", "cudnn-autotune", "nhwc"): times(1.0),
        ("l1", "fwd", "cudnn", "nchw"): times(1.1),
        ("l1", "bwd_filter", "cudnn-autotune", "nhwc"): times(1.0),
        ("l1", "bwd_filter", "direct", "nchw"): times(1.2),
        ("l2", "fwd", "cudnn", "nchw"): times(1.0),
    }, backend="cuda"))
    adv = advice.advise(df)
    conversions = [{"shape": list(s), "from": a, "to": b, "median_ms": 5.0, "iqr_ms": 0.0}
                   for s in ((2, 3, 8, 8), (2, 4, 8, 8)) for a, b in (("nchw", "nhwc"),
                                                                      ("nhwc", "nchw"))]
    plan = advice.build_plan(adv, {}, conversions, measurements=[])
    assert [lp.layout for lp in plan.layers] == ["nchw", "nchw"]  # conversions cost too much
    assert plan.layers[0].passes["fwd"] == Choice("cudnn", "cuda", 1.1, pytest.approx(0.011))
    assert plan.layers[0].passes["bwd_filter"].algo == "direct"
    assert plan.layers[0].passes["bwd_data"] is None
    assert plan.cudnn == {"benchmark": False, "deterministic": False}  # three heuristic passes
    assert plan.network.per_layer_best_layouts == ["nhwc", "nchw"]
    assert plan.network.total_ms == pytest.approx(3.3)
    assert plan.network.per_layer_best_ms == pytest.approx(2.0 + 1.0 + 10.0)
    cheap = [{**c, "median_ms": 0.01} for c in conversions]
    plan = advice.build_plan(adv, {}, cheap, measurements=[])
    assert [lp.layout for lp in plan.layers] == ["nhwc", "nchw"]
    assert plan.cudnn["benchmark"] is True  # two autotune passes, one heuristic pass
    unmeasured = advice.build_plan(adv, {}, None, measurements=[])
    assert unmeasured.network is None
    assert [lp.layout for lp in unmeasured.layers] == ["nhwc", "nchw"]



def test_a_problem_the_network_has_several_times_counts_that_many_times(tmp_path):
    """#35: on a --model run (each distinct problem measured once, env.json's `occurrences`
    saying how many layers have it) advise counted each problem once where the report weighs
    it by its occurrences; they agree now, the layout plan's conversions weighed alike."""
    folder = tmp_path / "run"
    sink = results.CsvSink(folder / results.RESULTS_CSV)
    for row in synthetic({("l1", "fwd", "gemm", "nchw"): times(1.0),
                          ("l1", "fwd", "direct", "nchw"): times(2.0),
                          ("l1", "bwd_data", "gemm", "nchw"): times(0.5),
                          ("l2", "fwd", "gemm", "nchw"): times(3.0),
                          ("l2", "fwd", "gemm", "nhwc"): times(4.0)}):
        sink.append(row)
    (folder / results.ENV_JSON).write_text(json.dumps(
        {"run": {"model": "m:net", "occurrences": {"l1": 3, "l2": 1}}}))
    df, env = results.load_run(folder)
    occurrences = env["run"]["occurrences"]
    adv = advice.advise(df, occurrences=occurrences)
    assert advice.layer_costs(adv) == [{"nchw": pytest.approx(3 * (1.5 + 2 * O))},
                                       {"nchw": pytest.approx(3.0 + O),
                                        "nhwc": pytest.approx(4.0 + O)}]
    bounds = advice.boundaries(adv)
    assert [b.count for b in bounds] == [3, 1, 1]
    plan = advice.build_plan(adv, {}, None, measurements=[])
    total = advice.plan_total_ms(plan, adv.occurrences)
    assert total == pytest.approx(3 * 1.5 + 3.0)
    assert fmt_ms(total) == report.choice_totals(df, occurrences).loc[
        "fastest per layer and pass", "network ms"]
    conversions = [{"shape": list(s), "from": a, "to": b, "median_ms": 0.25, "iqr_ms": 0.0}
                   for s in ((2, 3, 8, 8), (2, 4, 8, 8))
                   for a, b in (("nchw", "nhwc"), ("nhwc", "nchw"))]
    # each of l1's three occurrences is entered apart, its gradient crossing back
    assert advice.transition(bounds, advice.conversion_table(conversions))(
        0, "nchw", "nhwc") == pytest.approx(3 * 0.5)
    planned = advice.build_plan(adv, {}, conversions, measurements=[])
    # the network's total is of costs in a model: the choices' measured total and each of the
    # seven swapped passes' overhead (l1's two passes three times, l2's one)
    assert planned.network.total_ms == pytest.approx(total + 7 * O)
    text = advice.plan_text(planned, adv)
    assert "4 conv layers, 2 distinct problems" in text and "occurrences" in text
    assert f"Network plan: {total + 7 * O:.4g} ms per step" in text


# --- ties within noise, and busy machines -----------------------------------------------------
def test_a_tie_within_noise_goes_to_the_tie_break_and_a_real_gap_wins():
    df = results.frame(synthetic({
        ("l1", "fwd", "gemm", "nchw"): (times(1.0, spread=0.1), {"workspace": 1 << 20}),
        ("l1", "fwd", "direct", "nchw"): (times(1.02, spread=0.1), {"workspace": 0}),
        ("l1", "fwd", "fft", "nchw"): (times(1.04, spread=0.1), {"workspace": 1 << 10,
                                                                  "rel_error": 1e-8}),
        ("l2", "fwd", "gemm", "nchw"): (times(1.0), {"workspace": 1 << 20}),
        ("l2", "fwd", "direct", "nchw"): (times(1.2), {"workspace": 0}),
    }))
    a = advice.advise(df).passes["l1", "fwd"]
    assert a.fastest.algo == "gemm" and a.within_noise and a.best.algo == "direct"
    assert {c.algo for c in a.tied} == {"gemm", "direct", "fft"}
    assert advice.advise(df, Constraints(tie_break="time")).passes["l1", "fwd"].best.algo == "gemm"
    assert advice.advise(df, Constraints(tie_break="error")).passes["l1", "fwd"].best.algo == "fft"
    b = advice.advise(df).passes["l2", "fwd"]
    assert b.best.algo == "gemm" and not b.within_noise and b.ratio.low > 1.1
    table = advice.advice_table(advice.advise(df))
    assert "tie within noise with gemm nchw, fft nchw, workspace tie-break" in table
    # The choice (direct, by the tie-break) is compared with the fastest, not with itself
    # (it is the runner-up here), and the ratio is its own to the fastest's.
    best, other, ratio = advice.compared(a)
    assert (best.algo, other) == ("direct", "gemm nchw (the fastest)")
    assert ratio.value == pytest.approx(a.best.cost_ms / a.fastest.cost_ms)
    row = next(line for line in table.splitlines() if "| l1 " in line)
    assert row.count("direct nchw") == 0 and "gemm nchw (the fastest)" in row
    best, other, ratio = advice.compared(b)
    assert (best.algo, other, ratio) == ("gemm", "direct nchw", b.ratio)
    with pytest.raises(ValueError, match="tie-break 'luck'"):
        Constraints(tie_break="luck")


def test_times_of_a_busy_machine_are_left_out_unless_asked():
    rows = synthetic({("l1", "fwd", "gemm", "nchw"): times(1.0),
                      ("l1", "fwd", "direct", "nchw"): times(2.0),
                      ("l1", "fwd", "fft", "nchw"): times(3.0)})
    rows[0]["contended"] = True
    rows[1]["throttled"] = "power limit (3 ms held down)"
    df = results.frame(rows)
    adv = advice.advise(df)
    assert adv.passes["l1", "fwd"].best.algo == "fft" and adv.excluded[BUSY] == 2
    assert "2 " + BUSY in advice.plan_text(advice.build_plan(adv, {}, None, measurements=[]),
                                            adv)
    assert advice.advise(df, Constraints(include_busy=True)).passes["l1", "fwd"].best.algo == \
        "gemm"


# --- a swapped pass's cost in a model (#66) --------------------------------------------------
def test_many_small_layers_a_little_faster_alone_are_left_to_torch():
    """Ours 0.05 ms faster than torch's own alone, on every pass of small layers: each would
    pay the module's overhead per call in a model, so torch's pass wins, decidedly, by the
    ratio of their costs; without the overhead ours won every pass."""
    table = {(layer, p, algo, "nchw"): times(ms)
             for layer in ("l1", "l2") for p in ("fwd", "bwd_data", "bwd_filter")
             for algo, ms in (("torch-cpu", 0.15), ("gemm", 0.10))}
    df = results.frame(synthetic(table))
    adv = advice.advise(df)
    assert [(a.best.algo, a.runner_up.algo) for a in adv.passes.values()] == \
        [("torch-cpu", "gemm")] * 6
    assert adv.overhead_ms == O > 0.05
    for a in adv.passes.values():
        assert a.runner_up.cost_ms == pytest.approx(0.10 + O) and a.best.cost_ms == 0.15
        assert not a.within_noise and a.ratio.value == pytest.approx((0.10 + O) / 0.15)
    plan = advice.build_plan(adv, {}, None, measurements=[])
    assert {c.algo for lp in plan.layers for c in lp.passes.values()} == {"torch-cpu"}
    text = advice.plan_text(plan, adv)
    assert "in a model ms" in text and f"pays {fmt_ms(O)} ms a call" in text
    free = advice.advise(df, overhead_ms=0.0)
    assert {a.best.algo for a in free.passes.values()} == {"gemm"}


def test_a_big_layer_much_faster_alone_stays_ours_at_its_measured_time():
    """The overhead is per call: on a layer where ours is much faster it changes nothing but the
    cost the table shows; the plan's choice keeps the time measured."""
    df = results.frame(synthetic({("l1", "fwd", "torch-cpu", "nchw"): times(10.0),
                                  ("l1", "fwd", "gemm", "nchw"): times(5.0)}))
    adv = advice.advise(df)
    a = adv.passes["l1", "fwd"]
    assert a.best.algo == "gemm" and not a.within_noise
    assert (a.best.median_ms, a.best.cost_ms) == (5.0, pytest.approx(5.0 + O))
    plan = advice.build_plan(adv, {}, None, measurements=[])
    assert plan.layers[0].passes["fwd"].median_ms == 5.0
    row = next(line for line in advice.advice_table(adv).splitlines() if "| l1 " in line)
    assert f"| {fmt_ms(5.0)} " in row and f"| {fmt_ms(5.0 + O)} " in row


def test_a_swapped_gpu_pass_costs_the_larger_of_its_device_and_host_time():
    """On a GPU the host issues while the device runs: a swapped pass whose host's issue time
    plus the module's overhead exceeds its device time costs that, and loses to torch's pass
    it beat on the device; one whose device time is the longer costs its device time."""
    host = lambda m, ms: dataclasses.replace(m, host_ms=(ms,) * len(m.times_ms))
    rows = synthetic({("l1", "fwd", "cudnn", "nchw"): times(0.10),
                      ("l1", "fwd", "direct", "nchw"): host(times(0.05), 0.20),
                      ("l2", "fwd", "cudnn", "nchw"): times(0.10),
                      ("l2", "fwd", "direct", "nchw"): host(times(0.08), 0.01)},
                     backend="cuda")
    gpu = advice.SWAP_OVERHEAD_MS["cuda"]
    adv = advice.advise(results.frame(rows))
    host_bound = adv.passes["l1", "fwd"]
    assert (host_bound.best.algo, host_bound.runner_up.algo) == ("cudnn", "direct")
    assert host_bound.runner_up.cost_ms == pytest.approx(0.20 + gpu)
    assert host_bound.regret == 0
    device_bound = adv.passes["l2", "fwd"]
    assert device_bound.best.algo == "direct" and device_bound.best.cost_ms == 0.08
    assert device_bound.regret == pytest.approx(0.10 / 0.08 - 1)
    assert "the larger of its device time and its host's issue time" in advice.plan_text(
        advice.build_plan(adv, {}, None, measurements=[]), adv)


def inexact(layer: str, pass_: str, algo: str, layout: str, m: Measurement,
            backend: str = "cuda") -> dict:
    """An `inexact` row: 5.1e-3 relative error against a tolerance of 6.75e-4 (torch's fp32
    weight gradient of AlexNet's conv2 on an H200)."""
    case = runner.Case("net", layer, {"l1": P1, "l2": P2}[layer], algo, backend,
                       pass_, layout, "fp32")
    chk = verify.Check(False, 5.1e-3, 0.1, 6.75e-4)
    return runner.row(case, "inexact", chk.reason, check=chk, m=m)


def test_an_inexact_torch_pick_stays_the_baseline_and_is_chosen_only_within_max_error():
    """torch's inexact pick is timed: it is the regret's baseline, marked, and its error is
    said; no plan takes it unless --max-error admits its error. Where an exact choice is
    decidedly faster, that is chosen; where every exact one is slower, the pass is left to
    torch, never replaced by a slower one."""
    rows = synthetic({("l1", "bwd_filter", "direct", "nchw"): times(0.5),
                      ("l2", "bwd_filter", "direct", "nchw"): times(9.7)}, backend="cuda")
    rows += [inexact("l1", "bwd_filter", "cudnn", "nchw", times(1.0)),
             inexact("l2", "bwd_filter", "cudnn", "nchw", times(1.0))]
    adv = advice.advise(results.frame(rows))
    faster = adv.passes["l1", "bwd_filter"]
    assert faster.best.algo == "direct" and faster.runner_up is None  # cudnn no candidate
    assert faster.regret == pytest.approx(1.0)  # the inexact pick is still the baseline
    assert ("l2", "bwd_filter") not in adv.passes
    torchs, best = adv.left_to_torch["l2", "bwd_filter"]
    assert (torchs.algo, best.algo) == ("cudnn", "direct")
    assert adv.excluded[advice.INEXACT_EXCLUDED] == 2
    plan = advice.build_plan(adv, {}, None, measurements=[])
    assert plan.layers[1].passes["bwd_filter"] is None  # torch runs it, as it did
    text = advice.plan_text(plan, adv)
    assert "| †+100% " in text and "(left to torch: its inexact pick is faster)" in text
    assert ("torch's default (`cudnn`) computes l2 bwd_filter (nchw, fp32) with 0.51% relative "
            "error; its tolerance is 0.068%") in text
    allowed = advice.advise(results.frame(rows), Constraints(max_error=1e-2))
    assert allowed.passes["l2", "bwd_filter"].best.algo == "cudnn"
    assert not allowed.left_to_torch
    strict = advice.advise(results.frame(rows), Constraints(max_error=1e-3))
    assert strict.excluded["above --max-error 0.001"] == 2
    assert ("l2", "bwd_filter") in strict.left_to_torch


def test_times_from_the_same_rounds_pair_up():
    """Two algorithms timed in the same rounds, both slowed by the same drift: paired, their
    ratio is decided; apart, the drift's spread hides it."""
    drift = [1 + 0.3 * k / 6 for k in range(7)]
    rows = synthetic({("l1", "fwd", "gemm", "nchw"): Measurement(tuple(d for d in drift)),
                      ("l1", "fwd", "direct", "nchw"): Measurement(tuple(1.05 * d
                                                                         for d in drift))})
    for r in rows:
        r["round_group"] = "run-1"
    paired = advice.advise(results.frame(rows)).passes["l1", "fwd"]
    assert paired.ratio.paired and paired.ratio.decided and not paired.within_noise
    rows[1]["round_group"] = "run-2"
    apart = advice.advise(results.frame(rows)).passes["l1", "fwd"]
    assert not apart.ratio.paired and apart.within_noise
