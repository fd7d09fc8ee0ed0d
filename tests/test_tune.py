import contextlib
import io
import json
import logging
import sys
import warnings

import pytest
import torch
from torch import nn

from convbench.catalogs.layers import Layer
from convbench.core import results
from convbench.core.problem import ConvProblem
from convbench.machine.threads import CPU_THREAD_ENV
from convbench.measure import envinfo, runner
from convbench.planning import advice, apply, models, tune
from convbench.planning.plan import Constraints, Plan

P1 = ConvProblem(n=2, c=3, h=8, w=8, k=4, r=3, s=3, pad=1)
P2 = ConvProblem(n=2, c=4, h=8, w=8, k=4, r=3, s=3, pad=1)


def tiny_run(tmp_path, layers=2, algos=("direct", "gemm", "torch-cpu")):
    """A real CPU run folder of tiny layers, made the way `convbench layer --out` makes one."""
    problems = [P1, P2, ConvProblem(n=2, c=4, h=8, w=8, k=2, r=1, s=1)][:layers]
    cases = runner.sweep([Layer("custom", f"l{i + 1}", p) for i, p in enumerate(problems)],
                         algos, "numpy", ("fwd", "bwd_data", "bwd_filter"), ("nchw", "nhwc"),
                         ("fp32",))
    folder = tmp_path / "run"
    sink = results.CsvSink(folder / results.RESULTS_CSV)
    runner.run(cases, 0.001, on_row=sink.append)
    (folder / results.ENV_JSON).write_text(json.dumps(envinfo.collect("numpy")))
    return folder



def test_advice_on_a_real_cpu_run(tmp_path):
    folder = tiny_run(tmp_path)
    df, _ = results.load_run(folder)
    # every time competes, also where the machine running the tests was busy
    adv = advice.advise(df, Constraints(include_busy=True))
    for (layer, pass_), a in adv.passes.items():
        rows = df[(df["layer"] == layer) & (df["pass"] == pass_) & (df["status"] == "ok")]
        # ranked by their costs in a model: ours pay the module's overhead, torch's own not
        costs = sorted(advice.in_model_ms(r, adv.overhead_ms) for _, r in rows.iterrows())
        assert a.fastest.cost_ms == pytest.approx(costs[0])
        assert a.runner_up.cost_ms == pytest.approx(costs[1])
        # the fastest, unless it ties with others: then the least workspace among them (a
        # tie with a slower candidate than the runner-up counts too: its interval may reach 1
        # where the runner-up's does not, as a fresh-clone CI run drew)
        assert a.best is a.fastest or (a.best in a.tied and len(a.tied) > 1
                                       and a.best.workspace <= a.fastest.workspace)
    assert len(adv.passes) == 6
    plan, adv, note = tune.advise_run(folder, Constraints(include_busy=True))
    assert note is None and plan.network is not None
    assert plan.backend == "numpy" and len(plan.measurements) == len(df)
    assert {tuple(c["shape"]) for c in plan.conversions} >= {(2, 3, 8, 8), (2, 4, 8, 8)}
    assert Plan.from_json(plan.to_json()) == plan


def test_advise_run_made_elsewhere_has_no_network_plan(tmp_path):
    folder = tiny_run(tmp_path, layers=1, algos=("gemm",))
    env = json.loads((folder / results.ENV_JSON).read_text())
    env["torch"]["version"] = "0.0.1"
    (folder / results.ENV_JSON).write_text(json.dumps(env))
    plan, _, note = tune.advise_run(folder)
    assert plan.network is None and plan.conversions == []
    assert "this machine differs from the run's in torch" in note
    assert plan.env["torch"] == "0.0.1"



# --- a model's layers --------------------------------------------------------------
class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.body = nn.Sequential(nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2,
                                                                          padding=1),
                                  nn.ReLU(), nn.Conv2d(6, 6, 1, bias=False))
        self.odd = nn.Conv2d(6, 6, (1, 3), padding=(0, 1), padding_mode="reflect")
        self.head = nn.Linear(6 * 5 * 5, 3)

    def forward(self, x):
        return self.head(torch.flatten(self.odd(torch.relu(self.body(self.stem(x)))), 1))


FAST = {"algos": "direct,gemm,torch-cpu", "budget_s": 0.001, "step": None}


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


@pytest.fixture
def said(caplog):
    """What tune says at INFO on its logger (`tune.LOG`, under `convbench`): `said()` is the
    lines so far, in order."""
    caplog.set_level(logging.INFO, logger="convbench")
    return lambda: [r.getMessage() for r in caplog.records if r.name.startswith("convbench")]


@contextlib.contextmanager
def no_logging():
    """The process as a caller who set up no logging has it: pytest's own handlers (added to
    the root logger as each test runs) off it for the block."""
    root = logging.getLogger()
    handlers = root.handlers[:]
    for h in handlers:
        root.removeHandler(h)
    try:
        yield
    finally:
        for h in handlers:
            root.addHandler(h)


def test_find_convs_in_call_order_with_refusals():
    model = SmallCNN()
    model.train()
    bn = model.body[0]
    stats = bn.running_mean.clone()
    sites, refused = models.find_convs(model, torch.randn(2, 3, 10, 10))
    assert [s.name for s in sites] == ["stem", "body.2", "body.4"]
    assert sites[0].passes == ("fwd", "bwd_filter")  # the input needs no gradient
    assert sites[1].passes == ("fwd", "bwd_data", "bwd_filter")
    assert sites[1].problem == ConvProblem(n=2, c=4, h=10, w=10, k=6, r=3, s=3, stride=2, pad=1)
    assert [(u.layer, u.reason[:22]) for u in refused] == [("odd", "padding_mode 'reflect'")]
    assert model.training and bn.training and torch.equal(bn.running_mean, stats)


def test_find_convs_refuses_a_layer_called_with_two_shapes():
    conv = nn.Conv2d(2, 2, 3, padding=1)

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x):
            return self.conv(self.conv(x)[:, :, :4, :4])

    sites, refused = models.find_convs(Twice(), torch.randn(1, 2, 6, 6))
    assert sites == [] and "several input shapes" in refused[0].reason


def test_tune_measures_then_reuses_the_store(store, measured, said):
    torch.manual_seed(0)
    model, x = SmallCNN(), torch.randn(2, 3, 10, 10)
    plan = tune.tune(model, x, **FAST)
    assert measured == [(2 + 3 + 3) * 3 * 2]  # passes x algos x layouts
    assert [lp.layer for lp in plan.layers] == ["stem", "body.2", "body.4"]
    assert plan.layers[0].passes["bwd_data"] is None
    assert [u.layer for u in plan.unplanned] == ["odd"]
    assert plan.network is not None and plan.backend == "numpy" and plan.precision == "fp32"
    assert any(line.startswith("plan saved to " + str(store)) for line in said())
    again = tune.tune(model, x, **FAST)
    assert measured[-1] == 0  # everything came from the store
    assert [lp.passes for lp in again.layers] == [lp.passes for lp in plan.layers]
    tune.tune(model, x, algos="direct,gemm,torch-cpu,fft", budget_s=0.001, step=None)
    assert measured[-1] == 8 * 2  # only the algorithm the store lacks


def test_tune_says_a_few_lines_not_one_per_case(store, capsys):
    """A real model's tune measures thousands of cases: it says a few lines, on stderr where the
    caller set up no logging (the caller's stdout stays its own), and not one per case; the
    caller's own logging takes them where it has some."""
    model, x = SmallCNN(), torch.randn(2, 3, 10, 10)
    with no_logging():
        tune.tune(model, x, **FAST)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and 4 <= len(lines) <= 6, err  # of 48 cases
    assert all(line.startswith("convbench: ") for line in lines)
    assert lines[0] == f"convbench: 0 measurements from the plan store {store}, 48 to make"
    assert lines[1].startswith("convbench: expected to take up to about ")
    assert any(line.startswith("convbench: measured 48 of 48 in ") for line in lines)
    assert lines[-1].startswith("convbench: plan saved to ")
    package = logging.getLogger("convbench")
    assert package.handlers == [] and package.level == logging.NOTSET  # as it was

    class Kept(logging.Handler):
        def emit(self, record):
            taken.append(record.getMessage())

    taken, handler = [], Kept()
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    try:
        with no_logging():
            tune.tune(model, x, **FAST)
    finally:
        package.removeHandler(handler)
        package.setLevel(logging.NOTSET)
    assert capsys.readouterr() == ("", "")
    assert taken[0] == f"48 measurements from the plan store {store}, 0 to make"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_tune_shows_a_bar_over_the_cases_on_a_terminal(store, monkeypatch, tmp_path):
    """On a terminal the cases show as one bar, redrawn in place; `progress=False` hides it,
    `progress=True` shows it anywhere."""
    model, x = SmallCNN(), torch.randn(2, 3, 10, 10)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    tune.tune(model, x, **FAST)
    shown = terminal.getvalue()
    assert "convbench: measuring" in shown and "/48" in shown and "\r" in shown
    assert "\n" not in shown  # redrawn, not a line per case
    quiet = Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    tune.tune(model, x, **{**FAST, "algos": "direct,gemm,torch-cpu,fft"}, progress=False)
    assert quiet.getvalue() == ""
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    tune.tune(model, x, **FAST, layouts=("nchw",), store=tmp_path / "other", progress=True)
    assert "/24" in piped.getvalue()


def test_tune_says_how_long_it_expects_before_it_measures(store, said, monkeypatch):
    """Before minutes of measurements, the time they and the confirmation should take: each
    case's budget of repetitions and the confirmation's most comparisons of two steps, warm-up
    included."""
    heard = []
    real = runner.run

    def spy(cases, *args, **kwargs):
        heard.append(said())
        return real(cases, *args, **kwargs)

    monkeypatch.setattr(runner, "run", spy)
    model, x = SmallCNN(), torch.randn(2, 3, 10, 10)
    tune.tune(model, x, **FAST)
    assert heard[0][1] == tune.expected_text(48, 0.001, None, 2.0)
    assert tune.expected_text(100, 0.5, "train", 2.0) == (
        "expected to take up to about 1m52s: 100 cases to measure × 0.5 s of timed "
        "repetitions, then confirming on the train step, at most 10 comparisons of two steps × "
        "2 s (warm-up included)")  # 100 x 0.5 s x 1.25 + 10 x 2 x 2 s x 1.25 = 112.5 s
    assert tune.expected_text(0, 0.5, "inference", 1.0) == (
        "expected to take up to about 0m25s: then confirming on the inference step, at most 10 "
        "comparisons of two steps × 1 s (warm-up included)")


def test_each_confirmation_step_and_its_verdict_is_said(store, said, quiet):
    """What `train-step` prints of the confirmation reaches a Python caller too: each
    comparison with its verdict, then the plan's (`plan.checks`), as INFO lines."""
    torch.manual_seed(0)
    model, x = SmallCNN().eval(), torch.randn(2, 3, 10, 10)
    plan = tune.tune(model, x, algos="direct,gemm", budget_s=0.001, step_budget_s=0.02)
    lines = said()
    (check,) = plan.checks
    steps = [line for line in lines if line.startswith("inference step: ")]
    assert steps[0].startswith("inference step: the whole plan takes ")
    assert steps[0].endswith(("): faster beyond noise", "): not faster beyond noise"))
    assert steps[-1] == check.text() and lines[-1].startswith("plan saved to ")
    assert "changes confirmed" in check.text() or "change confirmed" in check.text()


def test_numpy_passes_measured_without_the_thread_settings_warn_once(store, monkeypatch,
                                                                   tmp_path):
    """Without the thread settings NumPy's and torch's idle threads spin against each other
    and every time measured beside them is off (ResNet-18's plan: 2.73x slower without, 1.65x
    with), whatever the plan ends up running: one warning, naming the caller's line, where
    NumPy passes were measured; none where nothing was, or the settings are there."""
    for name in CPU_THREAD_ENV:
        monkeypatch.delenv(name, raising=False)
    model, x = SmallCNN(), torch.randn(2, 3, 10, 10)

    def hints(**kwargs) -> list[warnings.WarningMessage]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tune.tune(model, x, **{**FAST, **kwargs})
        return [w for w in caught if "start Python with" in str(w.message)]

    (hint,) = hints()
    assert str(hint.message).startswith("NumPy passes were measured with idle threads")
    assert ("start Python with OMP_WAIT_POLICY=PASSIVE OPENBLAS_THREAD_TIMEOUT=4 "
            "GOMP_SPINCOUNT=10000 and tune into a fresh plan store") in str(hint.message)
    assert hint.filename == __file__ and str(store) in str(hint.message)
    assert hints() == []  # all from the store: nothing measured here
    assert hints(algos="torch-cpu", store=tmp_path / "torch") == []  # torch's passes alone
    for name, value in CPU_THREAD_ENV.items():
        monkeypatch.setenv(name, value)
    assert hints(store=tmp_path / "set") == []


def test_a_misspelt_tune_argument_is_a_type_error_at_the_call():
    with pytest.raises(TypeError, match=r"^tune\(\) got an unexpected keyword argument 'budget'"):
        tune.tune(SmallCNN(), torch.randn(2, 3, 10, 10), budget=0.1)


def test_tune_measures_a_layer_apply_leaves_as_is_and_says_so(store, said):
    """A conv subclass with a forward of its own is measured as it computes (TF-SAME: on
    the padded input) and planned; the log says apply will leave it to torch."""

    class SameStem(nn.Conv2d):
        def forward(self, x):
            return super().forward(torch.nn.functional.pad(x, [0, 1, 0, 1]))

    plan = tune.tune(nn.Sequential(SameStem(3, 4, 3, stride=2)), torch.randn(1, 3, 8, 8),
                     **FAST)
    assert [(lp.layer, lp.problem.h, lp.problem.p) for lp in plan.layers] == [("0", 9, 4)]
    assert "0: measured, but apply leaves it as is, torch runs it (SameStem has its own " \
        "forward)" in said()


def test_a_stale_store_is_measured_again(store, measured, monkeypatch, said):
    model, x = SmallCNN(), torch.randn(2, 3, 10, 10)
    tune.tune(model, x, **FAST)
    real = tune.current_env_key
    monkeypatch.setattr(tune, "current_env_key",
                        lambda backend: {**real(backend), "torch": "9.9.9"})
    tune.tune(model, x, **FAST)
    assert measured == [48, 48]
    assert any("not used: torch changed" in line for line in said())


def test_tune_refuses_what_it_cannot_measure():
    with pytest.raises(ValueError, match="dtype int64 has no convbench precision"):
        tune.tune(SmallCNN(), torch.zeros(1, 3, 10, 10, dtype=torch.int64))
    with pytest.raises(ValueError, match="unknown algo 'magic'"):
        tune.tune(SmallCNN(), torch.zeros(1, 3, 10, 10), algos="magic")
    with pytest.raises(ValueError, match="unknown layout 'chwn'"):
        tune.tune(SmallCNN(), torch.zeros(1, 3, 10, 10), layouts=("nchw", "chwn"))


@pytest.mark.gpu
def test_deterministic_plan_on_a_gpu_avoids_cudnn(store):
    model, x = SmallCNN().cuda(), torch.randn(4, 3, 10, 10, device="cuda")
    plan = tune.tune(model, x, algos="direct,cudnn,cudnn-autotune", budget_s=0.01, step=None,
                        constraints=Constraints(deterministic=True))
    algos = {c.algo for lp in plan.layers for c in lp.passes.values() if c}
    assert algos <= {"direct"} and plan.cudnn["deterministic"] is True
    apply.apply(model, plan)
    assert torch.backends.cudnn.deterministic is True
    torch.backends.cudnn.deterministic = False


def test_ctrl_c_in_tune_keeps_what_it_measured_in_the_store(store, monkeypatch, said):
    torch.manual_seed(0)
    model, x = SmallCNN(), torch.randn(2, 3, 10, 10)
    real, seen = runner.prepare, []

    def prepare(case, *args, **kw):
        if len(seen) == 20:
            raise KeyboardInterrupt
        seen.append(case)
        return real(case, *args, **kw)

    monkeypatch.setattr(runner, "prepare", prepare)
    with pytest.raises(tune.TuneInterrupted) as stop:
        tune.tune(model, x, **FAST)
    assert stop.value.planned == 48 and 0 < stop.value.made <= 20
    assert stop.value.path.parent == store and isinstance(stop.value, KeyboardInterrupt)
    monkeypatch.setattr(runner, "prepare", real)
    before = len(said())
    tune.tune(model, x, **FAST)
    assert said()[before] == (f"{stop.value.made} measurements from the plan store {store}, "
                              f"{48 - stop.value.made} to make")


def test_ctrl_c_while_the_step_confirms_keeps_every_measurement(store, monkeypatch, capsys,
                                                               tmp_path):
    """The whole steps of a real model take minutes after the measurements: a Ctrl-C there keeps
    them all (a GPU visit lost 786 measurements of MobileNetV3 so), and says so in one line."""
    from convbench import cli
    from convbench.planning import confirm

    (tmp_path / "tiny_confirm_model.py").write_text(
        "import torch.nn as nn\n"
        "def small():\n    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1))\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(confirm, "confirm", interrupted)
    argv = ["tune", "--model", "tiny_confirm_model:small", "--input", "2,3,8,8", "--algos",
            "gemm,torch-cpu", "--time-budget", "0.001"]
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith(
        "convbench: interrupted; 8 of 8 measurements kept in the plan store")
    assert err.splitlines()[-1].endswith("reuses them and confirms the plan on the step again")
    assert cli.main([*argv, "--step", "none"]) == 0
    assert "convbench: 8 measurements from the plan store" in capsys.readouterr().err


def test_the_tune_command_says_the_thread_hint_once(store, monkeypatch, capsys, tmp_path):
    """The command line says tune's warnings as its own lines: the thread hint once, where
    NumPy passes were measured without the settings."""
    from convbench import cli

    (tmp_path / "tiny_hint_model.py").write_text(
        "import torch.nn as nn\n"
        "def small():\n    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in CPU_THREAD_ENV:
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["tune", "--model", "tiny_hint_model:small", "--input", "2,3,8,8",
                     "--algos", "gemm,torch-cpu", "--time-budget", "0.001", "--step",
                     "none"]) == 0
    err = capsys.readouterr().err
    hints = [line for line in err.splitlines() if "start Python with" in line]
    assert len(hints) == 1 and hints[0].startswith(
        "convbench: warning: NumPy passes were measured with idle threads spinning"), err


def test_tune_measures_in_the_setting_it_is_called_in(monkeypatch, tmp_path):
    """The plan's precision is the caller's: an input's dtype, TF32 where torch runs cuDNN's
    convolutions in it, an active autocast's dtype; a named precision that differs is one line
    saying what to set. Under bf16 autocast on the CPU the plan is bf16, our NumPy passes (no
    bf16) are not candidates, and the planned model runs under autocast."""
    from convbench import nn as cbnn
    from convbench.algos import cudnn

    x = torch.randn(2, 3, 8, 8)
    assert tune._backend_precision(x) == ("numpy", "fp32")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert tune._backend_precision(x) == ("numpy", "bf16")
    with pytest.raises(ValueError, match=r"precision bf16 asked, and this call runs "
                       r"convolutions in fp32: call tune inside torch.autocast"):
        tune._backend_precision(x, "bf16")
    with pytest.raises(ValueError, match="precision tf32 is cuDNN's TF32 on a GPU"):
        tune._backend_precision(x, "tf32")
    monkeypatch.setattr(cudnn, "conv_runs_tf32", lambda: True)
    assert cbnn.live_precision("cuda", torch.float32) == "tf32"
    assert cbnn.live_precision("cpu", torch.float32) == "fp32"  # TF32 is cuDNN's
    monkeypatch.setattr(cudnn, "conv_runs_tf32", lambda: False)
    assert cbnn.live_precision("cuda", torch.float32) == "fp32"
    with cbnn.precision_setting("bf16", "cpu"):
        assert cbnn.live_precision("cpu", torch.float32) == "bf16"
    assert cbnn.live_precision("cpu", torch.float32) == "fp32"

    model, x = SmallCNN(), torch.randn(2, 3, 10, 10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plan = tune.tune(model, x, **FAST, store=tmp_path)
        assert plan.precision == "bf16"
        chosen = {c.algo for lp in plan.layers for c in lp.passes.values() if c}
        # what runs bf16 here: torch's, where the CPU computes bf16 (else nothing is chosen)
        assert chosen <= {"torch-cpu"}
        assert {e["status"] for e in plan.measurements if e["algo"] != "torch-cpu"} == {
            "unsupported"}
        apply.apply(model, plan)
        assert model(x).dtype == torch.bfloat16


def test_torch_s_tf32_setting_is_read_and_set_through_either_api():
    """torch's default runs fp32 convolutions in TF32; `strict_fp32` turns that off, and the
    reading follows, also where the new per-operator API was used (the legacy flag then
    raises when read)."""
    from convbench.algos import cudnn

    backends = torch.backends
    conv = getattr(backends.cudnn, "conv", None)
    saved = (conv.fp32_precision, backends.cuda.matmul.fp32_precision) if conv else None
    try:
        if conv:
            conv.fp32_precision = "tf32"
        else:
            backends.cudnn.allow_tf32 = True
        assert cudnn.conv_runs_tf32()
        cudnn.strict_fp32()
        assert not cudnn.conv_runs_tf32()
    finally:
        if conv:
            conv.fp32_precision, backends.cuda.matmul.fp32_precision = saved
        else:
            backends.cudnn.allow_tf32 = True


def test_ctrl_c_in_convbench_tune_is_one_line(store, monkeypatch, capsys, tmp_path):
    module = tmp_path / "tiny_tune_model.py"
    module.write_text("import torch.nn as nn\n"
                      "def small():\n    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    real, seen = runner.prepare, []

    def prepare(case, *args, **kw):
        if len(seen) == 5:  # the first group of competing cases (2 algos x 2 layouts) is done
            raise KeyboardInterrupt
        seen.append(case)
        return real(case, *args, **kw)

    monkeypatch.setattr(runner, "prepare", prepare)
    from convbench import cli

    code = cli.main(["tune", "--model", "tiny_tune_model:small", "--input", "2,3,8,8",
                     "--algos", "gemm,torch-cpu", "--budget", "0.001"])
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("convbench: interrupted; 4 of 8 measurements kept in the plan store")
    assert last.endswith("the same command measures the rest")


class Normed(nn.Module):
    """A conv, a global pool, a 1x1 conv and batch norm (a classifier's head, as Inception's):
    at batch 1 the norm sees one value per channel, and torch refuses the training step."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.b(torch.relu(self.a(x)).mean((2, 3), keepdim=True)))


def test_a_model_in_eval_mode_is_confirmed_on_inference(store):
    """Batch 1 through batch norm: in eval mode the plan is confirmed on the inference step
    (the model's own) without being asked, and the model is left in eval mode."""
    model, x = Normed().eval(), torch.randn(1, 3, 6, 6)
    plan = tune.tune(model, x, algos="direct,gemm", budget_s=0.001, step_budget_s=0.05,
                     progress=None)
    assert [c.mode for c in plan.checks] == ["inference"] and not model.training


def test_a_training_step_that_cannot_run_is_one_line_naming_the_fix(store, measured):
    """The same model in training mode (or asked for the training step) at batch 1: torch's
    batch norm refuses one value per channel; tune says so in one line, with what to do,
    before measuring anything."""
    x = torch.randn(1, 3, 6, 6)
    for model, step in ((Normed(), "model"), (Normed().eval(), "train")):
        with pytest.raises(ValueError) as err:
            tune.tune(model, x, algos="direct,gemm", budget_s=0.001, step=step)
        text = str(err.value)
        assert "\n" not in text and text.startswith("the model's train step cannot run on an "
                                                    "input of shape 1,3,6,6: Expected more")
        assert text.endswith("give a batch of 2 or more, or confirm on inference "
                             "(step='inference', --step inference, or the model in eval mode)")
    assert measured == []
