"""The results row as a typed record, and the schema version every reader of a run folder
checks: old folders read (their missing columns empty), newer ones refused in one line."""

import json
import shutil
from pathlib import Path

import pytest
from test_readme import committed_runs

from convbench.analysis import report
from convbench.catalogs.layers import Layer
from convbench.core import results
from convbench.core.measurement import Measurement
from convbench.core.problem import ConvProblem
from convbench.measure import runner

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = [p for p in committed_runs(ROOT) if (p / "measurements.csv").exists()]
#: The oldest committed run: written before the interval, contention and host columns.
OLDEST = ROOT / "results" / "2026-11-21-cpu-2core-alexnet"


def a_row() -> results.Row:
    (case,) = runner.sweep([Layer("t", "l", ConvProblem(n=1, c=2, h=6, w=6, k=3, r=3, s=3))],
                           ["gemm"], "numpy", ["fwd"], ["nchw"], ["fp32"])
    return runner.row(case, "ok", m=Measurement(tuple(1 + i / 100 for i in range(20))))


def test_the_row_record_fixes_the_columns_and_their_kinds():
    assert results.COLUMNS == tuple(results.Row.__annotations__)
    assert results.COLUMNS[:len(results.KEY)] == results.KEY
    assert set(results.INTEGER) <= set(results.NUMERIC)
    assert {"noisy", "contended", "host_bound", "tensor_cores"} == set(results.FLAGS)
    row = a_row()
    assert list(row) == list(results.COLUMNS)
    assert isinstance(row["median_ms"], float) and isinstance(row["n"], int)
    assert row["noisy"] in (True, False) and row["peak_bytes"] is None
    with pytest.raises(ValueError, match="no results column medain_ms"):
        results.new_row(medain_ms=1.0)


def test_frame_types_every_column_as_the_row_says(tmp_path):
    sink = results.CsvSink(tmp_path / results.RESULTS_CSV)
    sink.append(a_row())
    df = results.frame(results.read_rows(tmp_path / results.RESULTS_CSV))
    (r,) = df.to_dict("records")
    assert r["n"] == 1 and r["median_ms"] == pytest.approx(a_row()["median_ms"])
    assert r["noisy"] in (True, False) and r["reason"] == "" and r["stride"] == 1


def test_a_folder_from_before_schema_versions_is_read_as_version_0():
    """The committed run folders from before the schema say none: read as version 0, as they
    are, every column there; those made since say theirs."""
    assert COMMITTED and OLDEST in COMMITTED
    for folder in COMMITTED:
        df, env = results.load_run(folder)
        said = json.loads((folder / results.ENV_JSON).read_text()).get("schema", 0)
        assert results.schema_of(env, folder) == said and list(df.columns) == list(results.COLUMNS)
    assert "schema" not in json.loads((OLDEST / results.ENV_JSON).read_text())
    df, _ = results.load_run(OLDEST)
    assert df["stolen"].isna().all() and set(df["stop"]) == {""}  # columns it lacks: empty
    assert df["contended"].isna().all()


def test_an_old_folder_still_renders_its_report(tmp_path):
    folder = tmp_path / "old"
    shutil.copytree(OLDEST, folder)
    df, env = results.load_run(folder)
    text = report.write(folder, df, env)
    assert "## Which wins" in text and (folder / "report.md").exists()


def test_a_folder_of_a_newer_schema_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "new"
    shutil.copytree(OLDEST, folder)
    env = json.loads((folder / results.ENV_JSON).read_text())
    (folder / results.ENV_JSON).write_text(json.dumps({**env, "schema": results.SCHEMA + 1}))
    rows = (folder / results.RESULTS_CSV).read_bytes()
    with pytest.raises(ValueError) as exc:
        results.load_run(folder)
    assert str(exc.value) == (f"{folder / results.ENV_JSON} has schema {results.SCHEMA + 1}, "
                              f"newer than this convbench reads (up to {results.SCHEMA}): "
                              "upgrade convbench to read it")
    with pytest.raises(ValueError, match="newer than this convbench reads"):
        results.RunFolder.open(folder, {}, resume=True)
    assert (folder / results.RESULTS_CSV).read_bytes() == rows
    (folder / results.ENV_JSON).write_text(json.dumps({**env, "schema": "one"}))
    with pytest.raises(ValueError, match="which is no schema version"):
        results.load_run(folder)


def test_a_new_folder_says_its_schema(tmp_path):
    folder = results.RunFolder.open(tmp_path / "run", {"run": {}})
    assert folder.env["schema"] == results.SCHEMA
    env = json.loads((tmp_path / "run" / results.ENV_JSON).read_text())
    assert env["schema"] == results.SCHEMA
