"""The phases benchmark (`convbench.tools.phases_bench`) runs: a tiny problem, the last commit's
algorithm modules against the working tree's, every phase of each side in the table."""

import re
import shlex
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


def _readme_lines() -> list[list[str]]:
    """The phases_bench command lines of the README's console blocks, as the tool's
    arguments."""
    readme = REPO / "README.md"
    text = readme.read_text() if readme.exists() else ""
    out = []
    for body in re.findall(r"^```console\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
        for line in body.splitlines():
            words = (shlex.split(line.strip().removeprefix("$ "), comments=True)
                     if "phases" in line else [])
            if words[:1] == ["make"] and words[1:2] == ["phases"]:
                out.append([a for w in words[2:] if w.startswith("PHASES_ARGS=")
                            for a in shlex.split(w.partition("=")[2])])
            elif "convbench.tools.phases_bench" in words:
                out.append(words[words.index("convbench.tools.phases_bench") + 1:])
    return out


def test_the_readme_commands_parse():
    """Every phases_bench command the README quotes parses with the tool's own parser."""
    lines = _readme_lines()
    if not lines:
        pytest.skip("the README quotes no phases_bench command yet")
    for argv in lines:
        phases_bench._parser().parse_args(argv)
