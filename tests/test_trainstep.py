import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from convbench.catalogs.layers import net_layers
from convbench.cli import trainstep as cli_trainstep
from convbench.core.problem import PASSES
from convbench.planning import models
from convbench.planning.plan import Choice, Constraints, LayerPlan, Plan, current_env_key
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
    steps, faults = planned.time(0.001)
    assert len(steps) >= 3 and all(t > 0 for t in steps)
    assert len(faults) >= len(steps) and min(faults) >= 0


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
    # glibc's malloc held to one rule in every worker (workload.MALLOC_ENV): left alone, fc6's
    # and fc7's weight gradients were mapped afresh each step in defaults' process (53,250
    # page faults a step), fc6's alone in the plan's after its float64 check (36,865)
    assert max(r["faults_per_step"] for r in rows) < 1000
    assert rows[2]["applied"].startswith("| layer ") and rows[0]["applied"] == ""
    table = trainstep.table(rows, "numpy")
    assert "no effect on the CPU" in table and "1.00x" in table


def test_a_speed_up_within_noise_is_a_tie_and_a_real_one_is_faster():
    """The control (the same step, noise of a few percent) ties with defaults; a plan 20%
    faster wins; one 20% slower loses; each with its interval in the table."""
    rng = np.random.default_rng(0)
    steps = {"defaults": 240.0, "cudnn.benchmark": 240.0, "plan": 200.0}
    rows = [{"config": c, "median_ms": ms, "iqr_ms": 5.0, "reps": 24, "noisy": False,
             "first_loss": 6.9, "applied": "",
             "times_ms": list(ms * (1 + 0.03 * rng.standard_normal(24)))}
            for c, ms in steps.items()]
    rows = trainstep.with_speedups(rows)
    assert [r["verdict"] for r in rows] == ["baseline", "tie within noise", "faster"]
    assert rows[1]["speedup_low"] < 1 < rows[1]["speedup_high"]
    assert 1.1 < rows[2]["speedup_low"] < rows[2]["speedup"] < rows[2]["speedup_high"] < 1.3
    rows[2]["times_ms"] = [t * 1.44 for t in rows[2]["times_ms"]]  # 288 ms: 20% slower
    assert trainstep.with_speedups(rows)[2]["verdict"] == "slower"
    text = trainstep.table(rows, "numpy")
    assert "| verdict " in text and "| tie within noise |" in text and "| faster " in text


def _steps(ms: float, rng) -> list[float]:
    return list(ms * (1 + 0.03 * rng.standard_normal(30)))


def test_the_first_loss_column_is_named_for_what_it_shows():
    """#70: the column headed `first step` showed each configuration's first loss (the check
    that every configuration computes the same thing), not its first step's time."""
    rows = trainstep.with_speedups([
        {"config": c, "median_ms": 10.0, "iqr_ms": 0.5, "reps": 9, "noisy": False,
         "first_loss": 6.9, "applied": "", "times_ms": [10.0] * 9}
        for c in ("defaults", "plan")])
    header, _, first = trainstep.table(rows, "numpy").splitlines()[:3]
    cells = [c.strip() for c in header.split("|")]
    assert "first loss" in cells and "first step" not in cells
    assert [c.strip() for c in first.split("|")][cells.index("first loss")] == "6.9"


def test_the_step_plot_keeps_its_labels_clear_and_within_the_figure(monkeypatch, tmp_path):
    """#70: trainstep.png cut its title at the top and wrote each median over its whisker,
    past the frame: every text lies within the figure, each median past its whisker's end."""
    plt = pytest.importorskip("matplotlib.pyplot")
    from convbench.core import fmt

    figures = []
    monkeypatch.setattr(fmt, "save_figure", lambda fig, path, legend=True: figures.append(fig))
    rows = [{"config": "eager", "median_ms": 77.75, "times_ms": [76.9, 77.75, 78.6]},
            {"config": "plan", "median_ms": 93.38, "times_ms": [82.0, 93.38, 99.5]}]
    trainstep.plot(rows, tmp_path / "unused.png",
                   "torchvision.models:resnet50@3,224,224, batch 64, train")
    (fig,) = figures
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    lo, hi = ax.get_xlim()
    drawn = [t for x, t in zip(ax.get_xticks(), ax.get_xticklabels()) if lo <= x <= hi]
    texts = [ax.title, ax.xaxis.label, *ax.get_yticklabels(), *drawn, *ax.texts]
    for t in (t for t in texts if t.get_text()):
        box = t.get_window_extent(renderer)
        assert fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1), \
            t.get_text()
    medians = sorted(ax.texts, key=lambda t: t.get_window_extent(renderer).y0, reverse=True)
    for t, r, i in zip(medians, rows, range(len(rows))):
        whisker_end = ax.transData.transform((max(r["times_ms"]), i))[0]
        assert t.get_window_extent(renderer).x0 > whisker_end, t.get_text()
    plt.close(fig)


def test_on_the_cpu_the_plan_must_also_beat_the_control():
    """Where the control (a configuration that changes nothing) is itself apart from defaults
    beyond the steps' noise, that distance is the processes' noise: a plan as far as the
    control ties; one beyond both wins."""
    rng = np.random.default_rng(1)
    def rows(plan_ms):
        return [{"config": c, "times_ms": _steps(ms, rng)} for c, ms in
                (("defaults", 240.0), ("cudnn.benchmark", 230.0), ("plan", plan_ms))]
    near = trainstep.with_speedups(rows(228.0), control="cudnn.benchmark")
    assert [r["verdict"] for r in near] == [
        "baseline", f"control: the processes differ by {near[1]['speedup'] - 1:.0%}",
        "tie within noise of the control"]
    assert near[1]["speedup_low"] > 1
    assert near[2]["speedup_low"] > 1  # beyond the steps' noise, not beyond the control's
    far = trainstep.with_speedups(rows(200.0), control="cudnn.benchmark")
    assert far[2]["verdict"] == "faster"
    assert trainstep.with_speedups(rows(228.0))[2]["verdict"] == "faster"  # no control (GPU)
    same = trainstep.with_speedups([{"config": c, "times_ms": _steps(240.0, rng)}
                                    for c in trainstep.CONFIGS], control="cudnn.benchmark")
    assert same[1]["verdict"] == "control: tie within noise"


def test_a_configuration_that_cannot_start_says_why(tmp_path):
    """Its worker answers why (the others still run: `time_configs` makes it a row)."""
    with tempfile.TemporaryFile(mode="w+") as log, trainstep.Worker(
            log, "plan", Workload.parse("alexnet"), 1, "cpu",
            str(tmp_path / "missing.json")) as w:
        assert w.ready["failed"].startswith("FileNotFoundError")


def test_train_step_command(tmp_path, capsys, monkeypatch):
    """The command end to end but for the timed processes (tested above)."""
    seen = {}

    def fake_times(load, batch, device, budget_s, plan_file, log=None, mode="train",
                   configs=None):
        seen.update(net=load.name, batch=batch, budget_s=budget_s, configs=configs,
                    plan=json.loads(Path(plan_file).read_text()))
        return trainstep.with_speedups([
            {"config": c, "median_ms": 10.0 * (i + 1), "iqr_ms": 0.5, "reps": 9,
             "noisy": False, "first_loss": 6.9, "times_ms": [10.0 * (i + 1)] * 9,
             "applied": "| the plan |" if c == "plan" else ""}
            for i, c in enumerate(configs)])

    monkeypatch.setattr(trainstep, "time_configs", fake_times)
    real_tuned = trainstep._tuned

    def tuned(command, *args):
        seen["tune_job"] = json.loads(command[-1])
        return real_tuned(command, *args)

    monkeypatch.setattr(trainstep, "_tuned", tuned)
    parser = argparse.ArgumentParser()
    cli_trainstep.add_parsers(parser.add_subparsers())
    out = tmp_path / "out"
    args = parser.parse_args(["train-step", "--device", "cpu", "--batch", "1", "--algos",
                              "torch-cpu", "--tune-budget", "0.001", "--budget", "0.5",
                              "--step-budget", "0.2",
                              "--store", str(tmp_path / "store"), "--out", str(out),
                              "--configs", "plan,cudnn.benchmark"])
    assert args.func(args) == 0
    assert seen["configs"] == trainstep.CONFIGS
    text = capsys.readouterr().out
    assert text.startswith("# train-step: alexnet on ")
    assert "- batch 1, 3x227x227 images, fp32 (TF32 off)" in text
    assert "| defaults " in text and "| 0.50x [0.50, 0.50] | slower " in text
    assert "| the plan |" in text
    assert seen["batch"] == 1 and seen["budget_s"] == 0.5
    assert seen["tune_job"]["step_budget_s"] == 0.2  # tuning's whole-step comparisons
    assert [layer["layer"] for layer in seen["plan"]["layers"]] == [
        "conv1", "conv2", "conv3", "conv4", "conv5"]
    assert sorted(p.name for p in out.iterdir()) == [
        "env.json", "plan.json", "report.md", "trainstep.csv", "trainstep.json",
        "trainstep.png"]
    assert "![ms per train step, each configuration](trainstep.png)" in text
    assert json.loads((out / "trainstep.json").read_text())["rows"][2]["config"] == "plan"
    assert Plan.load(out / "plan.json").layers[0].passes["bwd_data"] is None


@pytest.mark.parametrize("argv, message", [
    (["--model", "torch.nn:Identity"], "--model and --input go together"),
    (["--net", "alexnet", "--model", "torch.nn:Identity", "--input", "1,3,8,8"],
     "--net and --model name two models"),
    (["--model", "nowhere:net", "--input", "1,3,8,8"], "nowhere"),
    (["--model", "torch.nn:Identity", "--input", "2,3,8,8", "--batch", "4"],
     "--batch 4 and --input's N 2 disagree"),
    (["--configs", "compile"], "configuration 'compile'"),
    (["--configs", ","], "no configuration given"),
])
def test_a_model_form_that_cannot_run_is_one_line(capsys, argv, message):
    from test_cli import run_cli

    code, out, err = run_cli(capsys, "train-step", "--device", "cpu", *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err


def test_the_tuning_process_runs_strict_fp32_like_the_timed_ones(monkeypatch, tmp_path):
    """The plan is confirmed in the tuning process: TF32 must be off there as in the timed
    processes, or an fp32 plan is weighed against TF32 convolutions (on a GPU)."""
    from convbench.planning import tune

    calls = []

    def fake_tune(model, x, **kw):
        calls.append("tune")
        raise tune.TuneInterrupted(3, 5, tmp_path / "p.json", confirming=True)

    monkeypatch.setattr(trainstep, "strict_fp32", lambda: calls.append("strict_fp32"))
    monkeypatch.setattr(tune, "tune", fake_tune)
    with pytest.raises(SystemExit) as stop:
        trainstep.tune_here("alexnet", 1, "cpu", str(tmp_path / "plan.json"), 0.001,
                            "torch-cpu", None)
    assert stop.value.code == 130 and calls == ["strict_fp32", "tune"]


def test_ctrl_c_in_train_step_is_one_line(monkeypatch, capsys):
    """Interrupted (a GPU visit's time limit sends SIGINT): one line, exit 130, no traceback."""
    from test_cli import run_cli

    def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainstep, "compare", interrupted)
    code, out, err = run_cli(capsys, "train-step", "--device", "cpu")
    assert code == 130 and out == "" and err.count("\n") == 1 and "train-step interrupted" in err


def test_configs_choose_what_is_timed_and_the_baseline_always_runs():
    """--configs is read in the workload's order, and its baseline is timed even when left
    out: every speed-up is read against it; on the CPU the control too, as a win is read
    against it (identical ResNet-18 steps in two processes read 1.13x and 1.27x apart)."""
    net, model = Workload.parse("alexnet"), Workload.of_model("torch.nn:Identity", (3, 8, 8))
    assert cli_trainstep._configs("plan,cudnn.benchmark", net) == (
        "defaults", "cudnn.benchmark", "plan")
    assert cli_trainstep._configs("plan,channels_last", model) == (
        "eager", "cudnn.benchmark", "channels_last", "plan")
    assert cli_trainstep._configs("plan,channels_last", model, "cuda") == (
        "eager", "channels_last", "plan")
    assert cli_trainstep._configs("plan", net) == ("defaults", "cudnn.benchmark", "plan")
    assert cli_trainstep._configs("all", model) == trainstep.MODEL_CONFIGS
    assert cli_trainstep._configs(None, net) is None


def test_a_users_model_has_five_configurations_a_catalog_net_three():
    """A user's model: eager, the control, channels_last, torch.compile and the plan; a
    catalog net keeps its three."""
    load = Workload.of_model("torch.nn:Identity", (3, 8, 8))
    assert trainstep.configs_of(load) == ("eager", "cudnn.benchmark", "channels_last",
                                          "compile", "plan")
    assert trainstep.configs_of(Workload.parse("alexnet")) == trainstep.CONFIGS


def test_a_model_that_cannot_be_made_on_meta_still_says_its_classes(tmp_path, monkeypatch):
    """RegNet copies data while it is built, which `meta` cannot: its output width is read from
    a real model in eval mode."""
    (tmp_path / "copying.py").write_text(
        "import torch\n\n\ndef net():\n"
        "    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),\n"
        "                            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),\n"
        "                            torch.nn.Linear(4, 7))\n"
        "    m[0].weight.data.copy_(torch.ones_like(m[0].weight))\n    return m\n")
    monkeypatch.chdir(tmp_path)
    assert Workload.of_model("copying:net", (3, 8, 8)).classes == 7


@pytest.mark.gpu
def test_train_step_on_a_gpu(tmp_path):
    rows, plan, _ = trainstep.compare(Workload.parse("alexnet"), 16, "cuda", budget_s=0.5, tune_budget_s=0.01,
                                      algos="direct,cudnn,cudnn-autotune", store=tmp_path)
    assert plan.backend == "cuda"
    losses = [r["first_loss"] for r in rows]
    assert max(losses) - min(losses) < 1e-3 * max(losses)
