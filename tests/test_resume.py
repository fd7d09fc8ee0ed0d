"""`--resume` where there is no run to resume, `--remeasure` of a run's busy rows, and the other
ways a measuring command is refused in one line before it writes anything."""

import csv
from pathlib import Path

import pytest
from test_cli import REAL_PREPARE, TINY, run_cli

from convbench import runs
from convbench.cli import common
from convbench.core import results
from convbench.core.measurement import Measurement
from convbench.machine import threads
from convbench.measure import runner

#: A small run of two competing groups (fwd, bwd_data), two algos each.
RUN = ["layer", TINY, "--algos", "gemm,torch-cpu", "--passes", "fwd,bwd_data", "--layouts",
       "nhwc", "--quiet", "--budget", "0.002"]


def _contents(folder: Path | None) -> dict | None:
    return ({p.name: p.read_bytes() if p.is_file() else "folder" for p in folder.iterdir()}
            if folder and folder.is_dir() else None)


def refused(capsys, argv, expected: str, folder: Path | None = None,
            prog: str = "convbench"):
    """`convbench ARGV` ends in one line starting with `expected`, exit 2, and leaves `folder`
    as it was (or absent)."""
    before = _contents(folder)
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"{prog}: error: {expected}"), err
    assert _contents(folder) == before


def test_resume_of_a_folder_that_does_not_exist_measures_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runner, "prepare", lambda *a, **k: pytest.fail("measured"))
    typo = tmp_path / "runs" / "doesnotexist"
    refused(capsys, ["bench", "--resume", "--out", str(typo)],
            f"--resume: {typo} does not exist: there is no run to resume", typo)
    assert not (tmp_path / "runs").exists()


def test_resume_without_out_names_the_folder_it_needs(tmp_path, capsys, monkeypatch):
    """`bench --resume` once resumed (or started) today's default folder, with whatever
    options it was given: a whole default sweep where there was none."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "prepare", lambda *a, **k: pytest.fail("measured"))
    for command in ("bench", "sweep"):
        refused(capsys, [command, "--resume"], "--resume needs the run folder to finish: --out")
    assert list(tmp_path.iterdir()) == []


def test_resume_of_a_folder_without_its_env_json_adds_nothing(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "run"
    code, _, err = run_cli(capsys, *RUN, "--out", str(folder))
    assert code == 0, err
    monkeypatch.setattr(runner, "prepare", lambda *a, **k: pytest.fail("measured"))
    (folder / results.ENV_JSON).unlink()
    refused(capsys, ["bench", "--resume", "--out", str(folder)],
            f"--resume: {folder} has no env.json, so the options of its run are unknown", folder)
    (folder / results.ENV_JSON).mkdir()  # there, but no file to read
    refused(capsys, ["bench", "--resume", "--out", str(folder)],
            f"--resume: {folder} has no env.json", folder)
    (folder / results.ENV_JSON).rmdir()
    (folder / results.ENV_JSON).write_bytes(b"\xff\xfe not json")
    refused(capsys, ["bench", "--resume", "--out", str(folder)],
            f"--resume: {folder / results.ENV_JSON} cannot be read", folder)


def test_out_naming_a_file_or_a_path_under_one_is_one_line(tmp_path, capsys):
    file = tmp_path / "notes.txt"
    file.write_text("mine\n")
    refused(capsys, [*RUN, "--out", str(file)], f"--out {file}: cannot write a run folder there")
    refused(capsys, [*RUN, "--out", str(file / "run")],
            f"--out {file / 'run'}: cannot write a run folder there")
    assert file.read_text() == "mine\n"


def test_more_threads_than_cores_is_refused_saying_why(tmp_path, capsys):
    cores = threads.available_cores()
    folder = tmp_path / "run"
    refused(capsys, [*RUN, "--threads", str(cores + 1), "--out", str(folder)],
            f"--threads {cores + 1}: this process may run on {cores} cores; more threads than "
            "cores wait on each other and their times would read as contended", folder)
    assert not folder.exists()


def test_remeasure_needs_resume_and_knows_its_flags(tmp_path, capsys):
    refused(capsys, [*RUN, "--remeasure", "busy"], "--remeasure takes rows of a run again")
    refused(capsys, ["layer", "--remeasure", "slow", "--resume", "--out", str(tmp_path)],
            "argument --remeasure: unknown flag 'slow'; valid: busy, noisy",
            prog="convbench layer")


# --- measuring busy rows again ---------------------------------------------------------------
def _rows(folder: Path) -> list[dict]:
    return results.read_rows(folder / results.RESULTS_CSV)


def _verdict(folder: Path, pass_: str) -> str:
    """The report's line of the layer's `pass_` in its table of winners."""
    text = (folder / "report.md").read_text()
    wins = text[text.index("## Which wins"):].split("\n## ")[0]
    (line,) = [x for x in wins.splitlines()
               if [c.strip() for c in x.split("|")[1:3]] == [TINY, pass_]]
    return line


def _plant_busy(folder: Path, algo: str, pass_: str) -> dict:
    """Flag one row of the run as contended (as a busy machine would have); returns it."""
    rows = _rows(folder)
    (busy,) = [r for r in rows if r["algo"] == algo and r["pass"] == pass_]
    busy["contended"] = "True"
    with open(folder / results.RESULTS_CSV, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=results.COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return busy


def test_remeasure_busy_times_the_busy_rows_group_again_and_replaces_its_rows(
        tmp_path, capsys, monkeypatch, interrupt):
    monkeypatch.setattr(Measurement, "contended", property(lambda self: False))  # quiet
    folder = tmp_path / "run"
    code, _, err = run_cli(capsys, *RUN, "--out", str(folder))
    assert code == 0, err
    busy = _plant_busy(folder, "gemm", "fwd")
    code, _, _ = run_cli(capsys, "report", str(folder), "--out", str(folder))
    assert code == 0 and "busy machine" in _verdict(folder, "fwd")
    keys = [results.row_key(r) for r in _rows(folder)]

    # Ctrl-C while the group is timed again: nothing is lost, the busy row is still there
    interrupt(1)
    code, _, err = run_cli(capsys, "layer", "--resume", "--out", str(folder), "--remeasure",
                           "busy")
    assert code == 130, err
    assert [results.row_key(r) for r in _rows(folder)] == keys
    assert [r for r in _rows(folder) if r["contended"] == "True"] == [busy]

    # the group (gemm and torch-cpu fwd, timed together) again, no more
    measured = []
    monkeypatch.setattr(runner, "prepare", lambda case, *a, **k: measured.append(case) or
                        REAL_PREPARE(case, *a, **k))
    code, _, err = run_cli(capsys, "layer", "--resume", "--out", str(folder), "--remeasure",
                           "busy")
    assert code == 0, err
    assert sorted((c.algo, c.pass_) for c in measured) == [("gemm", "fwd"), ("torch-cpu", "fwd")]
    rows = _rows(folder)
    assert [results.row_key(r) for r in rows] == keys  # one row per case, in its place
    assert not [r for r in rows if r["contended"] == "True"]
    fwd = {r["round_group"] for r in rows if r["pass"] == "fwd"}
    assert len(fwd) == 1 and fwd != {busy["round_group"]}  # timed together, anew
    assert "busy machine" not in _verdict(folder, "fwd")  # the report is rewritten
    df, _ = results.load_run(folder)
    assert not df["contended"].any()

    measured.clear()  # nothing busy any more: nothing to measure again
    code, _, err = run_cli(capsys, "layer", "--resume", "--out", str(folder), "--remeasure",
                           "busy")
    assert code == 0 and measured == [], err


def test_replace_row_swaps_one_row_in_one_step(tmp_path):
    path = tmp_path / results.RESULTS_CSV
    sink = results.CsvSink(path)
    old = [{**dict.fromkeys(results.COLUMNS, ""), "layer": f"l{i}", "n": 1, "c": 1, "h": 3,
            "w": 3, "k": 1, "r": 1, "s": 1, "stride": 1, "pad": 0, "dilation": 1, "groups": 1,
            "algo": "gemm", "status": "ok", "median_ms": i} for i in range(3)]
    for r in old:
        sink.append(r)
    results.replace_row(path, {**old[1], "median_ms": 9})
    assert [r["median_ms"] for r in results.read_rows(path)] == ["0", "9", "2"]
    assert not list(tmp_path.glob(".*.tmp"))
    results.replace_row(path, {**old[1], "layer": "l3"})  # a case the file lacks: appended
    assert [r["layer"] for r in results.read_rows(path)] == ["l0", "l1", "l2", "l3"]


def test_the_busy_warning_names_the_command_that_measures_again(tmp_path):
    outcome = runs.Outcome(results.frame([]), None, False, 0,
                           rows=[{"status": "ok", "contended": True}])
    warning = common.busy_warning(outcome, tmp_path / "run")
    assert warning.endswith(f"(--resume --out {tmp_path / 'run'} --remeasure busy)")
    assert common.busy_warning(outcome).endswith("(a new run)")


def test_tune_refuses_more_threads_than_cores_too(capsys):
    cores = threads.available_cores()
    refused(capsys, ["tune", "--model", "convbench.studies.workload:build_model", "--input",
                     "1,3,227,227", "--threads", str(cores + 1)],
            f"--threads {cores + 1}: this process may run on {cores} cores")
