import copy

import pytest
import torch
from test_tune import FAST, P2, SmallCNN
from torch import nn

import convbench.functional
from convbench import nn as cbnn
from convbench.core.problem import PASSES, PRECISION_OF_DTYPE
from convbench.machine.threads import CPU_THREAD_ENV
from convbench.planning import apply, models, tune
from convbench.planning.plan import (
    Choice,
    Constraints,
    LayerPlan,
    Plan,
    PlanError,
    StepCheck,
    current_env_key,
)


def hand_plan(model, x, layouts, passes) -> Plan:
    """A plan for `model` choosing `passes[i]` (pass -> algo or None) in `layouts[i]`."""
    sites, unplanned = models.find_convs(model, x)
    layers = [LayerPlan(s.name, s.problem, lay,
                        {p: Choice(choice[p], "numpy", 1.0, 0.1) if choice.get(p) else None
                         for p in PASSES})
              for s, lay, choice in zip(sites, layouts, passes)]
    precision = PRECISION_OF_DTYPE[str(x.dtype).removeprefix("torch.")]
    return Plan(env=current_env_key("numpy"), backend="numpy", precision=precision,
                constraints=Constraints(), cudnn={"benchmark": False, "deterministic": False},
                input_layout="nchw", output_layout="nchw", layers=layers, network=None,
                unplanned=unplanned)


def trained_twins(plan, x, requires_grad=False):
    """(grads of the original, grads after apply, the apply summary, the model after apply)
    for one forward and backward of the same model before and after `apply`."""
    torch.manual_seed(0)
    model = SmallCNN().double()
    ref = copy.deepcopy(model)
    summary = apply.apply(model, plan)
    out = []
    for m in (ref, model):
        xi = x.clone().requires_grad_(requires_grad)
        y = m(xi)
        y.backward(torch.ones_like(y))
        out.append((y, xi.grad, {n: p.grad for n, p in m.named_parameters()}))
    return out, summary, model


#: The autograd node of a replaced layer in eager mode (`nn._PlannedConv`).
PLANNED_NODE = "_PlannedConvBackward"


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
    real = convbench.functional.prepared_call

    def spy(problem, pass_, a, b, out, *, algo, backend, layout, precision=None):
        calls.append((problem.c, pass_, algo, layout))
        return real(problem, pass_, a, b, out, algo=algo, backend=backend, layout=layout,
                    precision=precision)

    monkeypatch.setattr(convbench.functional, "prepared_call", spy)
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
        ("stem", "replaced"), ("body.2", "replaced"), ("body.4", "as is"), ("odd", "skipped")]
    assert summary.replaced == ["stem", "body.2"]
    assert graph_nodes(model(x)).count(PLANNED_NODE) == 2  # one per replaced layer
    assert isinstance(model.stem, cbnn.Conv2d) and isinstance(model.body[2], cbnn.Conv2d)
    assert type(model.body[4]) is nn.Conv2d
    assert model.body[4].weight.is_contiguous(memory_format=torch.channels_last)
    assert "converts its channels_last input to NCHW" in str(summary)
    assert "(no effect on the CPU)" in str(summary)
    for name in CPU_THREAD_ENV:
        monkeypatch.delenv(name, raising=False)
    assert ("start Python with OMP_WAIT_POLICY=PASSIVE OPENBLAS_THREAD_TIMEOUT=4 "
            "GOMP_SPINCOUNT=10000") in str(summary)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "4")
    assert "start Python" in str(summary)  # the spin count is still missing
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")
    assert "start Python" not in str(summary)


def test_apply_s_table_says_one_word_per_meaning():
    """What apply did to a layer is `replaced`, `as is` (torch runs the module itself, in the
    layout its row says) or `skipped`; what the whole step retained of the plan is counted as
    changes confirmed. `kept` said both once ("kept" rows, then "0 of 16 changed layers
    kept")."""
    x = torch.randn(2, 3, 10, 10, dtype=torch.float64)
    plan = hand_plan(SmallCNN().double(), x, ["nhwc", "nchw", "nhwc"], [
        {"fwd": "gemm", "bwd_data": None, "bwd_filter": "direct"},
        {"fwd": "torch-cpu", "bwd_data": "torch-cpu", "bwd_filter": "torch-cpu"},
        {"fwd": "torch-cpu", "bwd_data": "torch-cpu", "bwd_filter": "torch-cpu"}])
    plan.checks = [StepCheck(mode="train", time_ratio=1.0, low=None, high=None, plan_ms=None,
                             default_ms=None, whole_ratio=2.14, whole_low=2.06, whole_high=2.26,
                             trials=3, kept=[], dropped=["stem", "body.2", "body.4"])]
    summary = apply.apply(SmallCNN().double(), plan)
    text = str(summary)
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip()
            for line in text.splitlines()[2:6]}
    assert rows == {"stem": "replaced", "body.2": "replaced", "body.4": "as is",
                    "odd": "skipped"}
    assert "kept" not in text
    assert ("measured on the whole train step: torch's default (nothing confirmed); 0 of 3 "
            "changes confirmed; the whole plan measured 2.14× [2.06, 2.26]") in text
    one = StepCheck(mode="inference", time_ratio=0.9, low=0.85, high=0.95, plan_ms=9.0,
                    default_ms=10.0, whole_ratio=0.9, whole_low=0.85, whole_high=0.95,
                    trials=1, kept=["stem"], dropped=[])
    assert one.text() == ("inference step: 0.9× [0.85, 0.95] torch's default's time; 1 of 1 "
                          "change confirmed")


def test_apply_computes_the_first_data_gradient_only_when_asked(monkeypatch):
    calls = []
    real = convbench.functional.prepared_call
    monkeypatch.setattr(convbench.functional, "prepared_call",
                        lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    x = torch.randn(2, 3, 10, 10, dtype=torch.float64)
    every = {"fwd": "gemm", "bwd_data": "gemm", "bwd_filter": "gemm"}
    plan = hand_plan(SmallCNN().double(), x, ["nchw"] * 3, [every] * 3)
    (ref, ours), _, _ = trained_twins(plan, x, requires_grad=True)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-12, atol=1e-12)
    assert calls.count("bwd_data") == 3
    calls.clear()
    trained_twins(plan, x, requires_grad=False)
    assert calls.count("bwd_data") == 2


class InceptionBlock(nn.Module):
    """Inception-v3-style factorized convolutions: 1x7 then 7x1 with one-sided padding, and a
    3x3 strided along the height only."""

    def __init__(self):
        super().__init__()
        self.wide = nn.Conv2d(3, 4, (1, 7), padding=(0, 3))
        self.tall = nn.Conv2d(4, 4, (7, 1), padding=(3, 0))
        self.down = nn.Conv2d(4, 5, 3, stride=(2, 1), padding=(1, 0), bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.tall(torch.relu(self.wide(x)))))


def test_the_advisor_plans_and_runs_per_axis_layers(store):
    """Per-axis layers are planned and run as planned, not listed as unplanned; the applied
    model computes what the original does, in fp32."""
    from convbench import advisor

    torch.manual_seed(0)
    model, x = InceptionBlock(), torch.randn(2, 3, 9, 10)
    ref = copy.deepcopy(model)
    plan = advisor.tune(model, x, algos="direct,gemm,fft", budget_s=0.001, step=None)
    assert plan.unplanned == []
    assert [(lp.layer, lp.problem.pad, lp.problem.stride) for lp in plan.layers] == [
        ("wide", (0, 3), 1), ("tall", (3, 0), 1), ("down", (1, 0), (2, 1))]
    assert {c.algo for lp in plan.layers for c in lp.passes.values() if c} <= {
        "direct", "gemm", "fft"}
    assert not any(c and c.algo == "fft" for c in plan.layers[2].passes.values())  # stride 2x1
    summary = advisor.apply(model, plan)
    assert [c.action for c in summary.changes] == ["replaced"] * 3
    xi, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, y_ref = model(xi), ref(xr)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-5)
    y.sum().backward()
    y_ref.sum().backward()
    torch.testing.assert_close(xi.grad, xr.grad, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_a_plan_for_other_per_axis_geometry_is_skipped():
    """apply compares stride, padding and dilation per axis: the plan's 1x7 padded 0x3 does not
    fit a layer padded 3x0."""
    x = torch.randn(1, 3, 9, 10, dtype=torch.float64)
    plan = hand_plan(InceptionBlock().double(), x, ["nchw"] * 3,
                     [{"fwd": "gemm"}] * 3)
    model = InceptionBlock().double()
    model.wide = nn.Conv2d(3, 4, (1, 7), padding=(3, 0)).double()
    with pytest.warns(UserWarning, match="1 of the plan's 3 layers do not fit it"):
        summary = apply.apply(model, plan)
    assert (summary.changes[0].layer, summary.changes[0].action) == ("wide", "skipped")
    assert "geometry differ" in summary.changes[0].reason


def test_the_readme_recipe_on_the_cpu(store):
    torch.manual_seed(0)
    model, x = SmallCNN(), torch.randn(2, 3, 10, 10)
    ref = copy.deepcopy(model)
    plan = tune.tune(model, x, **FAST)
    summary = apply.apply(model, plan)
    assert len(summary.changes) == 4
    torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-5)


def test_apply_skips_what_does_not_fit_and_refuses_another_device():
    x = torch.randn(2, 3, 10, 10, dtype=torch.float64)
    plan = hand_plan(SmallCNN().double(), x, ["nchw"] * 3, [{"fwd": "gemm"}] * 3)
    fits = plan.layers[2]  # body.4
    plan.layers[1] = LayerPlan("nosuch", plan.layers[1].problem, "nchw", plan.layers[1].passes)
    plan.layers[2] = LayerPlan("stem", P2, "nchw", plan.layers[2].passes)
    plan.layers[0] = LayerPlan("body.0", plan.layers[0].problem, "nchw", plan.layers[0].passes)
    plan.layers.append(fits)
    with pytest.warns(UserWarning, match="the plan was not tuned for this model: 3 of the "
                      "plan's 4 layers do not fit it and are skipped .body.0: is a BatchNorm2d"
                      ".*; 1 of its conv layers are not in the plan and run torch's default "
                      ".body.2."):
        summary = apply.apply(SmallCNN().double(), plan)
    assert [(c.layer, c.reason) for c in summary.changes[:3]] == [
        ("body.0", "is a BatchNorm2d, not an nn.Conv2d"),
        ("nosuch", "the model has no such module"),
        ("stem", "its channels, filter or geometry differ from the plan's")]
    plan.layers.pop()
    with pytest.raises(PlanError, match="the plan fits none of the model's conv layers "
                       ".body.0: is a BatchNorm2d, not an nn.Conv2d.: it was tuned for another"):
        apply.apply(SmallCNN().double(), plan)
    plan.backend = "cuda"
    with pytest.raises(PlanError, match="for backend cuda \\(cuda\\); the model is on cpu"):
        apply.apply(SmallCNN(), plan)


def test_apply_reads_a_plan_file_and_warns_when_versions_differ(tmp_path):
    x = torch.randn(2, 3, 10, 10, dtype=torch.float64)
    plan = hand_plan(SmallCNN().double(), x, ["nchw"] * 3, [{"fwd": "gemm"}] * 3)
    plan.env = {**plan.env, "torch": "0.0.1"}
    path = plan.save(tmp_path / "plan.json")
    with pytest.warns(UserWarning, match="plan made with another torch"):
        summary = apply.apply(SmallCNN().double(), str(path))
    assert summary.replaced == ["stem", "body.2", "body.4"]



# --- on a GPU -------------------------------------------------------------------------------
@pytest.mark.gpu
def test_tune_and_apply_on_a_gpu(store):
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model, x = SmallCNN().cuda(), torch.randn(8, 3, 10, 10, device="cuda")
    ref = copy.deepcopy(model)
    plan = tune.tune(model, x, algos="direct,cudnn,cudnn-autotune", budget_s=0.01, step=None)
    assert plan.backend == "cuda" and plan.env["device"] is not None
    summary = apply.apply(model, plan)
    assert len(summary.changes) == 4
    y, y0 = model(x), ref(x)
    torch.testing.assert_close(y, y0, rtol=1e-4, atol=1e-4)
    y.sum().backward()
    y0.sum().backward()
    for (name, p), p0 in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, p0.grad, rtol=1e-3, atol=1e-3, msg=name)


def test_the_check_compares_the_whole_model_with_float64_in_both_modes():
    """apply(check=x): the whole model, before and after, and in channels_last alone, against
    its float64 run, in train mode (batch statistics) and eval mode; the plan's errors are of
    torch's own size here (exact algorithms), and the table says so."""
    from convbench.planning import numerics

    torch.manual_seed(0)
    model, x = SmallCNN(), torch.randn(2, 3, 10, 10)
    every = {"fwd": "gemm", "bwd_data": "gemm", "bwd_filter": "gemm"}
    plan = hand_plan(SmallCNN(), x, ["nchw"] * 3, [every] * 3)
    state = torch.get_rng_state()
    summary = apply.apply(model, plan, check=x)
    assert torch.equal(torch.get_rng_state(), state)  # a training run after it draws the same
    errors = summary.numerics
    assert len(errors) == 2 * 3 * 3
    assert {(e.mode, e.quantity, e.run) for e in errors} == {
        (m, q, r) for m in numerics.MODES for q in numerics.QUANTITIES
        for r in ("torch", "channels_last", "plan")}
    assert all(0 < e.rel < 1e-4 and e.max_rel < 1e-3 for e in errors)
    text = str(summary)
    assert "The whole model against float64" in text and "| train  | output" in text
    assert "moves" not in text  # nothing beyond torch's own


def test_what_the_user_must_be_told_of_the_numbers():
    """channels_last moving a quantity ten times further than NCHW is said; so is a plan that
    moves one ten times further than torch's own runs."""
    from convbench.planning import numerics
    from convbench.planning.apply import _numerics_text

    E = numerics.Error
    errors = [E("train", "input gradient", "torch", 1e-7, 1e-6),
              E("train", "input gradient", "channels_last", 1e-3, 0.035),
              E("train", "input gradient", "plan", 1e-3, 0.4)]
    assert numerics.moved_by_layout(errors) == [errors[1]]
    text = _numerics_text(errors)
    assert "channels_last alone moves the train-mode input gradient to 0.035" in text
    assert "the plan moves the train-mode input gradient to 0.4 of its largest value, 11.4x" \
        in text
