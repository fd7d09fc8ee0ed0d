"""Memory strategies: gradients unchanged, the batch search exact and within the budget, the
output, and bad input."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_cli import run_cli

from convbench.core.problem import LAYOUTS, PASSES
from convbench.studies import footprint, memplan, memplan_report, workspace
from convbench.studies.workload import Workload

ALEXNET = Workload.parse("alexnet")


def affine(a: int, b: int, seen: list):
    """A footprint known exactly: a + b·batch bytes, every probe recorded."""
    def measure(batch: int) -> memplan.Probe:
        seen.append(batch)
        return memplan.Probe(batch, a + b * batch, [10.0 * batch])

    return measure


@given(a=st.integers(0, 10**9), b=st.integers(1, 10**7), extra=st.integers(0, 10**9),
       margin=st.floats(1.0, 4.0))
def test_the_search_never_probes_beyond_the_budget_and_ends_near_the_limit(a, b, extra,
                                                                            margin):
    """With a bound on the growth per image `margin` times the true one, no probe goes beyond
    the budget, and the search ends fewer than `margin` batches below the true limit."""
    budget = a + b + extra  # batch 1 fits
    seen = []
    found = memplan.largest_measured_batch(affine(a, b, seen), budget, slope_bound=b * margin)
    true = min((budget - a) // b, memplan.MAX_BATCH)
    assert all(a + b * n <= budget for n in seen), seen
    # the gap in batches, an integer, against the margin: `true - margin` rounds (4 - (1 + 2⁻⁵²)
    # is 3.0 in floating point, and a search 1 below with margin 1 + 2⁻⁵² is within it)
    assert true - found.batch < margin and found.batch <= true
    assert found.peak == a + b * found.batch


def test_a_margin_a_hair_above_one_may_end_one_batch_below():
    """The case hypothesis found: budget 4, one byte an image, a bound 1 + 2⁻⁵² times the slope:
    the search stops at 3, one batch below the limit, within its margin."""
    seen = []
    found = memplan.largest_measured_batch(affine(0, 1, seen), 4,
                                           slope_bound=1.0000000000000002)
    assert found.batch == 3 and max(seen) <= 4
    exact = memplan.largest_measured_batch(affine(0, 1, []), 4, slope_bound=1.0)
    assert exact.batch == 4


@pytest.mark.parametrize("a, b, budget", [(100, 7, 1000), (780_000_000, 4_600_000, 1 << 30),
                                          (0, 1, 65536), (5, 3, 8)])
def test_with_the_true_growth_as_the_bound_the_search_finds_the_true_limit(a, b, budget):
    """A footprint known exactly, and a bound equal to its growth: one probe at batch 1, one at
    the limit."""
    seen = []
    found = memplan.largest_measured_batch(affine(a, b, seen), budget, slope_bound=b)
    assert found.batch == min((budget - a) // b, memplan.MAX_BATCH)
    assert seen == sorted(set(seen)) and len(seen) <= 2


def test_a_peak_that_bends_is_closed_in_on_from_below():
    """Where the peak grows faster than the line through the probes said, the overshooting
    probe is recorded and the search halves its way down to the largest batch that fits."""
    seen = []

    def bent(batch):
        seen.append(batch)
        return memplan.Probe(batch, 100 + 10 * batch + (500 if batch > 40 else 0))

    found = memplan.largest_measured_batch(bent, 1000, slope_bound=10)
    assert found.batch == 40 and max(found.probes) > 40
    assert [n for n in seen if 100 + 10 * n + (500 if n > 40 else 0) > 1000] != []


def test_batch_one_over_the_budget_is_refused():
    with pytest.raises(ValueError, match="even batch 1 needs 110 B, over the budget of 100 B"):
        memplan.largest_measured_batch(affine(100, 10, []), 100, 10)


@pytest.mark.parametrize("strategy", ["checkpoint", "recompute-cheap"])
def test_recomputation_leaves_the_gradients_as_they_were(strategy):
    assert memplan.gradient_error(ALEXNET, strategy, "cpu") <= memplan.GRADIENT_TOLERANCE


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["offload", "checkpoint+offload", "recompute-cheap+offload"])
def test_offloading_leaves_the_gradients_as_they_were(strategy):
    assert memplan.gradient_error(ALEXNET, strategy, "cuda") <= memplan.GRADIENT_TOLERANCE


def test_strategies_are_checked_where_they_are_named():
    assert memplan.parse_strategies("none, checkpoint,recompute-cheap+offload,none") == [
        "none", "checkpoint", "recompute-cheap+offload"]
    for text, words in (("magic", "unknown strategy 'magic'"),
                        ("checkpoint+recompute-cheap", "recomputes the cheap layers already"),
                        ("none+offload", "combines none"), ("", "no strategy given")):
        with pytest.raises(ValueError, match=words):
            memplan.parse_strategies(text)
    assert "on the CPU they are there already" in memplan.unsupported("checkpoint+offload",
                                                                      "cpu")
    assert memplan.unsupported("offload", "cuda") is None
    assert memplan.unsupported("checkpoint", "cpu") is None


def test_the_report_table_and_rows(tmp_path):
    pytest.importorskip("matplotlib")
    seen = []
    plain = memplan.StrategyResult("none", search=memplan.largest_measured_batch(affine(100, 10, seen), 1000, 10),
                           gradient_error=0.0)
    plain.timed = {b: affine(100, 10, [])(b) for b in memplan.curve(plain.search.batch, 1)}
    assert sorted(plain.timed) == [1, 45, 90]
    off = memplan.StrategyResult("offload", reason="no second memory here")
    text = memplan_report.markdown("alexnet", "cpu", 1000, [plain, off], 1, {"device": "a CPU"})
    assert "| none " in text and "| 90 " in text and "| offload    | unsupported" in text
    names = memplan_report.write(tmp_path, text, [plain, off], {}, "title")
    assert names == ["report.md", "memplan.csv", "env.json", "memplan.png"]
    rows = memplan_report.rows([plain, off])
    assert [r["batch"] for r in rows if r["status"] == "ok"] == [1, 45, 90]
    assert next(r for r in rows if r["largest"] is True)["batch"] == 90
    assert [r["search_probe"] for r in rows if r["status"] == "ok"] == [True, False, True]


def test_offloadings_images_per_second_are_said_to_be_a_lower_bound():
    """save_on_cpu copies without overlap: the report says what its speed means."""
    off = memplan.StrategyResult("offload", search=memplan.largest_measured_batch(
        affine(100, 10, []), 1000, 10), gradient_error=0.0)
    off.timed = {b: affine(100, 10, [])(b) for b in memplan.curve(off.search.batch, None)}
    text = memplan_report.markdown("alexnet", "cuda", 1000, [off], 90, {"device": "a GPU"})
    assert "its images/s is a lower bound for offloading" in text
    plain = memplan.StrategyResult("none", search=off.search, gradient_error=0.0,
                                   timed=off.timed)
    assert "lower bound" not in memplan_report.markdown("alexnet", "cuda", 1000, [plain], 90, {})


def test_only_unsupported_strategies_say_so_and_draw_nothing(tmp_path, capsys):
    """offload alone on the CPU: no common batch to speak of, no empty plot; a line says why."""
    out = tmp_path / "plan"
    code, printed, _ = run_cli(capsys, "memplan", "--device", "cpu", "--strategies",
                               "offload", "--out", str(out))
    assert code == 0 and "None" not in printed and "memplan.png" not in printed
    assert "no strategy asked for runs on this device: nothing was measured" in printed
    assert "| offload    | unsupported     |" in printed and "common batch" not in printed
    assert sorted(p.name for p in out.iterdir()) == ["env.json", "memplan.csv", "report.md"]


def test_a_budget_too_small_for_batch_one_is_one_line(capsys):
    code, out, err = run_cli(capsys, "memplan", "--device", "cpu", "--budget", "64MiB")
    assert code == 2 and err.count("\n") == 1 and out == ""
    assert "training step at batch 1 needs about" in err and "over the budget of 64 MiB" in err


# --- the workspace strategy ------------------------------------------------------------------
def synthetic_choices(times: dict[str, float]) -> workspace.Choices:
    """AlexNet's conv passes at batch 2, each algo of `times` verified and timed at that many
    ms (the same for every pass and layout) where it runs the pass, as `measure_choices` would
    have measured them."""
    from convbench.algos import registry
    from convbench.catalogs import layers
    from convbench.core.measurement import Measurement
    from convbench.measure import runner, verify

    rows = []
    for layer in layers.net_layers("alexnet"):
        problem = layer.problem.with_batch(workspace.REFERENCE_BATCH)
        passes = ("fwd", "bwd_filter") if layer.name == "conv1" else PASSES
        for algo, ms in times.items():
            for pass_ in passes:
                for layout in LAYOUTS:
                    case = runner.Case("alexnet", layer.name, problem, algo, "numpy", pass_,
                                       layout, "fp32")
                    why = registry.supports(registry.get(algo, "numpy"), problem, pass_, layout,
                                            "fp32")
                    ok = verify.Check(True, 1e-7, 1e-6, 1e-5)
                    rows.append(runner.row(case, "unsupported", why) if why else
                                runner.row(case, "ok", check=ok, m=Measurement((ms, ms, ms)),
                                           peak_bytes=0))
    return workspace.Choices(rows, workspace.REFERENCE_BATCH, "numpy")


def test_the_workspace_strategy_is_named_and_combined():
    assert memplan.parse_strategies("workspace,recompute-cheap+workspace") == [
        "workspace", "recompute-cheap+workspace"]
    assert memplan.base("workspace") == "none"
    assert memplan.base("recompute-cheap+workspace") == "recompute-cheap"
    with pytest.raises(ValueError, match="combines none"):
        memplan.parse_strategies("none+workspace")


def test_the_plan_takes_the_fastest_algorithms_whose_workspaces_fit_the_room():
    """gemm (1 ms, im2col workspace) beats direct (2 ms, its planes) beats torch-cpu (3 ms,
    none declared): with room for everything the plan is all gemm; as the room shrinks it
    holds less, never more than the room, and at no room it leaves every pass to torch."""
    choices = synthetic_choices({"gemm": 1.0, "direct": 2.0, "torch-cpu": 3.0})
    fastest, held = workspace.budgeted_plan(choices, 16, 1 << 62)
    assert {c.algo for lp in fastest.layers for c in lp.passes.values() if c} == {"gemm"}
    assert held == workspace.held_workspace(fastest) > 0
    previous = held
    for room in (held - 1, held // 2, held // 8, 1 << 20, 0):
        plan, got = workspace.budgeted_plan(choices, 16, room)
        assert got <= room and got <= previous
        previous = got
    assert got == 0
    assert {c.algo for lp in plan.layers for c in lp.passes.values() if c} <= {"torch-cpu"}
    # the workspace grows with the batch: the same room holds less of the plan at a larger one
    assert workspace.budgeted_plan(choices, 64, held)[1] <= held
    assert workspace.budgeted_plan(choices, 64, 1 << 62)[1] > held


def test_a_plan_leaves_the_gradients_within_its_algorithms_tolerance(tmp_path, monkeypatch):
    """Winograd on conv1-conv5 leaves every gradient within the loosest of its passes'
    tolerances. AlexNet's max-pools average here, in both steps: a
    convolution that rounds differently flips a pool's argmax (one window of pool2's 86,528
    did, which alone took the gradients' error from 2e-6 to 3.5e-4), which no tolerance of
    the algorithms bounds."""
    import torch

    def average(self, x):
        return torch.nn.functional.avg_pool2d(x, self.kernel_size, self.stride, self.padding)

    monkeypatch.setattr(torch.nn.MaxPool2d, "forward", average)
    choices = synthetic_choices({"gemm": 1.0, "winograd-4x4": 0.5, "direct": 2.0})
    plan, _ = workspace.budgeted_plan(choices, memplan.CHECK_BATCH, 1 << 62)
    chosen = {c.algo for lp in plan.layers for c in lp.passes.values() if c}
    assert "winograd-4x4" in chosen  # conv3-5's 3x3 passes
    tolerance = workspace.plan_tolerance(plan, memplan.GRADIENT_TOLERANCE)
    assert tolerance > memplan.GRADIENT_TOLERANCE  # Winograd's looser rounding
    error = memplan.gradient_error(ALEXNET, "workspace", "cpu",
                                   plan_file=str(plan.save(tmp_path / "plan.json")))
    assert 0 < error <= tolerance


# --- a user's model -----------------------------------------------------------------------
USER_NET = '''
from torch import nn

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8),
                                      nn.ReLU(inplace=True), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(inplace=True))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

    def forward(self, x):
        return self.head(self.features(x))

def tiny():
    return Tiny()
'''


@pytest.fixture
def tiny_net(tmp_path, monkeypatch):
    (tmp_path / "memplan_user_net.py").write_text(USER_NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    return Workload.of_model("memplan_user_net:tiny", (3, 16, 16))


@pytest.mark.parametrize("strategy", ["checkpoint", "recompute-cheap"])
def test_recomputation_of_a_users_model_leaves_the_gradients_as_they_were(tiny_net, strategy):
    """Its top-level children checkpointed, or its cheap layers (in-place ReLUs made
    out-of-place); batch norm's statistics are the batch's either way."""
    assert memplan.gradient_error(tiny_net, strategy, "cpu") <= memplan.GRADIENT_TOLERANCE


def test_a_users_model_is_modelled_and_stepped_like_a_catalog_net(tiny_net):
    assert tiny_net.image_shape == (3, 16, 16) and Workload.parse(tiny_net.name) == tiny_net
    x, target = tiny_net.example_batch(4, "cpu")
    assert x.shape == (4, 3, 16, 16) and int(target.max()) < 10  # the model's 10 classes
    at = footprint.modelled_peak(tiny_net, {})
    assert 0 < at(1).total < at(8).total
    probe = memplan.probe_here(tiny_net.name, "recompute-cheap", 4, "cpu", 1 << 30, 0.0)
    assert probe.fits(1 << 30) and probe.peak > 0


def test_memplan_model_door_is_checked_where_it_is_given(tiny_net, capsys):
    for argv, says in ((["--model", "memplan_user_net:tiny"], "--model needs --input"),
                       (["--model", "memplan_user_net:tiny", "--input", "2,3,16,16",
                         "--net", "alexnet"], "--model and --net are sources"),
                       (["--input", "2,3,16,16"], "--input goes with --model"),
                       (["--model", "memplan_user_net:tiny", "--input", "2,5,16,16"],
                        "the model rejects input 2,5,16,16")):
        code, out, err = run_cli(capsys, "memplan", "--device", "cpu", *argv)
        assert code == 2 and err.count("\n") == 1 and says in err and out == ""


def test_a_workspace_plan_that_overshoots_falls_back_to_smaller_rooms_then_the_base_step(
        monkeypatch, tmp_path):
    """The budget is 1000: the base step peaks at 600, leaving 400; every plan's step overshoots
    but the one for no workspace at batch 2; at batch 3 none fits, so the base step runs."""
    choices = synthetic_choices({"gemm": 1.0, "torch-cpu": 3.0})
    tried = []

    def fake_probe(load, strategy, batch, device, budget, time_s=0.0, plan_file=None):
        tried.append((strategy, batch, plan_file is not None))
        if plan_file is None:
            return memplan.Probe(batch, 600, [1.0])
        planned_for_none = plan_file.endswith("-0.json")  # the plan for a room of 0 bytes
        return memplan.Probe(batch, 900 if planned_for_none and batch == 2 else 1100, [1.0])

    monkeypatch.setattr(memplan, "probe", fake_probe)
    run = memplan.prober(ALEXNET, "workspace", "cpu", 1000, choices, tmp_path, {})
    fits = run(2)
    assert fits.peak == 900 and "planned for 0 B" in fits.note
    assert [t for t in tried if t[2]] == [("workspace", 2, True)] * 3  # room, room/4, none
    base = run(3)
    assert base.peak == 600 and "no plan fits, the none step runs" in base.note
    assert tried.count(("none", 3, False)) == 1  # the base step's peak is read once


def test_the_workspace_strategys_limit_is_its_base_steps(monkeypatch, tmp_path):
    """Its plan fills the room, so its peak is near the budget at every batch; the limit is
    found on the base step's peaks (a + b·batch), and the strategy probed there."""
    choices = synthetic_choices({"gemm": 1.0, "torch-cpu": 3.0})

    def fake_probe(load, strategy, batch, device, budget, time_s=0.0, plan_file=None):
        return memplan.Probe(batch, 990 if plan_file else 100 + 10 * batch, [1.0])

    monkeypatch.setattr(memplan, "probe", fake_probe)
    run = memplan.prober(ALEXNET, "workspace", "cpu", 1000, choices, tmp_path, {})
    found = run.search(10, memplan.MAX_BATCH)
    assert found.batch == 90 and list(found.probes) == [90] and found.peak == 990
