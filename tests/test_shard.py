"""Sharded sweeps: `torchrun --nproc-per-node 2 -m convbench bench` on this machine (gloo, two
processes) writes exactly the rows of an unsharded bench, no case lost or measured twice, also
when a rank dies and the run is resumed; the merging of partial files on its own."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import convbench
from convbench import cli
from convbench.core import results
from convbench.runs.shard import Shard

ROOT = Path(convbench.__file__).resolve().parent.parent
BENCH = ["bench", "--algos", "torch-cpu,gemm", "--batch", "1", "--passes", "fwd", "--layouts",
         "nhwc", "--budget", "0.002"]
#: What a row says besides its times and measured memory: equal in a sharded and an unsharded
#: run, errors included: each rank gets its share of the cores (one thread here), so the
#: unsharded run is given one thread too (BLAS sums in another order with two, which moves a
#: max_abs_error by a few percent).
CONTENT = (*results.KEY, "net", "status", "reason", "tolerance", "workspace_bytes", "algo_ops",
           "memory_method")
ERRORS = ("rel_error", "max_abs_error")
#: The products' library pinned in every process: where the probe picks (`algos.products`), a
#: busy machine may tip two processes to different libraries, whose sums round apart.
PINNED = {"CONVBENCH_GEMM": "torch"}
#: A rank that dies: rank 1 exits, as if killed, when its second group of competing cases (a
#: layer's two algos) starts.
DYING = """\
import os, sys
from convbench import cli
from convbench.measure import runner
real, started = runner.prepare, []
def prepare(case, *args, **kw):
    if os.environ["RANK"] == "1" and len(started) == 2:
        os._exit(9)
    started.append(case)
    return real(case, *args, **kw)
runner.prepare = prepare
sys.exit(cli.main())
"""


def torchrun(*argv, script: list[str] | None = None) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node 2 -m convbench ARGV` (or SCRIPT ARGV), bounded."""
    target = script or ["-m", "convbench"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **PINNED}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", *target, *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180, check=False)


def content(folder: Path) -> list[tuple]:
    """The rows of `folder`'s measurements.csv as (CONTENT, ERRORS) tuples, in file order."""
    return [(tuple(r[c] for c in CONTENT), [float(r[c]) for c in ERRORS])
            for r in results.read_rows(folder / "measurements.csv")]


def assert_same_rows(got: list[tuple], want: list[tuple]) -> None:
    assert [c for c, _ in got] == [c for c, _ in want]
    for (_, errors), (_, expected) in zip(got, want):
        assert errors == pytest.approx(expected, rel=1e-6, abs=1e-8)


@pytest.fixture(scope="module")
def unsharded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("unsharded") / "run"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in PINNED.items():
            mp.setenv(name, value)
        assert cli.main([*BENCH, "--threads", "1", "--out", str(folder)]) == 0
    rows = content(folder)
    assert len(rows) == 10 and len({r[0] for r in rows}) == 10
    return rows


def test_a_sharded_bench_writes_exactly_the_unsharded_rows(unsharded, tmp_path):
    proc = torchrun(*BENCH, "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_same_rows(content(tmp_path / "run"), unsharded)  # each case once, in order
    assert results.partial_files(tmp_path / "run") == []
    assert proc.stdout.count("## Time per layer") == 1  # rank 0 alone prints the report
    _, env = results.load_run(tmp_path / "run")
    assert env["run"]["ranks"] == 2


def test_a_dead_rank_loses_only_its_unfinished_cases(unsharded, tmp_path):
    script = tmp_path / "dying.py"
    script.write_text(DYING)
    folder = tmp_path / "run"
    proc = torchrun(*BENCH, "--out", str(folder), script=[str(script)])
    assert proc.returncode != 0
    kept = {results.row_key(r): r["times_ms"] for r in results.partial_rows(folder)}
    assert len(results.read_rows(folder / results.partial_csv(folder, 1))) == 2
    assert 1 <= len(kept) < 10

    proc = torchrun(*BENCH, "--out", str(folder), "--resume")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_same_rows(content(folder), unsharded)
    final = {results.row_key(r): r["times_ms"] for r in results.read_rows(
        folder / "measurements.csv")}
    assert all(final[k] == times for k, times in kept.items())  # kept, not measured again
    assert results.partial_files(folder) == []


#: Rank 1 late: it waits SLOW_S seconds before its first case, so the run lasts that long at
#: least, and rank 0, done before it, waits for its rows.
SLOW_S = 4
SLOW_RANK = f"""\
import os, sys, time
from convbench import cli
from convbench.measure import runner
real, started = runner.prepare, []
def prepare(case, *args, **kw):
    if os.environ["RANK"] == "1" and not started:
        time.sleep({SLOW_S})
    started.append(case)
    return real(case, *args, **kw)
runner.prepare = prepare
sys.exit(cli.main())
"""


def test_rank_0_alone_says_what_the_run_chose_found_and_took(tmp_path):
    """#45: rank 1 printed its own sample line, row count and summary, and rank 0's summary
    gave its own seconds, not the run's: rank 0 alone speaks, and its time covers the slowest
    rank's share."""
    script = tmp_path / "slow.py"
    script.write_text(SLOW_RANK)
    proc = torchrun(*BENCH, "--sample", "3", "--out", str(tmp_path / "run"),
                    script=[str(script)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    err = proc.stderr
    assert err.count("3 of 5 problems, a sample drawn with seed 0") == 1, err
    assert err.count(f"rows in {tmp_path / 'run'}") == 1, err
    (took,) = re.findall(r"convbench: \d+ cases in (\d+)m(\d\d)s", err)
    assert 60 * int(took[0]) + int(took[1]) >= SLOW_S, err


def row(layer: str, times: str) -> dict:
    return {**dict.fromkeys(results.COLUMNS, ""), "layer": layer, "n": "1", "times_ms": times}


def test_partial_files_merge_into_one_row_per_case(tmp_path):
    sink = results.CsvSink(tmp_path / "measurements.csv")
    sink.append(row("conv2", "1"))
    results.CsvSink(results.partial_csv(tmp_path, 0)).append(row("conv1", "2"))
    results.CsvSink(results.partial_csv(tmp_path, 1)).append(row("conv2", "3"))
    with open(results.partial_csv(tmp_path, 1), "a") as f:
        f.write("conv3,1,half a row")  # a rank killed while writing
    results.merge_rows(tmp_path, [row("conv3", "4"), row("conv1", "5")],
                       order=[results.row_key(row(name, "")) for name in ("conv1", "conv2")])
    merged = results.read_rows(tmp_path / "measurements.csv")
    assert [(r["layer"], r["times_ms"]) for r in merged] == [("conv1", "2"), ("conv2", "1"),
                                                            ("conv3", "4")]
    assert results.partial_files(tmp_path) == []
    results.CsvSink(results.partial_csv(tmp_path, 3)).append(row("conv4", "6"))
    opened = results.RunFolder.open(tmp_path, {}, resume=True)  # a resume merges them too
    assert [r["layer"] for r in opened.measured] == ["conv1", "conv2", "conv3", "conv4"]


def test_round_robin_shares_cover_every_case_once():
    cases = list(range(11))
    shares = [Shard(rank, 3).share(cases) for rank in range(3)]
    assert sorted(c for s in shares for c in s) == cases and shares[1] == [1, 4, 7, 10]


def test_a_bad_local_rank_is_one_line_and_exit_2(monkeypatch, capsys):
    from convbench.runs import shard

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "first")
    assert cli.main([*BENCH]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "LOCAL_RANK='first' is not an integer" in err[0]
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setattr(shard, "_gpu_count", lambda: 2)
    with pytest.raises(ValueError, match="LOCAL_RANK=2, but this node has 2 GPU"):
        shard.from_env("cuda")


def test_each_rank_gets_its_share_of_the_host_threads(monkeypatch):
    from convbench.runs import shard

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert shard.host_threads(None, 16) is None
    assert shard.host_threads(Shard(1, 4), 16) == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # 4 ranks, 2 on this node
    assert shard.host_threads(Shard(1, 4), 16) == 8
    assert shard.host_threads(Shard(1, 4), 1) == 1
