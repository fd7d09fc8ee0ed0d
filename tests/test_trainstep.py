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
    eager = trainstep.ConfigTrainer("eager", alexnet, 1, "cpu")
    planned = trainstep.ConfigTrainer("plan", alexnet, 1, "cpu", plan_file)
    assert planned.first_loss == pytest.approx(eager.first_loss, rel=1e-5)
    assert eager.applied == "" and "| conv4   | replaced | nhwc" in planned.applied
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
    steps = {"eager": 240.0, "cudnn.benchmark": 240.0, "plan": 200.0}
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
        for c in ("eager", "plan")])
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
                (("eager", 240.0), ("cudnn.benchmark", 230.0), ("plan", plan_ms))]
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

    def fake_times(load, batch, device, budget_s, plan_file, configs, **kw):
        seen.update(net=load.name, batch=batch, budget_s=budget_s, configs=configs,
                    plan=json.loads(Path(plan_file).read_text()), plan_file=plan_file)
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
    assert "| eager " in text and "| 0.50x [0.50, 0.50] | slower " in text
    assert "| the plan |" in text
    assert seen["batch"] == 1 and seen["budget_s"] == 0.5
    assert seen["tune_job"]["step_budget_s"] == 0.2  # tuning's whole-step comparisons
    assert [layer["layer"] for layer in seen["plan"]["layers"]] == [
        "conv1", "conv2", "conv3", "conv4", "conv5"]
    assert seen["plan_file"] == str(out / "plan.json")  # there as soon as it is tuned
    assert sorted(p.name for p in out.iterdir()) == [
        "configs.jsonl", "env.json", "plan.json", "report.md", "trainstep.csv",
        "trainstep.json", "trainstep.png"]
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
    (["--configs", "bogus"], "unknown configuration 'bogus'"),
    (["--configs", "legacy-find"], "'legacy-find' sets only what cuDNN reads"),
    (["--configs", "cudnn.benchmark_limit=0"], "only what cuDNN reads: on the CPU"),
    (["--precision", "tf32"], "precision tf32 is a GPU's"),
    (["--plan", "nowhere.json"], "cannot read the plan nowhere.json"),
    (["--plan", "nowhere.json", "--configs", "channels_last"],
     "is timed as the configuration 'plan'"),
    (["--configs", ","], "no configuration given"),
])
def test_a_model_form_that_cannot_run_is_one_line(capsys, argv, message):
    from test_cli import run_cli

    code, out, err = run_cli(capsys, "train-step", "--device", "cpu", *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err


@pytest.mark.parametrize("precision, tf32, autocast", [
    ("fp32", False, None), ("tf32", True, None), ("bf16", False, torch.bfloat16)])
def test_the_tuning_process_runs_in_the_timed_ones_precision(monkeypatch, tmp_path, precision,
                                                           tf32, autocast):
    """The plan is measured and confirmed in the tuning process: in the run's precision, set as
    in the timed processes (TF32 off but for tf32, bf16 under autocast), or `apply` refuses it
    there (or, were it not checked, an fp32 plan would be weighed against TF32 steps)."""
    from convbench.planning import tune

    calls = []

    def fake_tune(model, x, **kw):
        calls.append(("tune", torch.is_autocast_enabled("cpu") and
                      torch.get_autocast_dtype("cpu")))
        raise tune.TuneInterrupted(3, 5, tmp_path / "p.json", confirming=True)

    monkeypatch.setattr(trainstep, "set_tf32", lambda on: calls.append(("tf32", on)))
    monkeypatch.setattr(tune, "tune", fake_tune)
    with pytest.raises(SystemExit) as stop:
        trainstep.tune_here("alexnet", 1, "cpu", str(tmp_path / "plan.json"), 0.001,
                            "torch-cpu", None, precision=precision)
    assert stop.value.code == 130
    assert calls == [("tf32", tf32), ("tune", autocast or False)]


def test_ctrl_c_in_train_step_is_one_line(monkeypatch, capsys):
    """Interrupted (a GPU visit's time limit sends SIGINT): one line, exit 130, no traceback."""
    from test_cli import run_cli

    def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainstep, "compare", interrupted)
    code, out, err = run_cli(capsys, "train-step", "--device", "cpu")
    assert code == 130 and out == "" and err.count("\n") == 1 and "train-step interrupted" in err


def test_configs_choose_what_is_timed_and_the_baseline_always_runs():
    """--configs is read in the configurations' order, and its baseline is timed even when left
    out: every speed-up is read against it; on the CPU the control too, as a win is read
    against it (identical ResNet-18 steps in two processes read 1.13x and 1.27x apart)."""
    net, model = Workload.parse("alexnet"), Workload.of_model("torch.nn:Identity", (3, 8, 8))
    assert cli_trainstep._configs("plan,cudnn.benchmark", net) == (
        "eager", "cudnn.benchmark", "plan")
    assert cli_trainstep._configs("plan,channels_last", model) == (
        "eager", "cudnn.benchmark", "channels_last", "plan")
    assert cli_trainstep._configs("plan,channels_last", model, "cuda") == (
        "eager", "channels_last", "plan")
    assert cli_trainstep._configs("plan", net) == ("eager", "cudnn.benchmark", "plan")
    assert cli_trainstep._configs("all", model) == trainstep.MODEL_CONFIGS
    assert cli_trainstep._configs("all", net) == trainstep.MODEL_CONFIGS  # all a CPU runs
    assert cli_trainstep._configs("all", net, "cuda") == tuple(trainstep.CONFIGURATIONS)
    # any configuration for any workload: the GPU visit times AlexNet in legacy-find
    assert cli_trainstep._configs("legacy-find,channels_last", net, "cuda") == (
        "eager", "legacy-find", "channels_last")
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


# --- configurations that set a process's flags and environment ------------------------------
TINY = """import torch

seen = []  # the autocast dtype each forward ran under (None: none)


class Net(torch.nn.Sequential):
    def forward(self, x):
        on = torch.is_autocast_enabled(x.device.type)
        seen.append(torch.get_autocast_dtype(x.device.type) if on else None)
        return super().forward(x)


def net():
    return Net(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
               torch.nn.Flatten(), torch.nn.Linear(4, 5))
"""


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A user's model of one small conv layer, importable here and in worker processes (from
    the current folder, as `--model mynet:net` is), and the tiny module to read what it saw."""
    (tmp_path / "tiny_trainstep_net.py").write_text(TINY)
    monkeypatch.chdir(tmp_path)
    load = Workload.of_model("tiny_trainstep_net:net", (3, 8, 8))
    load.build()  # imports it (`models.load`)
    import sys

    yield load, sys.modules["tiny_trainstep_net"]
    sys.modules.pop("tiny_trainstep_net", None)


@pytest.fixture
def torch_flags():
    """torch's process-wide flags a ConfigTrainer sets, restored after the test."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    conv = getattr(cudnn, "conv", None)
    tf32 = ((conv.fp32_precision, matmul.fp32_precision) if conv is not None else
            (cudnn.allow_tf32, matmul.allow_tf32))
    saved = (cudnn.benchmark, cudnn.benchmark_limit)
    yield
    cudnn.benchmark, cudnn.benchmark_limit = saved
    if conv is not None:
        conv.fp32_precision, matmul.fp32_precision = tf32
    else:
        cudnn.allow_tf32, matmul.allow_tf32 = tf32


def test_each_configuration_sets_its_flags_and_says_what_it_ran_with(tiny, torch_flags):
    """What a configuration and a precision set is read back from torch (`settings`), and the
    step runs under bf16 autocast only at precision bf16."""
    from convbench.algos.cudnn import conv_runs_tf32

    load, module = tiny
    load.classes  # noqa: B018 - runs the model once (on meta), before what is watched here
    module.seen.clear()
    limit0 = trainstep.ConfigTrainer("cudnn.benchmark_limit=0", load, 2, "cpu")
    assert torch.backends.cudnn.benchmark and torch.backends.cudnn.benchmark_limit == 0
    assert limit0.settings == "cudnn.benchmark=True cudnn.benchmark_limit=0 tf32=off"
    assert module.seen == [None] and not conv_runs_tf32()
    tf32 = trainstep.ConfigTrainer("eager", load, 2, "cpu", precision="tf32")
    assert tf32.settings == "cudnn.benchmark=False tf32=on" and conv_runs_tf32()
    module.seen.clear()
    bf16 = trainstep.ConfigTrainer("channels_last", load, 2, "cpu", precision="bf16")
    assert module.seen == [torch.bfloat16] and not conv_runs_tf32()
    assert bf16.run.x.is_contiguous(memory_format=torch.channels_last)
    assert bf16.first_loss != pytest.approx(tf32.first_loss, rel=1e-6)  # bf16 rounds
    bf16.time(0.001)
    assert set(module.seen) == {torch.bfloat16}


def test_a_configuration_s_variables_are_its_own(monkeypatch):
    """legacy-find's process gets TORCH_CUDNN_V8_API_DISABLED=1; one the shell exported is
    left out of the other configurations' processes, else every row would time the legacy
    find."""
    name = "TORCH_CUDNN_V8_API_DISABLED"
    monkeypatch.delenv(name, raising=False)
    assert trainstep.config_environment("legacy-find", "cuda")[name] == "1"
    assert name not in trainstep.config_environment("cudnn.benchmark", "cuda")
    monkeypatch.setenv(name, "1")
    assert name not in trainstep.config_environment("eager", "cuda")
    assert trainstep.CONFIG_ENV == (name,)


def test_a_worker_process_runs_with_its_configuration_s_environment(tiny):
    """End to end in a real worker (legacy-find runs on the CPU here, below the check that
    refuses it there): its settings, read back inside the process, show the variable and
    cudnn.benchmark, and the precision reaches it."""
    load, _ = tiny
    with tempfile.TemporaryFile(mode="w+") as log, trainstep.Worker(
            log, "legacy-find", load, 2, "cpu", precision="bf16") as w:
        limit = 10 if torch.backends.cudnn.is_available() else None  # a CPU torch: no cuDNN
        assert w.ready["settings"] == (f"cudnn.benchmark=True cudnn.benchmark_limit={limit} "
                                       "tf32=off TORCH_CUDNN_V8_API_DISABLED=1"), w.ready
        assert len(w.time(0.001)["times_ms"]) >= 3
        bf16_loss = w.ready["first_loss"]
    with tempfile.TemporaryFile(mode="w+") as log, trainstep.Worker(
            log, "eager", load, 2, "cpu") as w:
        assert w.ready["settings"] == "cudnn.benchmark=False tf32=off"
        assert w.ready["first_loss"] != pytest.approx(bf16_loss, rel=1e-6)  # fp32 there


def saved_plan(tmp_path, backend="numpy", precision="fp32") -> str:
    """A plan file of no layers for `backend` and `precision`."""
    plan = Plan(env=current_env_key(backend), backend=backend, precision=precision,
                constraints=Constraints(), cudnn={"benchmark": False, "deterministic": False},
                input_layout="nchw", output_layout="nchw", layers=[], network=None)
    return str(plan.save(tmp_path / f"{backend}-{precision}.json"))


@pytest.mark.parametrize("configs, backend, precision, plan, message", [
    (("eager", "bogus"), "numpy", "fp32", None, "unknown configuration 'bogus'; valid: eager"),
    (("eager", "legacy-find"), "numpy", "fp32", None, "on the CPU it would time eager"),
    (("eager", "legacy-find"), "cuda", "fp64", None, "unknown precision 'fp64'"),
    (("eager",), "numpy", "tf32", None, "precision tf32 is a GPU's tensor-core mode"),
    (("eager",), "numpy", "fp32", "numpy-fp32", "timed as the configuration 'plan'"),
    (("eager", "plan"), "numpy", "fp32", "cuda-fp32", "made for cuda; this run is on numpy"),
    (("eager", "plan"), "numpy", "bf16", "numpy-fp32", "in bf16: run it at precision fp32"),
])
def test_what_cannot_run_here_is_refused_in_one_line(tmp_path, configs, backend, precision,
                                                     plan, message):
    plan_file = plan and saved_plan(tmp_path, *plan.split("-"))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        trainstep.check(configs, backend, precision, plan_file)


def test_what_runs_here_passes_the_check(tmp_path):
    assert trainstep.check(("eager", "legacy-find", "cudnn.benchmark_limit=0", "plan"), "cuda",
                           "tf32", saved_plan(tmp_path, "cuda", "tf32")).precision == "tf32"
    assert trainstep.check(("eager", "channels_last", "compile"), "numpy", "bf16") is None
    assert trainstep.check(("eager", "plan"), "cuda", "tf32") is None  # tuned in tf32


def test_a_saved_plan_is_timed_without_tuning_and_no_plan_tunes_nothing(tmp_path, monkeypatch):
    """--plan FILE: the plan's process applies the file, nothing is tuned; no `plan` among the
    configurations: nothing is tuned and no plan is reported."""
    seen = []

    def no_tuning(*args):
        raise AssertionError("tuned")

    def fake_times(plan_file, configs, precision, **kw):
        seen.append((plan_file, configs, precision))
        return [fake_row(c, i) for i, c in enumerate(configs)]

    monkeypatch.setattr(trainstep, "_tuned", no_tuning)
    monkeypatch.setattr(trainstep, "time_configs", fake_times)
    alexnet, file = Workload.parse("alexnet"), saved_plan(tmp_path, "numpy", "bf16")
    rows, plan, tuning_s = trainstep.compare(alexnet, 1, "cpu", precision="bf16",
                                             plan_file=file)
    assert seen[-1] == (file, trainstep.CONFIGS, "bf16") and plan.precision == "bf16"
    assert tuning_s is None
    text = trainstep.markdown(rows, plan, alexnet, 1, "cpu", "numpy", tuning_s, False,
                              precision="bf16", plan_file=file)
    assert f"- the plan is {file} as saved (not tuned here); it rests on 0 measurements" in text
    assert "bf16 autocast (torch.autocast around forward and loss" in text
    rows, plan, tuning_s = trainstep.compare(alexnet, 1, "cpu",
                                             configs=("eager", "cudnn.benchmark"))
    assert plan is None and tuning_s is None and seen[-1][0] is None
    text = trainstep.markdown(rows, plan, alexnet, 1, "cpu", "numpy", tuning_s, False)
    assert "## The plan as applied" not in text and "rests on" not in text
    trainstep.write(tmp_path / "out", rows, plan, text, {}, {"net": "alexnet"})
    assert not (tmp_path / "out" / "plan.json").exists()


def fake_row(config: str, i: int) -> dict:
    """A timed row of `config`, its steps 10 ms x (i + 1)."""
    return {"config": config, "precision": "fp32", "median_ms": 10.0 * (i + 1),
            "iqr_ms": 0.5, "reps": 9, "noisy": False, "first_loss": 6.9, "applied": "",
            "settings": "cudnn.benchmark=False tf32=off", "faults_per_step": 0.0,
            "times_ms": [10.0 * (i + 1)] * 9, "speedup": 1.0, "speedup_low": 1.0,
            "speedup_high": 1.0, "verdict": "baseline"}


class FakeWorker:
    """A configuration's process as `time_configs` sees it: ready at once, each round 3 steps;
    `interrupt_at` (config, round): Ctrl-C arrives while that round is timed."""

    interrupt_at: tuple[str, int] | None = None
    failing = "compile"

    def __init__(self, log, config, load, batch, device, plan_file, mode, precision):
        self.config, self.rounds = config, 0
        self.ready = ({"failed": "RuntimeError: no compiler"} if config == self.failing else
                      {"first_loss": 6.9, "applied": "", "first_step_s": 0.1,
                       "settings": f"{config} {precision}"})

    def time(self, budget_s):
        self.rounds += 1
        if (self.config, self.rounds) == self.interrupt_at:
            raise KeyboardInterrupt
        ms = 10.0 + list(trainstep.CONFIGURATIONS).index(self.config)
        return {"times_ms": [ms, ms * 1.01, ms * 0.99], "faults": [0, 0, 0]}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def lines(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / trainstep.LINES).read_text().splitlines()]


def test_each_configuration_s_row_is_written_as_it_ends(tmp_path, monkeypatch):
    """A failed configuration's line as it gives up, a timed one's as its last round ends, with
    its speed-up and verdict: the rows returned, in the order they ended."""
    monkeypatch.setattr(trainstep, "Worker", FakeWorker)
    configs = ("eager", "cudnn.benchmark", "channels_last", "compile", "plan")
    rows = trainstep.time_configs(Workload.parse("alexnet"), 1, "cpu", 0.3, configs=configs,
                                  on_row=trainstep.line_writer(tmp_path), precision="bf16")
    assert [r["config"] for r in rows] == list(configs)
    written = lines(tmp_path)
    assert [r["config"] for r in written] == ["compile", "eager", "cudnn.benchmark",
                                              "channels_last", "plan"]
    assert sorted(written, key=lambda r: configs.index(r["config"])) == rows
    assert rows[3]["verdict"] == "failed: RuntimeError: no compiler"
    assert rows[2]["verdict"] == "slower" and rows[2]["precision"] == "bf16"
    assert rows[2]["settings"] == "channels_last bf16"


def test_a_run_cut_short_keeps_the_configurations_that_finished(tmp_path, monkeypatch, capsys):
    """Ctrl-C in the last round, after the baseline ended: the command says where its line is,
    and the folder holds it (and no plan: none is among the configurations, so none was
    tuned)."""
    from test_cli import run_cli

    monkeypatch.setattr(trainstep, "Worker", FakeWorker)
    monkeypatch.setattr(FakeWorker, "interrupt_at", ("cudnn.benchmark", trainstep.ROUNDS))
    out = tmp_path / "out"
    code, stdout, err = run_cli(capsys, "train-step", "--device", "cpu", "--batch", "1",
                                "--configs", "channels_last", "--budget", "0.3", "--out",
                                str(out))
    assert code == 130 and stdout == "" and "Traceback" not in err, err
    assert err.splitlines()[:3] == [f"convbench: starting {c}" for c in (
        "eager", "cudnn.benchmark", "channels_last")]
    (said,) = err.splitlines()[3:]
    assert f"the configurations that finished are in {out / trainstep.LINES}" in said
    assert [r["config"] for r in lines(out)] == ["eager"]
    assert lines(out)[0]["verdict"] == "baseline" and lines(out)[0]["reps"] == 9
    assert not (out / "plan.json").exists()  # nothing was tuned: no plan among them
