import csv
import json
import sys
from pathlib import Path

import pytest

from convbench.algos.phases import phase_names
from convbench.analysis import report
from convbench.analysis.report import plots, prose, tables
from convbench.analysis.report import roof as roofs
from convbench.catalogs.layers import net_layers
from convbench.core import results
from convbench.core.measurement import Measurement
from convbench.measure import runner, verify

LAYERS = net_layers("alexnet")[2:4]  # conv3, conv4


def rows(times: dict, algos=("gemm", "winograd-2x2", "torch-cpu")) -> list[dict]:
    """Synthetic rows: `times[(algo, layer)]` is a Measurement, a status word, ("inexact",
    Measurement) (5.1e-3 relative error against a tolerance of 6.75e-4), or missing."""
    out = []
    for case in runner.sweep(LAYERS, algos, "numpy", ["fwd", "bwd_data"], ["nchw"], ["fp32"]):
        got = times.get((case.algo, case.layer), "unsupported")
        if isinstance(got, tuple):
            chk = verify.Check(False, 5.1e-3, 0.1, 6.75e-4)
            out.append(runner.row(case, got[0], chk.reason, check=chk, m=got[1]))
        elif isinstance(got, Measurement):
            chk = verify.Check(True, 1e-7, 1e-6, 1e-5)
            out.append(runner.row(case, "ok", check=chk, m=got, workspace=1 << 20))
        else:
            out.append(runner.row(case, got, f"{got} because"))
    return out


FAST = Measurement((0.99, 1.0, 1.005, 1.01, 1.015, 1.02, 1.03))
SLOW = Measurement((3.0, 3.05, 3.08, 3.1, 3.12, 3.15, 3.2))
NOISY = Measurement((2.0, 2.5, 2.9, 3.1, 3.5, 3.8, 4.0))
TIMES = {("gemm", "conv3"): SLOW, ("winograd-2x2", "conv3"): FAST, ("torch-cpu", "conv3"): NOISY,
         ("gemm", "conv4"): FAST, ("winograd-2x2", "conv4"): "failed",
         ("torch-cpu", "conv4"): "oom"}


def test_time_table_marks_the_best_per_column():
    df = results.frame(rows(TIMES))
    table = tables.time_table(df[df["pass"] == "fwd"])
    assert list(table.index) == ["gemm", "winograd-2x2", "torch-cpu"]
    assert list(table.columns) == ["conv3", "conv4"]
    assert table.loc["winograd-2x2", "conv3"] == "1.01" + report.BEST
    assert table.loc["gemm", "conv3"] == "3.1"
    assert table.loc["torch-cpu", "conv3"] == report.NOISY + "3.1"
    assert table.loc["gemm", "conv4"] == "1.01" + report.BEST
    assert table.loc["winograd-2x2", "conv4"] == "failed"
    assert table.loc["torch-cpu", "conv4"] == "oom"


def test_host_bound_gpu_times_are_marked_and_listed():
    """A GPU time whose host took as long to issue the pass is marked `!` and listed; where no
    row is (every CPU run), the report says nothing of it."""
    bound = Measurement((0.02, 0.02, 0.02), host_ms=(0.05, 0.05, 0.05))
    fine = Measurement((1.0, 1.01, 1.02), host_ms=(0.05, 0.05, 0.05))
    df = results.frame(rows({("gemm", "conv3"): bound, ("gemm", "conv4"): fine}))
    table = tables.time_table(df[df["pass"] == "fwd"])
    assert table.loc["gemm", "conv3"] == report.HOST_BOUND + "0.02" + report.BEST
    assert table.loc["gemm", "conv4"] == "1.01" + report.BEST
    text = report.markdown(df, {})
    assert "## Host-bound measurements" in text and "`!` a time the host may have set" in text
    assert list(tables.host_bound_table(df).index.get_level_values("layer")) == ["conv3"] * 2
    plain = report.markdown(results.frame(rows(TIMES)), {})
    assert "Host-bound" not in plain and "`!`" not in plain


def test_markdown_has_every_section():
    df = results.frame(rows(TIMES))
    text = report.markdown(df, {"run": {"backend": "numpy", "budget_s": 0.5}},
                           ["time_fwd.png"])
    for heading in ("## Time per layer", "### fwd, nchw, fp32", "### bwd_data, nchw, fp32",
                    "## Operation counts", "## Workspace", "## Accuracy", "### fp32",
                    "## Not measured", "## Noisy measurements"):
        assert heading in text
    assert "1.01 *" in text and "![time_fwd](time_fwd.png)" in text
    assert "oom because" in text and "- batch: 256" in text
    assert "2 of 8 measurements have IQR/median > 0.1" in text
    assert "## Phase breakdown" not in text  # no row has phases


def test_op_table_counts_gflop():
    df = results.frame(rows(TIMES))
    table = tables.op_table(df)
    conv3 = LAYERS[0].problem
    assert table.loc[("gemm", "fwd"), "conv3"] == f"{conv3.flops / 1e9:.4g}"
    assert table.loc[("torch-cpu", "fwd"), "conv3"] == "n/a"


def test_csv_round_trip_and_json(tmp_path):
    sink = results.CsvSink(tmp_path / results.RESULTS_CSV)
    for r in rows(TIMES):
        sink.append(r)
    df, env = results.load_run(tmp_path)
    assert env == {} and len(df) == 12
    assert df.loc[df["status"] == "ok", "noisy"].tolist() == [False, False, True] * 2 + [False] * 2
    records = json.loads(results.to_json(df))
    ok = [r for r in records if r["status"] == "ok"]
    assert ok[0]["times_ms"] == list(SLOW.times_ms) and ok[0]["reps"] == 7
    assert ok[0]["rel_error"] == 1e-7
    assert isinstance(ok[0]["workspace_bytes"], int)
    assert all(r["median_ms"] is None for r in records if r["status"] != "ok")
    assert results.to_csv(df).splitlines()[0] == ",".join(results.COLUMNS)


def test_load_run_refuses_a_folder_without_results(tmp_path):
    with pytest.raises(ValueError, match="not a run folder"):
        results.load_run(tmp_path)


def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    names = report.plot(results.frame(rows(TIMES)), tmp_path)
    assert names == ["time_fwd.png", "time_bwd_data.png", "opcount.png"]
    for name in names:
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_plots_are_skipped_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    note = report.plot(results.frame(rows(TIMES)), tmp_path)
    assert "matplotlib is not installed" in note
    assert note in report.markdown(results.frame(rows(TIMES)), {}, note)
    assert not list(tmp_path.iterdir())


def test_where_names_whole_layers_alone():
    cases = [("conv1", p, layout) for p in ("fwd", "bwd_data") for layout in ("nchw", "nhwc")]
    assert tables.where(cases + [("conv2", "fwd", "nhwc")], per_layer=4) == \
        "conv1; conv2 fwd nhwc"


# --- accuracy -------------------------------------------------------------------------------
def error_rows(errors: dict, precision="fp32") -> list[dict]:
    """Measured rows whose rel_error is `errors[(algo, layer, pass, layout)]`."""
    out = []
    for case in runner.sweep(LAYERS, ("winograd-2x2", "winograd-4x4", "gemm"), "numpy",
                             ["fwd", "bwd_filter"], ["nchw", "nhwc"], [precision]):
        err = errors[(case.algo, case.layer, case.pass_, case.layout)]
        out.append(runner.row(case, "ok", check=verify.Check(True, err, err, 1e-4), m=FAST))
    return out


def synthetic_errors(ratio_4x4) -> dict:
    """2x2 at 1e-7 everywhere, gemm at 1e-8, 4x4 at `ratio_4x4(layer, pass, layout)` × 2x2."""
    out = {}
    for layer in ("conv3", "conv4"):
        for pass_ in ("fwd", "bwd_filter"):
            for layout in ("nchw", "nhwc"):
                out[("winograd-2x2", layer, pass_, layout)] = 1e-7
                out[("winograd-4x4", layer, pass_, layout)] = 1e-7 * ratio_4x4(layer, pass_,
                                                                              layout)
                out[("gemm", layer, pass_, layout)] = 1e-8
    return out


def test_accuracy_table_is_per_layer_pass_and_algo_worst_layout():
    errors = synthetic_errors(lambda layer, pass_, layout: 4.0 if layout == "nhwc" else 6.0)
    errors[("gemm", "conv4", "bwd_filter", "nhwc")] = 3e-8
    table = tables.error_table(results.frame(error_rows(errors)))
    assert list(table.columns) == ["conv3", "conv4"]
    assert list(table.index) == [(a, p) for a in ("gemm", "winograd-2x2", "winograd-4x4")
                                 for p in ("fwd", "bwd_filter")]
    assert table.loc[("winograd-4x4", "fwd"), "conv3"] == "6e-07"  # the worse layout
    assert table.loc[("gemm", "bwd_filter"), "conv4"] == "3e-08"
    assert table.loc[("gemm", "bwd_filter"), "conv3"] == "1e-08"


def test_winograd_4x4_over_2x2_error_ratio_from_the_data():
    ratios = {("conv3", "fwd"): 2.0, ("conv3", "bwd_filter"): 4.0, ("conv4", "fwd"): 8.0,
              ("conv4", "bwd_filter"): 16.0}
    df = results.frame(error_rows(synthetic_errors(lambda l, p, _: ratios[(l, p)])))
    got = tables.error_ratios(df, "winograd-4x4", "winograd-2x2")
    assert len(got) == 8 and sorted(got) == pytest.approx(sorted(list(ratios.values()) * 2))
    line = prose.error_ratio_line(df, "winograd-4x4", "winograd-2x2")
    assert line == ("winograd-4x4 / winograd-2x2 error ratio: median 6× (min 2×, max 16×) over "
                    "8 (layer, pass, layout) cases; winograd-4x4's error is the larger in 8 of "
                    "8.")
    text = report.markdown(df, {})
    assert f"- {line}" in text and "### fp32" in text


def test_the_ratio_line_says_so_when_4x4_is_not_worse():
    df = results.frame(error_rows(synthetic_errors(lambda layer, p, l: 0.5)))
    assert prose.error_ratio_line(df, "winograd-4x4", "winograd-2x2").endswith(
        "median 0.5× (min 0.5×, max 0.5×) over 8 (layer, pass, layout) cases; winograd-4x4's "
        "error is the larger in 0 of 8.")


def test_no_ratio_line_without_both_algorithms():
    df = results.frame(rows(TIMES))  # winograd-2x2 only
    assert prose.error_ratio_line(df, "winograd-4x4", "winograd-2x2") is None
    assert "error ratio" not in report.markdown(df, {})


def test_accuracy_has_a_table_per_precision():
    errors = synthetic_errors(lambda *_: 5.0)
    df = results.frame(error_rows(errors) + error_rows(errors, precision="fp64"))
    text = report.markdown(df, {})
    assert "### fp32" in text and "### fp64" in text


# --- phase breakdown ------------------------------------------------------------------------
def phase_rows(phases: dict) -> list[dict]:
    """fft and winograd-2x2 rows, `phases[(algo, layer)]` the four phase medians in ms."""
    out = []
    for case in runner.sweep(LAYERS, ("fft", "winograd-2x2", "gemm"), "emu",
                             ["fwd", "bwd_data"], ["nchw"], ["fp32"]):
        ms = phases.get((case.algo, case.layer))
        named = None if ms is None else dict(zip(phase_names(case.pass_),
                                                 (Measurement((v,)) for v in ms)))
        total = Measurement((sum(ms),)) if ms else FAST
        out.append(runner.row(case, "ok", check=verify.Check(True, 1e-7, 1e-6, 1e-4), m=total,
                              phases=named))
    return out


PHASES = {("fft", "conv3"): (3.0, 1.0, 2.0, 4.0), ("fft", "conv4"): (1.0, 1.0, 6.0, 2.0),
          ("winograd-2x2", "conv3"): (0.5, 0.25, 4.0, 0.25),
          ("winograd-2x2", "conv4"): (0.5, 0.5, 0.5, 0.5)}


def test_phase_table_shares_and_dominant():
    df = results.frame(phase_rows(PHASES))
    phased = tables.phase_frame(df)
    assert set(phased["algo"]) == {"fft", "winograd-2x2"}  # gemm has no phases
    fft_fwd = phased[(phased["algo"] == "fft") & (phased["pass"] == "fwd")]
    table = tables.phase_table(fft_fwd)
    assert list(table.columns) == ["transform x", "transform w", "product", "inverse y",
                                   "phases ms", "pass ms", "dominant"]
    assert list(table.loc[("conv3", "nchw")]) == ["3 (30%)", "1 (10%)", "2 (20%)", "4 (40%)",
                                                  "10", "10", "transforms 80%"]
    assert table.loc[("conv4", "nchw"), "dominant"] == "product 60%"


def test_phase_breakdown_section():
    text = report.markdown(results.frame(phase_rows(PHASES)), {})
    section = text[text.index("## Phase breakdown"):text.index("## Plots")]
    for heading in ("### fft, fwd, fp32", "### fft, bwd_data, fp32",
                    "### winograd-2x2, fwd, fp32", "### winograd-2x2, bwd_data, fp32"):
        assert heading in section
    assert section.index("### fft, bwd_data") < section.index("### winograd-2x2, fwd")
    assert "transform dy" in section and "inverse dx" in section
    assert "gemm" not in section
    assert "- fft: the transforms dominate in 2 of 4 (layer, pass, layout) cases, the product " \
           "in 2." in section
    assert "- winograd-2x2: the transforms dominate in 2 of 4" in section  # conv4: 3 x 0.5 ms


def test_fused_phases_show_the_fused_kernels_share():
    """A fused kernel is one phase after the filter transform: `dominant` gives its share, and
    the summary says what it holds rather than counting it as a transform."""
    rows = []
    for case in runner.sweep(LAYERS, ("winograd-fused-2x2",), "emu", ["fwd"], ["nchw"], ["fp32"]):
        if case.layer in ("conv3", "conv4"):
            ms = {"conv3": (1.0, 3.0), "conv4": (1.0, 9.0)}[case.layer]
            named = dict(zip(("transform w", "fused"), (Measurement((v,)) for v in ms)))
            rows.append(runner.row(case, "ok", check=verify.Check(True, 1e-7, 1e-6, 1e-4),
                                   m=Measurement((sum(ms),)), phases=named))
    df = results.frame(rows)
    table = tables.phase_table(tables.phase_frame(df))
    assert list(table.columns) == ["transform w", "fused", "phases ms", "pass ms", "dominant"]
    assert table.loc[("conv3", "nchw"), "dominant"] == "fused 75%"
    assert table.loc[("conv4", "nchw"), "dominant"] == "fused 90%"
    text = report.markdown(df, {})
    assert ("- winograd-fused-2x2: one fused kernel (input transform, product, output transform) "
            "takes 75%–90% of the phases' time in 2 (layer, pass, layout) cases") in text


def test_phases_in_json_and_through_the_csv(tmp_path):
    sink = results.CsvSink(tmp_path / results.RESULTS_CSV)
    for r in phase_rows(PHASES):
        sink.append(r)
    df, _ = results.load_run(tmp_path)
    records = {(r["algo"], r["layer"], r["pass"]): r for r in results.to_records(df)}
    assert records[("fft", "conv3", "fwd")]["phases_ms"] == dict(
        zip(phase_names("fwd"), PHASES[("fft", "conv3")]))
    assert records[("gemm", "conv3", "fwd")]["phases_ms"] is None
    assert "## Phase breakdown" in report.markdown(df, {})


def test_phase_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    names = report.plot(results.frame(phase_rows(PHASES)), tmp_path)
    assert names[-1] == "phases.png"
    assert (tmp_path / "phases.png").read_bytes()[:4] == b"\x89PNG"


def test_the_phase_plot_marks_a_busy_row(tmp_path, monkeypatch):
    """#35: the phase plot's bars, one per row, are marked as the time plots' are."""
    plt = pytest.importorskip("matplotlib.pyplot")
    df = results.frame(phase_rows(PHASES))
    busy = df.index[(df["algo"] == "fft") & (df["layer"] == "conv3") & (df["pass"] == "fwd")]
    df["contended"] = df["contended"].astype(object)
    df.loc[busy, "contended"] = True
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, legend=True: figures.append(fig))
    assert plots.phase_plot(plt, df, tmp_path) == ["phases.png"]
    ax = figures[0].axes[0]  # fft, fwd: conv3 (busy), then conv4
    assert ax.get_title() == "fft, fwd"
    assert [c.patches[0].get_hatch() for c in ax.containers[:4]] == ["///"] * 4
    assert [c.patches[1].get_hatch() for c in ax.containers[:4]] == [None] * 4
    assert plots.BUSY_BAR[1] in ax.get_legend_handles_labels()[1]
    plt.close(figures[0])


def test_a_results_file_from_before_phases_still_renders(tmp_path):
    older = [c for c in results.COLUMNS if c != "phases_ms"]
    with open(tmp_path / results.RESULTS_CSV, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=older, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows(TIMES))
    df, _ = results.load_run(tmp_path)
    text = report.markdown(df, {})
    assert "## Time per layer" in text and "## Phase breakdown" not in text


def test_network_cost_weighs_each_problem_by_its_occurrences():
    """conv3 x1, conv4 x3: fwd and bwd_data each, so conv4 (1.01 ms per pass in gemm) costs
    the network 3 x 2 x 1.01 ms and comes first; gemm runs everything, winograd-2x2 and
    torch-cpu lack conv4, so they have no network total."""
    df = results.frame(rows(TIMES))
    occurrences = {"conv3": 1, "conv4": 3}
    cost = tables.cost_table(df, occurrences)
    assert list(cost.index) == ["conv4", "conv3"]
    assert list(cost["occurrences"]) == [3, 1]
    assert cost.loc["conv4", "fwd"] == "1.01 gemm nchw"
    assert cost.loc["conv3", "bwd_data"] == "1.01 winograd-2x2 nchw"
    assert list(cost["network ms"]) == ["6.06", "2.02"] and list(cost["share"]) == ["75%", "25%"]
    totals = tables.choice_totals(df, occurrences)
    assert totals.loc["fastest per layer and pass", "network ms"] == "8.08"
    assert totals.loc["gemm", "network ms"] == "12.26"  # 2 x 3.1 + 6 x 1.01
    assert totals.loc["gemm", "covers"] == "4 of 4"
    assert totals.loc["winograd-2x2", "network ms"] == ""
    assert totals.loc["winograd-2x2", "covers"] == "2 of 4"
    text = report.markdown(df, {"run": {"model": "m:net", "occurrences": occurrences,
                                        "unmeasured": {"odd": "padding_mode 'reflect'"}}})
    assert "## Network cost" in text and "m:net: 4 conv layers, 2 distinct problems" in text
    assert "odd (padding_mode 'reflect')" in text
    skipped = [f"f:{i}: id: 3-D convolution (id=2, kd=2, od=1): convbench runs 2-D"
               for i in range(5)]
    text = report.markdown(df, {"run": {"problems": "f", "occurrences": occurrences,
                                        "skipped": skipped}})
    assert ("Skipped: 5 lines of the file are convolutions convbench cannot hold (env.json lists "
            "them all): f:0: id: 3-D") in text and "f:2: id" in text and "f:3: id" not in text
    assert "## Network cost" not in report.markdown(df, {"run": {}})


def test_the_busy_table_says_how_much_the_hypervisor_stole():
    stolen = Measurement(FAST.times_ms, cpu_share=(1.0,) * 7, stolen=0.5)  # contended
    quiet = Measurement(SLOW.times_ms, cpu_share=(1.0,) * 7, stolen=0.02)
    df = results.frame(rows({("gemm", "conv3"): stolen, ("torch-cpu", "conv3"): quiet}))
    busy = tables.busy_table(df)
    assert list(busy.columns) == ["median ms", "cpu share", "stolen", "throttled",
                                  "flagged by"]
    assert busy.loc[("conv3", "gemm", "fwd", "nchw"), ["cpu share", "stolen"]].tolist() == \
        ["1.00", "0.50"]
    assert "torch-cpu" not in busy.index.get_level_values("algo")
    # a results file from before the column: the table still has it, empty
    older = tables.busy_table(df.drop(columns="stolen"))
    assert len(older) == 2 and older["stolen"].tolist() == ["", ""]
    text = report.markdown(df, {}, [])
    busy_section = text.split("## Busy machine")[1]
    assert "`cpu_share` times 1 - `stolen`" in busy_section
    assert "|   stolen |" in busy_section


#: A time whose threads got half their ready time on a core: contended, so busy.
SHARED = Measurement(FAST.times_ms, cpu_share=(0.5,) * 7)


def test_which_wins_lists_every_pair_a_busy_one_not_decided():
    """#35: a (layer, pass) whose verified times were all measured on a busy machine was left
    out of "Which wins" unsaid; it is listed, not decided, and so is one where nothing ran."""
    df = results.frame(rows({("gemm", "conv3"): SHARED, ("winograd-2x2", "conv3"): SHARED,
                             ("gemm", "conv4"): "failed"}))
    table = tables.winner_table(df)
    assert list(table.index) == [(la, p) for la in ("conv3", "conv4")
                                 for p in ("fwd", "bwd_data")]
    assert table.loc[("conv3", "fwd"), "verdict"] == tables.UNDECIDED_BUSY
    assert table.loc[("conv3", "fwd"), "fastest"] == ""
    assert table.loc[("conv4", "fwd"), "verdict"] == tables.UNDECIDED_NONE
    assert table.loc[("conv4", "fwd"), "did not run"] == "gemm failed; winograd-2x2, " \
        "torch-cpu unsupported"
    # beside a fair time, the busy ones still compete for nothing
    df = results.frame(rows({("gemm", "conv3"): SHARED, ("winograd-2x2", "conv3"): SLOW}))
    table = tables.winner_table(df)
    assert table.loc[("conv3", "fwd"), "fastest"] == "winograd-2x2 nchw"
    assert table.loc[("conv3", "fwd"), "verdict"] == \
        "only candidate; not competing (busy machine): gemm nchw"
    assert table.loc[("conv4", "fwd"), "verdict"] == tables.UNDECIDED_NONE
    assert tables.UNDECIDED_NONE in report.markdown(df, {}).split("## Which wins")[1]


def test_which_wins_calls_no_winner_over_what_remains_when_torch_s_times_were_busy():
    """#70: on a busy machine "Which wins" called `direct` the winner of conv1 bwd_data over the
    one row left when torch's rows were set aside as busy: the time every other is read against
    was not known, so the pair is not decided; beside a quiet torch time it is decided as
    before."""
    for times in ({("gemm", "conv3"): FAST, ("torch-cpu", "conv3"): SHARED},  # one row left
                  {("gemm", "conv3"): FAST, ("winograd-2x2", "conv3"): SLOW,
                   ("torch-cpu", "conv3"): SHARED}):
        table = tables.winner_table(results.frame(rows(times)))
        verdict = table.loc[("conv3", "fwd"), "verdict"]
        assert verdict == (f"{tables.UNDECIDED_BASELINE}; not competing (busy machine): "
                           "torch-cpu nchw"), verdict
        assert table.loc[("conv3", "fwd"), "fastest"] == "gemm nchw"  # shown, winning nothing
    quiet = results.frame(rows({("gemm", "conv3"): FAST, ("winograd-2x2", "conv3"): SHARED,
                                ("torch-cpu", "conv3"): SLOW}))
    assert tables.winner_table(quiet).loc[("conv3", "fwd"), "verdict"] == \
        "wins; not competing (busy machine): winograd-2x2 nchw"
    text = report.markdown(results.frame(rows({("gemm", "conv3"): FAST,
                                               ("torch-cpu", "conv3"): SHARED})), {})
    assert "the fastest of the rest is not called a winner" in text.split("## Which wins")[1]


def test_the_layer_verdict_sets_the_best_of_ours_against_torch_or_says_why_not():
    """#70: `convbench layer` printed its rows and no answer. Its verdict per (layer, pass):
    the fastest of ours against torch's with the ratio's interval (the report's "Best of ours
    against torch", the same numbers), or `not decided` and why where busy or missing rows left
    no comparison."""
    from convbench.analysis import speedup

    df = results.frame(rows({("gemm", "conv3"): SLOW, ("winograd-2x2", "conv3"): FAST,
                             ("torch-cpu", "conv3"): NOISY, ("gemm", "conv4"): FAST,
                             ("torch-cpu", "conv4"): SHARED}))
    table = tables.verdict_table(df)
    assert list(table.columns) == ["best own", "torch's", "own / torch [95% interval]",
                                   "verdict"]
    vs = speedup.against_torch(df).set_index(["layer", "pass"]).loc[("conv3", "fwd")]
    conv3 = table.loc[("conv3", "fwd")]
    assert conv3["best own"] == "winograd-2x2 nchw 1.01 ms"
    assert conv3["torch's"] == "torch-cpu nchw 3.1 ms"
    assert conv3["own / torch [95% interval]"] == \
        f"{vs['ratio']:.2f} [{vs['low']:.2f}, {vs['high']:.2f}]"
    assert conv3["verdict"] == "ours faster"
    conv4 = table.loc[("conv4", "fwd")]  # torch's only time busy: no comparison left
    assert conv4["verdict"] == "not decided: torch's measured on a busy machine only"
    assert conv4["best own"] == conv4["own / torch [95% interval]"] == ""
    failed = results.frame(rows({("gemm", "conv3"): FAST, ("torch-cpu", "conv3"): "oom"}))
    assert tables.verdict_table(failed).loc[("conv3", "fwd"), "verdict"] == \
        "not decided: torch's did not run (torch-cpu oom)"
    busy = results.frame(rows({("gemm", "conv3"): SHARED, ("torch-cpu", "conv3"): SHARED}))
    assert tables.verdict_table(busy).loc[("conv3", "fwd"), "verdict"] == \
        "not decided: both measured on a busy machine only"
    text = prose.layer_verdict(df)
    assert text.startswith("Verdict (fp32): the fastest of ours against torch's")
    assert text.splitlines()[-1].startswith("| conv4   | bwd_data ")
    alone = prose.layer_verdict(df[df["algo"] != "torch-cpu"])
    assert alone.startswith("Verdict: This run measured none of torch's convolution")


def test_the_busy_table_says_which_rule_flagged_each_row():
    """#35: a row flagged by the noisy lower-quartile rule showed share 1.00, stolen 0.00, as if
    flagged for nothing; `flagged by` names the rule of each row."""
    stolen = Measurement(FAST.times_ms, cpu_share=(0.95,) * 7, stolen=0.2)
    # its median share is 1.0, but a quarter of its repetitions got 0.5: noisy and contended
    quartile = Measurement(NOISY.times_ms, cpu_share=(0.5, 0.5, 1, 1, 1, 1, 1))
    assert quartile.contended and quartile.share == 1.0
    df = results.frame(rows({("gemm", "conv3"): SHARED, ("winograd-2x2", "conv3"): stolen,
                             ("torch-cpu", "conv3"): quartile}))
    flagged = tables.busy_table(df).xs("fwd", level="pass")["flagged by"]
    assert flagged["conv3", "gemm", "nchw"] == "cores shared (share 0.50)"
    assert flagged["conv3", "winograd-2x2", "nchw"] == \
        "stolen 20% (share 0.95 x 0.80 left = 0.76)"
    assert flagged["conv3", "torch-cpu", "nchw"].startswith(
        "a quarter of its repetitions or more ran on a busy machine")
    gpu = df.assign(contended=False, throttled="power cap")
    assert set(tables.busy_table(gpu)["flagged by"]) == {"GPU clocks held down (power cap)"}
    section = report.markdown(df, {}).split("## Busy machine")[1]
    assert "flagged by" in section and "cores shared (share 0.50)" in section


def test_bar_plots_mark_busy_and_noisy_times():
    """#35: the time plots drew busy and noisy bars like any other; busy ones are hatched,
    noisy ones faded, each with its legend entry."""
    plt = pytest.importorskip("matplotlib.pyplot")
    df = results.frame(rows({("gemm", "conv3"): SHARED, ("winograd-2x2", "conv3"): NOISY,
                             ("torch-cpu", "conv3"): FAST}))
    ok = df[(df["pass"] == "fwd") & (df["status"] == "ok")]
    fig, ax = plt.subplots()
    plots.bar_groups(ax, ok, "median_ms", ["gemm", "winograd-2x2", "torch-cpu"], ["conv3"])
    plots.mark_legend(ax, ok)
    bars = ax.patches[:3]
    assert [b.get_hatch() for b in bars] == ["///", None, None]
    assert [b.get_alpha() for b in bars] == [None, 0.4, None]
    labels = ax.get_legend_handles_labels()[1]
    assert labels[3:] == [plots.BUSY_BAR[1], plots.NOISY_BAR[1]]
    plt.close(fig)


def test_an_inexact_time_is_drawn_crossed_not_left_out():
    """An `inexact` row ran: its bar is drawn, crossed, with its legend entry (`†`)."""
    plt = pytest.importorskip("matplotlib.pyplot")
    df = results.frame(rows({("gemm", "conv3"): SLOW, ("torch-cpu", "conv3"): ("inexact",
                                                                               FAST)}))
    fwd = df[(df["pass"] == "fwd") & (df["layer"] == "conv3")]
    fig, ax = plt.subplots()
    plots.bar_groups(ax, fwd, "median_ms", ["gemm", "torch-cpu"], ["conv3"])
    plots.mark_legend(ax, fwd)
    assert [b.get_hatch() for b in ax.patches[:2]] == [None, "xx"]
    assert ax.patches[1].get_height() == pytest.approx(FAST.median)
    assert ax.get_legend_handles_labels()[1][2:] == [plots.INEXACT_BAR[1]]
    plt.close(fig)


# --- the device's ceilings: the header, each row's share, the roofline --------------------------
def ceilings_env(**figures) -> dict:
    """env.json of a run whose ceilings are conftest's fake with these figures, in the form a
    measurement has them (the attainable's library and product named in `methods`)."""
    import dataclasses

    from convbench.measure import ceilings

    c = dataclasses.replace(ceilings.measure("cpu", 2), **{
        "model": "Fake CPU", "gflops_attainable": 100.0, "gemm_backend": "torch",
        "gflops_peak_theoretical": 150.0, "peak_method": "2 cores x 16 lanes x 2 FMA units",
        "bandwidth_gbs_dram": 10.0, "bandwidth_gbs_cache": 100.0,
        "methods": {"attainable": "torch on square",
                    "gflops": "best of 3; products: square (2048x2048)@(2048x2048); im2col "
                              "(256x2304)@(2304x1352)",
                    "bandwidth": "STREAM copy and triad"}, **figures})
    return {"run": {"backend": "numpy", "budget_s": 0.5}, "ceilings": c.to_dict(),
            "ceilings_note": None}


def test_marked_bars_have_no_dashed_edges():
    """A dashed edge on a log axis bar (its foot at minus infinity) is dashes along an endless
    edge: seconds per bar. Busy and noisy bars are marked by hatching and fading instead."""
    for style, _ in (plots.BUSY_BAR, plots.NOISY_BAR):
        assert style.get("linestyle", "-") in ("-", "solid")


def test_the_header_states_the_ceilings_and_the_winners_their_share():
    df = results.frame(rows(TIMES))
    text = report.markdown(df, ceilings_env())
    header = text.split("## Which wins")[0]
    assert "- ceilings of Fake CPU (cpu, 2 threads" in header
    assert ("  - attainable fp32: 100 GFLOP/s, torch on square (2048x2048)@(2048x2048)"
            in header)
    assert "  - theoretical peak: 150 GFLOP/s (2 cores x 16 lanes x 2 FMA units)" in header
    assert ("  - bandwidth: 10 GB/s beyond cache, 100 GB/s within (STREAM copy and triad)"
            in header)
    assert "peak is not known here" not in text
    assert "the share of the device's attainable fp32 ceiling, 100 GFLOP/s" in text
    gflops = df.loc[(df["algo"] == "gemm") & (df["layer"] == "conv4")
                    & (df["pass"] == "fwd"), "gflops"].iloc[0]
    assert f"{gflops:.4g} ({gflops / 100:.0%} of ceiling)" in text


def test_a_measured_fma_peak_above_the_sgemm_is_the_roof_the_report_reads_and_names():
    df = results.frame(rows(TIMES))
    env = ceilings_env(gflops_peak_measured=200.0,
                       methods={"attainable": "torch on square", "peak_measured": "fake loop"})
    text = report.markdown(df, env)
    header = text.split("## Which wins")[0]
    assert "  - measured FMA peak: 200 GFLOP/s (fake loop)" in header
    assert "  - compute roof: 200 GFLOP/s, the measured FMA peak" in header
    assert "the share of the device's fp32 compute roof (the measured FMA peak), 200" in text
    assert "a share of the fp32 compute roof, 200 GFLOP/s (the measured FMA peak)" in text
    gflops = df.loc[(df["algo"] == "gemm") & (df["layer"] == "conv4")
                    & (df["pass"] == "fwd"), "gflops"].iloc[0]
    assert f"{gflops:.4g} ({gflops / 200:.0%} of ceiling)" in text


def test_each_row_s_share_of_the_ceiling_in_direct_flops_and_own_ops_and_its_bound():
    from convbench.measure import ceilings, memory

    df = results.frame(rows(TIMES))
    env = ceilings_env()
    c = ceilings.from_env(env)
    roof = roofs.roof_frame(df, c).set_index(["layer", "pass", "algo"])
    assert len(roof) == 8  # every ok fp32 row
    wino = roof.loc[("conv3", "fwd", "winograd-2x2")]
    conv3 = LAYERS[0].problem
    seconds = FAST.median / 1e3
    assert wino["direct_share"] == pytest.approx(conv3.flops / seconds / 1e9 / 100)
    assert wino["own_share"] == pytest.approx(wino["algo_ops"] / seconds / 1e9 / 100)
    assert wino["own_share"] < wino["direct_share"]  # Winograd does fewer operations
    nbytes = memory.operand_bytes(conv3, "fwd", "float32") + (1 << 20)  # and its workspace
    assert wino["bytes"] == nbytes
    assert wino["intensity"] == pytest.approx(wino["algo_ops"] / nbytes)
    b = ceilings.bound(ceilings.roofline_point(wino["algo_ops"], nbytes, seconds), c)
    assert (wino["bound"], wino["roof_share"]) == (b.kind, pytest.approx(b.share))
    torch_cpu = roof.loc[("conv3", "fwd", "torch-cpu")]  # a library's choice: no own count
    assert not torch_cpu["own_counted"]
    table = roofs.roof_table(roofs.roof_frame(df, c))
    assert list(table.columns) == list(roofs.ROOF_COLUMNS)
    assert {"% of ceiling (direct flops)", "% of ceiling (own ops)"} <= set(table.columns)
    assert table.loc[("conv3", "fwd", "torch-cpu", "nchw"), "% of ceiling (own ops)"] == ""
    text = report.markdown(df, env)
    section = text.split("## How far from the roof")[1].split("\n## ")[0]
    assert "% of ceiling (direct flops)" in section and "% of ceiling (own ops)" in section
    assert "its two inputs and its output once each, 4 bytes an element" in section
    assert "the DRAM bandwidth (10 GB/s, the ridge at 10 flop/byte)" in section


def test_a_large_run_lists_each_algorithm_s_row_nearest_its_roof(monkeypatch):
    monkeypatch.setattr(prose, "ROOF_MAX_ROWS", 3)
    text = report.markdown(results.frame(rows(TIMES)), ceilings_env())
    section = text.split("## How far from the roof")[1].split("\n## ")[0]
    # #45: it said "8 rows: each ..." above a table of 6
    assert ("The best of 8 rows: for each (algo, pass, layout), of its rows the one nearest "
            "the ceiling in its own operations (6 listed).") in section
    assert section.count("| conv") == 6  # 3 algos x 2 passes


def test_a_run_without_ceilings_says_they_were_not_measured(tmp_path):
    df = results.frame(rows(TIMES))
    old = report.markdown(df, {"run": {"backend": "numpy"}})
    assert ("- ceilings: not measured for this run (a run folder from before the ceilings "
            "were measured)") in old
    assert "The device's ceilings were not measured for this run" in old
    assert "the device's peak is not known here" in old
    failed = report.markdown(df, {"run": {}, "ceilings": None,
                                  "ceilings_note": "not measured: ImportError: no cupy"})
    assert "- ceilings: not measured for this run (not measured: ImportError: no cupy)" in failed
    if plots.pyplot() is not None:
        assert "roofline.png" not in report.plot(df, tmp_path, {"run": {}})


def test_the_roofline_is_drawn_from_env_json_s_ceilings(tmp_path):
    pytest.importorskip("matplotlib")
    df, env = results.frame(rows(TIMES)), ceilings_env()
    names = report.plot(df, tmp_path, env)
    assert names[-1] == "roofline.png"
    assert (tmp_path / "roofline.png").read_bytes()[:4] == b"\x89PNG"
    assert "![roofline](roofline.png)" in report.markdown(df, env, names)


def test_the_header_says_how_long_the_run_took_from_its_readings():
    """#45: the header promised "the whole sweep finishes in 15 minutes"; it states what the
    run took (env.json's load readings, each sitting start to end), or nothing."""
    df = results.frame(rows(TIMES))
    env = {"run": {"backend": "numpy"},
           "load": [{"when": "start", "time": "2026-11-26T21:41:26+00:00"},
                    {"when": "end", "time": "2026-11-26T21:44:32+00:00"},
                    {"when": "resumed start", "time": "2026-11-27T08:00:00+00:00"},
                    {"when": "end", "time": "2026-11-27T08:01:00+00:00"}]}
    assert prose.run_seconds(env) == 246
    text = report.markdown(df, env)
    assert "- took: 4m06s (env.json's load readings, start to end)" in text
    assert "minutes" not in text.split("\n## ")[0]
    assert "- took:" not in report.markdown(df, {"run": {"backend": "numpy"}})


@pytest.mark.parametrize("source, says", [
    ("cache", ("measured 2026-01-01T00:00:00+00:00, taken from this machine's cache "
               "(`convbench machine --refresh` measures again)")),
    ("measured", "measured 2026-01-01T00:00:00+00:00, for this run"),
    (None, "measured 2026-01-01T00:00:00+00:00):")])
def test_the_header_says_whether_the_ceilings_came_from_the_cache(source, says):
    """#45: the header showed cached ceilings as if measured for the run; it says where they
    came from and when they were measured (a record from before `source` says when only)."""
    env = ceilings_env(measured_at="2026-01-01T00:00:00+00:00", source=source)
    if source is None:
        del env["ceilings"]["source"]
    header = report.markdown(results.frame(rows(TIMES)), env).split("## Which wins")[0]
    assert f"- ceilings of Fake CPU (cpu, 2 threads, {says}" in header


def test_every_report_sets_the_best_of_ours_against_torch_per_layer_and_pass():
    """#45: the report did not answer the first question, how the best of ours does against
    torch's convolution layer by layer and pass by pass ("Which wins" sets the winner against
    its runner-up): a section of every run's report, the README's table."""
    from convbench.analysis import speedup

    df = results.frame(rows(TIMES))
    vs = speedup.against_torch(df).set_index(["layer", "pass"])
    conv3 = vs.loc[("conv3", "fwd")]  # winograd-2x2 (FAST) against torch-cpu (NOISY)
    assert (conv3["own"], conv3["torch"]) == ("winograd-2x2", "torch-cpu")
    assert conv3["ratio"] == pytest.approx(FAST.median / NOISY.median)
    assert conv3["low"] < conv3["ratio"] < conv3["high"] and conv3["outcome"] == "ours"
    conv4 = vs.loc[("conv4", "fwd")]  # torch-cpu out of memory: nothing to set against
    assert conv4["own"] == conv4["torch"] == conv4["outcome"] == ""
    text = report.markdown(df, {"run": {"backend": "numpy"}})
    section = text.split("## Best of ours against torch")[1].split("\n## ")[0]
    assert text.index("## Best of ours against torch") < text.index("## Which wins")
    assert "| best own / torch-cpu [95% interval]" in section
    line = next(x for x in section.splitlines() if x.startswith("| fwd "))
    assert f"{conv3['ratio']:.2f} [{conv3['low']:.2f}, {conv3['high']:.2f}]" in line
    assert "winograd-2x2 nchw 1.01 ms" in section and "torch-cpu nchw" in section
    assert ("Ours faster in 2, torch's in 0, a tie in 0 of 4 (layer, pass); 2 not compared."
            in section)
    alone = report.markdown(df[df["algo"] != "torch-cpu"], {"run": {"backend": "numpy"}})
    assert "This run measured none of torch's convolution" in alone


def test_an_inexact_torch_pick_keeps_its_time_marked_and_said_and_never_wins():
    """torch's pick beyond its tolerance (`inexact`) is what its users run: its time stands in
    the time table, marked and with no win; it is torch's side against ours and its own
    network total, marked; the report says its error in a sentence; it did run, so it is not
    under Not measured; the fastest verified time wins."""
    quick = Measurement((0.49, 0.5, 0.5, 0.5, 0.5, 0.51, 0.51))
    times = {**TIMES, ("torch-cpu", "conv3"): ("inexact", quick)}
    df = results.frame(rows(times))
    fwd = df[df["pass"] == "fwd"]
    table = tables.time_table(fwd)
    assert table.loc["torch-cpu", "conv3"] == report.INEXACT + "0.5"
    assert table.loc["winograd-2x2", "conv3"] == "1.01" + report.BEST
    winner = tables.winner_table(fwd).loc[("conv3", "fwd")]
    assert winner["fastest"] == "winograd-2x2 nchw" and winner["runner-up"] == "gemm nchw"
    assert "not competing (inexact): torch-cpu nchw †0.5" in winner["verdict"]
    assert "torch-cpu" not in winner["did not run"]
    from convbench.analysis import speedup

    vs = speedup.against_torch(df).set_index(["layer", "pass"]).loc[("conv3", "fwd")]
    assert vs["torch"] == "torch-cpu" and vs["torch_inexact"] and vs["outcome"] == "torch"
    totals = tables.choice_totals(df[df["layer"] == "conv3"], {})
    assert totals.loc["torch-cpu", "network ms"].startswith(report.INEXACT)
    text = report.markdown(df, {"run": {"backend": "numpy"}})
    section = text.split("## Inexact results")[1].split("\n## ")[0]
    assert ("- torch's default (`torch-cpu`) computes conv3 fwd (nchw, fp32) with 0.51% "
            "relative error; its tolerance is 0.068%.") in section
    assert "torch-cpu nchw †0.5 ms" in text.split("## Best of ours against torch")[1]
    assert "inexact" not in text.split("## Not measured")[1].split("\n## ")[0]
    assert "`†` the time of an inexact result, which wins nothing" in text


# --- #45: the plots read as they should --------------------------------------------------------
#: A committed AlexNet run: 10 bars a panel of its phase plot.
ROOFED = Path(__file__).resolve().parent.parent / "results" / \
    "2026-11-26-cpu-2core-xeon-alexnet-ceilings"


def _drawn(plt, monkeypatch, draw):
    """The figures `draw(plt)` saves, drawn (their text laid out), instead of written."""
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, legend=True: figures.append(fig))
    draw(plt)
    for fig in figures:
        fig.canvas.draw()
    return figures


def test_a_legend_entry_is_its_algorithm_s_colour_not_its_first_bar_s_style():
    """An algorithm whose first bar was noisy (faded) or busy (hatched) looked so in the
    legend, which takes a bar series' first bar: the entry is the plain colour."""
    plt = pytest.importorskip("matplotlib.pyplot")
    df = results.frame(rows({("gemm", "conv3"): SHARED, ("winograd-2x2", "conv3"): NOISY,
                             ("torch-cpu", "conv3"): FAST, ("gemm", "conv4"): FAST}))
    ok = df[(df["pass"] == "fwd") & (df["status"] == "ok")]
    fig, ax = plt.subplots()
    plots.bar_groups(ax, ok, "median_ms", ["gemm", "winograd-2x2", "torch-cpu"],
                     ["conv3", "conv4"])
    legend = ax.legend()
    entries = dict(zip([t.get_text() for t in legend.get_texts()], legend.legend_handles))
    for algo in ("gemm", "winograd-2x2"):
        handle = entries[algo]
        assert handle.get_alpha() in (None, 1.0), algo
        assert not getattr(handle, "get_hatch", lambda: None)(), algo
    from matplotlib.container import BarContainer

    wino = [c for c in ax.containers if isinstance(c, BarContainer)][1]
    assert [b.get_alpha() for b in wino.patches] == [0.4, None]  # the bar itself is faded
    plt.close(fig)


def test_log_axes_read_in_plain_numbers(monkeypatch):
    """The time plots, the roofline and the speed-up curves labelled their log ticks 6x10^1."""
    plt = pytest.importorskip("matplotlib.pyplot")
    df, env = results.load_run(ROOFED)
    one = df[df["layer"].isin(["conv3", "conv4"])]
    figures = _drawn(plt, monkeypatch, lambda p: plots.plot(one, Path("unused"), env))
    labels = [t.get_text() for fig in figures for ax in fig.axes
              for axis in (ax.xaxis, ax.yaxis) if axis.get_scale() == "log"
              for t in axis.get_ticklabels(minor=True) + axis.get_ticklabels()]
    assert [t for t in labels if t], "no log axis labelled"
    assert [t for t in labels if "10^" in t or "times" in t or "e+" in t] == []
    assert {"10", "20", "100"} & set(labels)
    for fig in figures:
        plt.close(fig)


#: A committed run of 10 catalog problems in both layouts: 20 bars a panel of its phase plot.
DILATED = ROOFED.parent / "2026-11-29-cpu-2core-epyc-convset-dilated-409810e"


@pytest.mark.parametrize("folder, algos, bars, named", [
    (ROOFED, ["winograd-4x4", "gemm"], 10, ""), (DILATED, ["gemm", "fft"], 20, ""),
    (DILATED, ["gemm"], 20, ":resnet_layer4_branch2b")])  # a problem file's names: upright
def test_the_phase_plot_s_labels_do_not_run_into_each_other(monkeypatch, folder, algos, bars,
                                                            named):
    """phases.png wrote each bar's total above it and its layer under it, ten bars a panel,
    one into the next; at twenty bars (#70) the totals under them (`1.494 ms1.842 ms`) still
    ran together: every label of a panel stands clear of the others, within the figure."""
    plt = pytest.importorskip("matplotlib.pyplot")
    df, _ = results.load_run(folder)
    one = df[df["algo"].isin(algos)]
    one = one.assign(layer=one["layer"] + named)
    (fig,) = _drawn(plt, monkeypatch, lambda p: plots.phase_plot(p, one, Path("unused")))
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        texts = [t for t in ax.get_xticklabels() + ax.texts if t.get_text()]
        assert len(texts) >= bars
        boxes = [t.get_window_extent(renderer) for t in texts]
        clash = [(texts[i].get_text(), texts[j].get_text())
                 for i in range(len(boxes)) for j in range(i + 1, len(boxes))
                 if boxes[i].overlaps(boxes[j])]
        assert clash == [], ax.get_title()
        assert all(fig.bbox.contains(b.x0, b.y0) and fig.bbox.contains(b.x1, b.y1)
                   for b in boxes), ax.get_title()
        assert {t.get_rotation() for t in ax.get_xticklabels()} == {90 if named else 0}
    plt.close(fig)


def test_a_case_that_did_not_run_is_marked_as_large_as_the_axis_labels():
    """The `u` of an unsupported case was x-small, hard to find under the bars."""
    plt = pytest.importorskip("matplotlib.pyplot")
    from matplotlib.font_manager import FontProperties

    df = results.frame(rows(TIMES))
    fwd = df[df["pass"] == "fwd"]
    fig, ax = plt.subplots()
    plots.bar_groups(ax, fwd[fwd["status"] == "ok"], "median_ms",
                     ["gemm", "winograd-2x2", "torch-cpu"], ["conv3", "conv4"],
                     missing=fwd[fwd["status"] != "ok"])
    marks = [t for t in ax.texts if t.get_text() in plots.NOT_RUN_MARKS.values()]
    assert [t.get_text() for t in marks] == ["f", "m"]
    tick = FontProperties(size=ax.get_xticklabels()[0].get_fontsize())
    assert all(t.get_fontsize() >= tick.get_size_in_points() for t in marks)
    plt.close(fig)


def test_torch_s_convolution_is_what_a_model_runs_not_cudnn_s_algorithms_one_by_one():
    from convbench.analysis import speedup

    assert [a for a in ("torch-cpu", "cudnn", "cudnn-autotune", "cudnn-find-fft", "gemm",
                        "gemm-cublas") if speedup.is_torchs(a)] == ["torch-cpu", "cudnn",
                                                                   "cudnn-autotune"]


def test_a_run_interrupted_before_its_first_row_still_gets_its_report(tmp_path):
    """Ctrl-C before any row is measured: the report is written, with no plots (matplotlib
    raised on a figure of no columns, and the command ended in a traceback)."""
    df = results.frame([])
    assert df.empty
    text = report.write(tmp_path, df, {})
    assert (tmp_path / "report.md").read_text() == text
    assert not list(tmp_path.glob("*.png"))
