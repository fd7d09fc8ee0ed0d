import json
from itertools import pairwise

import pandas as pd
import pytest
from test_cli import run_cli

from convbench.algos import registry
from convbench.catalogs.layers import Layer, net_layers
from convbench.core import results
from convbench.core.measurement import Measurement
from convbench.measure import opcount, runner, verify
from convbench.planning.plan import Choice, Constraints, LayerPlan, Plan, current_env_key
from convbench.studies import footprint, memprofile
from convbench.studies.workload import Workload

MiB = 1 << 20
ALEXNET = Workload.parse("alexnet")
CONVS = net_layers("alexnet")


def parameter_bytes() -> int:
    """The model's parameters from the catalog alone: each conv's K·C·R·S weights and K biases,
    then fc6-fc8 on the 256×6×6 features pool5 leaves."""
    convs = sum(p.k * p.c * p.r * p.s + p.k for p in (layer.problem for layer in CONVS))
    fcs = (256 * 6 * 6 + 1) * 4096 + (4096 + 1) * 4096 + (4096 + 1) * 1000
    return 4 * (convs + fcs)


def saved_activation_bytes(n: int) -> int:
    """What autograd keeps for backward at the end of the forward pass, counted by hand: each
    ReLU's output (also the next conv's or fc's input), each max-pool's int64 indices and its
    output (the next layer's input), log-softmax's output and nll's 0-d total weight. The
    images, labels and weights are counted as input and weights instead."""
    relus = sum(p.k * p.p * p.q for p in (layer.problem for layer in CONVS)) + 2 * 4096
    pooled = [(96, 27), (256, 13), (256, 6)]  # after conv1, conv2, conv5
    pools = sum(k * side * side * (8 + 4) for k, side in pooled)
    return n * (4 * relus + pools + 4 * 1000) + 4


def by_name(events, phase, layer):
    return next(e for e in events if (e.phase, e.layer) == (phase, layer))


@pytest.mark.parametrize("n", [1, 3])
def test_timeline_sums_match_sizes_counted_independently(n):
    events = footprint.profile_step(ALEXNET, n, "meta")
    first = CONVS[0].problem
    for e in events:
        assert e.weights == parameter_bytes() and e.optimizer == parameter_bytes()
        assert e.input == n * (4 * first.c * first.h * first.w + 8)
        assert e.workspace == 0 and e.allocated is None
    loss = by_name(events, "loss", "cross-entropy")
    assert loss.activations == saved_activation_bytes(n) and loss.gradients == 0
    assert events[-1].gradients == parameter_bytes() and events[-1].activations == 0
    acts = [e.activations for e in events]
    top = acts.index(max(acts))
    assert all(a <= b for a, b in pairwise(acts[:top + 1]))  # kept through forward
    assert all(a >= b for a, b in pairwise(acts[top:]))  # released in backward
    grads = [e.gradients for e in events]
    assert grads == sorted(grads)


def test_measured_cpu_step_agrees_with_the_model():
    """The real step at batch 1, read by torch's CPU allocator at every event: the model (the
    same step on `meta`) matches what was allocated, within what hooks do not see (oneDNN's
    weight reorders, autograd's transient gradient buffers)."""
    events = footprint.profile_step(ALEXNET, 1, "cpu", measure=True)
    meta = footprint.profile_step(ALEXNET, 1, "meta")
    assert [(e.phase, e.layer, e.total) for e in events] == \
        [(e.phase, e.layer, e.total) for e in meta]
    for e in events:
        assert abs(e.allocated - e.total) <= 2 * MiB, (e.phase, e.layer)
        assert e.peak >= e.allocated - 1
    text = memprofile.timeline_table(events)
    assert "allocated (measured)" in text and " *" in text


def test_largest_batch_searches_a_growing_peak():
    def peak_at(n):
        return footprint.Event("bwd", "conv5", 100, 0, 7 * n, 0, 0, 0, 0)

    assert footprint.largest_modelled_batch(peak_at, 100 + 7 * 1000)[0] == 1000
    assert footprint.largest_modelled_batch(peak_at, 100 + 7 * 1000 - 1)[0] == 999
    assert footprint.largest_modelled_batch(peak_at, 99) == (0, None)
    assert footprint.largest_modelled_batch(peak_at, 10**15)[0] == footprint.MAX_BATCH


def plan(choices: dict[str, str], layout: str = "nchw") -> Plan:
    """A numpy plan running `choices[layer]` for every pass of those layers, torch elsewhere."""
    layers = []
    for layer in CONVS:
        algo = choices.get(layer.name, "torch-cpu")
        passes = {p: Choice(algo, "numpy", 1.0, 0.1) for p in ("fwd", "bwd_data", "bwd_filter")}
        layers.append(LayerPlan(layer.name, layer.problem, layout, passes))
    return Plan(env=current_env_key("numpy"), backend="numpy", precision="fp32",
                constraints=Constraints(), cudnn={"benchmark": False, "deterministic": False},
                input_layout="nchw",
                output_layout="nchw", layers=layers, network=None, unplanned=[],
                measurements=[], conversions=[])


def test_plan_workspaces_enter_the_peak_and_shrink_the_largest_batch():
    algos = footprint.plan_algos(plan({"conv2": "fft", "conv3": "gemm"}))
    assert set(algos) == {(c, p) for c in ("conv2", "conv3")
                          for p in ("fwd", "bwd_data", "bwd_filter")}
    ws = footprint.declared_workspace(ALEXNET, algos)
    conv2 = CONVS[1].problem.with_batch(16)
    assert ws("conv2", "fwd", 16) == opcount.workspace_bytes(
        registry.get("fft", "numpy"), conv2, "fwd", "nchw", "fp32")
    assert ws("conv1", "fwd", 16) == 0
    events = footprint.profile_step(ALEXNET, 16, "meta", workspace=ws, held=False)
    assert by_name(events, "fwd", "conv2").workspace == ws("conv2", "fwd", 16)
    bwd = by_name(events, "bwd", "conv3").workspace
    assert bwd == max(ws("conv3", "bwd_data", 16), ws("conv3", "bwd_filter", 16))
    held = footprint.profile_step(ALEXNET, 16, "meta", workspace=ws, held=True)
    every = sum(ws(*lp, 16) for lp in ALEXNET.conv_passes())
    assert {e.workspace for e in held} == {every}  # all prepared passes stay allocated
    budget = 2 << 30
    found = {f.config: f.found for f in memprofile.fits(
        ALEXNET, {"defaults": ({}, ""), "planned": (algos, "")}, budget)}
    assert found["defaults"]["held"] == found["defaults"]["per-pass"]
    planned = found["planned"]
    assert 0 < planned["held"][0] < planned["per-pass"][0] < found["defaults"]["held"][0]
    for config, by_mode in found.items():
        for mode, (batch, event) in by_mode.items():
            assert event.total <= budget
            over = footprint.modelled_peak(ALEXNET, algos if config == "planned" else {},
                                            mode == "held")(batch + 1)
            assert over.total > budget


def test_applied_plan_is_measured_with_its_workspaces_held():
    """With a plan applied, conv2's passes run convbench's gemm on NumPy: tracemalloc sees the
    column buffers functional.run keeps for each of the three passes, all through the step."""
    p = plan({"conv2": "gemm"})
    ws = footprint.declared_workspace(ALEXNET, footprint.plan_algos(p))
    events = footprint.profile_step(ALEXNET, 1, "cpu", workspace=ws, plan=p, measure=True)
    # im2col's padded input for fwd and bwd_filter; bwd_data's col2im writes into dx itself
    columns = sum(ws("conv2", pass_, 1) for pass_ in ("fwd", "bwd_data", "bwd_filter"))
    assert columns < 3 * ws("conv2", "fwd", 1)
    for e in events:
        assert e.workspace == columns
        # gemm's bwd_filter also holds a filter-sized buffer it does not declare
        assert -MiB <= e.allocated - e.total <= 4 * CONVS[1].problem.k * 96 * 25 + 2 * MiB


def synthetic_run(folder) -> None:
    """A bench run of alexnet at batch 1 where fft is fastest wherever it runs, gemm next,
    torch-cpu slowest; fft's workspace is far larger than gemm's."""
    sink = results.CsvSink(folder / results.RESULTS_CSV)
    chk = verify.Check(True, 1e-7, 1e-6, 1e-5)
    layers = [Layer("alexnet", layer.name, layer.problem.with_batch(1)) for layer in CONVS]
    for case in runner.sweep(layers, ["fft", "gemm", "torch-cpu"], "numpy",
                             ["fwd", "bwd_data", "bwd_filter"], ["nchw"], ["fp32"]):
        impl = registry.get(case.algo, "numpy")
        args = (case.problem, case.pass_, case.layout, case.precision)
        if registry.supports(impl, *args):
            sink.append(runner.row(case, "unsupported", "stride"))
            continue
        t = {"fft": 1.0, "gemm": 2.0, "torch-cpu": 3.0}[case.algo]
        sink.append(runner.row(case, "ok", check=chk, m=Measurement((t, t, t)),
                               workspace=opcount.workspace_bytes(impl, *args)))


def test_memprofile_command_with_the_advisors_plans(tmp_path, capsys):
    run = tmp_path / "run"
    synthetic_run(run)
    out = tmp_path / "profile"
    code, printed, _ = run_cli(capsys, "memprofile", "--batch", "1", "--budget", "3GiB",
                               "--run", str(run), "--workspace-budget", "64MiB", "--out",
                               str(out), "--format", "json")
    assert code == 0
    data = json.loads(printed)
    assert data["timeline"][0]["phase"] == "fwd" and data["timeline"][0]["allocated"] > 0
    text = (out / "report.md").read_text()
    assert "| defaults" in text and "| fastest" in text and "| budgeted" in text
    assert "Modelled peak" in text and "allocated (measured)" in text
    rows = {(r["configuration"], r["workspace"]): r for r in data["largest_batch"]}
    assert len(rows) == 6 and all(r["peak_bytes"] <= 3 << 30 for r in rows.values())
    assert rows == {(r["configuration"], r["workspace"]): r for r in pd.read_csv(
        out / "largest_batch.csv").to_dict("records")}
    defaults = rows["defaults", "held"]["largest_batch"]
    for config in ("fastest", "budgeted"):
        assert rows[config, "held"]["largest_batch"] <= rows[config, "per-pass"]["largest_batch"]
        assert rows[config, "per-pass"]["largest_batch"] < defaults
    # at batch 1 fft's filter spectra break 64 MiB, so the budgeted plan has none
    assert "fft" in rows["fastest", "held"]["algorithms"]
    budgeted = rows["budgeted", "held"]["algorithms"]
    assert "fft" not in budgeted and budgeted.endswith("(workspace <= 64 MiB)")
    assert {p.name for p in out.iterdir()} >= {"report.md", "memprofile.csv", "env.json",
                                              "largest_batch.csv"}


def test_the_workloads_model_is_the_catalogs():
    model = ALEXNET.build()
    assert sum(p.numel() * 4 for p in model.parameters()) == parameter_bytes()


@pytest.mark.gpu
def test_cuda_timeline_is_read_from_torchs_allocator():
    events = footprint.profile_step(ALEXNET, 8, "cuda", measure=True)
    meta = footprint.profile_step(ALEXNET, 8, "meta")
    for e, m in zip(events, meta):
        assert e.total == m.total
        # cuDNN's workspaces come and go between events: seen in the peaks, not the model;
        # cuBLAS's workspace, from torch's allocator, stays from the first step on.
        assert -16 * MiB <= e.allocated - e.total <= 64 * MiB and e.peak >= e.allocated
