import json
import sys

import pytest

from convbench import report, runner, verify
from convbench.layers import net_layers
from convbench.measurement import Measurement

LAYERS = net_layers("alexnet")[2:4]  # conv3, conv4


def rows(times: dict, algos=("gemm", "winograd-2x2", "torch-cpu")) -> list[dict]:
    """Synthetic rows: `times[(algo, layer)]` is a Measurement, a status word, or missing."""
    out = []
    for case in runner.sweep(LAYERS, algos, "numpy", ["fwd", "bwd_data"], ["nchw"], ["fp32"]):
        got = times.get((case.algo, case.layer), "unsupported")
        if isinstance(got, Measurement):
            chk = verify.Check(True, 1e-7, 1e-6, 1e-5)
            out.append(runner.row(case, "ok", check=chk, m=got, workspace=1 << 20))
        else:
            out.append(runner.row(case, got, f"{got} because"))
    return out


FAST, SLOW = Measurement((1.0, 1.01, 1.02)), Measurement((3.0, 3.1, 3.2))
NOISY = Measurement((2.0, 3.1, 4.0))
TIMES = {("gemm", "conv3"): SLOW, ("winograd-2x2", "conv3"): FAST, ("torch-cpu", "conv3"): NOISY,
         ("gemm", "conv4"): FAST, ("winograd-2x2", "conv4"): "failed",
         ("torch-cpu", "conv4"): "oom"}


def test_time_table_marks_the_best_per_column():
    df = report.frame(rows(TIMES))
    table = report.time_table(df[df["pass"] == "fwd"])
    assert list(table.index) == ["gemm", "winograd-2x2", "torch-cpu"]
    assert list(table.columns) == ["conv3", "conv4"]
    assert table.loc["winograd-2x2", "conv3"] == "1.01" + report.BEST
    assert table.loc["gemm", "conv3"] == "3.1"
    assert table.loc["torch-cpu", "conv3"] == report.NOISY + "3.1"
    assert table.loc["gemm", "conv4"] == "1.01" + report.BEST
    assert table.loc["winograd-2x2", "conv4"] == "failed"
    assert table.loc["torch-cpu", "conv4"] == "oom"


def test_markdown_has_every_section():
    df = report.frame(rows(TIMES))
    text = report.markdown(df, {"run": {"backend": "numpy", "budget_s": 0.5}},
                           ["time_fwd.png"])
    for heading in ("## Time per layer", "### fwd, nchw, fp32", "### bwd_data, nchw, fp32",
                    "## Operation counts", "## Workspace", "## Error", "## Not measured",
                    "## Noisy measurements"):
        assert heading in text
    assert "1.01 *" in text and "![time_fwd](time_fwd.png)" in text
    assert "oom because" in text and "- batch: 256" in text
    assert "2 of 8 measurements have IQR/median > 0.1" in text


def test_op_table_counts_gflop():
    df = report.frame(rows(TIMES))
    table = report.op_table(df)
    conv3 = LAYERS[0].problem
    assert table.loc[("gemm", "fwd"), "conv3"] == f"{conv3.flops / 1e9:.4g}"
    assert table.loc[("torch-cpu", "fwd"), "conv3"] == "n/a"


def test_csv_round_trip_and_json(tmp_path):
    sink = runner.CsvSink(tmp_path / runner.RESULTS_CSV)
    for r in rows(TIMES):
        sink.append(r)
    df, env = report.load_run(tmp_path)
    assert env == {} and len(df) == 12
    assert df.loc[df["status"] == "ok", "noisy"].tolist() == [False, False, True] * 2 + [False] * 2
    records = json.loads(report.to_json(df))
    ok = [r for r in records if r["status"] == "ok"]
    assert ok[0]["times_ms"] == [3.0, 3.1, 3.2] and ok[0]["reps"] == 3
    assert ok[0]["rel_error"] == 1e-7
    assert isinstance(ok[0]["workspace_bytes"], int)
    assert all(r["median_ms"] is None for r in records if r["status"] != "ok")
    assert report.to_csv(df).splitlines()[0] == ",".join(runner.COLUMNS)


def test_load_run_refuses_a_folder_without_results(tmp_path):
    with pytest.raises(ValueError, match="not a run folder"):
        report.load_run(tmp_path)


def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    names = report.plot(report.frame(rows(TIMES)), tmp_path)
    assert names == ["time_fwd.png", "time_bwd_data.png", "opcount.png"]
    for name in names:
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_plots_are_skipped_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    note = report.plot(report.frame(rows(TIMES)), tmp_path)
    assert "matplotlib is not installed" in note
    assert note in report.markdown(report.frame(rows(TIMES)), {}, note)
    assert not list(tmp_path.iterdir())


def test_compare_flags_changes_beyond_noise():
    a = report.frame(rows(TIMES))
    b_times = dict(TIMES)
    b_times[("gemm", "conv3")] = FAST  # 3x faster, IQRs apart
    b_times[("torch-cpu", "conv3")] = Measurement((2.5, 3.0, 3.5))  # overlaps: noise
    b_times[("winograd-2x2", "conv4")] = SLOW  # failed -> ok
    b = report.frame(rows(b_times))
    cmp = report.compare(a, b)
    fwd = cmp[cmp["pass"] == "fwd"].set_index(["algo", "layer"])
    assert fwd.loc[("gemm", "conv3"), "change"] == "faster"
    assert fwd.loc[("gemm", "conv3"), "ratio"] == pytest.approx(1.01 / 3.1)
    assert fwd.loc[("torch-cpu", "conv3"), "change"] == ""
    assert fwd.loc[("winograd-2x2", "conv4"), "change"] == "failed -> ok"
    text = report.compare_table(cmp)
    assert "2 faster, 0 slower" in text  # gemm conv3, fwd and bwd_data
    assert "geometric mean" in text


def test_compare_rows_in_one_run_only():
    a = report.frame(rows(TIMES))
    b = report.frame(rows(TIMES, algos=("gemm",)))
    cmp = report.compare(a, b)
    assert (cmp["change"] == "only in A").sum() == 8


def test_where_names_whole_layers_alone():
    cases = [("conv1", p, layout) for p in ("fwd", "bwd_data") for layout in ("nchw", "nhwc")]
    assert report.where(cases + [("conv2", "fwd", "nhwc")], per_layer=4) == \
        "conv1; conv2 fwd nhwc"
