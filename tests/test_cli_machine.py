"""`convbench machine`: the ceilings every run states, on the command line."""

import json

from test_ceilings import fake_ceilings

from convbench import cli
from convbench.measure import ceilings


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_machine_prints_the_ceilings_and_how_each_was_measured(capsys, monkeypatch):
    asked = []

    def measure(device, threads, refresh=False):
        asked.append((device, threads, refresh))
        return fake_ceilings(methods={"gflops": "best of 3, fake"})

    monkeypatch.setattr(ceilings, "measure", measure)
    code, out, _ = run(capsys, "machine", "--threads", "1", "--refresh")
    assert code == 0 and asked == [("cpu", 1, True)]
    assert "attainable fp32: 100 GFLOP/s" in out and "gflops: best of 3, fake" in out
    code, out, _ = run(capsys, "machine", "--format", "json")
    assert code == 0 and json.loads(out)["gflops_attainable"] == 100.0


def test_machine_refuses_bad_input_in_one_line(capsys):
    for argv, says in ((["--device", "tpu"], "invalid choice: 'tpu'"),
                       (["--threads", "4096"], "--threads 4096: this process may run on")):
        try:
            code = cli.main(["machine", *argv])
        except SystemExit as exc:
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2 and says in err and err.count("\n") == 1, err


def test_machine_says_its_ceilings_came_from_the_cache_and_when(capsys, monkeypatch, tmp_path,
                                                               real_ceilings):
    """#45: `convbench machine` printed cached ceilings as if measured now: the first call
    measures (and says so), the second reads the cache and says that, and when they were
    measured."""
    monkeypatch.setattr(ceilings, "measure", real_ceilings)
    monkeypatch.setenv("CONVBENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ceilings, "measure_cpu", lambda threads, scale=1.0: fake_ceilings(
        threads=threads, measured_at="2026-01-01T00:00:00+00:00"))
    _, first, _ = run(capsys, "machine", "--threads", "1")
    _, second, _ = run(capsys, "machine", "--threads", "1")
    assert "measured 2026-01-01T00:00:00+00:00, for this run" in first.splitlines()[0]
    assert ("measured 2026-01-01T00:00:00+00:00, taken from this machine's cache "
            "(`convbench machine --refresh` measures again)") in second.splitlines()[0]
    _, again, _ = run(capsys, "machine", "--threads", "1", "--refresh")
    assert "for this run" in again.splitlines()[0]
