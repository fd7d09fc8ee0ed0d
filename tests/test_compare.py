import json

import pytest
from test_cli import run_cli

from convbench.analysis import compare
from convbench.catalogs.layers import Layer
from convbench.core import results
from convbench.core.measurement import Measurement
from convbench.core.problem import ConvProblem
from convbench.measure import runner, verify

P = ConvProblem(n=2, c=3, h=8, w=8, k=4, r=3, s=3, pad=1)
LAYERS = [Layer("alexnet", "conv3", P), Layer("alexnet", "conv4", P.with_batch(2))]


def spread(median: float, width: float = 0.01) -> Measurement:
    """Seven repetitions spread evenly ±`width` around `median`."""
    return Measurement(tuple(median * (1 + width * k / 3) for k in range(-3, 4)))


def rows(times: dict, algos=("gemm", "torch-cpu"), layers=LAYERS) -> list[dict]:
    out = []
    for case in runner.sweep(layers, algos, "numpy", ["fwd"], ["nchw"], ["fp32"]):
        got = times.get((case.algo, case.layer), spread(1.0))
        chk = verify.Check(True, 1e-7, 1e-6, 1e-5)
        out.append(runner.row(case, got, f"{got} because") if isinstance(got, str)
                   else runner.row(case, "ok", check=chk, m=got))
    return out


def test_changes_beyond_noise_ties_and_status_changes():
    a = results.frame(rows({("gemm", "conv3"): spread(3.0), ("torch-cpu", "conv4"): "failed"}))
    b = results.frame(rows({("gemm", "conv3"): spread(1.0),  # 3x faster
                            ("torch-cpu", "conv3"): spread(1.01, width=0.2),  # within noise
                            ("torch-cpu", "conv4"): spread(2.0)}))
    cmp = compare.compare(a, b).set_index(["algo", "layer"])
    assert cmp.loc[("gemm", "conv3"), "change"] == "faster"
    assert cmp.loc[("gemm", "conv3"), "ratio"] == pytest.approx(1 / 3)
    assert cmp.loc[("gemm", "conv3"), "ratio_high"] < 0.4
    assert cmp.loc[("torch-cpu", "conv3"), "change"] == ""
    assert cmp.loc[("torch-cpu", "conv3"), "ratio_low"] < 1 < cmp.loc[("torch-cpu", "conv3"),
                                                                      "ratio_high"]
    assert cmp.loc[("torch-cpu", "conv4"), "change"] == "failed -> ok"
    text = compare.compare_table(compare.compare(a, b))
    assert "1 faster, 0 slower; 2 ties within noise" in text and "95% interval" in text


def test_rows_in_one_run_only():
    a = results.frame(rows({}))
    b = results.frame(rows({}, algos=("gemm",)))
    cmp = compare.compare(a, b)
    assert (cmp["change"] == "only in A").sum() == 2


def test_runs_of_other_problems_or_batches_are_refused():
    a = results.frame(rows({}))
    compare.check_comparable(a, a)
    with pytest.raises(ValueError, match=r"other batches \(A: 2; B: 4\)"):
        compare.check_comparable(a, results.frame(rows({}, layers=[
            Layer("alexnet", "conv3", P.with_batch(4)), Layer("alexnet", "conv4", P.with_batch(4))])))
    with pytest.raises(ValueError, match="different problems: 1 only in A \\(conv4\\)"):
        compare.check_comparable(a, results.frame(rows({}, layers=LAYERS[:1])))


def test_environment_differences_are_named():
    env = {"device": "AMD EPYC, 2 cores", "cpu": {"model": "AMD EPYC", "cores": 2},
           "torch": {"version": "2.13.0", "threads": 2}, "numpy": {"version": "2.4"},
           "threads": {"threads": 2}}
    other = {**env, "device": "Intel Xeon, 2 cores", "cpu": {"model": "Intel Xeon", "cores": 2},
             "threads": {"threads": 1}}
    assert compare.environment_differences(env, env) == []
    assert compare.environment_differences(env, other) == [
        ("device", "AMD EPYC, 2 cores", "Intel Xeon, 2 cores"), ("CPU", "AMD EPYC", "Intel Xeon"),
        ("threads", "2", "1")]


def test_regressions_are_slower_beyond_noise_by_more_than_the_share():
    a = results.frame(rows({}))
    b = results.frame(rows({("gemm", "conv3"): spread(1.2), ("gemm", "conv4"): spread(1.03),
                            ("torch-cpu", "conv3"): spread(1.5, width=0.6)}))
    cmp = compare.compare(a, b)
    slow = compare.regressions(cmp, 0.05)
    assert list(zip(slow["algo"], slow["layer"])) == [("gemm", "conv3")]  # not the 3%, not noise


def test_a_regression_is_an_interval_wholly_above_the_threshold():
    """A median 8% slower whose interval reaches down to 2% is not known to be more than 5%
    slower: `--fail-above 5` does not fail on it (it did while the median alone was read)."""
    a = results.frame(rows({}))
    b = results.frame(rows({("gemm", "conv3"): spread(1.08, width=0.1),
                            ("gemm", "conv4"): spread(1.12)}))
    cmp = compare.compare(a, b).set_index(["algo", "layer"])
    assert cmp.loc[("gemm", "conv3"), "change"] == "slower"
    assert 1 < cmp.loc[("gemm", "conv3"), "ratio_low"] < 1.05 < cmp.loc[("gemm", "conv3"),
                                                                       "ratio"]
    slow = compare.regressions(cmp.reset_index(), 0.05)
    assert list(zip(slow["algo"], slow["layer"])) == [("gemm", "conv4")]


def folder(path, times: dict, env: dict, **kw):
    path.mkdir()
    sink = results.CsvSink(path / results.RESULTS_CSV)
    for r in rows(times, **kw):
        sink.append(r)
    (path / results.ENV_JSON).write_text(json.dumps(env))
    return str(path)


def test_compare_command_says_what_differs_refuses_and_fails_above(tmp_path, capsys):
    env = {"device": "AMD EPYC, 2 cores", "torch": {"version": "2.13.0"}}
    a = folder(tmp_path / "a", {}, env)
    b = folder(tmp_path / "b", {("gemm", "conv3"): spread(1.2)},
               {**env, "device": "Intel Xeon, 2 cores"})
    code, out, err = run_cli(capsys, "compare", a, b)
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("A: AMD EPYC") and lines[1].startswith("B: Intel")
    assert lines[2] == "Differences: device: AMD EPYC, 2 cores vs Intel Xeon, 2 cores"
    code, _, err = run_cli(capsys, "compare", a, b, "--fail-above", "5")
    assert code == 1 and err.splitlines()[-1].startswith(
        "convbench: 1 rows of B slower than A beyond noise by more than 5%: conv3 fwd nchw gemm "
        "(+20%)")
    code, _, _ = run_cli(capsys, "compare", a, b, "--fail-above", "25")
    assert code == 0
    code, out, err = run_cli(capsys, "compare", a, b, "--format", "json")
    assert code == 0 and len(json.loads(out)) == 4 and err.startswith("A: AMD EPYC")

    c = folder(tmp_path / "c", {}, env, layers=LAYERS[:1])
    code, out, err = run_cli(capsys, "compare", a, c)
    assert code == 2 and out == "" and err.splitlines()[-1] == (
        "convbench: error: the runs measured different problems: 1 only in A (conv4); --force "
        "compares the rows they share")
    code, out, _ = run_cli(capsys, "compare", a, c, "--force")
    assert code == 0 and "only in A" in out
    code, _, err = run_cli(capsys, "compare", a, b, "--fail-above", "nan")
    assert code == 2 and err.count("\n") == 1


def test_the_runs_answers_winners_and_ratios():
    a = results.frame(rows({("gemm", "conv3"): spread(2.0), ("gemm", "conv4"): spread(1.01)}))
    b = results.frame(rows({("gemm", "conv3"): spread(2.02), ("torch-cpu", "conv4"): spread(0.5)}))
    wins = compare.winners(a, b).set_index("layer")
    assert wins.loc["conv3", "answer"] == "same winner" and wins.loc["conv3", "A"] == "torch-cpu"
    assert wins.loc["conv4", "answer"] == "tie in A" and wins.loc["conv4", "B"] == "torch-cpu"
    ratios = compare.ratio_consistency(a, b).set_index("layer")
    assert bool(ratios.loc["conv3", "in A's interval"]) is True  # 2.02 in A's [1.9x, 2.1x]
    assert bool(ratios.loc["conv4", "in A's interval"]) is False  # 0.25 far from A's ~1.01
    text = compare.answers_text(a, b)
    assert "1 same winner, 0 same tie, 1 tie in A, 0 tie in B, 0 disagree" in text
    assert "1 of 2 of B's within A's 95% interval" in text


def busy_spread(median: float) -> Measurement:
    """`spread`, timed while other processes held the cores (a third of the ready time)."""
    return Measurement(spread(median).times_ms, cpu_share=(0.33,) * 7)


def test_a_busy_run_names_no_winner_and_says_its_changes_may_be_the_load():
    a = results.frame(rows({("gemm", "conv3"): spread(2.0), ("gemm", "conv4"): spread(2.0)}))
    # B beside a load: conv3's gemm contended and slow, torch-cpu quiet: a "win" for torch-cpu
    # that is only the load's; conv4 quiet, the same answer as A
    b = results.frame(rows({("gemm", "conv3"): busy_spread(6.0), ("gemm", "conv4"): spread(2.0)}))
    cmp = compare.compare(a, b).set_index(["algo", "layer"])
    assert cmp.loc[("gemm", "conv3"), "busy"] == "B" and cmp.loc[("gemm", "conv4"), "busy"] == ""
    assert "0 in A and 1 in B were timed on a busy machine" in compare.compare_table(
        compare.compare(a, b))
    wins = compare.winners(a, b).set_index("layer")
    assert wins.loc["conv3", "answer"] == "busy in B" and wins.loc["conv3", "B"] == "busy"
    assert wins.loc["conv4", "answer"] == "same winner"
    assert "1 same winner, 0 same tie, 0 tie in A, 0 tie in B, 0 disagree, 1 busy in B" in \
        compare.answers_text(a, b)
    assert "busy in" not in compare.answers_text(a, a)  # a quiet pair: the counts as before
    both = compare.compare(b, b)
    assert (both["busy"] == ["A+B" if x == "B" else x for x in cmp["busy"]]).all()
