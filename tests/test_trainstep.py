import argparse
import json
import tempfile
from pathlib import Path

import pytest
import torch

from convbench import models
from convbench.cli import trainstep as cli_trainstep
from convbench.layers import net_layers
from convbench.plan import Choice, Constraints, LayerPlan, Plan, current_env_key
from convbench.problem import PASSES
from convbench.studies import trainstep
from convbench.studies.workload import CLASSES, NETS, Workload


@pytest.mark.parametrize("net", NETS)
def test_the_model_has_the_catalogs_conv_layers(net):
    load = Workload.parse(net)
    model = load.build()
    x, target = load.example_batch(1, "cpu")
    sites, refused = models.find_convs(model, x)
    assert refused == []
    assert [(s.name, s.problem) for s in sites] == [
        (layer.name, layer.problem.with_batch(1)) for layer in net_layers(net)]
    assert model(x).shape == (1, CLASSES) and target.shape == (1,)


def catalog_plan(tmp_path, algos: dict) -> str:
    """A plan file for the AlexNet-shaped model at batch 1 choosing `algos` for every layer."""
    run = Workload.parse("alexnet").prepare(1, "cpu")
    sites, _ = models.find_convs(run.model, run.x)
    layers = [LayerPlan(s.name, s.problem, "nhwc" if i % 2 else "nchw",
                        {p: Choice(algos[p], "numpy", 1.0, 0.1) if p in s.passes else None
                         for p in PASSES})
              for i, s in enumerate(sites)]
    plan = Plan(env=current_env_key("numpy"), backend="numpy", precision="fp32",
                constraints=Constraints(), cudnn={"benchmark": False, "deterministic": False},
                input_layout="nchw", output_layout="nchw", layers=layers, network=None)
    return str(plan.save(tmp_path / "plan.json"))


def test_every_configuration_trains_the_same_model(tmp_path):
    plan_file = catalog_plan(tmp_path, {"fwd": "gemm", "bwd_data": "gemm",
                                        "bwd_filter": "torch-cpu"})
    alexnet = Workload.parse("alexnet")
    defaults = trainstep.ConfigTrainer("defaults", alexnet, 1, "cpu")
    planned = trainstep.ConfigTrainer("plan", alexnet, 1, "cpu", plan_file)
    assert planned.first_loss == pytest.approx(defaults.first_loss, rel=1e-5)
    assert defaults.applied == "" and "| conv4   | replaced | nhwc" in planned.applied
    assert torch.backends.cudnn.benchmark is False
    steps = planned.time(0.001)
    assert len(steps) >= 3 and all(t > 0 for t in steps)


@pytest.mark.slow
def test_configurations_take_turns_in_their_own_processes(tmp_path, monkeypatch):
    monkeypatch.setattr(trainstep, "ROUNDS", 2)
    plan_file = catalog_plan(tmp_path, {p: "torch-cpu" for p in PASSES})
    lines = []
    rows = trainstep.time_configs(Workload.parse("alexnet"), 1, "cpu", 0.03, plan_file,
                                  lines.append)
    assert [r["config"] for r in rows] == list(trainstep.CONFIGS)
    assert lines == [f"starting {c}" for c in trainstep.CONFIGS]
    losses = {r["first_loss"] for r in rows}
    assert max(losses) - min(losses) < 1e-4 * max(losses)
    for r in rows:
        assert r["reps"] == len(r["times_ms"]) >= 3 * trainstep.ROUNDS
        assert r["median_ms"] > 0
    assert rows[2]["applied"].startswith("| layer ") and rows[0]["applied"] == ""
    table = trainstep.table(rows, "numpy")
    assert "no effect on the CPU" in table and "1.00x" in table


def test_a_failing_worker_says_why(tmp_path):
    with tempfile.TemporaryFile(mode="w+") as log, pytest.raises(
            RuntimeError, match="train-step plan: worker exited with 1: FileNotFoundError"):
        trainstep.Worker(log, "plan", Workload.parse("alexnet"), 1, "cpu",
                         str(tmp_path / "missing.json"))


def test_train_step_command(tmp_path, capsys, monkeypatch):
    """The command end to end but for the timed processes (tested above)."""
    seen = {}

    def fake_times(load, batch, device, budget_s, plan_file, log=None):
        seen.update(net=load.name, batch=batch, budget_s=budget_s,
                    plan=json.loads(Path(plan_file).read_text()))
        return [{"config": c, "median_ms": 10.0 * (i + 1), "iqr_ms": 0.5, "reps": 9,
                 "noisy": False, "first_loss": 6.9, "times_ms": [10.0] * 9,
                 "applied": "| the plan |" if c == "plan" else ""}
                for i, c in enumerate(trainstep.CONFIGS)]

    monkeypatch.setattr(trainstep, "time_configs", fake_times)
    parser = argparse.ArgumentParser()
    cli_trainstep.add_parsers(parser.add_subparsers())
    out = tmp_path / "out"
    args = parser.parse_args(["train-step", "--device", "cpu", "--batch", "1", "--algos",
                              "torch-cpu", "--tune-budget", "0.001", "--budget", "0.5",
                              "--store", str(tmp_path / "store"), "--out", str(out)])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert text.startswith("# train-step: alexnet on ")
    assert "- batch 1, 3x227x227 images, fp32 (TF32 off)" in text
    assert "| defaults " in text and "0.50x" in text and "| the plan |" in text
    assert seen["batch"] == 1 and seen["budget_s"] == 0.5
    assert [layer["layer"] for layer in seen["plan"]["layers"]] == [
        "conv1", "conv2", "conv3", "conv4", "conv5"]
    assert sorted(p.name for p in out.iterdir()) == [
        "env.json", "plan.json", "report.md", "trainstep.csv", "trainstep.json"]
    assert json.loads((out / "trainstep.json").read_text())["rows"][2]["config"] == "plan"
    assert Plan.load(out / "plan.json").layers[0].passes["bwd_data"] is None


@pytest.mark.gpu
def test_train_step_on_a_gpu(tmp_path):
    rows, plan, _ = trainstep.compare(Workload.parse("alexnet"), 16, "cuda", budget_s=0.5, tune_budget_s=0.01,
                                      algos="direct,cudnn,cudnn-autotune", store=tmp_path)
    assert plan.backend == "cuda"
    losses = [r["first_loss"] for r in rows]
    assert max(losses) - min(losses) < 1e-3 * max(losses)
