import argparse
import copy
import json

import pytest
import torch
from torch import nn

import convbench.functional
from convbench import advisor, envinfo, report, runner, verify
from convbench import nn as cbnn
from convbench.layers import Layer
from convbench.measurement import Measurement
from convbench.plan import Choice, Constraints, LayerPlan, Plan, PlanError, PlanStore
from convbench.problem import PASSES, ConvProblem

P1 = ConvProblem(n=2, c=3, h=8, w=8, k=4, r=3, s=3, pad=1)
P2 = ConvProblem(n=2, c=4, h=8, w=8, k=4, r=3, s=3, pad=1)


def times(median: float, spread: float = 0.01) -> Measurement:
    return Measurement((median * (1 - spread), median, median * (1 + spread)))


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
    df = report.frame(synthetic({
        ("l1", "fwd", "gemm", "nchw"): times(1.0),
        ("l1", "fwd", "direct", "nchw"): times(1.5),
        ("l1", "fwd", "gemm", "nhwc"): times(2.0),
        ("l1", "fwd", "fft", "nhwc"): "unsupported",
        ("l2", "fwd", "gemm", "nchw"): times(1.0, spread=0.2),
        ("l2", "fwd", "winograd-2x2", "nhwc"): times(1.1, spread=0.2),
    }))
    adv = advisor.advise(df)
    a = adv.passes["l1", "fwd"]
    assert (a.best.algo, a.best.layout) == ("gemm", "nchw")
    assert (a.runner_up.algo, a.runner_up.layout) == ("direct", "nchw")
    assert a.margin == pytest.approx(0.5) and a.within_noise is False
    assert set(a.by_layout) == {"nchw", "nhwc"} and a.by_layout["nhwc"].median_ms == 2.0
    b = adv.passes["l2", "fwd"]
    assert b.best.algo == "gemm" and b.margin == pytest.approx(0.1) and b.within_noise is True
    assert adv.layers == [("l1", P1), ("l2", P2)]
    table = advisor.advice_table(adv)
    assert "within noise" in table and "+50%" in table and "(not measured)" in table


def test_heuristic_regret_compares_cudnn_with_the_best_in_its_layout():
    df = report.frame(synthetic({
        ("l1", "fwd", "cudnn-autotune", "nhwc"): times(1.0),
        ("l1", "fwd", "cudnn", "nhwc"): times(1.8),
        ("l1", "fwd", "cudnn", "nchw"): times(1.1),
        ("l1", "bwd_data", "cudnn", "nchw"): times(1.0),
        ("l1", "bwd_data", "direct", "nchw"): times(2.0),
        ("l2", "fwd", "direct", "nchw"): times(1.0),
    }, backend="cuda"))
    adv = advisor.advise(df)
    assert adv.passes["l1", "fwd"].regret == pytest.approx(0.8)
    assert adv.passes["l1", "bwd_data"].regret == 0
    assert adv.passes["l2", "fwd"].regret is None
    assert "+80%" in advisor.advice_table(adv)


def test_constraints_rule_out_candidates_and_say_how_many():
    table = {
        ("l1", "fwd", "cudnn-autotune", "nchw"): times(1.0),
        ("l1", "fwd", "gemm", "nchw"): (times(1.5), {"workspace": 1 << 30}),
        ("l1", "fwd", "winograd-4x4", "nchw"): (times(2.0), {"rel_error": 5e-6}),
        ("l1", "fwd", "direct", "nchw"): times(3.0),
        ("l1", "fwd", "fft", "nchw"): (times(0.5), {"rel_error": 1e-3}),  # above tolerance
    }
    df = report.frame(synthetic(table, backend="cuda"))
    best = lambda c: advisor.advise(df, c).passes["l1", "fwd"].best.algo
    assert best(Constraints()) == "cudnn-autotune"
    assert best(Constraints(deterministic=True)) == "gemm"
    assert best(Constraints(deterministic=True, workspace_budget=1 << 20)) == "winograd-4x4"
    strict = Constraints(deterministic=True, workspace_budget=1 << 20, max_error=1e-6)
    assert best(strict) == "direct"
    excluded = advisor.advise(df, strict).excluded
    assert excluded == {"above their tolerance": 1, "above --max-error 1e-06": 1,
                        "over the workspace budget of 1 MiB": 1,
                        "not deterministic": 1}
    assert not advisor.is_deterministic("cudnn", "cuda")
    assert advisor.is_deterministic("direct", "cuda") and advisor.is_deterministic("gemm", "numpy")


def test_a_row_that_declares_no_workspace_is_judged_by_its_measured_peak():
    rows = synthetic({("l1", "fwd", "cudnn", "nchw"): times(1.0),
                      ("l1", "fwd", "cudnn-autotune", "nchw"): times(1.5),
                      ("l1", "fwd", "direct", "nchw"): times(2.0)}, backend="cuda")
    rows[0].update(workspace_bytes=None, peak_bytes=2 << 30)  # seen to allocate 2 GiB
    rows[1].update(workspace_bytes=None, peak_bytes=None)  # nothing known: does not fit
    adv = advisor.advise(report.frame(rows), Constraints(workspace_budget=1 << 30))
    assert adv.passes["l1", "fwd"].best.algo == "direct"
    assert adv.excluded == {"above their tolerance": 0,
                            "over the workspace budget of 1 GiB": 2}
    rows[0]["peak_bytes"] = 1 << 20
    adv = advisor.advise(report.frame(rows), Constraints(workspace_budget=1 << 30))
    assert adv.passes["l1", "fwd"].best.algo == "cudnn"


def test_advice_refuses_mixed_backends_and_several_batches():
    rows = synthetic({("l1", "fwd", "gemm", "nchw"): times(1.0)})
    other = synthetic({("l1", "fwd", "cudnn", "nchw"): times(1.0)}, backend="cuda")
    with pytest.raises(ValueError, match="one backend"):
        advisor.advise(report.frame(rows + other))
    batch = synthetic({("l1", "fwd", "gemm", "nchw"): times(1.0)},
                      layers=(("l1", P1.with_batch(4)),))
    with pytest.raises(ValueError, match="layer l1 appears with several problems"):
        advisor.advise(report.frame(rows + batch))
    with pytest.raises(ValueError, match="no fp16 rows; they have fp32"):
        advisor.advise(report.frame(rows), precision="fp16")


def test_layer_costs_and_boundaries():
    df = report.frame(synthetic({
        ("l1", "fwd", "gemm", "nchw"): times(1.0),
        ("l1", "fwd", "gemm", "nhwc"): times(2.0),
        ("l1", "bwd_filter", "gemm", "nchw"): times(3.0),  # no nhwc bwd_filter: nhwc is out
        ("l2", "fwd", "gemm", "nchw"): "failed",
        ("l2", "bwd_data", "gemm", "nhwc"): times(1.0),
    }))
    adv = advisor.advise(df)
    assert advisor.layer_costs(adv) == [{"nchw": 4.0}, {"nhwc": 1.0}]
    bounds = advisor.boundaries(adv)
    assert bounds == [advisor.Boundary((2, 3, 8, 8), False), advisor.Boundary((2, 4, 8, 8), True),
                      advisor.Boundary((2, 4, 8, 8), True)]
    need = advisor.needed_conversions(advisor.layer_costs(adv), bounds, "nchw", "nchw")
    assert need == {((2, 4, 8, 8), "nchw", "nhwc"), ((2, 4, 8, 8), "nhwc", "nchw")}


def test_build_plan_takes_the_network_layouts_and_the_majority_cudnn_mode():
    df = report.frame(synthetic({
        ("l1", "fwd", "cudnn-autotune", "nhwc"): times(1.0),
        ("l1", "fwd", "cudnn", "nchw"): times(1.1),
        ("l1", "bwd_filter", "cudnn-autotune", "nhwc"): times(1.0),
        ("l1", "bwd_filter", "direct", "nchw"): times(1.2),
        ("l2", "fwd", "cudnn", "nchw"): times(1.0),
    }, backend="cuda"))
    adv = advisor.advise(df)
    conversions = [{"shape": list(s), "from": a, "to": b, "median_ms": 5.0, "iqr_ms": 0.0}
                   for s in ((2, 3, 8, 8), (2, 4, 8, 8)) for a, b in (("nchw", "nhwc"),
                                                                      ("nhwc", "nchw"))]
    plan = advisor.build_plan(adv, {}, conversions, measurements=[])
    assert [lp.layout for lp in plan.layers] == ["nchw", "nchw"]  # conversions cost too much
    assert plan.layers[0].passes["fwd"] == Choice("cudnn", "cuda", 1.1, pytest.approx(0.011))
    assert plan.layers[0].passes["bwd_filter"].algo == "direct"
    assert plan.layers[0].passes["bwd_data"] is None
    assert plan.cudnn == {"benchmark": False, "deterministic": False}  # three heuristic passes
    assert plan.network.per_layer_best_layouts == ["nhwc", "nchw"]
    assert plan.network.total_ms == pytest.approx(3.3)
    assert plan.network.per_layer_best_ms == pytest.approx(2.0 + 1.0 + 10.0)
    cheap = [{**c, "median_ms": 0.01} for c in conversions]
    plan = advisor.build_plan(adv, {}, cheap, measurements=[])
    assert [lp.layout for lp in plan.layers] == ["nhwc", "nchw"]
    assert plan.cudnn["benchmark"] is True  # two autotune passes, one heuristic pass
    unmeasured = advisor.build_plan(adv, {}, None, measurements=[])
    assert unmeasured.network is None
    assert [lp.layout for lp in unmeasured.layers] == ["nhwc", "nchw"]


def tiny_run(tmp_path, layers=2, algos=("direct", "gemm", "torch-cpu")):
    """A real CPU run folder of tiny layers, made the way `convbench layer --out` makes one."""
    problems = [P1, P2, ConvProblem(n=2, c=4, h=8, w=8, k=2, r=1, s=1)][:layers]
    cases = runner.sweep([Layer("custom", f"l{i + 1}", p) for i, p in enumerate(problems)],
                         algos, "numpy", ("fwd", "bwd_data", "bwd_filter"), ("nchw", "nhwc"),
                         ("fp32",))
    folder = tmp_path / "run"
    sink = runner.CsvSink(folder / runner.RESULTS_CSV)
    runner.run(cases, 0.001, on_row=sink.append)
    (folder / report.ENV_JSON).write_text(json.dumps(envinfo.collect("numpy")))
    return folder


def test_advice_on_a_real_cpu_run(tmp_path):
    folder = tiny_run(tmp_path)
    df, _ = report.load_run(folder)
    adv = advisor.advise(df)
    for (layer, pass_), a in adv.passes.items():
        rows = df[(df["layer"] == layer) & (df["pass"] == pass_) & (df["status"] == "ok")]
        assert a.best.median_ms == rows["median_ms"].min()
        assert a.runner_up.median_ms == sorted(rows["median_ms"])[1]
    assert len(adv.passes) == 6
    plan, adv, note = advisor.advise_run(folder)
    assert note is None and plan.network is not None
    assert plan.backend == "numpy" and len(plan.measurements) == len(df)
    assert {tuple(c["shape"]) for c in plan.conversions} >= {(2, 3, 8, 8), (2, 4, 8, 8)}
    assert Plan.from_json(plan.to_json()) == plan


def test_advise_run_made_elsewhere_has_no_network_plan(tmp_path):
    folder = tiny_run(tmp_path, layers=1, algos=("gemm",))
    env = json.loads((folder / report.ENV_JSON).read_text())
    env["torch"]["version"] = "0.0.1"
    (folder / report.ENV_JSON).write_text(json.dumps(env))
    plan, _, note = advisor.advise_run(folder)
    assert plan.network is None and plan.conversions == []
    assert "this machine differs from the run's in torch" in note
    assert plan.env["torch"] == "0.0.1"


def command(*argv):
    parser = argparse.ArgumentParser()
    advisor.add_cli(parser.add_subparsers())
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_advise_command_prints_the_advice_and_writes_the_plan(tmp_path, capsys):
    folder = tiny_run(tmp_path)
    store, out = tmp_path / "store", tmp_path / "plan.json"
    assert command("advise", str(folder), "--store", str(store), "--out", str(out),
                   "--workspace-budget", "1GiB", "--deterministic", "--max-error", "1e-3") == 0
    text, err = capsys.readouterr()
    assert "## Per-layer best (numpy, fp32)" in text and "## Network layout plan" in text
    assert "Network plan:" in text and "cudnn regret" in text
    assert "The constraints (workspace <= 1 GiB, deterministic, error <= 0.001) cost " in text
    plan = Plan.load(out)
    assert plan.constraints == Constraints(1 << 30, True, 1e-3)
    assert [p.name for p in store.iterdir()] == [PlanStore(store).path_for(plan).name]
    assert f"plan written to {out}" in err
    assert command("advise", str(folder), "--no-store", "--format", "json",
                   "--store", str(tmp_path / "unused")) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "convbench-plan"
    assert not (tmp_path / "unused").exists()


def test_what_a_workspace_budget_costs(tmp_path, capsys):
    folder = tiny_run(tmp_path)
    free, _, _ = advisor.advise_run(folder)
    tight, _, _ = advisor.advise_run(folder, Constraints(workspace_budget=1))
    assert tight.layers and all(c is None for lp in tight.layers for c in lp.passes.values())
    assert advisor.plan_total_ms(free) > 0
    line = advisor.constraint_cost(tight, free)
    assert line.startswith("The constraints (workspace <= 1 B) cost ")
    assert f"against {advisor.plan_total_ms(free):.4g} ms unconstrained" in line
    assert "No choice fits for l" in line  # nothing declares under one byte
    assert command("advise", str(folder), "--no-store") == 0
    assert "The constraints" not in capsys.readouterr().out  # none given: nothing to cost


def test_advise_command_errors_are_usage_errors(tmp_path):
    from convbench.cli import UsageError

    with pytest.raises(UsageError, match="is not a run folder"):
        command("advise", str(tmp_path), "--no-store")
    with pytest.raises(SystemExit):
        command("advise", str(tmp_path), "--workspace-budget", "lots")
    with pytest.raises(SystemExit):
        command("advise", str(tmp_path), "--max-error", "-1")


# --- tune and apply on a model --------------------------------------------------------------
class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.body = nn.Sequential(nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2,
                                                                          padding=1),
                                  nn.ReLU(), nn.Conv2d(6, 6, 1, bias=False))
        self.odd = nn.Conv2d(6, 6, (1, 3), padding=(0, 1))
        self.head = nn.Linear(6 * 5 * 5, 3)

    def forward(self, x):
        return self.head(torch.flatten(self.odd(torch.relu(self.body(self.stem(x)))), 1))


FAST = {"algos": "direct,gemm,torch-cpu", "budget_s": 0.001}


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVBENCH_PLAN_DIR", str(tmp_path / "plans"))
    return tmp_path / "plans"


@pytest.fixture
def measured(monkeypatch):
    """How many cases each runner.run call measured."""
    counts = []
    real = runner.run

    def spy(cases, *args, **kwargs):
        counts.append(len(cases))
        return real(cases, *args, **kwargs)

    monkeypatch.setattr(runner, "run", spy)
    return counts


def test_find_convs_in_call_order_with_refusals():
    model = SmallCNN()
    model.train()
    bn = model.body[0]
    stats = bn.running_mean.clone()
    sites, refused = advisor.find_convs(model, torch.randn(2, 3, 10, 10))
    assert [s.name for s in sites] == ["stem", "body.2", "body.4"]
    assert sites[0].passes == ("fwd", "bwd_filter")  # the input needs no gradient
    assert sites[1].passes == ("fwd", "bwd_data", "bwd_filter")
    assert sites[1].problem == ConvProblem(n=2, c=4, h=10, w=10, k=6, r=3, s=3, stride=2, pad=1)
    assert [(u.layer, u.reason[:19]) for u in refused] == [("odd", "asymmetric padding ")]
    assert model.training and bn.training and torch.equal(bn.running_mean, stats)


def test_find_convs_refuses_a_layer_called_with_two_shapes():
    conv = nn.Conv2d(2, 2, 3, padding=1)

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x):
            return self.conv(self.conv(x)[:, :, :4, :4])

    sites, refused = advisor.find_convs(Twice(), torch.randn(1, 2, 6, 6))
    assert sites == [] and "several input shapes" in refused[0].reason


def test_tune_measures_then_reuses_the_store(store, measured):
    torch.manual_seed(0)
    model, x = SmallCNN(), torch.randn(2, 3, 10, 10)
    lines = []
    plan = advisor.tune(model, x, log=lines.append, **FAST)
    assert measured == [(2 + 3 + 3) * 3 * 2]  # passes x algos x layouts
    assert [lp.layer for lp in plan.layers] == ["stem", "body.2", "body.4"]
    assert plan.layers[0].passes["bwd_data"] is None
    assert [u.layer for u in plan.unplanned] == ["odd"]
    assert plan.network is not None and plan.backend == "numpy" and plan.precision == "fp32"
    assert any(line.startswith("plan saved to " + str(store)) for line in lines)
    again = advisor.tune(model, x, **FAST)
    assert measured[-1] == 0  # everything came from the store
    assert [lp.passes for lp in again.layers] == [lp.passes for lp in plan.layers]
    advisor.tune(model, x, algos="direct,gemm,torch-cpu,fft", budget_s=0.001)
    assert measured[-1] == 8 * 2  # only the algorithm the store lacks


def test_a_stale_store_is_measured_again(store, measured, monkeypatch):
    model, x = SmallCNN(), torch.randn(2, 3, 10, 10)
    advisor.tune(model, x, **FAST)
    real = advisor.current_env_key
    monkeypatch.setattr(advisor, "current_env_key",
                        lambda backend: {**real(backend), "torch": "9.9.9"})
    lines = []
    advisor.tune(model, x, log=lines.append, **FAST)
    assert measured == [48, 48]
    assert any("not used: torch changed" in line for line in lines)


def test_tune_refuses_what_it_cannot_measure():
    with pytest.raises(ValueError, match="dtype int64 has no convbench precision"):
        advisor.tune(SmallCNN(), torch.zeros(1, 3, 10, 10, dtype=torch.int64))
    with pytest.raises(ValueError, match="unknown algo 'magic'"):
        advisor.tune(SmallCNN(), torch.zeros(1, 3, 10, 10), algos="magic")
    with pytest.raises(ValueError, match="unknown layout 'chwn'"):
        advisor.tune(SmallCNN(), torch.zeros(1, 3, 10, 10), layouts=("nchw", "chwn"))


def hand_plan(model, x, layouts, passes) -> Plan:
    """A plan for `model` choosing `passes[i]` (pass -> algo or None) in `layouts[i]`."""
    sites, unplanned = advisor.find_convs(model, x)
    layers = [LayerPlan(s.name, s.problem, lay,
                        {p: Choice(choice[p], "numpy", 1.0, 0.1) if choice.get(p) else None
                         for p in PASSES})
              for s, lay, choice in zip(sites, layouts, passes)]
    return Plan(env=advisor.current_env_key("numpy"), backend="numpy", precision="fp64",
                constraints=Constraints(), cudnn={"benchmark": False, "deterministic": False},
                input_layout="nchw", output_layout="nchw", layers=layers, network=None,
                unplanned=unplanned)


def trained_twins(plan, x, requires_grad=False):
    """(grads of the original, grads after apply, the apply summary, calls to functional.run)
    for one forward and backward of the same model before and after `apply`."""
    torch.manual_seed(0)
    model = SmallCNN().double()
    ref = copy.deepcopy(model)
    summary = advisor.apply(model, plan)
    out = []
    for m in (ref, model):
        xi = x.clone().requires_grad_(requires_grad)
        y = m(xi)
        y.backward(torch.ones_like(y))
        out.append((y, xi.grad, {n: p.grad for n, p in m.named_parameters()}))
    return out, summary, model


def graph_nodes(y) -> list[str]:
    """The names of the autograd nodes behind `y`."""
    names, todo, seen = [], [y.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        todo += [n for n, _ in node.next_functions]
    return names


def test_apply_keeps_outputs_and_gradients_and_dispatches_as_planned(monkeypatch):
    calls = []
    real = convbench.functional.run

    def spy(problem, pass_, a, b, *, algo, backend, layout, out=None):
        calls.append((problem.c, pass_, algo, layout))
        return real(problem, pass_, a, b, algo=algo, backend=backend, layout=layout, out=out)

    monkeypatch.setattr(convbench.functional, "run", spy)
    x = torch.randn(2, 3, 10, 10, dtype=torch.float64)
    plan = hand_plan(SmallCNN().double(), x, ["nhwc", "nchw", "nhwc"], [
        {"fwd": "gemm", "bwd_data": None, "bwd_filter": "direct"},
        {"fwd": "torch-cpu", "bwd_data": "torch-cpu", "bwd_filter": "torch-cpu"},
        {"fwd": "torch-cpu", "bwd_data": "torch-cpu", "bwd_filter": "torch-cpu"}])
    (ref, ours), summary, model = trained_twins(plan, x)
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-12, atol=1e-12)
    for name, grad in ref[2].items():
        torch.testing.assert_close(ours[2][name], grad, rtol=1e-12, atol=1e-12)
    # stem: ours, and no data gradient for the input; body.2: torch's, but it must convert
    # its channels_last input back to NCHW; body.4: torch alone runs it NHWC.
    assert calls == [(3, "fwd", "gemm", "nhwc"), (3, "bwd_filter", "direct", "nhwc")]
    assert [(c.layer, c.action) for c in summary.changes] == [
        ("stem", "replaced"), ("body.2", "replaced"), ("body.4", "kept"), ("odd", "skipped")]
    assert summary.replaced == ["stem", "body.2"]
    assert graph_nodes(model(x)).count("_PlannedConvBackward") == 2  # one per replaced layer
    assert isinstance(model.stem, cbnn.Conv2d) and isinstance(model.body[2], cbnn.Conv2d)
    assert type(model.body[4]) is nn.Conv2d
    assert model.body[4].weight.is_contiguous(memory_format=torch.channels_last)
    assert "converts its channels_last input to NCHW" in str(summary)
    assert "(no effect on the CPU)" in str(summary)
    for name in advisor.CPU_THREAD_ENV:
        monkeypatch.delenv(name, raising=False)
    assert "start Python with OMP_WAIT_POLICY=PASSIVE OPENBLAS_THREAD_TIMEOUT=4" in str(summary)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "4")
    assert "start Python" not in str(summary)


def test_apply_computes_the_first_data_gradient_only_when_asked(monkeypatch):
    calls = []
    real = convbench.functional.run
    monkeypatch.setattr(convbench.functional, "run", lambda *a, **k: calls.append(a[1])
                        or real(*a, **k))
    x = torch.randn(2, 3, 10, 10, dtype=torch.float64)
    every = {"fwd": "gemm", "bwd_data": "gemm", "bwd_filter": "gemm"}
    plan = hand_plan(SmallCNN().double(), x, ["nchw"] * 3, [every] * 3)
    (ref, ours), _, _ = trained_twins(plan, x, requires_grad=True)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-12, atol=1e-12)
    assert calls.count("bwd_data") == 3
    calls.clear()
    trained_twins(plan, x, requires_grad=False)
    assert calls.count("bwd_data") == 2


def test_the_readme_recipe_on_the_cpu(store):
    torch.manual_seed(0)
    model, x = SmallCNN(), torch.randn(2, 3, 10, 10)
    ref = copy.deepcopy(model)
    plan = advisor.tune(model, x, **FAST)
    summary = advisor.apply(model, plan)
    assert len(summary.changes) == 4
    torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-5)


def test_apply_skips_what_does_not_fit_and_refuses_another_device():
    x = torch.randn(2, 3, 10, 10, dtype=torch.float64)
    plan = hand_plan(SmallCNN().double(), x, ["nchw"] * 3, [{"fwd": "gemm"}] * 3)
    plan.layers[1] = LayerPlan("nosuch", plan.layers[1].problem, "nchw", plan.layers[1].passes)
    plan.layers[2] = LayerPlan("stem", P2, "nchw", plan.layers[2].passes)
    plan.layers[0] = LayerPlan("body.0", plan.layers[0].problem, "nchw", plan.layers[0].passes)
    summary = advisor.apply(SmallCNN().double(), plan)
    assert [(c.layer, c.reason) for c in summary.changes[:3]] == [
        ("body.0", "is a BatchNorm2d, not an nn.Conv2d"),
        ("nosuch", "the model has no such module"),
        ("stem", "its channels, filter or geometry differ from the plan's")]
    plan.backend = "cuda"
    with pytest.raises(PlanError, match="for backend cuda \\(cuda\\); the model is on cpu"):
        advisor.apply(SmallCNN(), plan)


def test_apply_reads_a_plan_file_and_warns_when_versions_differ(tmp_path):
    x = torch.randn(2, 3, 10, 10, dtype=torch.float64)
    plan = hand_plan(SmallCNN().double(), x, ["nchw"] * 3, [{"fwd": "gemm"}] * 3)
    plan.env = {**plan.env, "torch": "0.0.1"}
    path = plan.save(tmp_path / "plan.json")
    with pytest.warns(UserWarning, match="plan made with another torch"):
        summary = advisor.apply(SmallCNN().double(), str(path))
    assert summary.replaced == ["stem", "body.2", "body.4"]


# --- on a GPU -------------------------------------------------------------------------------
@pytest.mark.gpu
def test_tune_and_apply_on_a_gpu(store):
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model, x = SmallCNN().cuda(), torch.randn(8, 3, 10, 10, device="cuda")
    ref = copy.deepcopy(model)
    plan = advisor.tune(model, x, algos="direct,cudnn,cudnn-autotune", budget_s=0.01)
    assert plan.backend == "cuda" and plan.env["device"] is not None
    summary = advisor.apply(model, plan)
    assert len(summary.changes) == 4
    y, y0 = model(x), ref(x)
    torch.testing.assert_close(y, y0, rtol=1e-4, atol=1e-4)
    y.sum().backward()
    y0.sum().backward()
    for (name, p), p0 in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, p0.grad, rtol=1e-3, atol=1e-3, msg=name)


@pytest.mark.gpu
def test_deterministic_plan_on_a_gpu_avoids_cudnn(store):
    model, x = SmallCNN().cuda(), torch.randn(4, 3, 10, 10, device="cuda")
    plan = advisor.tune(model, x, algos="direct,cudnn,cudnn-autotune", budget_s=0.01,
                        constraints=Constraints(deterministic=True))
    algos = {c.algo for lp in plan.layers for c in lp.passes.values() if c}
    assert algos <= {"direct"} and plan.cudnn["deterministic"] is True
    advisor.apply(model, plan)
    assert torch.backends.cudnn.deterministic is True
    torch.backends.cudnn.deterministic = False
