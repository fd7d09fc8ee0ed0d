"""`convbench gpu-check` and `gpu-check --tests` in their dry forms (on the CPU, a tiny batch):
the two commands the first GPU session runs, kept working by CI, also with the optional
packages hidden."""

import contextlib
import importlib.abc
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from test_cli import run_cli

from convbench import cli
from convbench.algos import registry
from convbench.analysis.report import plots as report_plots
from convbench.catalogs.layers import net_layers
from convbench.core import results
from convbench.machine.devices import DEVICES
from convbench.measure import runner
from convbench.runs import gpucheck

#: The classes' sample runs gemm beside torch: direct's depthwise and grouped kernels compile
#: for seconds each where the disk cache is cold, and test_depthwise checks them; here the
#: sample's shape is what is checked.
DRY = ["gpu-check", "--device", "cpu", "--batch", "1", "--budget", "0.002", "--layers", "conv3",
       "--sample", "3", "--class-algos", "gemm,torch-cpu", "--models", "none"]
#: One gpu test, its file named so that pytest collects that file alone (seconds, not the
#: whole suite's collection each time)
TESTS = ["--pytest-args",
         "tests/test_timing.py -m gpu -q -p no:cacheprovider -k cuda_timer_flushes"]
ROOT = Path(__file__).resolve().parent.parent


def _no_plots(monkeypatch) -> None:
    """The run reports draw no plots, as without matplotlib: the plots took a third of each
    check here, and the reports' plots are tested with the report (test_report) and, from a
    gpu-first run, by `test_gpu_first_dry_form_finishes_and_packs_at_most_eight_files`."""
    monkeypatch.setattr(report_plots, "pyplot", lambda: None)


@pytest.fixture
def plots():
    """The run reports draw their plots, for this test (`_no_plots`)."""


@pytest.fixture(autouse=True)
def _plots_off(request, monkeypatch):
    """No plots unless the test uses `plots`."""
    if "plots" not in request.fixturenames:
        _no_plots(monkeypatch)


@pytest.fixture(scope="module")
def dry_check(tmp_path_factory):
    """One dry check (`DRY`) into a folder of its own: (folder, exit code, stdout, stderr).
    The tests that read, resume or extend a finished check copy it rather than measure again
    (a dry check takes 20-30 s here). Made before any test's own fixtures, it takes two of
    theirs itself: no plots, and Winograd's GEMM transforms (conftest's `_gemm_winograd`:
    compiled, its transforms for conv3's three passes and two tiles took 100 s of a clean
    machine's dry check)."""
    from convbench.algos import winograd_jit

    folder = tmp_path_factory.mktemp("dry") / "check"
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as monkeypatch, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        _no_plots(monkeypatch)
        monkeypatch.setattr(winograd_jit, "MIN_BYTES", 1 << 62)
        code = cli.main([*DRY, "--out", str(folder)])
    return folder, code, out.getvalue(), err.getvalue()


def _copy(dry_check, tmp_path) -> Path:
    folder, code, _, err = dry_check
    assert code == 0, err
    return Path(shutil.copytree(folder, tmp_path / "check"))


def test_the_run_leaves_its_folder_and_summary_and_resumes(tmp_path, capsys, dry_check):
    folder, code, out, err = dry_check
    assert code == 0, err
    assert {p.name for p in folder.iterdir()} == {"env.json", "run", "classes", "summary.md"}
    df, env = results.load_run(folder / "run")
    assert set(df["layer"]) == {"conv3"} and set(df["n"]) == {1}
    assert set(df["status"]) <= {"ok", "unsupported"}  # every CPU algo, pass and layout
    algos = set(df["algo"])
    assert {"direct", "gemm", "fft", "winograd-2x2", "winograd-4x4", "torch-cpu"} <= algos
    assert len(df) == len(algos) * 3 * 2 and env["run"]["command"].startswith(
        "convbench gpu-check")
    text = (folder / "summary.md").read_text()
    assert out.startswith("# GPU check: ") and text.rstrip("\n") == out.rstrip("\n")
    assert "\n## fp32 (TF32 off)\n" in text  # the run's one precision, its setting named
    for section in ("### Own SGEMM / cuBLAS", "### Best own kernel / cudnn-autotune",
                    "### NCHW / NHWC", "### Achieved FP32 TFLOP/s"):
        assert section in text
    stages = next(ln for ln in text.splitlines() if ln.startswith("- host stages of the run: "))
    assert all(f"{name} " in stages for name in runner.STAGES)
    assert "gpu-check --tests --out" in err and "run/, classes/" in err

    copy = _copy(dry_check, tmp_path)
    code, _, _ = run_cli(capsys, *DRY, "--out", str(copy))
    assert code == 0 and len(results.read_rows(copy / "run" / "measurements.csv")) == len(df)
    assert len(results.read_rows(copy / "classes" / "measurements.csv")) == 3 * 2 * 3 * 2


def test_the_second_part_samples_each_class_the_net_lacks(dry_check):
    """After the net, `classes/`: a stratified sample of convset's depthwise, grouped and
    pointwise problems (one each here), every pass and layout, and its per-class table in
    summary.md."""
    folder, code, _, err = dry_check
    assert code == 0, err
    df, env = results.load_run(folder / "classes")
    assert set(df["algo"]) == {"gemm", "torch-cpu"} and set(df["n"]) == {1}
    assert len(df) == 3 * 2 * 3 * 2 and set(df["status"]) <= {"ok", "unsupported"}
    shapes = df.drop_duplicates("layer")
    assert sorted(("depthwise" if g == c else "grouped" if g > 1 else
                   "pointwise" if (r, s) == (1, 1) else "other")
                  for g, c, r, s in zip(shapes["groups"], shapes["c"], shapes["r"],
                                        shapes["s"], strict=True)) == sorted(gpucheck.CLASSES)
    run = env["run"]
    assert run["net"] == "convset" and run["stratify"] and run["class_counts"] == dict.fromkeys(
        ("pointwise", "grouped", "depthwise"), 1)
    text = (folder / "summary.md").read_text()
    assert "## Depthwise, grouped, pointwise (convset)" in text
    assert "classes/ (classes/report.md): 3 problems of convset (" in text
    section = text.split("## Depthwise, grouped, pointwise (convset)")[1]
    assert "| depthwise" in section and "| best of ours" in section and "torch-cpu" in section


def test_the_classes_table_keeps_each_precision_apart():
    """A second part in fp32 and bf16: its per-class table has a line per precision (a
    speed-up is of one precision's rows), and its head names both."""
    from convbench.core.measurement import Measurement
    from convbench.core.problem import ConvProblem
    from convbench.measure import verify
    from convbench.runs.run import Outcome

    depthwise = ConvProblem(n=1, c=8, h=8, w=8, k=8, r=3, s=3, pad=1, groups=8)
    rows = [runner.row(runner.Case("convset", "dw", depthwise, algo, "cuda", "fwd", "nhwc",
                                   precision), "ok", check=verify.Check(True, 1e-7, 1e-6, 1e-5),
                       m=Measurement((ms,) * 3))
            for precision, scale in (("fp32", 1.0), ("bf16", 0.25))
            for algo, ms in (("cudnn-autotune", 1.0), ("direct", 2.0 * scale))]
    env = {"run": {"precisions": ["fp32", "bf16"], "algos": ["direct", "cudnn-autotune"]}}
    text = gpucheck.classes_markdown(Outcome(results.frame(rows), None, False, 0), env, "cuda",
                                     1.0)
    assert "every pass and layout in fp32, bf16: 4 ok" in text
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
             if line.startswith("| ")]
    direct = [c for c in cells if c[3] == "direct"]
    assert [(c[0], c[8]) for c in direct] == [("fp32", "0.5×"), ("bf16", "2×")]


def test_the_second_part_can_be_left_out(tmp_path, capsys):
    folder = tmp_path / "check"
    code, out, err = run_cli(capsys, *DRY, "--algos", "direct", "--classes", "none", "--out",
                             str(folder))
    assert code == 0, err
    assert {p.name for p in folder.iterdir()} == {"env.json", "run", "summary.md"}
    assert "(convset)" not in out and "classes/" not in err


def test_the_tests_command_adds_its_line_to_the_summary(tmp_path, capsys, dry_check):
    folder = _copy(dry_check, tmp_path)
    code, out, err = run_cli(capsys, *DRY, "--out", str(folder), "--tests", *TESTS)
    assert code == 0, err
    line = ("- tests: `pytest tests/test_timing.py -m gpu -q -p no:cacheprovider -k "
            "cuda_timer_flushes`: 1 skipped")
    assert out.startswith(line)
    text = (folder / "summary.md").read_text()
    assert text.count("- tests: ") == 1 and line in text and "skipped" in (
        folder / "tests.log").read_text()
    code, _, _ = run_cli(capsys, *DRY, "--out", str(folder), "--tests", *TESTS)
    assert code == 0 and (folder / "summary.md").read_text().count("- tests: ") == 1


def test_the_tests_command_needs_no_run(tmp_path, capsys):
    code, out, _ = run_cli(capsys, *DRY, "--out", str(tmp_path / "t"), "--tests", *TESTS)
    assert code == 0 and "1 skipped" in out
    assert {p.name for p in (tmp_path / "t").iterdir()} == {"tests.log"}


def test_bad_input_is_one_line(capsys):
    for argv, words in ((["--layers", "conv9"], "unknown layer 'conv9'"),
                        (["--algos", "magic"], "unknown algo 'magic'"),
                        (["--classes", "magic"], "unknown class 'magic'"),
                        (["--class-algos", "magic"], "unknown algo 'magic'")):
        code, _, err = run_cli(capsys, "gpu-check", "--device", "cpu", *argv)
        assert code == 2 and err.count("\n") == 1 and words in err


def test_the_precisions_reach_the_check_and_the_visit(tmp_path, capsys, monkeypatch):
    """`--precisions` is the check's axis: each command hands its list on, and the check's run
    has a case per precision (fp32 alone where not told)."""
    handed = {}

    def check(folder, device, **kwargs):
        handed["gpu-check"] = kwargs["precisions"]
        raise SystemExit(0)

    def first(out, device, **kwargs):
        handed["gpu-first"] = kwargs["precisions"]
        return gpucheck.First([], "", True)

    monkeypatch.setattr(gpucheck, "run_check", check)
    monkeypatch.setattr(gpucheck, "first", first)
    run_cli(capsys, "gpu-check", "--device", "cpu", "--out", str(tmp_path), "--precisions",
            "fp32,tf32,bf16")
    run_cli(capsys, "gpu-first", "--device", "cpu", "--out", str(tmp_path), "--precisions",
            "bf16")
    assert handed == {"gpu-check": ("fp32", "tf32", "bf16"), "gpu-first": ("bf16",)}
    run_cli(capsys, "gpu-check", "--device", "cpu", "--out", str(tmp_path))
    assert handed["gpu-check"] == ("fp32",)
    registry.load()
    spec = gpucheck.check_spec(DEVICES["cpu"], "alexnet", ["conv3"], "gemm", 1,
                               precisions=("fp32", "bf16"))
    kept = gpucheck.tiled(spec)[1]
    assert spec.precisions == ("fp32", "bf16") and len(kept) == 2 * 3 * 2
    assert {c.precision for c in kept} == {"fp32", "bf16"}
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        gpucheck.check_spec(DEVICES["cpu"], "alexnet", None, None, 1, precisions=("fp8",))


def test_fft_tiled_is_left_out_where_it_never_tiles():
    registry.load()
    conv2, conv1_1 = net_layers("alexnet")[1].problem, net_layers("vgg16")[0].problem
    case = runner.Case("n", "l", conv2, "fft-tiled", "cuda", "fwd", "nchw", "fp32")
    assert gpucheck.never_tiles(case)  # 27x27 with its padding fits one 32x32 tile
    assert not gpucheck.never_tiles(runner.Case("n", "l", conv1_1, "fft-tiled", "cuda", "fwd",
                                                "nchw", "fp32"))
    assert not gpucheck.never_tiles(runner.Case("n", "l", conv2, "fft", "cuda", "fwd", "nchw",
                                                "fp32"))


class _Hide(importlib.abc.MetaPathFinder):
    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ImportError(f"No module named {name!r} (hidden by the test)")


@pytest.fixture
def hidden(monkeypatch):
    """`hidden(*names)`: those packages cannot be imported (and are forgotten) for the test."""
    def hide(*names):
        for name in [m for m in sys.modules if m.split(".")[0] in names]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setattr(sys, "meta_path", [_Hide(names), *sys.meta_path])

    return hide


def test_the_run_without_the_optional_packages_loses_only_what_needs_them(tmp_path, capsys,
                                                                          hidden):
    """Without pyFFTW, matplotlib and tabulate the run still measures every case (fft on
    numpy.fft), writes its report and summary (tables drawn without tabulate) and says the
    plots are skipped."""
    hidden("pyfftw", "matplotlib", "tabulate")
    folder = tmp_path / "check"
    code, out, err = run_cli(capsys, *DRY, "--out", str(folder), "--algos", "fft,gemm")
    assert code == 0, err
    df, _ = results.load_run(folder / "run")
    assert set(df["status"]) == {"ok"} and len(df) == 12
    assert all(n.startswith("numpy.fft (pyFFTW missing)") for n in df[df["algo"] == "fft"]["note"])
    assert "| layer" in out and "Plots skipped: matplotlib is not installed" in (
        folder / "run" / "report.md").read_text()


def test_the_tests_without_hypothesis_skip_only_the_property_tests(tmp_path):
    """`gpu-check --tests` collects every test module without hypothesis: its property tests
    skip, the others in the same modules run (a collection error would lose them all)."""
    script = tmp_path / "nohyp.py"
    script.write_text(
        "import importlib.abc, sys\n"
        "class Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'hypothesis':\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "import pytest\n"
        "sys.exit(pytest.main(sys.argv[1:]))\n")
    proc = subprocess.run(
        [sys.executable, str(script), "-q", "-p", "no:cacheprovider", "-p",
         "no:hypothesispytest", "tests/test_direct_gemm_cpu.py", "-k",
         "random_problems or test_workspaces", "-rs"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "hypothesis is not installed" in proc.stdout and " passed" in proc.stdout


# --- gpu-first --------------------------------------------------------------------------------
FIRST = ["gpu-first", "--device", "cpu", "--batch", "1", "--time-budget", "0.002", "--layers",
         "conv3", "--algos", "direct,gemm", "--models", "none"]


def test_gpu_first_dry_form_finishes_and_packs_at_most_eight_files(tmp_path, capsys, plots):
    """The CI form of a first GPU visit: tests, env and ceilings, the check, the summary, all
    within its wall time, and the folder given holds what comes back from a lent machine."""
    out, work = tmp_path / "out", tmp_path / "work"
    code, stdout, err = run_cli(capsys, *FIRST, "--wall", "300", "--out", str(out),
                                "--work", str(work), *TESTS)
    assert code == 0, err
    files = sorted(p.name for p in out.iterdir())
    assert files == ["gpu-first.log", "gpu-first.tar.gz", "probe.json", "summary.md",
                     "tests.log"]
    assert len(files) <= gpucheck.MAX_FILES and all(
        p.stat().st_size <= gpucheck.MAX_FILE_BYTES for p in out.iterdir())
    with tarfile.open(out / "gpu-first.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"work/env.json", "work/run/measurements.csv", "work/summary.md",
            "work/tests.log", "work/run/time_fwd.png"} <= names
    text = (out / "summary.md").read_text()
    assert text.rstrip("\n") == stdout.rstrip("\n")
    assert "- gpu-first: 300 s of wall time" in text and "1 skipped" in text
    assert "- checked: layers conv3 in this order" in text and "not reached" not in text
    assert "pass and layout in fp32" in text
    for section in ("### The heuristic's regret", "### cuDNN's algorithms one by one",
                    "### Tuning cost"):
        assert section in text
    df, _ = results.load_run(work / "run")
    assert len(df) == 2 * 3 * 2


def test_gpu_first_stops_between_groups_at_its_deadline(tmp_path, monkeypatch):
    """With no time left after the tests, the check stops once its first competing group is
    done (every row of it kept), says what it did not reach, and still packs."""
    monkeypatch.setattr(gpucheck, "run_tests", lambda log, args, timeout_s: (
        log.write_text("1 passed\n"), gpucheck.Tests(0, "1 passed", args, 0.1))[1])
    registry.load()
    done = gpucheck.first(tmp_path / "out", DEVICES["cpu"], work=tmp_path / "work",
                          layers=["conv3"], algos="direct,gemm", batch=1, budget_s=0.002,
                          wall_s=10.0, reserve_s=10.0)
    assert done.ok
    df, _ = results.load_run(tmp_path / "work" / "run")
    assert len(df) == 4 and set(df["pass"]) == {"fwd"}  # one group: 2 algos x 2 layouts
    assert "not reached: conv3 (bwd_data, bwd_filter)" in done.text
    assert "`convbench gpu-check --out" in done.text
    assert {p.name for p in done.files} == {"gpu-first.tar.gz", "summary.md", "tests.log",
                                            "probe.json", "gpu-first.log"}


def test_a_failed_check_still_leaves_the_probe_the_log_and_the_tests(tmp_path, capsys,
                                                                     monkeypatch):
    """The rehearsal of a visit that fails: with the measuring part broken, the folder given
    still holds the probe, the log (with the traceback) and the tests' summary, packed."""
    def broken(*args, **kwargs):
        raise RuntimeError("a planted failure in the measuring part")

    monkeypatch.setattr(gpucheck, "run_check", broken)
    out, work = tmp_path / "out", tmp_path / "work"
    code, _, err = run_cli(capsys, *FIRST, "--wall", "300", "--out", str(out),
                           "--work", str(work), *TESTS)
    assert code != 0
    assert "gpu-first's check failed" in err
    names = {p.name for p in out.iterdir()}
    assert {"probe.json", "gpu-first.log", "tests.log", "summary.md",
            "gpu-first.tar.gz"} <= names
    probe = json.loads((out / "probe.json").read_text())
    assert probe["device"] == "cpu" and "torch" in probe and "packages" in probe
    log = (out / "gpu-first.log").read_text()
    assert "RuntimeError: a planted failure in the measuring part" in log
    assert "Traceback" in log and "tests: started" in log
    summary = (out / "summary.md").read_text()
    assert "the check failed: see gpu-first.log" in summary and "1 skipped" in summary


def test_a_resumed_visit_runs_no_tests_and_continues_the_work_folder(tmp_path, capsys):
    """A second, short call on a still-warm machine: --no-tests, the same --work, the rows
    already there kept and the rest measured."""
    out, work = tmp_path / "out", tmp_path / "work"
    base = ["gpu-first", "--device", "cpu", "--batch", "1", "--time-budget", "0.002",
            "--layers", "conv3", "--wall", "300", "--out", str(out), "--work", str(work),
            "--no-tests"]
    code, _, err = run_cli(capsys, *base, "--algos", "direct")
    assert code == 0, err
    assert len(results.load_run(work / "run")[0]) == 6
    code, stdout, err = run_cli(capsys, *base, "--algos", "direct,gemm")
    assert code == 0, err
    df, _ = results.load_run(work / "run")
    assert len(df) == 12 and "no tests (a resumed visit)" in stdout
    assert "not run (--no-tests)" in stdout


def test_the_tests_at_their_limit_are_interrupted_and_still_summarised(tmp_path):
    """At the time limit pytest gets a SIGINT, as Ctrl-C: it names where it was and prints
    its summary (a SIGKILL left the log with neither)."""
    import signal

    slow = tmp_path / "test_slow_suite.py"
    slow.write_text("import time\n\ndef test_quick():\n    pass\n\n"
                    "def test_slow():\n    time.sleep(60)\n")
    # as in a command a shell started in the background: SIGINT ignored, inherited
    was = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        tested = gpucheck.run_tests(tmp_path / "tests.log", (str(slow), "-v", "-p",
                                                             "no:cacheprovider"), 4.0, 20.0)
    finally:
        signal.signal(signal.SIGINT, was)
    assert tested.returncode == -1 and tested.seconds < 30
    assert tested.line.startswith("interrupted at its limit of 4 s: ")
    assert "1 passed" in tested.line
    log = (tmp_path / "tests.log").read_text()
    assert "KeyboardInterrupt" in log and "test_quick PASSED" in log


#: Tests that pin the reviews' predictions (by node id, as gpu-first once named them): each
#: must stay among the pins its marker selects (a marker lost would be a silent gap).
PINS = ("tests/test_timing.py::", "tests/test_cudnn.py::test_the_first_call_is_timed_once",
        "tests/test_cudnn.py::test_cudnn_peak_excludes_the_warm_up_operands",
        "tests/test_cudnn.py::test_tf32_setting_does_not_leak",
        "tests/test_cudnn.py::test_describe_names_the_fp32_kernel",
        "tests/test_cudnn.py::test_the_row_says_whether_tensor_cores_ran",
        "tests/test_cudnn_find.py::",
        "tests/test_runner.py::test_a_gpu_case_is_verified_on_the_device",
        "tests/test_memory.py::", "tests/test_nn.py::", "tests/test_pinned.py::",
        "tests/test_depthwise.py::test_depthwise_kernel_matches_reference")
SUITES = ("tests/test_gemm_kernels.py::", "tests/test_cudnn.py::test_fp32_matches_reference",
          "tests/test_cudnn.py::test_reduced_precisions_match_reference")


def test_the_first_tests_are_pins_first_and_each_exists():
    """gpu-first asks pytest for its tests by marker (`FIRST_MARKERS`), not by path: collected
    so, every pin comes before every suite, none is left out, and the log names every test
    (-v)."""
    args = list(gpucheck.FIRST_TESTS)
    assert args[:2] == ["-m", gpucheck.FIRST_MARKERS] and "-v" in args
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                           "no:cacheprovider", "-m", gpucheck.FIRST_MARKERS.replace(
                               "gpu and ", ""), "tests"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    kinds = ["pin" if any(i.startswith(p) for p in PINS) else
             "suite" if any(i.startswith(s) for s in SUITES) else i for i in ids]
    assert set(kinds) == {"pin", "suite"}, set(kinds) - {"pin", "suite"}
    assert kinds == sorted(kinds)  # "pin" < "suite": every pin first
    for pin in PINS:
        assert any(i.startswith(pin) for i in ids), pin


def test_the_commands_own_default_gives_pytest_the_marker_expression_whole(tmp_path, capsys,
                                                                        monkeypatch):
    """`gpu-first` and `gpu-check --tests` without `--pytest-args`: what each command hands
    pytest from its own default is the default's arguments, the marker expression one argument
    of `-m` (split into words, pytest took `and` for a path and ran nothing), and pytest
    collecting with them selects the marked tests of a file and deselects the rest."""
    handed = {}

    def first(out, device, **kwargs):
        handed["gpu-first"] = tuple(kwargs["pytest_args"])
        return gpucheck.First([], "", True)

    def tests(folder, pytest_args, timeout_s):
        handed["gpu-check"] = tuple(pytest_args)
        return gpucheck.Tests(0, "1 passed", tuple(pytest_args))

    monkeypatch.setattr(gpucheck, "first", first)
    monkeypatch.setattr(gpucheck, "tests", tests)
    assert run_cli(capsys, "gpu-first", "--device", "cpu", "--out", str(tmp_path))[0] == 0
    assert run_cli(capsys, "gpu-check", "--device", "cpu", "--tests", "--out",
                   str(tmp_path))[0] == 0
    assert handed == {"gpu-first": gpucheck.FIRST_TESTS, "gpu-check": gpucheck.PYTEST_ARGS}
    args = handed["gpu-first"]
    assert args[args.index("-m") + 1] == gpucheck.FIRST_MARKERS
    collected = gpucheck.run_tests(tmp_path / "collect.log",
                                   (*args, "--collect-only", "tests/test_cudnn.py"), 120)
    assert collected.returncode == 0, (tmp_path / "collect.log").read_text()[-2000:]
    assert re.search(r"\d+/\d+ tests collected \(\d+ deselected\)", collected.line), \
        collected.line


def test_packing_counts_its_own_files_and_warns_rather_than_fails(tmp_path, capsys):
    """A wrapper's files in the folder given (its own log, say) are not ours: packing writes
    ours, returns them, and warns that more than come back are there."""
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    (work / "summary.md").write_text("# GPU check\n")
    for i in range(8):
        (out / f"wrapper-{i}.txt").write_text("x")
    files = gpucheck.pack(work, out)
    assert [p.name for p in files] == ["gpu-first.tar.gz", "summary.md"]
    assert "holds 10 entries, 2 of them ours (at most 8 come back)" in capsys.readouterr().err


def test_the_commit_comes_from_the_caller_where_there_is_no_git(monkeypatch):
    """A GPU machine gets the working tree without `.git`: env.json takes the commit the
    caller names."""
    from convbench.measure import envinfo

    def no_git(*args, **kwargs):
        return subprocess.CompletedProcess(args, 128, "", "not a git repository")

    monkeypatch.setattr(envinfo.subprocess, "run", no_git)
    monkeypatch.delenv(envinfo.COMMIT_VARIABLE, raising=False)
    assert envinfo.git_commit() is None
    monkeypatch.setenv(envinfo.COMMIT_VARIABLE, "0123abc")
    assert envinfo.git_commit() == "0123abc"
    monkeypatch.undo()  # a copy with a stale .git (seen on an H200): the caller's word wins
    monkeypatch.setenv(envinfo.COMMIT_VARIABLE, "0123abc")
    assert envinfo.git_commit() == "0123abc"


def test_pytest_args_starting_with_a_dash_are_taken_with_an_equals_sign(tmp_path, capsys):
    code, out, err = run_cli(capsys, "gpu-check", "--device", "cpu", "--tests", "--out",
                             str(tmp_path), "--pytest-args=tests/test_timing.py -m gpu -q "
                             "-p no:cacheprovider -k cuda_timer_flushes")
    assert code == 0, err
    assert "1 skipped" in out


def test_the_whole_step_of_each_model_is_a_section_and_a_folder(tmp_path, monkeypatch):
    """The GPU check's training-step part: each model through `trainstep.compare` in the
    check's configurations, its folder written and its table in the section; a model that
    cannot run is one line, the others run."""
    from test_confirm import Net

    from convbench.cli import gpucheck as cli_gpucheck
    from convbench.planning.plan import Plan
    from convbench.studies import trainstep

    seen = []

    def fake_compare(load, batch, device, **kw):
        seen.append((load.name, batch, device, kw["configs"], kw["algos"], kw["deadline"]))
        if load.net == "broken:model":
            raise ValueError("no module named 'broken'")
        if load.net == "slow:model":
            raise trainstep.OutOfTime("tuning interrupted at the deadline, after 9 s")
        torch_ = __import__("torch")
        plan = __import__("convbench.planning.tune", fromlist=["tune"]).tune(
            Net(), torch_.randn(2, 3, 12, 12), algos="gemm", budget_s=0.001, step=None,
            progress=None, store=tmp_path / "store")
        rows = trainstep.with_speedups([
            {"config": c, "median_ms": 10.0 + i, "iqr_ms": 0.1, "reps": 9, "noisy": False,
             "first_loss": 1.0, "times_ms": [10.0 + i] * 9, "applied": ""}
            for i, c in enumerate(kw["configs"])])
        return rows, plan, 1.0

    monkeypatch.setattr(trainstep, "compare", fake_compare)
    text = cli_gpucheck.model_steps(tmp_path, DEVICES["cpu"],
                                    ["good:model", "broken:model", "slow:model"],
                                    (4, 3, 12, 12), "gemm,torch-cpu", left_s=100.0)
    assert [s[:3] for s in seen] == [("good:model@3,12,12", 4, "cpu"),
                                     ("broken:model@3,12,12", 4, "cpu"),
                                     ("slow:model@3,12,12", 4, "cpu")]
    assert seen[0][3] == ("eager", "cudnn.benchmark", "channels_last", "plan")
    assert seen[0][4] == "gemm,torch-cpu" and seen[0][5] == seen[2][5] is not None
    assert "### slow:model\n\nnot finished: tuning interrupted at the deadline" in text
    assert "### good:model (trainstep-good-model/report.md)" in text and "| eager " in text
    assert "### broken:model\n\nfailed: ValueError: no module named 'broken'" in text
    assert Plan.load(tmp_path / "trainstep-good-model" / "plan.json").backend == "numpy"


def test_a_model_s_tuning_ends_at_the_deadline():
    """A lent GPU's command ends at its limit: a tuning process still running at the deadline
    gets Ctrl-C, and the stage says it did not finish instead of outlasting the command."""
    import time

    from convbench.studies import trainstep

    started = time.monotonic()
    # as `launch.module_command`'s children: Ctrl-C taken even where this worker ignores it
    slow = [sys.executable, "-c", ("import signal, time; "
                                   "signal.signal(signal.SIGINT, signal.default_int_handler); "
                                   "time.sleep(60)")]
    with pytest.raises(trainstep.OutOfTime, match="tuning interrupted at the deadline"):
        trainstep._tuned(slow, None, started + 1.0, started)
    assert time.monotonic() - started < 15
    assert trainstep._tuned([sys.executable, "-c", "pass"], None, None, started) == 0


def test_model_algos_are_checked_in_one_line(capsys):
    from test_cli import run_cli

    code, out, err = run_cli(capsys, "gpu-first", "--out", "x", "--device", "cpu",
                             "--model-algos", "nope")
    assert code == 2 and out == "" and err.count("\n") == 1 and "nope" in err


def test_gpu_first_runs_the_whole_step_only_where_time_is_left(tmp_path, monkeypatch):
    monkeypatch.setattr(gpucheck, "run_tests", lambda log, args, timeout_s: (
        log.write_text("1 passed\n"), gpucheck.Tests(0, "1 passed", args, 0.1))[1])
    registry.load()
    ran = []
    done = gpucheck.first(tmp_path / "out", DEVICES["cpu"], work=tmp_path / "work",
                          layers=["conv3"], algos="direct", batch=1, budget_s=0.002,
                          wall_s=400.0, extra=lambda work, left_s: ran.append((work, left_s)) or "## Step\n",
                          extra_min_s=10.0)
    assert [w for w, _ in ran] == [tmp_path / "work"] and "## Step" in done.text
    assert 10.0 <= ran[0][1] < 400.0  # the seconds it must end within
    ran.clear()
    done = gpucheck.first(tmp_path / "out2", DEVICES["cpu"], work=tmp_path / "work2",
                          layers=["conv3"], algos="direct", batch=1, budget_s=0.002,
                          wall_s=400.0, extra=lambda work, left_s: ran.append(work) or "",
                          extra_min_s=1000.0)
    assert ran == [] and "not run: " in done.text and "under the 1000 s it needs" in done.text


def test_the_deadline_stops_before_a_group_predicted_to_end_past_it():
    """The next group's time is predicted from the last one's per case: the run stops before a
    group that would end past the deadline, not up to a whole group after it."""
    from convbench.measure.rows import row

    layer = next(la for la in net_layers("alexnet") if la.name == "conv3")
    cases = runner.sweep([layer], ["direct", "gemm"], "numpy",
                         ["fwd", "bwd_data", "bwd_filter"], ["nchw"], ["fp32"])
    # fwd ends at 10 s (5 s a case): bwd_data is predicted to take 10 s, to end at 20
    times = iter([0.0, 10.0])
    early = gpucheck._Deadline(cases, 18.0, clock=lambda: next(times))
    early(row(cases[0], "ok", ""))
    with pytest.raises(KeyboardInterrupt):
        early(row(cases[1], "ok", ""))
    assert early.stopped
    times = iter([0.0, 10.0, 14.0])
    late = gpucheck._Deadline(cases, 25.0, clock=lambda: next(times))
    for case in cases[:4]:  # bwd_data took 4 s: bwd_filter is predicted to end at 18
        late(row(case, "ok", ""))
    assert not late.stopped and late.predicted() == 4.0


@pytest.mark.parametrize("command", [["gpu-first", "--out", "x"], ["gpu-check"],
                                     ["gpu-check", "--tests"]])
def test_without_cuda_the_gpu_commands_refuse_in_one_line(tmp_path, capsys, monkeypatch,
                                                          command):
    """No silent CPU run: without --device, a machine where CUDA cannot be used is refused at
    once, naming why; the dry form is asked for by name."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gpucheck, "cuda_refusal", lambda: "no CUDA GPU found")
    code, out, err = run_cli(capsys, *command)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "CUDA cannot be used here: no CUDA GPU found" in err and "--device cpu" in err
    assert list(tmp_path.iterdir()) == []


def test_a_per_thread_default_stream_is_refused(monkeypatch):
    from convbench.algos import cudnn

    monkeypatch.delenv(cudnn.PER_THREAD_STREAM, raising=False)
    assert cudnn.per_thread_stream_refusal() is None
    monkeypatch.setenv(cudnn.PER_THREAD_STREAM, "1")
    assert "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1" in cudnn.per_thread_stream_refusal()
    if gpucheck.backends.available("cuda") is None:
        assert "PER_THREAD" in gpucheck.cuda_refusal()
