"""The whole step decides (`planning.confirm`): a plan's replacements kept only where the
model's step confirms them, on fakes that make a layer slow in place or torch slow, so the
verdicts do not hang on this machine's speed."""

import time

import pytest
import torch
from torch import nn

from convbench import nn as cbnn
from convbench.planning import apply, confirm, tune
from convbench.planning.plan import Plan


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)
        self.c = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def ours_plan(store) -> tuple[nn.Module, torch.Tensor, Plan]:
    """A plan choosing convbench's algorithms for every pass (torch's own not among them),
    not confirmed."""
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 3, 12, 12)
    plan = tune.tune(model, x, algos="direct,gemm", budget_s=0.001, step=None, progress=None)
    assert {lp.layer for lp in confirm.changed_layers(plan)} == {"a", "b", "c"}
    return model, x, plan


def slow(monkeypatch, cls, ms: float, only=None):
    """`cls.forward` takes `ms` more (for modules in `only`, if given)."""
    real = cls.forward

    def forward(self, x):
        if only is None or self in only:
            time.sleep(ms / 1e3)
        return real(self, x)

    monkeypatch.setattr(cls, "forward", forward)


def test_a_replacement_that_wins_alone_but_loses_in_place_is_dropped(store, monkeypatch):
    """Layer b's replacement is measured fast alone, but costs 250 ms more in the model (what
    the module call, hand-offs and cold caches cost in place, exaggerated beyond what a test
    process's torch step took at its slowest: 153 ms under xdist, when 60 ms were planted and
    the whole plan was measured faster): the step drops it, torch runs b, and the plan is not
    slower than torch's default."""
    model, x, plan = ours_plan(store)
    real = cbnn.Conv2d.forward

    def forward(self, inp):
        if self.weight.shape[1] == 8 and self.kernel_size == (3, 3):  # layer b
            time.sleep(0.25)
        return real(self, inp)

    monkeypatch.setattr(cbnn.Conv2d, "forward", forward)
    lines = []
    out = confirm.confirm(model, x, plan, "train", budget_s=0.3, log=lines.append)
    (check,) = out.checks
    assert check.mode == "train" and "b" in check.dropped and "b" not in check.kept
    b = next(lp for lp in out.layers if lp.layer == "b")
    planned = next(lp for lp in plan.layers if lp.layer == "b").layout
    assert all(c is None for c in b.passes.values())
    assert b.layout == (planned if check.layouts_kept else "nchw")  # torch's, in which layout
    assert check.trials >= 2  # the whole plan, then groups (its ratio is this machine's)
    assert check.low is None or check.high < 1  # kept: confirmed faster; else nothing kept
    summary = apply.apply(model, out)
    assert "b" not in summary.replaced
    assert "measured on the whole train step: " in str(summary)
    assert any("the whole plan takes" in line for line in lines)
    assert Plan.from_json(out.to_json()) == out


def test_a_plan_the_step_confirms_is_kept_whole(store, monkeypatch):
    """Where torch's own convolution is slow in place (60 ms a call more, a stand-in for a
    poor default), the whole plan is confirmed in one comparison and kept as tuned."""
    model, x, plan = ours_plan(store)
    slow(monkeypatch, nn.Conv2d, 60)
    out = confirm.confirm(model, x, plan, "inference", budget_s=0.3)
    (check,) = out.checks
    assert check.mode == "inference" and check.dropped == [] and not check.layouts_kept
    # one comparison; where the plan also changes layouts, its layouts alone are weighed too,
    # and (if they win) the whole plan against them
    assert check.trials == 1 or confirm.changed_layers(confirm.layouts_only(plan))
    assert sorted(check.kept) == ["a", "b", "c"] and check.high < 1
    assert [lp.passes for lp in out.layers] == [lp.passes for lp in plan.layers]
    assert "inference step: " in check.text() and "3 of 3 changes confirmed" in check.text()


@pytest.mark.parametrize("ours_ms", [120, 10], ids=["whole plan slower", "layouts' gain"])
def test_layouts_that_win_are_kept_where_the_replacements_lose(store, monkeypatch, ours_ms):
    """A plan of NHWC layers running our algorithms, where torch's convolution is slow unless
    its weights are channels_last (40 ms a call more: a stand-in for the layout's gain) and our
    replacements cost `ours_ms` more in place: slower than torch's default (the whole plan
    loses), or faster than it but slower than torch in channels_last (the whole plan wins, on
    its layouts' gain alone). Either way its layouts alone win, and the plan keeps them with
    torch's algorithms in them."""
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 3, 12, 12)
    plan = tune.tune(model, x, algos="direct,gemm", layouts=("nhwc",), budget_s=0.001,
                     step=None, progress=None)
    assert all(lp.layout == "nhwc" and confirm.replaced(lp) for lp in plan.layers)
    real_torch, real_ours = nn.Conv2d.forward, cbnn.Conv2d.forward

    def torch_forward(self, inp):
        if not self.weight.is_contiguous(memory_format=torch.channels_last):
            time.sleep(0.04)
        return real_torch(self, inp)

    def ours_forward(self, inp):
        time.sleep(ours_ms / 1e3)
        return real_ours(self, inp)

    monkeypatch.setattr(nn.Conv2d, "forward", torch_forward)
    monkeypatch.setattr(cbnn.Conv2d, "forward", ours_forward)
    lines = []
    out = confirm.confirm(model, x, plan, "inference", budget_s=0.3, log=lines.append)
    (check,) = out.checks
    assert check.layouts_kept and check.kept == [] and sorted(check.dropped) == ["a", "b", "c"]
    assert (check.whole_ratio > 1) is (ours_ms == 120) and check.high < 1
    assert any("the time of its layouts alone" in line for line in lines) is (ours_ms == 10)
    assert all(lp.layout == "nhwc" and not confirm.replaced(lp) for lp in out.layers)
    assert any("the plan's layouts alone, torch's algorithms in them: " in line
               and line.endswith("kept") for line in lines)
    assert "the plan's layouts kept" in check.text()
    assert Plan.from_json(out.to_json()) == out
    summary = apply.apply(model, out)
    assert summary.replaced == []  # torch runs every layer, in channels_last


def test_a_plan_that_changes_nothing_needs_no_step(store):
    model, x, plan = ours_plan(store)
    default = confirm.subplan(plan, set())
    assert confirm.changed_layers(default) == []
    out = confirm.confirm(model, x, default, "train")
    assert out.layers == default.layers and out.checks[0].trials == 0
    assert "the plan changes no layer; torch's default runs it all" in str(
        apply.apply(model, out))
    with pytest.raises(ValueError, match="unknown step mode 'eval'; valid: train, inference"):
        confirm.confirm(model, x, plan, "eval")


def test_the_callers_model_is_never_changed(store):
    model, x, plan = ours_plan(store)
    before = [type(m) for m in model.modules()]
    confirm.confirm(model, x, plan, "train", budget_s=0.05)
    assert [type(m) for m in model.modules()] == before
    assert all(p.grad is None for p in model.parameters())


def test_a_step_heavy_on_the_host_is_not_hidden_behind_one_heavy_on_the_gpu(gpu_queue):
    """On a pretend GPU with a queue: a plan whose step the host takes 10 ms to issue (2 ms of
    device work) against a default whose step the GPU takes 8 ms to run. Interleaved, the
    plan's step queued behind the default's work would read its device's tail (`timing`'s
    fake-queue test shows it); timed from an idle device it reads at least its host's time,
    the comparison calls it slower, and the host's time per step is kept beside each (read
    on this machine's clock: `timing`'s fake-queue test checks its value)."""
    import types

    plan = types.SimpleNamespace(backend="cuda", cudnn={"benchmark": False,
                                                        "deterministic": False})
    host_heavy = gpu_queue.step(20, host_ms=10.0, device_ms=2.0)
    device_heavy = gpu_queue.step(5, host_ms=0.5, device_ms=8.0)
    ratio, plan_ms, default_ms, *host = confirm.compare(
        plan, host_heavy, device_heavy, torch.zeros(1), "inference", budget_s=0.2)
    assert plan_ms >= 10 and default_ms == pytest.approx(8.1)
    assert ratio.low > 1  # the plan's step is the slower: its host sets the pace
    assert len(host) == 2 and None not in host
