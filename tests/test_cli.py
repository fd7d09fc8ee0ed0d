import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from convbench import cli
from convbench.algos import registry
from convbench.analysis import report
from convbench.cli import common
from convbench.core import results
from convbench.core.problem import PASSES
from convbench.machine import backends
from convbench.measure import runner

TINY = "n=1,c=2,h=6,w=6,k=3,r=3,s=3,pad=1"
REAL_PREPARE = runner.prepare
ROOT = Path(__file__).resolve().parent.parent
FAST = ["--budget", "0.002"]


def run_cli(capsys, *argv):
    """(exit code, stdout, stderr) of `convbench ARGV`, argparse's exits included."""
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, names", [
    (["layer", "conv9"], "unknown layer 'conv9' in alexnet; valid: conv1"),
    (["layer", "nosuch:conv1"], "unknown net 'nosuch'"),
    (["layer", "conv2", "--net", "nosuch"], "invalid choice: 'nosuch'"),
    (["layer", "conv2", "--algos", "bogus"], "unknown algo 'bogus'"),
    (["layer", "conv2", "--passes", "fwd,sideways"], "unknown pass 'sideways'; valid: fwd"),
    (["layer", "conv2", "--layouts", "chwn"], "unknown layout 'chwn'; valid: nchw, nhwc"),
    (["layer", "conv2", "--precision", "fp8"], "unknown precision 'fp8'"),
    (["bench", "--precisions", "fp32,fp8"], "unknown precision 'fp8'; valid: fp64, fp32"),
    (["gpu-check", "--device", "cpu", "--precisions", "tf16"], "unknown precision 'tf16'"),
    (["gpu-first", "--device", "cpu", "--out", "x", "--precisions", "bf8"],
     "unknown precision 'bf8'"),
    (["tune", "--model", "m:f", "--input", "1,3,8,8", "--precisions", "fp33"],
     "unknown precision 'fp33'"),
    (["tune", "--model", "m:f", "--input", "1,3,8,8", "--precisions", "fp32,bf16"],
     "a plan is made in one precision"),
    (["layer", "n=1,c=2,h=6"], "malformed layer spec"),
    (["layer", "n=1,c=2,h=6,w=6,k=3,r=9,s=3"], "larger than the padded input"),
    (["layer", "conv2", "--batch", "0"], "'0' is not positive"),
    (["layer", "conv2", "--budget", "nan"], "'nan' is not a finite number"),
    (["layer", "conv2", "--budget", "inf"], "'inf' is not a finite number"),
    (["layer", "conv2", "--batch", "99999999999"], "is larger than 2147483647"),
    (["layer", "n=1,c=1,h=5,w=5,k=1,r=3,s=3,stride=1x0"], "stride must be >= 1, got 1x0"),
    (["sweep", "--batch", "1,4294967296"], "4294967296 is larger than 2147483647"),
    (["bench", "--memory-limit", "0.5B"], "'0.5B' is not a positive size"),
    (["layer", "conv2", "--resume"], "--resume needs the run folder"),
    (["report", "/nonexistent/run"], "is not a run folder"),
    (["bench", "--device", "tpu"], "invalid choice: 'tpu'"),
    (["bench", "--memory-limit", "lots"], "'lots' is not a positive size"),
    (["sweep", "--batch", "1,x"], "'1,x' is not a comma list of batch sizes"),
    (["sweep", "--batch", "0,2"], "'0,2' is not a comma list of positive batch sizes"),
    (["sweep", "--layers", "conv9"], "unknown layer 'conv9'; valid: conv1"),
    (["sweep", "--algos", "bogus"], "unknown algo 'bogus'"),
    (["memprofile", "--config", "fastest"], "--config fastest needs --run RUN"),
    (["memprofile", "--budget", "0GiB"], "'0GiB' is not a positive size"),
    (["memprofile", "--run", "/nonexistent/run"], "--run /nonexistent/run: "),
    (["memprofile", "--net", "vgg16"], "invalid choice: 'vgg16'"),
    ([], "the following arguments are required: command"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, names):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and names in err and "Traceback" not in err
    assert out == ""


def test_tune_hands_its_precision_to_the_library(capsys, monkeypatch):
    """`tune --precisions P` measures and plans in P (the library's `precision`), the input's
    dtype's where not given; the library refuses an unknown one itself."""
    import torch

    from convbench.cli import tune as cli_tune
    from convbench.planning import tune

    handed = []

    def fake(model, x, **kwargs):
        handed.append(kwargs["precision"])
        raise ValueError("stop here")

    monkeypatch.setattr(cli_tune.models, "load", lambda spec: torch.nn.Conv2d(3, 4, 3))
    monkeypatch.setattr(cli_tune, "tune_advice", fake)
    for extra in (["--precisions", "tf32"], ["--precision", "bf16"], []):
        code, _, err = run_cli(capsys, "tune", "--model", "m:f", "--input", "1,3,8,8",
                               "--device", "cpu", *extra)
        assert code == 2 and "stop here" in err
    assert handed == ["tf32", "bf16", None]
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        tune.tune_advice(torch.nn.Conv2d(3, 4, 3), torch.randn(1, 3, 8, 8), precision="fp8")


#: A cheap run's other options: were an empty list read as not given, the run is small.
CHEAP = ["--algos", "torch-cpu", "--passes", "fwd", "--layouts", "nchw", "--precision", "fp32",
         "--batch", "1", *FAST]


@pytest.mark.parametrize("option, names", [
    ("--algos", "no algo given; valid: direct"), ("--passes", "no pass given; valid: fwd"),
    ("--layouts", "no layout given; valid: nchw"),
    ("--precision", "no precision given; valid: fp64"), ("--layers", "no layer given; valid: "),
    ("--class", "unknown class ''")])
def test_an_empty_comma_list_is_refused(capsys, tmp_path, option, names):
    """#45: `--algos ""` ran every algorithm: a comma list given empty is bad input, not the
    default."""
    command = "sweep" if option == "--layers" else "bench"
    pairs = dict(zip(CHEAP[::2], CHEAP[1::2]))
    cheap = [a for name, value in pairs.items() if name != option for a in (name, value)]
    code, out, err = run_cli(capsys, command, option, "", *cheap, "--out",
                             str(tmp_path / "run"))
    assert code == 2 and out == "", err
    assert err.count("\n") == 1 and names in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_gpu_check_refuses_an_empty_algo_list(capsys, tmp_path):
    code, _, err = run_cli(capsys, "gpu-check", "--device", "cpu", "--algos", "", "--out",
                           str(tmp_path / "out"))
    assert code == 2 and err.count("\n") == 1 and "no algo given" in err, err


@pytest.mark.skipif(backends.available("cuda") is None, reason="this machine has a GPU")
def test_cuda_without_gpu_names_what_is_valid(capsys):
    code, _, err = run_cli(capsys, "layer", "conv2", "--device", "cuda")
    assert code == 2 and err.count("\n") == 1
    assert "--device cuda:" in err and "valid here: cpu" in err


def test_python_dash_m_reports_errors_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "convbench", "layer", "conv9"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("convbench: error: unknown layer 'conv9'")
    assert proc.stderr.count("\n") == 1


def test_layer_json_lists_every_algo_pass_and_layout(capsys):
    code, out, _ = run_cli(capsys, "layer", TINY, "--algos", "all", "--format", "json", *FAST)
    assert code == 0
    rows = json.loads(out)
    algos = [a for a in registry.algos_for("numpy") if a not in registry.OPT_IN]
    assert {(r["algo"], r["pass"], r["layout"]) for r in rows} == {
        (a, p, layout) for a in algos for p in PASSES for layout in ("nchw", "nhwc")}
    for r in rows:
        assert r["status"] in results.STATUSES
        if r["status"] == "ok":
            assert r["median_ms"] > 0 and r["gflops"] > 0 and r["rel_error"] < r["tolerance"]
            assert r["reps"] >= 3 and len(r["times_ms"]) == r["reps"]
        else:
            assert r["reason"]
    assert any(r["algo"] == "torch-cpu" and r["status"] == "ok" for r in rows)


def test_layer_table_and_csv(capsys):
    code, out, _ = run_cli(capsys, "layer", TINY, "--algos", "torch-cpu", "--passes", "fwd",
                           *FAST)
    assert code == 0 and "torch-cpu" in out and "| ok " in out
    code, out, _ = run_cli(capsys, "layer", TINY, "--algos", "torch-cpu", "--passes", "fwd",
                           "--layouts", "nhwc", "--format", "csv", *FAST)
    lines = out.splitlines()
    assert lines[0] == ",".join(results.COLUMNS) and len(lines) == 2


def test_layer_ends_on_its_verdict_and_its_data_stays_parseable(capsys):
    """#70: `convbench layer conv2 --algos all` gave 48 rows and no answer; it ends on the
    verdict of ours against torch's per layer and pass. As JSON the verdict goes to stderr."""
    argv = ["layer", TINY, "--algos", "gemm,torch-cpu", "--passes", "fwd", "--layouts", "nchw",
            "--quiet", *FAST]
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0
    verdict = out[out.index("Verdict (fp32): the fastest of ours against torch's"):]
    last = verdict.strip().splitlines()[-1]
    assert last.startswith(f"| {TINY} | fwd "), last
    assert re.search(r"\| (ours faster|torch's faster|tie within noise|not decided: .*) \|$",
                     last), last
    code, out, err = run_cli(capsys, *argv, "--format", "json")
    assert code == 0 and len(json.loads(out)) == 2 and "Verdict (fp32)" in err


BENCH = ["bench", "--algos", "torch-cpu", "--batch", "1", "--passes", "fwd,bwd_data",
         "--layouts", "nhwc", *FAST]


def test_bench_writes_a_run_folder_and_report_compare_work(tmp_path, capsys):
    folder = tmp_path / "run"
    code, out, err = run_cli(capsys, *BENCH, "--out", str(folder))
    assert code == 0
    names = {p.name for p in folder.iterdir()}
    assert {"measurements.csv", "env.json", "report.md"} <= names
    df, env = results.load_run(folder)
    assert len(df) == 5 * 2 and set(df["status"]) == {"ok"}
    assert env["run"]["batch"] == 1 and env["run"]["command"].startswith("convbench bench")
    assert env["numpy"]["version"] and env["torch"]["threads"] >= 1
    assert env["device_slug"] == f"cpu-{os.cpu_count()}core" and env["cpu"]["cores"] >= 1
    assert "## Time per layer" in out and "conv5" in out

    (folder / "report.md").unlink()
    code, out, _ = run_cli(capsys, "report", str(folder))  # read: nothing written
    assert code == 0 and not (folder / "report.md").exists() and "## Operation counts" in out
    code, out, err = run_cli(capsys, "report", str(folder), "--out", str(folder))
    assert code == 0 and (folder / "report.md").read_text() == out.rstrip("\n") + "\n"
    assert f"report.md and its plots written to {folder}" in err

    code, out, _ = run_cli(capsys, "compare", str(folder), str(folder), "--format", "json")
    cmp = json.loads(out)
    assert len(cmp) == 10 and all(r["ratio"] == 1 and r["change"] == "" for r in cmp)

    code, _, err = run_cli(capsys, *BENCH, "--out", str(folder))
    assert code == 2 and "already holds results; pass --resume" in err


def _files(folder: Path) -> dict:
    """Every file under `folder`: its modification time (ns) and bytes."""
    return {p.relative_to(folder): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_reading_a_run_folder_writes_nothing(tmp_path, capsys):
    """#70: the README's `convbench report results/... --format json | head -3` rewrote that
    committed folder's report.md and five plots (the checkout left dirty). Reading in any format
    changes no file; the report is written only where --out asks, there alone."""
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    shutil.copytree(ROOT / "results" / "2026-11-25-cpu-2core-alexnet", run)
    before = _files(run)
    for fmt in ("json", "csv", "table"):
        code, out, err = run_cli(capsys, "report", str(run), "--format", fmt)
        assert code == 0 and out, err
        assert _files(run) == before, fmt
    assert report.NOT_DRAWN in out  # the markdown read says where its plots would be drawn
    code, out, err = run_cli(capsys, "report", str(run), "--format", "json", "--out",
                             str(tmp_path / "rendered"))
    assert code == 0 and json.loads(out) and _files(run) == before
    written = {p.name for p in (tmp_path / "rendered").iterdir()}
    assert "report.md" in written and "time_fwd.png" in written
    code, _, err = run_cli(capsys, "report", str(run), "--out", str(run / "report.md"))
    assert code == 2 and "cannot write a report there" in err and _files(run) == before


def test_interrupted_bench_keeps_rows_and_resume_finishes(tmp_path, capsys, monkeypatch,
                                                          interrupt):
    folder = tmp_path / "run"
    real = runner.prepare
    seen = interrupt(3)
    code, _, err = run_cli(capsys, *BENCH, "--out", str(folder))
    assert code == 130 and "--resume" in err
    assert len(results.read_rows(folder / "measurements.csv")) == 3
    assert (folder / "report.md").exists()  # the report of what exists

    measured = []
    monkeypatch.setattr(runner, "prepare", lambda case, *a, **k: measured.append(case) or
                        real(case, *a, **k))
    code, _, _ = run_cli(capsys, *BENCH, "--out", str(folder), "--resume")
    assert code == 0 and len(measured) == 7
    assert not {c.key() for c in measured} & {c.key() for c in seen}
    assert len(results.read_rows(folder / "measurements.csv")) == 10


def test_a_gpu_fault_is_one_line_naming_the_case_and_how_to_go_on(tmp_path, capsys,
                                                                monkeypatch):
    folder = tmp_path / "run"
    real = runner.prepare

    def fault_on_conv2(case, *args, **kw):
        if case.layer == "conv2":
            raise runner.NotMeasured("failed", "CUDA error: an illegal memory access was "
                                     "encountered", fatal=True)
        return real(case, *args, **kw)

    monkeypatch.setattr(runner, "prepare", fault_on_conv2)
    code, _, err = run_cli(capsys, *BENCH, "--out", str(folder), "--quiet")
    lines = [line for line in err.splitlines() if not line.startswith("convbench: warning:")]
    assert code == 1 and len(lines) == 3  # the rows line, the summary, the fault's
    assert lines[1].startswith("convbench: 3 cases in ")  # (and a warning if the machine is busy)
    line = err.splitlines()[-1]
    assert line.startswith("convbench: error: conv2 torch-cpu fwd nhwc faulted the GPU (")
    assert line.endswith(f"continue after it with --resume --out {folder}")
    assert len(results.read_rows(folder / "measurements.csv")) == 3


def test_list_shows_the_catalogs_and_support(capsys):
    code, out, _ = run_cli(capsys, "list")
    assert code == 0
    for text in ("## catalogs", "| resnet50 ", "| convset ", ("## backend numpy on alexnet: "
                 "available"), "torch-cpu", "## backend cuda on alexnet"):
        assert text in out
    assert len(out.splitlines()) < 100
    code, out, _ = run_cli(capsys, "list", "--net", "resnet50")
    assert code == 0 and "## resnet50" in out and "res5_3x3" in out


def test_kernels_hands_its_arguments_to_the_gate(monkeypatch):
    from convbench.cli import kernels as cli_kernels

    monkeypatch.setattr(cli_kernels, "main", lambda argv: 40 + len(argv))
    assert cli.main(["kernels", "a", "--b"]) == 42


class Tty:
    """A stream that says it is a terminal."""

    def __init__(self, tty: bool):
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> None:
        self.text += s

    def flush(self) -> None:
        pass


def test_progress_is_a_bar_on_a_terminal_and_a_line_per_case_elsewhere():
    row = {"layer": "conv2", "pass": "fwd", "layout": "nchw", "algo": "gemm", "status": "ok",
           "median_ms": 12.345, "noisy": True, "contended": False, "throttled": ""}
    for tty, quiet in ((True, False), (False, False), (False, True)):
        stream = Tty(tty)
        progress = cli.Progress(2, stream, quiet=quiet)
        progress(row)
        progress({**row, "status": "unsupported"})
        progress.close()
        if quiet:
            assert stream.text == ""
        elif tty:
            assert stream.text.startswith("\r[1/2] conv2 fwd nchw gemm: 12.35 ms (noisy)")
            assert "\r[2/2]" in stream.text and stream.text.endswith("\n")
        else:
            lines = stream.text.splitlines()
            assert len(lines) == 2 and "\r" not in stream.text
            assert lines[0].startswith("[1/2] conv2 fwd nchw gemm: 12.35 ms (noisy)  elapsed")
            assert lines[1].startswith("[2/2] conv2 fwd nchw gemm: unsupported  elapsed")


def test_resume_refuses_a_results_file_with_other_columns(tmp_path, capsys):
    folder = tmp_path / "old"
    folder.mkdir()
    old_header = [c for c in results.COLUMNS if c not in ("peak_bytes", "memory_method")]
    (folder / "measurements.csv").write_text(",".join(old_header) + "\n")
    (folder / "env.json").write_text(json.dumps({"run": {"argv": BENCH}}))
    code, _, err = run_cli(capsys, *BENCH, "--out", str(folder), "--resume")
    assert code == 2 and err.count("\n") == 1 and "has other columns" in err


def test_every_subcommand_has_working_help(capsys):
    commands = [a for a in cli.build_parser()._subparsers._group_actions[0].choices]
    assert {"layer", "bench", "sweep", "report", "compare", "list", "advise"} <= set(commands)
    for command in commands:
        if command == "kernels":  # its own parser, in convbench.cuda.kernels
            continue
        with pytest.raises(SystemExit) as exc:
            cli.main([command, "--help"])
        assert exc.value.code == 0, command
        assert "usage:" in capsys.readouterr().out


def _numeric_options():
    """(command, option, its type) of every option that parses a number or a size."""
    sub = next(a for a in cli.build_parser()._actions if a.choices and "layer" in a.choices)
    for command, parser in sub.choices.items():
        for action in parser._actions:
            if action.type is not None and action.type not in (str, Path) \
                    and action.option_strings:
                yield command, action.option_strings[0], action.type


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "-1", "0", "1e999", "", "x"])
def test_every_numeric_option_refuses_what_is_no_count_size_or_time(text):
    """The class of `--budget nan`: every numeric option of every command is checked where it
    is parsed, so nothing absurd reaches a measurement."""
    import argparse

    options = list(_numeric_options())
    assert len(options) >= 15  # --budget, --batch, --memory-limit, ... of every command
    for command, option, kind in options:
        if kind is common.seed and text == "0":
            assert kind(text) == 0  # a seed may be 0; everything else here is refused
            continue
        with pytest.raises(argparse.ArgumentTypeError):
            kind(text)
            pytest.fail(f"{command} {option} took {text!r}")


def test_a_problem_larger_than_any_machine_is_an_oom_row_saying_what_it_needs(capsys):
    code, out, _ = run_cli(capsys, "layer", "n=99999999,c=99999,h=9999,w=9999,k=64,r=3,s=3",
                             "--algos", "all", "--passes", "fwd", "--layouts", "nchw",
                             "--format", "json")
    rows = json.loads(out)
    assert code == 0 and rows and {r["status"] for r in rows} == {"oom"}
    assert all(r["reason"].startswith("its operands need 3") and " EiB, more than the " in
               r["reason"] and r["reason"].endswith("this device has") for r in rows)


def test_a_workspace_larger_than_the_machine_is_an_oom_row_before_it_is_allocated(capsys):
    """Operands that fit (256 MiB of input) but an im2col matrix that does not (993 GiB): the
    row says what the case would need, and nothing was allocated for it (on the host an
    allocation the kernel cannot back would be touched into the out-of-memory killer)."""
    code, out, _ = run_cli(capsys, "layer", "n=1,c=64,h=1024,w=1024,k=1,r=63,s=63,pad=31",
                           "--algos", "gemm", "--passes", "fwd", "--layouts", "nchw",
                           "--format", "json")
    (row,) = json.loads(out)
    assert code == 0 and row["status"] == "oom", row
    assert row["reason"].startswith("OverLimit: its operands and workspace need ") and \
        row["reason"].endswith("this device has"), row


# --- resuming with the run's own options ------------------------------------------------------
SMALL = ["bench", "--algos", "torch-cpu", "--batch", "2", "--passes", "fwd", "--layouts",
         "nhwc", "--quiet", *FAST]


def interrupted_run(tmp_path, capsys, interrupt, after: int = 2) -> Path:
    folder = tmp_path / "run"
    interrupt(after)
    code, _, err = run_cli(capsys, *SMALL, "--out", str(folder))
    assert code == 130 and err.splitlines()[-1].endswith(f"--resume --out {folder}")
    return folder


def test_resume_without_options_finishes_the_run_as_it_was_asked(tmp_path, capsys, monkeypatch,
                                                                 interrupt):
    folder = interrupted_run(tmp_path, capsys, interrupt)
    monkeypatch.setattr(runner, "prepare", REAL_PREPARE)
    code, _, err = run_cli(capsys, "bench", "--resume", "--out", str(folder), "--quiet")
    assert code == 0, err
    df, env = results.load_run(folder)
    assert len(df) == 5 and set(df["n"]) == {2}  # the run's batch 2, not the default 8
    assert env["schema"] == results.SCHEMA and "argv" not in env["run"]
    assert env["run"]["subcommand"] == "bench" and env["run"]["algos"] == ["torch-cpu"]
    assert env["run"]["batches"] == [2] and env["run"]["layouts"] == ["nhwc"]
    assert [r["when"] for r in env["load"]] == ["start", "end", "resumed start", "end"]


def test_resume_with_a_contradicting_option_is_one_line_and_writes_nothing(tmp_path, capsys,
                                                                          interrupt,
                                                                          monkeypatch):
    folder = interrupted_run(tmp_path, capsys, interrupt)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    for argv, expected in (
            (["bench", "--batch", "8"], "--batch 8 contradicts the run in {f}, made with --batch 2"),
            (["bench", "--algos", "gemm"], ("--algos gemm contradicts the run in {f}, made with "
                                           "--algos torch-cpu")),
            (["bench", "--threads", "9"], ("--threads 9 contradicts the run in {f}, made with "
                                          "--threads")),
            (["layer", TINY], "{f} was made by `convbench bench`, not `convbench layer`")):
        code, out, err = run_cli(capsys, *argv, "--resume", "--out", str(folder))
        line = expected.format(f=folder)
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert err.startswith("convbench: error: " + line), err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    # the run's own options, given again, are no contradiction
    monkeypatch.setattr(runner, "prepare", REAL_PREPARE)
    code, _, err = run_cli(capsys, *SMALL, "--resume", "--out", str(folder))
    assert code == 0, err


def test_resume_names_the_default_batch_a_run_was_made_at(tmp_path, capsys, interrupt):
    """#45: a run given no --batch ran at the device's default; --batch other than it names
    that batch, not a blank."""
    folder = tmp_path / "run"
    interrupt(2)
    no_batch = [a for a in SMALL if a not in ("--batch", "2")]
    code, _, _ = run_cli(capsys, *no_batch, "--out", str(folder))
    assert code == 130
    code, out, err = run_cli(capsys, "bench", "--batch", "2", "--resume", "--out", str(folder))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert (f"--batch 2 contradicts the run in {folder}, made without --batch, at the default "
            "batch 8 (env.json)") in err, err


def as_schema_0(folder: Path, argv: bool = True) -> None:
    """Make `folder`'s env.json one from before run specs: no schema, the run as its command
    line (`argv`, or before that only the `command`) and what it resolved."""
    env = json.loads((folder / "env.json").read_text())
    del env["schema"]
    run = env["run"]
    for name in ("subcommand", "layers", "problems", "model", "input", "classes", "sample",
                 "seed", "batches"):
        del run[name]
    if argv:
        run["argv"] = [*SMALL, "--out", str(folder)]
    (folder / "env.json").write_text(json.dumps(env))


@pytest.mark.parametrize("argv", [True, False], ids=["argv", "command"])
def test_resume_of_a_folder_from_before_run_specs_reads_its_command(tmp_path, capsys, interrupt,
                                                                    monkeypatch, argv):
    folder = interrupted_run(tmp_path, capsys, interrupt)
    as_schema_0(folder, argv)
    code, _, err = run_cli(capsys, "bench", "--batch", "8", "--resume", "--out", str(folder))
    assert code == 2 and err.startswith("convbench: error: --batch 8 contradicts the run"), err
    monkeypatch.setattr(runner, "prepare", REAL_PREPARE)
    code, _, err = run_cli(capsys, "bench", "--resume", "--out", str(folder), "--quiet")
    assert code == 0, err
    df, env = results.load_run(folder)
    assert len(df) == 5 and set(df["n"]) == {2} and set(df["layout"]) == {"nhwc"}
    assert "schema" not in env  # the folder keeps the env.json of its first start


def test_resume_of_a_folder_a_newer_convbench_wrote_is_one_line(tmp_path, capsys, interrupt,
                                                                 monkeypatch):
    folder = interrupted_run(tmp_path, capsys, interrupt)
    env = json.loads((folder / "env.json").read_text())
    env["schema"] = results.SCHEMA + 1
    (folder / "env.json").write_text(json.dumps(env))
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    monkeypatch.setattr(runner, "prepare", lambda *a, **k: pytest.fail("measured"))
    for argv in (["bench", "--resume", "--out", str(folder)], ["report", str(folder)]):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert err.startswith(f"convbench: error: {folder / 'env.json'} has schema "
                              f"{results.SCHEMA + 1}, newer than this convbench reads"), err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_a_run_ends_on_a_summary_line(tmp_path, capsys):
    code, _, err = run_cli(capsys, "layer", TINY, "--algos", "torch-cpu,fft", "--passes", "fwd",
                           "--layouts", "nhwc", "--quiet", *FAST)
    lines = err.splitlines()
    if lines[-1].startswith("convbench: warning: ") and "contended" in lines[-1]:
        lines.pop()  # the machine running the tests was busy: the warning follows the summary
    last = lines[-1]
    assert code == 0 and last.startswith("convbench: 2 cases in 0m")
    # both run; how many are noisy or contended is the machine's (the old check, `... or
    # "noisy" in last`, held for any line)
    assert re.search(r"2 ok, 0 inexact, 0 unsupported, 0 failed, 0 oom; [0-2] noisy, "
                     r"[0-2] contended, "
                     r"0 throttled, 0 host-bound$", last), last


def test_threads_and_target_noise_are_recorded_and_checked(tmp_path, capsys):
    folder = tmp_path / "run"
    code, _, _ = run_cli(capsys, "layer", TINY, "--algos", "torch-cpu", "--passes", "fwd",
                         "--layouts", "nhwc", "--threads", "1", "--target-noise", "5%",
                         "--out", str(folder), "--quiet", *FAST)
    env = json.loads((folder / "env.json").read_text())
    assert code == 0 and env["run"]["threads"] == 1 and env["run"]["target_noise"] == 0.05
    assert env["threads"]["threads"] == 1 and env["threads"]["set_by"] == "--threads"
    assert env["threads"]["torch"] == 1
    for bad in (["--threads", "0"], ["--target-noise", "0"], ["--target-noise", "150"],
                ["--target-noise", "two"]):
        code, _, err = run_cli(capsys, "layer", TINY, *bad)
        assert code == 2 and err.count("\n") == 1, err


def test_a_reader_that_leaves_the_pipe_ends_the_command_quietly(tmp_path):
    """`convbench report RUN --format json | head -1`: no BrokenPipeError traceback."""
    from convbench.catalogs.layers import Layer
    from convbench.core.measurement import Measurement
    from convbench.core.problem import ConvProblem

    folder = tmp_path / "run"  # more rows than a pipe buffers (64 KiB of JSON and more)
    sink = results.CsvSink(folder / results.RESULTS_CSV)
    layers = [Layer("t", f"l{i}", ConvProblem(n=1, c=2, h=6, w=6, k=3, r=3, s=3)) for i in range(40)]
    for case in runner.sweep(layers, ["gemm"], "numpy", ["fwd"], ["nchw"], ["fp32"]):
        sink.append(runner.row(case, "ok", m=Measurement(tuple(1 + i / 1000 for i in range(400)))))
    proc = subprocess.Popen([sys.executable, "-m", "convbench", "report", str(folder),
                             "--format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline() == b"[\n"
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in err, err


def test_ctrl_c_outside_a_run_is_one_line_and_130(monkeypatch, capsys):
    """Ctrl-C before a run's own handling (the machine's ceilings measured for a new folder,
    seen so): one line and exit 130, no traceback."""
    from convbench import cli

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.measure, "cmd_layer", interrupted)
    assert cli.main(["layer", "conv3", "--algos", "gemm"]) == 130
    err = capsys.readouterr().err
    assert err == "convbench: interrupted\n"


@pytest.mark.parametrize("command, option, value, needs", [
    ("layer", "--time-budget", "0.5", []), ("bench", "--time-budget", "0.5", []),
    ("sweep", "--time-budget", "0.5", []), ("gpu-check", "--time-budget", "0.5", []),
    ("train-step", "--time-budget", "0.5", []),
    ("tune", "--time-budget", "0.5", ["--model", "m:f", "--input", "1,3,8,8"]),
    ("memplan", "--memory-budget", "2GiB", []), ("memprofile", "--memory-budget", "2GiB", []),
])
def test_a_budget_is_named_by_what_it_counts_and_the_old_spelling_still_reads(command, option,
                                                                            value, needs):
    """`--budget` meant seconds in some commands and bytes in others: each meaning has its
    name, listed in --help; `--budget` is still read, unlisted, as the one it meant there."""
    sub = cli.build_parser()._subparsers._group_actions[0].choices[command]
    dest = option.removeprefix("--").replace("-", "_")
    new, old = (sub.parse_args([*needs, o, value]) for o in (option, "--budget"))
    assert getattr(new, dest) == getattr(old, dest) and getattr(new, dest) is not None
    text = sub.format_help()
    assert option in text and "--budget" not in text
