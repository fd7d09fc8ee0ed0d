"""A newcomer's first hour (issue 24 §3): what a new user meets first works, or says why not."""

import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import convbench
from convbench import __version__
from convbench.cli.common import EXIT_PIPE
from convbench.machine import backends, launch

PACKAGE = os.path.dirname(convbench.__file__)
ROOT = Path(PACKAGE).parent

#: setuptools' editable finder, in short: a meta path finder after the path's own, so a folder
#: named `convbench` in the current directory is found first.
EDITABLE = textwrap.dedent(f"""
    import importlib.util, sys
    from importlib.machinery import PathFinder
    PKG = {PACKAGE!r}
    class Editable:
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name == "convbench":
                return importlib.util.spec_from_file_location(
                    name, PKG + "/__init__.py", submodule_search_locations=[PKG])
            if name.rpartition(".")[0] == "convbench":
                return PathFinder.find_spec(name, [PKG])
            return None
    sys.meta_path.insert(sys.meta_path.index(PathFinder) + 1, Editable)
""")


@pytest.fixture
def beside_a_clone(tmp_path):
    """(the folder holding a clone named convbench, the environment of an editable install)."""
    (tmp_path / "convbench" / "results" / "some-run").mkdir(parents=True)
    (tmp_path / "convbench" / "README.md").write_text("a clone\n")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(EDITABLE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return tmp_path, {**env, "PYTHONPATH": str(site)}


def _run(argv, cwd, env):
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def test_python_m_convbench_beside_a_clone_runs_the_package(beside_a_clone):
    cwd, env = beside_a_clone
    proc = _run([sys.executable, "-m", "convbench", "--version"], cwd, env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"convbench {__version__}"


def test_worker_processes_beside_a_clone_import_the_package(beside_a_clone):
    cwd, env = beside_a_clone
    assert _run(launch.module_command("convbench.core.results"), cwd, env).returncode == 0


def test_worker_processes_of_a_checkout_that_is_not_installed_import_it(tmp_path):
    """`python3 -m convbench` in a clone that is not installed (a GPU machine without a package
    registry): the worker processes, started without the current directory on their path,
    import the very package their parent runs, not another one installed."""
    copy = tmp_path / "clone"
    shutil.copytree(ROOT / "convbench", copy / "convbench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    parent = ("import subprocess; from convbench.machine import launch; print(subprocess.run("
              "launch.module_command('convbench.machine.launch'), capture_output=True, "
              "text=True, check=True).stdout, end='')")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = _run([sys.executable, "-c", parent], copy, env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str((copy / "convbench").resolve())


def test_every_command_leaves_quietly_when_its_reader_does(tmp_path):
    """`convbench ... | head`: exit 141 and no traceback, for outputs larger than a pipe holds
    (a report's JSON rows) and smaller (the end of `list`, flushed before exit)."""
    run = tmp_path / "run"
    shutil.copytree(ROOT / "results" / "2026-11-21-cpu-2core-alexnet", run)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv in (["report", str(run), "--format", "json"], ["list"]):
        proc = subprocess.run(f"{sys.executable} -m convbench {' '.join(argv)} | head -1; "
                              "echo ${PIPESTATUS[0]} >&2", shell=True, executable="/bin/bash",
                              env=env, capture_output=True, text=True, timeout=120,
                              check=False)
        assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, argv
        assert proc.stderr.strip().splitlines()[-1] == str(EXIT_PIPE), argv


def test_list_says_a_missing_backend_once(capsys):
    from test_cli import run_cli


    code, out, _ = run_cli(capsys, "list")
    assert code == 0
    reason = backends.available("cuda")
    if reason is not None:
        assert out.count(reason) == 1
    assert "runs here" in out  # the numpy table keeps the column: its algos may differ


def test_list_of_a_large_catalog_is_by_class(capsys):
    from test_cli import run_cli

    code, out, _ = run_cli(capsys, "list", "--net", "convset")
    assert code == 0
    assert "The 15 most frequent of 8498 problems" in out
    assert re.search(r"\| algo +\| precisions +\| runs here +\| pointwise", out)
    assert len(out.splitlines()) < 300  # by class: not a line per problem of 8,498


def test_version(capsys):
    from test_cli import run_cli

    code, out, _ = run_cli(capsys, "--version")
    assert code == 0 and out.strip() == f"convbench {__version__}"


MODELS = textwrap.dedent("""
    import torch
    def two():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
                                   torch.nn.Conv2d(4, 4, 1))
    def noconv():
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 6 * 6, 4))
    def normed():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                                   torch.nn.BatchNorm2d(4))
""")


@pytest.fixture
def tiny_models(tmp_path, monkeypatch):
    (tmp_path / "newcomer_models.py").write_text(MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_tune_says_what_it_measured_and_what_training_does_not_need(tiny_models, capsys):
    from test_cli import run_cli

    code, out, err = run_cli(capsys, "tune", "--model", "newcomer_models:two", "--input",
                             "1,3,6,6", "--algos", "gemm,torch-cpu", "--budget", "0.002",
                             "--store", str(tiny_models / "store"))
    assert code == 0, err
    lines = err.splitlines()
    # the first layer's input needs no gradient: no bwd_data for it
    assert ("convbench: 1 pass not measured, training does not run them (an input or weight "
            "that needs no gradient): 0 bwd_data") in lines
    # 2 layers x 3 passes - 1, x 2 algos x 2 layouts
    assert any(line.startswith("convbench: measured 20 of 20 in ") for line in lines), err
    assert "cudnn regret" not in out  # a CPU plan: no cuDNN to regret


def test_a_model_without_conv_layers_says_so(tiny_models, capsys):
    from test_cli import run_cli

    for command in (["tune"], ["bench", "--device", "cpu"]):
        code, _, err = run_cli(capsys, *command, "--model", "newcomer_models:noconv",
                               "--input", "1,3,6,6", "--store" if command == ["tune"] else
                               "--out", str(tiny_models / "x"))
        assert code == 2, err
        assert "no nn.Conv2d layer" in err or "has no conv layer" in err, err
        assert len(err.strip().splitlines()) == 1


def test_a_training_step_torch_refuses_is_one_line_naming_the_fix(tiny_models, capsys):
    """Batch 1 into batch norm on one value per channel (Inception v3 at 1x3x80x80 did it):
    exit 2 and one line saying what to do, before anything is measured; on inference it runs."""
    from test_cli import run_cli

    args = ("tune", "--model", "newcomer_models:normed", "--input", "1,3,6,6", "--algos",
            "gemm", "--layouts", "nchw", "--budget", "0.002", "--step-budget", "0.05",
            "--store", str(tiny_models / "store"))
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "Expected more than 1 value per channel when training" in err
    assert "give a batch of 2 or more, or confirm on inference" in err
    code, _, err = run_cli(capsys, *args, "--step", "inference")
    assert code == 0, err


@pytest.fixture(scope="module")
def alexnet_run():
    from convbench.core import results

    return results.load_run(ROOT / "results" / "2026-11-21-cpu-2core-alexnet")


def test_the_report_opens_on_which_wins_by_how_much_and_why_not_the_others(alexnet_run):
    from convbench.analysis import report

    df, env = alexnet_run
    text = report.markdown(df, env, [])
    first = text.split("## Time per layer")[0]
    assert "## Which wins (fp32)" in first and "`convbench advise RUN`" in first
    assert "the device's peak is not known here" in first
    table = report.winner_table(df[df["precision"] == "fp32"], peak_gflops=1000.0)
    row = table.loc[("conv1", "bwd_data")]
    assert row["fastest"] == "gemm nchw" and row["verdict"] == "wins"
    assert row["GFLOP/s"] == "75.96 (8% of peak)"
    assert row["did not run"] == "fft, winograd-2x2, winograd-4x4 unsupported"
    assert table.loc[("conv3", "fwd"), "did not run"] == ""


def test_the_time_plots_share_their_y_range_mark_what_did_not_run_and_show_intervals(
        alexnet_run, monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    from convbench.analysis import report
    from convbench.analysis.report import plots

    df, env = alexnet_run
    figures = {}

    def keep(fig, path, legend=True):
        figures[path.name] = fig

    monkeypatch.setattr(plots, "save_figure", keep)
    report.plot(df, tmp_path, env)
    nchw, nhwc = figures["time_fwd.png"].axes[:2]
    assert nchw.get_ylim() == nhwc.get_ylim()
    marks = [t.get_text() for t in nchw.texts]
    assert marks.count("u") == 5  # conv1: fft, winograd x2; conv2: winograd x2
    assert nchw.containers and any(getattr(c, "has_yerr", False) for c in nchw.containers)
    fwd_ops = figures["opcount.png"].axes[0]
    fft = next(c for c in fwd_ops.containers if c.get_label() == "_fft")  # out of the legend
    assert math.isnan(fft.patches[0].get_height())  # conv1: FFT cannot run it (stride 4)
    assert fft.patches[1].get_height() > 0
