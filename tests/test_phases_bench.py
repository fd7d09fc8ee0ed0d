"""The phases benchmark (`convbench.tools.phases_bench`) runs: a tiny problem, the last commit's
algorithm modules against the working tree's, every phase of each side in the table."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from convbench.tools import phases_bench

REPO = Path(phases_bench.__file__).resolve().parents[2]
TINY = "n=2,c=3,h=7,w=6,k=4,r=3,s=3,pad=1"


def _in_git() -> bool:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                              check=False, capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not _in_git(), reason="the baseline is read from git: not a git checkout")
def test_bench_runs_both_sides(tmp_path, capsys):
    out = tmp_path / "phases.csv"
    rc = phases_bench.main(["--baseline", "HEAD", "--layers", TINY, "--batch", "2",
                            "--algos", "gemm,fft,winograd-2x2", "--passes", "fwd,bwd_filter",
                            "--layouts", "nhwc", "--budget", "0.01", "--csv", str(out)])
    assert rc == 0
    df = pd.read_csv(out)
    sides = df.groupby(["algo", "pass_"])["side"].agg(set)
    assert len(sides) == 6 and all(s == {"before", "after"} for s in sides)
    fft = df[(df.algo == "fft") & (df.pass_ == "fwd") & (df.side == "after")]
    assert list(fft.phase) == ["transform x", "transform w", "product", "inverse y", "total"]
    phases = fft[fft.phase != "total"].ms.sum()
    assert fft[fft.phase == "total"].ms.item() == pytest.approx(phases, rel=0.5)
    assert "| after  |" in capsys.readouterr().out
    assert phases_bench.BASELINE_PACKAGE not in sys.modules  # a second run may load another


def test_bad_baseline_is_one_line(capsys):
    if not _in_git():
        pytest.skip("the baseline is read from git: not a git checkout")
    rc = phases_bench.main(["--baseline", "no-such-commit-xyz", "--layers", TINY])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("phases_bench: --baseline no-such-commit-xyz") and "\n" not in err
