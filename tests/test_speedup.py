"""The sorted speed-up picture of a run of many problems: wins only beyond noise, per class."""

import math
import warnings

import pandas as pd
import pytest
from test_cli import FAST, run_cli

from convbench.analysis import report, speedup


def _row(layer, algo, times, layout="nchw", status="ok", contended=False, c=8, r=3):
    t = sorted(times)
    return {"layer": layer, "pass": "fwd", "precision": "fp32", "algo": algo,
            "backend": "numpy", "layout": layout, "status": status,
            "median_ms": t[len(t) // 2] if status == "ok" else math.nan, "iqr_ms": 0.0,
            "times_ms": " ".join(map(str, times)) if status == "ok" else "",
            "round_group": "", "workspace_bytes": 0, "peak_bytes": math.nan,
            "rel_error": 0.0, "contended": contended, "throttled": "",
            "n": 1, "c": c, "h": 8, "w": 8, "k": 8, "r": r, "s": r, "stride": 1,
            "pad": r // 2, "dilation": 1, "groups": 1}


BASE = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99]


def test_a_win_is_beyond_noise_and_a_tie_is_not_a_win():
    df = pd.DataFrame([
        _row("a", "torch-cpu", BASE), _row("a", "gemm", [t / 2 for t in BASE]),  # 2x: win
        _row("b", "torch-cpu", BASE), _row("b", "gemm", [t * 1.001 for t in BASE]),  # tie
        _row("c", "torch-cpu", BASE), _row("c", "gemm", [t * 3 for t in BASE]),  # loss
        # the faster layout counts: nhwc at 4x beats the baseline's nchw
        _row("d", "torch-cpu", BASE), _row("d", "gemm", [t * 3 for t in BASE]),
        _row("d", "gemm", [t / 4 for t in BASE], layout="nhwc"),
        _row("e", "torch-cpu", BASE), _row("e", "gemm", [], status="unsupported"),
        _row("f", "torch-cpu", BASE, contended=True), _row("f", "gemm", BASE),  # busy
    ])
    every = speedup.speedups(df, "torch-cpu")
    sp = every[every["algo"] == "gemm"].set_index("layer")
    assert sp["outcome"].to_dict() == {"a": "win", "b": "tie", "c": "loss", "d": "win",
                                       "e": "not compared", "f": "not compared"}
    assert sp.loc["a", "speedup"] == pytest.approx(2.0, rel=0.02)
    assert sp.loc["a", "low"] <= 2.0 <= sp.loc["a", "high"]
    assert sp.loc["d", "speedup"] == pytest.approx(4.0, rel=0.02)
    table = speedup.summary(every, ["algo"])
    gemm = table.loc["gemm"].to_dict()
    low, high = speedup.gmean_interval(sp["speedup"])
    assert gemm == {
        "problems": 4, "wins": "50%", "ties": "25%", "losses": "25%",
        "geomean speed-up": f"{(2 * 1 / 1.001 / 3 * 4) ** 0.25:.3g}×",
        "95% interval": f"[{low:.3g}, {high:.3g}]",
        "median speed-up": f"{(2 + 1 / 1.001) / 2:.3g}×", "not compared": 2,
        "fastest of ours": ""}
    assert low < (2 * 1 / 1.001 / 3 * 4) ** 0.25 < high
    # gemm is the only one of ours: best of ours is gemm on every problem
    assert table.loc[speedup.BEST_OF_OURS, "fastest of ours"] == "gemm 4"
    assert table.loc[speedup.BEST_OF_OURS, "geomean speed-up"] == gemm["geomean speed-up"]


def test_best_of_ours_is_the_fastest_of_our_algorithms():
    """Per problem the fastest of ours (never a library's convolution), with its interval; the
    tables say which of ours it was."""
    df = pd.DataFrame([
        _row("a", "torch-cpu", BASE), _row("a", "gemm", [t * 2 for t in BASE]),
        _row("a", "direct", [t / 2 for t in BASE]),  # direct wins a
        _row("b", "torch-cpu", BASE), _row("b", "gemm", [t * 3 for t in BASE]),
        _row("b", "direct", [t * 4 for t in BASE]),  # gemm is ours' best on b, a loss
        _row("c", "torch-cpu", BASE), _row("c", "direct", [], status="unsupported"),
        _row("c", "gemm", [t / 1.0005 for t in BASE]),  # a tie
    ])
    sp = speedup.speedups(df, "torch-cpu")
    best = sp[sp["algo"] == speedup.BEST_OF_OURS].set_index("layer")
    assert best["winner"].to_dict() == {"a": "direct", "b": "gemm", "c": "gemm"}
    assert best["outcome"].to_dict() == {"a": "win", "b": "loss", "c": "tie"}
    assert best.loc["a", "speedup"] == pytest.approx(2.0, rel=0.02)
    assert best.loc["a", "low"] <= 2.0 <= best.loc["a", "high"]
    table = speedup.summary(sp, ["algo"])
    assert table.loc[speedup.BEST_OF_OURS, "fastest of ours"] == "gemm 2, direct 1"
    assert not speedup.is_ours("torch-cpu") and not speedup.is_ours("cudnn-find-fft")
    assert speedup.is_ours("winograd-fused-4x4") and not speedup.is_ours("gemm-cublas")


def test_the_interval_of_a_geometric_mean():
    low, high = speedup.gmean_interval(pd.Series([0.5, 1.0, 2.0, 4.0]))
    assert low < 2 ** 0.5 < high and low >= 0.5 and high <= 4.0
    assert speedup.gmean_interval(pd.Series([2.0]))[0] != speedup.gmean_interval(
        pd.Series([2.0]))[0]  # NaN: one problem has no interval
    assert speedup.gmean_interval(pd.Series([1.0, 2.0, 3.0])) == speedup.gmean_interval(
        pd.Series([1.0, 2.0, 3.0]))  # seeded


def test_the_classes_of_the_summary():
    df = pd.DataFrame([_row("a", "torch-cpu", BASE, r=1), _row("a", "gemm", BASE, r=1),
                       _row("b", "torch-cpu", BASE), _row("b", "gemm", BASE)])
    table = speedup.summary(speedup.speedups(df, "torch-cpu"), ["class", "algo"])
    assert list(table.index) == [("pointwise", "gemm"), ("pointwise", speedup.BEST_OF_OURS),
                                 ("dense", "gemm"), ("dense", speedup.BEST_OF_OURS)]


def test_the_default_baseline():
    assert speedup.default_baseline("cuda") == "cudnn-autotune"
    assert speedup.default_baseline("numpy") == "torch-cpu"


def test_a_sampled_cpu_run_draws_the_sorted_curve(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "bench", "--net", "convset", "--sample", "8", "--class",
                           "pointwise,dense", "--device", "cpu", "--algos", "gemm,torch-cpu",
                           "--passes", "fwd", "--layouts", "nchw", *FAST, "--out", str(out),
                           "--quiet")
    assert code == 0, err
    text = (out / report.REPORT_MD).read_text()
    assert "## Speed-up over torch-cpu" in text and "| gemm " in text
    assert "![speedup_fwd](speedup_fwd.png)" in text
    assert (out / "speedup_fwd.png").stat().st_size > 10_000
    code, stdout, err = run_cli(capsys, "report", str(out), "--baseline", "gemm")
    assert code == 0, err
    assert "## Speed-up over gemm" in stdout and "| torch-cpu " in stdout
    code, _, err = run_cli(capsys, "report", str(out), "--baseline", "fft")
    assert code == 2 and "--baseline fft was not measured" in err


def test_a_picture_with_nothing_compared_says_why(tmp_path):
    """Every time busy (or failed): no curve, no legend of nothing (matplotlib's warning),
    and the empty axes say why."""
    plt = pytest.importorskip("matplotlib.pyplot")
    sp = pd.DataFrame([{"layer": f"l{i}", "pass": "fwd", "precision": "fp32", "class": "dense",
                        "algo": "gemm", "speedup": math.nan, "low": math.nan, "high": math.nan,
                        "outcome": speedup.NOT_COMPARED} for i in range(8)])
    texts = []
    real_text = plt.Axes.text

    def text(ax, *args, **kwargs):
        texts.append(args[2])
        return real_text(ax, *args, **kwargs)

    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as mp:
        warnings.simplefilter("error")
        mp.setattr(plt.Axes, "text", text)
        speedup.draw(plt, sp, "torch-cpu", "fwd", tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 1000
    assert any("no problem compared with torch-cpu" in t for t in texts)


def test_few_problems_draw_no_curve():
    df = pd.DataFrame([_row("a", "torch-cpu", BASE), _row("a", "gemm", BASE)])
    assert report.speedup_section(df, {"run": {"backend": "numpy"}}) == []


def test_the_speed_up_axis_reads_in_plain_numbers(tmp_path, monkeypatch):
    """#45: the log axis of speed-ups near 1 read 6x10^-1; it reads 0.6."""
    plt = pytest.importorskip("matplotlib.pyplot")
    sp = pd.DataFrame([{"layer": f"l{i}", "pass": "fwd", "precision": "fp32", "class": "dense",
                        "algo": "gemm", "speedup": 0.6 + i / 10, "low": 0.5 + i / 10,
                        "high": 0.7 + i / 10, "outcome": "tie", "winner": ""}
                       for i in range(8)])
    figures = []
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    speedup.draw(plt, sp, "torch-cpu", "fwd", tmp_path / "s.png")
    (fig,) = figures
    fig.canvas.draw()
    labels = [t.get_text() for t in fig.axes[0].yaxis.get_ticklabels(minor=True)
              + fig.axes[0].yaxis.get_ticklabels() if t.get_text()]
    assert labels and all("10^" not in t and "times" not in t for t in labels), labels
    assert "0.6" in labels
