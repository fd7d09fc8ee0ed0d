"""The whole step decides (`planning.confirm`): a plan's replacements kept only where the
model's step confirms them, on fakes that make a layer slow in place or torch slow, so the
verdicts do not hang on this machine's speed."""

import copy
import time

import pytest
import torch
from torch import nn

from convbench import nn as cbnn
from convbench.core import stats
from convbench.machine import contention
from convbench.measure import timing
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


def test_a_replacement_that_wins_alone_but_loses_in_place_is_dropped(store, quiet, monkeypatch):
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
    # torch's, in which layout: channels_last's, the plan's, or torch's default's
    assert b.layout == ("nhwc" if check.alternative else planned if check.layouts_kept
                        else "nchw")
    assert check.trials >= 2  # the whole plan, then groups (its ratio is this machine's)
    assert check.low is None or check.high < 1  # kept: confirmed faster; else nothing kept
    summary = apply.apply(model, out)
    assert "b" not in summary.replaced
    assert "measured on the whole train step: " in str(summary)
    assert any("the whole plan takes" in line for line in lines)
    assert Plan.from_json(out.to_json()) == out


def test_a_plan_the_step_confirms_is_kept_whole(store, quiet, monkeypatch):
    """Where torch's own convolution is slow in place (60 ms a call more, a stand-in for a
    poor default), the whole plan is confirmed in one comparison and kept as tuned, beside
    channels_last too."""
    model, x, plan = ours_plan(store)
    slow(monkeypatch, nn.Conv2d, 60)
    out = confirm.confirm(model, x, plan, "inference", budget_s=0.3)
    (check,) = out.checks
    assert check.mode == "inference" and check.dropped == [] and not check.layouts_kept
    # the whole plan, then channels_last against it (slow too: torch's layer is slow in any
    # layout); where the plan also changes layouts, its layouts alone are weighed too, and (if
    # they win) the whole plan against them
    assert check.trials == 2 or confirm.changed_layers(confirm.layouts_only(plan))
    assert check.alternative == "" and not check.busy
    assert sorted(check.kept) == ["a", "b", "c"] and check.high < 1
    assert [lp.passes for lp in out.layers] == [lp.passes for lp in plan.layers]
    assert "inference step: " in check.text() and "3 of 3 changes confirmed" in check.text()


@pytest.mark.parametrize("ours_ms", [120, 10], ids=["whole plan slower", "layouts' gain"])
def test_layouts_that_win_are_kept_where_the_replacements_lose(store, quiet, monkeypatch, ours_ms):
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
    ratio, plan_ms, default_ms, *host, busy = confirm.compare(
        plan, host_heavy, device_heavy, torch.zeros(1), "inference", budget_s=0.2)
    assert plan_ms >= 10 and default_ms == pytest.approx(8.1)
    assert ratio.low > 1  # the plan's step is the slower: its host sets the pace
    assert len(host) == 2 and None not in host and busy == ""


class Load:
    """A machine whose load varies between comparisons, on a fake clock: every try of a
    comparison (a `timing.time_steps` call) reads contended (half its threads' ready time on a
    core) while `busy` says so, quiet after; and a step takes what its convolutions add to the
    clock, `cost(layer, busy)` ms each (layer: the module, torch's or ours), nothing else."""

    def __init__(self, monkeypatch, busy, cost):
        self.now, self.tries, self.on, self.waiting = 0.0, 0, 0, 0
        self.busy_when, self.cost = busy, cost
        real = timing.time_steps

        def time_steps(contenders, budget_s, backend, **options):
            self.tries += 1
            return real(contenders, budget_s, backend, clock=lambda: self.now,
                        probe=self.probe, **options)

        monkeypatch.setattr(timing, "time_steps", time_steps)
        for cls in (nn.Conv2d, cbnn.Conv2d):
            monkeypatch.setattr(cls, "forward", self.costing(cls.forward))

    @property
    def busy(self) -> bool:
        return self.busy_when(self.tries)

    def costing(self, real):
        def forward(module, x):
            self.now += self.cost(module, self.busy) / 1e3
            return real(module, x)
        return forward

    def probe(self) -> contention.Sample:
        self.on += 10**6
        self.waiting += 10**6 if self.busy else 0
        return contention.Sample({1: (self.on, self.waiting)}, 0.0, 0)


def nchw_plan(store) -> tuple[nn.Module, torch.Tensor, Plan]:
    """A plan running convbench's algorithms in every pass of every layer, all NCHW (so its
    layouts alone change nothing), not confirmed."""
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 3, 12, 12)
    plan = tune.tune(model, x, algos="direct,gemm", layouts=("nchw",), budget_s=0.001,
                     step=None, progress=None)
    assert all(lp.layout == "nchw" and confirm.replaced(lp) for lp in plan.layers)
    return model, x, plan


def ours(module) -> bool:
    return isinstance(module, cbnn.Conv2d)


def busy_favours_the_plan(module, busy: bool) -> float:
    """On the busy machine ours look 6x faster than torch's (the load fell on torch's steps);
    on the quiet one they are 6x slower."""
    return (10 if busy else 60) if ours(module) else (60 if busy else 10)


def test_a_comparison_timed_on_a_busy_machine_is_timed_again_and_decided_quiet(
        store, monkeypatch):
    """The first try of the first comparison reads contended, and there the plan looks 3x
    faster; timed again on the quiet machine it is 6x slower, and nothing is kept. Decided on
    the busy try, the whole plan was kept."""
    model, x, plan = nchw_plan(store)
    load = Load(monkeypatch, lambda tries: tries <= 1, busy_favours_the_plan)
    lines = []
    out = confirm.confirm(model, x, plan, "inference", budget_s=0.3, log=lines.append)
    (check,) = out.checks
    assert lines[0].startswith("inference step: timed while the machine was busy (contended:")
    assert lines[0].endswith("; timing it again (try 2 of 3)")
    assert check.whole_ratio == pytest.approx(6) and check.kept == [] and check.busy == ""
    assert check.alternative == ""  # channels_last: torch's time here whatever its layout
    assert all(not confirm.replaced(lp) and lp.layout == "nchw" for lp in out.layers)
    assert check.trials == load.tries - 1  # one comparison took two tries
    assert "stayed busy" not in check.text()


def test_a_machine_busy_through_every_try_keeps_nothing_and_says_so(store, monkeypatch):
    """Contended through all three tries of the first comparison (the plan looking faster on
    each): the confirmation stops, keeps torch's default, and the log and the check say why."""
    model, x, plan = nchw_plan(store)
    load = Load(monkeypatch, lambda tries: True, busy_favours_the_plan)
    lines = []
    out = confirm.confirm(model, x, plan, "train", budget_s=0.3, log=lines.append)
    (check,) = out.checks
    assert load.tries == confirm.TRIES and check.trials == 1
    assert check.kept == [] and check.low is None and check.busy.startswith("contended")
    assert all(not confirm.replaced(lp) for lp in out.layers)
    assert lines[-1].startswith("train step: the machine stayed busy through 3 tries "
                                "(contended:")
    assert lines[-1].endswith("stopped; nothing kept, torch's default for what was not "
                              "confirmed")
    assert "; the machine stayed busy (contended: " in check.text()
    assert Plan.from_json(out.to_json()) == out
    assert f"measured on the whole {check.text()}" in str(apply.apply(model, out))


def test_what_was_confirmed_before_the_machine_got_busy_is_kept(store, monkeypatch):
    """A plan of NHWC layers running ours (10 ms in place) where torch's convolution takes
    40 ms unless its weight is channels_last (5 ms): quiet while the whole plan is confirmed
    against torch's default, busy through every try of its layouts alone after. The whole plan
    stays, as confirmed; the check says the machine stopped the rest."""
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 3, 12, 12)
    plan = tune.tune(model, x, algos="direct,gemm", layouts=("nhwc",), budget_s=0.001,
                     step=None, progress=None)
    assert all(lp.layout == "nhwc" and confirm.replaced(lp) for lp in plan.layers)

    def cost(module, busy):
        if ours(module):
            return 10
        return 5 if module.weight.is_contiguous(memory_format=torch.channels_last) else 40

    Load(monkeypatch, lambda tries: tries > 1, cost)
    out = confirm.confirm(model, x, plan, "inference", budget_s=0.3)
    (check,) = out.checks
    assert sorted(check.kept) == ["a", "b", "c"] and check.high < 1 and check.busy
    assert not check.layouts_kept and check.trials == 2
    assert [lp.passes for lp in out.layers] == [lp.passes for lp in plan.layers]
    assert "3 of 3 changes confirmed" in check.text() and "stayed busy" in check.text()


def test_channels_last_faster_than_the_plan_becomes_the_plan(store, monkeypatch):
    """torch's convolution is 8x faster with a channels_last weight (40 ms against 5), ours
    20 ms in place: the plan of ours in NCHW beats torch's default, and all channels_last beats
    the plan. The plan becomes every layer NHWC with torch's algorithms, and says so."""
    model, x, plan = nchw_plan(store)

    def cost(module, busy):
        if ours(module):
            return 20
        return 5 if module.weight.is_contiguous(memory_format=torch.channels_last) else 40

    Load(monkeypatch, lambda tries: False, cost)
    lines = []
    out = confirm.confirm(model, x, plan, "inference", budget_s=0.3, log=lines.append)
    (check,) = out.checks
    assert check.alternative == confirm.CHANNELS_LAST and check.kept == []
    assert sorted(check.dropped) == ["a", "b", "c"] and not check.layouts_kept
    assert check.whole_ratio < 1  # the plan alone was faster than torch's default
    assert check.high < check.whole_low  # channels_last, against the default, faster still
    assert check.trials == 3  # the whole plan; channels_last against it, then the default
    assert out.layers == confirm.channels_last(plan).layers
    assert all(lp.layout == "nhwc" and not confirm.replaced(lp) for lp in out.layers)
    assert any(line.startswith("inference step: channels_last (every layer nhwc, torch's "
                               "algorithms) takes") and "the time of what was kept" in line
               and line.endswith(": faster beyond noise") for line in lines)
    assert lines[-1] == "inference step: the plan becomes channels_last"
    assert "channels_last (torch's algorithms) was faster than the plan and runs instead" in \
        check.text()
    assert Plan.from_json(out.to_json()) == out
    applied = copy.deepcopy(model)
    assert apply.apply(applied, out).replaced == []
    assert all(m.weight.is_contiguous(memory_format=torch.channels_last)
               for m in applied.modules() if isinstance(m, nn.Conv2d))


def test_faster_means_below_one_by_the_margin():
    """A step 1.5% faster with a tight interval is not a change two runs would agree on."""
    assert not confirm.faster(stats.Ratio(0.985, 0.98, 0.99, True))
    assert confirm.faster(stats.Ratio(0.95, 0.94, 0.96, True))
    assert not confirm.faster(stats.Ratio(0.9, None, None, False))
