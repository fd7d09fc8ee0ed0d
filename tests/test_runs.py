"""A run folder made through the library alone: cases, environment, rows, report, resume."""

import json

import pytest

from convbench import runs
from convbench.core import results
from convbench.core.problem import LAYOUTS
from convbench.core.runspec import RunSpec
from convbench.machine import backends, devices
from convbench.measure import runner
from convbench.measure.timing import TARGET_NOISE
from convbench.runs.run import device_ceilings, layer_at, sweep_cases

TINY = "n=1,c=2,h=6,w=6,k=3,r=3,s=3,pad=1"
BUDGET = 0.002
#: Two layers at batch 1, fwd in both layouts: two competing groups of two cases each.
SPEC = RunSpec(device="cpu", algos=("torch-cpu",), passes=("fwd",), layouts=LAYOUTS,
               precisions=("fp32",), budget_s=BUDGET, target_noise=TARGET_NOISE,
               net="alexnet", layers=(TINY, "alexnet:conv3"), batches=(1,))


def tiny_cases():
    return runs.cases(SPEC)


def test_sweep_cases_take_the_batch_and_keep_a_spec_s_own():
    device = devices.resolve("cpu")
    cases = tiny_cases()
    assert [(c.layer, c.problem.n, c.layout) for c in cases] == [
        (TINY, 1, "nchw"), (TINY, 1, "nhwc"), ("conv3", 1, "nchw"), ("conv3", 1, "nhwc")]
    defaults = sweep_cases([TINY, "conv3"], "alexnet", [None], device, ["gemm"], ["fwd"],
                                ["nchw"], ["fp32"])
    assert [c.problem.n for c in defaults] == [1, device.batch]
    with pytest.raises(ValueError, match="unknown layer 'conv9' in alexnet"):
        sweep_cases(["conv9"], "alexnet", [None], device, ["gemm"], ["fwd"], ["nchw"],
                         ["fp32"])


def test_a_run_folder_from_the_library(tmp_path):
    cases = tiny_cases()
    env = runs.environment(SPEC, cases, command="a test")
    assert env["run"]["algos"] == ["torch-cpu"] and env["run"]["layouts"] == list(LAYOUTS)
    folder = results.RunFolder.open(tmp_path / "run", env)
    outcome = runs.Run(SPEC, cases, folder).measure()
    assert not outcome.interrupted and outcome.skipped == 0
    assert len(outcome.frame) == 4 and set(outcome.frame["status"]) == {"ok"}
    assert (tmp_path / "run" / "report.md").read_text() == outcome.report
    df, stored = results.load_run(tmp_path / "run")
    assert len(df) == 4 and stored["run"]["command"] == "a test"

    with pytest.raises(results.FolderInUse, match="already holds results"):
        results.RunFolder.open(tmp_path / "run", env)
    resumed = results.RunFolder.open(tmp_path / "run", {"another": "env"}, resume=True)
    assert resumed.env == stored and len(resumed.measured) == 4
    assert runs.Run(SPEC, cases, resumed).todo == []
    assert json.loads((tmp_path / "run" / results.ENV_JSON).read_text()) == stored


def test_an_interrupted_run_keeps_its_rows_and_writes_its_report(tmp_path, monkeypatch,
                                                                interrupt):
    cases = tiny_cases()
    real = runner.prepare
    interrupt(2)
    folder = results.RunFolder.open(tmp_path / "run", runs.environment(SPEC, cases))
    outcome = runs.Run(SPEC, cases, folder).measure()
    assert outcome.interrupted and len(outcome.frame) == 2
    assert "## Time per layer" in (tmp_path / "run" / "report.md").read_text()
    monkeypatch.setattr(runner, "prepare", real)
    rest = runs.Run(SPEC, cases, results.RunFolder.open(tmp_path / "run", {}, resume=True))
    assert [c.key() for c in rest.todo] == [c.key() for c in cases[2:]]


def test_an_interrupt_after_the_last_row_still_writes_the_report(tmp_path, monkeypatch):
    """Ctrl-C (or a deadline's SIGINT) while the run notes the machine's load at its end (a
    reading that sleeps a window): that reading is left out, the run counts as interrupted, and
    the report from every row is still written (an H200 run lost it so)."""
    from convbench.machine import contention

    cases = tiny_cases()
    folder = results.RunFolder.open(tmp_path / "run", runs.environment(SPEC, cases))
    run = runs.Run(SPEC, cases, folder)

    def interrupted_reading(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(contention, "machine_load", interrupted_reading)
    outcome = run.measure()
    assert outcome.interrupted and len(outcome.frame) == 4
    assert "## Time per layer" in (tmp_path / "run" / "report.md").read_text()


def test_without_a_folder_the_rows_come_back(tmp_path):
    cases = tiny_cases()
    outcome = runs.Run(SPEC, cases[:1]).measure()
    assert outcome.report is None and list(outcome.frame.columns) == list(results.COLUMNS)


def test_devices_say_what_is_wrong():
    with pytest.raises(ValueError, match="unknown device 'tpu'; valid: cpu, cuda, emu"):
        devices.resolve("tpu")
    assert devices.resolve(None).name == devices.default_device()
    assert devices.of_backend("numpy").name == "cpu"
    if backends.available("cuda") is not None:
        with pytest.raises(ValueError, match="^cuda: .*; valid here: cpu"):
            devices.resolve("cuda")


def test_a_gpu_fault_ends_the_run_with_its_row_kept(tmp_path, monkeypatch):
    """A case that faults the GPU ends the run (nothing later could run in this process): its
    row is kept as failed, the report is written, and a resumed run continues after it. Its
    competitor, prepared but not yet timed beside it, is measured by the resumed run."""
    cases = tiny_cases()
    real = runner.prepare

    def fault_at_2(case, *args, **kw):
        if case is cases[1]:
            raise runner.NotMeasured("failed", "CUDARuntimeError: cudaErrorIllegalAddress: an "
                                     "illegal memory access was encountered", fatal=True)
        return real(case, *args, **kw)

    monkeypatch.setattr(runner, "prepare", fault_at_2)
    folder = results.RunFolder.open(tmp_path / "run", runs.environment(SPEC, cases))
    outcome = runs.Run(SPEC, cases, folder).measure()
    assert outcome.fault.startswith(f"{TINY} torch-cpu fwd nhwc faulted the GPU")
    assert list(outcome.frame["status"]) == ["failed"]
    assert (tmp_path / "run" / "report.md").exists()
    rest = runs.Run(SPEC, cases, results.RunFolder.open(tmp_path / "run", {}, resume=True))
    assert [c.key() for c in rest.todo] == [c.key() for c in [cases[0], *cases[2:]]]


def test_a_problem_list_keeps_each_problems_own_batch_unless_one_is_given():
    from convbench.catalogs import layers

    cpu = devices.resolve("cpu")
    first = layers.net_layers("deepbench-train")[0]
    assert layer_at(f"deepbench-train:{first.name}", "alexnet", None, cpu).problem == \
        first.problem
    assert layer_at(f"deepbench-train:{first.name}", "alexnet", 3, cpu).problem.n == 3
    assert layer_at("alexnet:conv2", "alexnet", None, cpu).problem.n == cpu.batch
    counted = layer_at(layers.Layer("f", "x*4", first.problem, 4), "alexnet", 2, cpu)
    assert counted.count == 4 and counted.problem.n == 2


# --- the device's ceilings: in env.json, guarding the run ---------------------------------------
def test_env_json_carries_the_ceilings_of_the_run_s_device_and_threads(tmp_path, monkeypatch):
    """The ceilings `ceilings.measure` gives for the run's backend and thread count (conftest's
    fake here), stored whole; the run reads them back from the folder to guard its rows."""
    from convbench.machine import threads
    from convbench.measure import ceilings

    asked = []
    fake = ceilings.measure
    monkeypatch.setattr(ceilings, "measure",
                        lambda device, n: asked.append((device, n)) or fake(device, n))
    cases = tiny_cases()
    env = runs.environment(SPEC, cases)
    assert asked == [("numpy", threads.count())]
    assert ceilings.Ceilings.from_dict(env["ceilings"]) == fake("numpy", threads.count())
    assert env["ceilings_note"] is None
    folder = results.RunFolder.open(tmp_path / "run", env)
    assert runs.Run(SPEC, cases, folder).ceilings == ceilings.from_env(env)
    _, stored = results.load_run(tmp_path / "run")
    assert stored["ceilings"] == env["ceilings"]


def test_the_emu_backend_s_ceilings_are_said_to_be_the_cpu_s():
    record, note = device_ceilings("emu", 1)
    assert record["device"] == "cpu" and "the CPU's ceilings" in note


def test_ceilings_that_cannot_be_measured_are_none_with_the_reason(monkeypatch):
    from convbench.measure import ceilings

    def no_gpu(device, n):
        raise ModuleNotFoundError("No module named 'cupy'")

    monkeypatch.setattr(ceilings, "measure", no_gpu)
    cases = tiny_cases()
    env = runs.environment(SPEC, cases)  # the run goes on
    assert env["ceilings"] is None
    assert env["ceilings_note"] == "not measured: ModuleNotFoundError: No module named 'cupy'"
    assert runs.Run(SPEC, cases).ceilings is None


def test_a_run_whose_rows_beat_its_ceilings_records_them_failed_never_a_win(tmp_path):
    """Ceilings far below what the rows reach: every row is `failed` by the guard, so the
    report names no winner and advice has nothing to advise."""
    import dataclasses

    from convbench.analysis import report
    from convbench.measure import ceilings
    from convbench.planning import advice

    cases = tiny_cases()
    env = runs.environment(SPEC, cases)
    env["ceilings"] = dataclasses.replace(ceilings.from_env(env), gflops_attainable=1e-9,
                                          gflops_peak_theoretical=None).to_dict()
    outcome = runs.Run(SPEC, cases, results.RunFolder.open(tmp_path / "run", env)).measure()
    assert set(outcome.frame["status"]) == {"failed"}
    assert all(r.startswith("implausible: timed at") for r in outcome.frame["reason"])
    assert set(report.winner_table(outcome.frame)["verdict"]) == {report.UNDECIDED_NONE}
    assert advice.advise(outcome.frame).passes == {}
    assert "## Not measured" in outcome.report and "implausible" in outcome.report


def test_tests_get_fake_ceilings_measured_in_no_time():
    import time

    from convbench.measure import ceilings

    start = time.perf_counter()
    c = ceilings.measure("cpu", 2)
    assert time.perf_counter() - start < 0.1 and c.model.startswith("test fake")


def test_a_run_in_a_subprocess_reads_the_fake_from_the_session_s_cache():
    """The CLI or torchrun's ranks, which conftest's monkeypatch does not reach, find the fake
    in the session's cache ($CONVBENCH_CACHE_DIR) and measure nothing."""
    import os
    import subprocess
    import sys

    code = ("from convbench.measure import ceilings as C\n"
            "C.measure_cpu = C.measure_gpu = None  # measuring would fail\n"
            "print(C.measure('cpu', 1).model)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=os.environ, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("test fake")
