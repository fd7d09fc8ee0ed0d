import json

import numpy as np
import pytest
from test_cli import run_cli

from convbench.algos import registry
from convbench.analysis.report import sweep as sweepreport
from convbench.analysis.report.cells import BEST
from convbench.catalogs.layers import Layer, resolve
from convbench.core import fmt, results
from convbench.core.measurement import Measurement
from convbench.measure import batchsweep, memory, opcount, runner, verify

CONV3 = resolve("conv3").problem


def conv3_cases(n: int, algos: list[str]) -> list[runner.Case]:
    return runner.sweep([Layer("alexnet", "conv3", CONV3.with_batch(n))], algos, "numpy",
                        ["fwd"], ["nchw"], ["fp32"])


def footprint(algo: str, n: int) -> int:
    """Predicted bytes of conv3's forward at batch n: operands and declared workspace."""
    p = CONV3.with_batch(n)
    impl = registry.get(algo, "numpy")
    return (memory.operand_bytes(p, "fwd", np.float32)
            + opcount.workspace_bytes(impl, p, "fwd", "nchw", "fp32"))


def limit_between_batches_1_and_2(algo: str) -> int:
    """A memory limit `algo` fits at batch 1 and not at 2 (found from its declarations, so the
    test holds whatever the implementation's buffers)."""
    return (footprint(algo, 1) + footprint(algo, 2)) // 2


def sweep_argv(folder, limit: int, *extra) -> list[str]:
    return ["sweep", "--layers", "conv3", "--batch", "4,1,2", "--algos", "gemm,winograd-2x2",
            "--passes", "fwd", "--layouts", "nchw", "--budget", "0.002", "--memory-limit",
            str(limit), "--out", str(folder), *extra]


def statuses(folder) -> dict[tuple[str, int], str]:
    return {(r["algo"], int(r["n"])): r["status"]
            for r in results.read_rows(folder / results.RESULTS_CSV)}


def test_sweep_runs_until_oom_and_goes_on_with_the_others(tmp_path, capsys):
    limit = limit_between_batches_1_and_2("winograd-2x2")
    assert footprint("gemm", 4) < limit  # gemm fits at every batch
    folder = tmp_path / "sweep"
    code, out, err = run_cli(capsys, *sweep_argv(folder, limit))
    assert code == 0
    assert statuses(folder) == {("gemm", 1): "ok", ("winograd-2x2", 1): "ok",
                                ("gemm", 2): "ok", ("winograd-2x2", 2): "oom",
                                ("gemm", 4): "ok"}  # winograd-2x2 not tried at 4
    assert "1 not tried (their series ran out of memory)" in err
    df, env = results.load_run(folder)
    assert env["run"]["batch"] == [1, 2, 4] and env["run"]["memory_limit_bytes"] == limit
    assert env["memory_method"] == "torch-profiler+tracemalloc"
    ok = df[df["status"] == "ok"]
    assert (ok["peak_bytes"] > 0).all() and (ok["memory_method"] != "").all()
    gemm = ok[ok["algo"] == "gemm"].sort_values("n")
    assert gemm["peak_bytes"].is_monotonic_increasing  # the column matrix grows with the batch
    oom = df[df["status"] == "oom"].iloc[0]
    assert oom["reason"].startswith("OverLimit: predicted footprint")
    for heading in ("## Time per image", "## Peak memory", "## Out of memory",
                    "### fwd, nchw, fp32", f"Memory limit: {memory.format_size(limit)}"):
        assert heading in out
    table = sweepreport.oom_table(df)
    assert table.loc[("conv3", "winograd-2x2"), "oom at batch"] == 2
    assert table.loc[("conv3", "winograd-2x2"), "largest that ran"] == 1
    if fmt.pyplot() is not None:
        assert (folder / "sweep_conv3.png").read_bytes()[:4] == b"\x89PNG"


def test_resumed_sweep_finishes_and_keeps_skipping_what_ran_out(tmp_path, capsys, monkeypatch):
    limit = limit_between_batches_1_and_2("winograd-2x2")
    folder = tmp_path / "sweep"
    real, seen = runner.prepare, []

    def interrupt_after_the_oom(case, *args, **kw):
        if len(seen) == 4:  # gemm 1, winograd 1, gemm 2, winograd 2 (oom) are done
            raise KeyboardInterrupt
        seen.append(case)
        return real(case, *args, **kw)

    monkeypatch.setattr(runner, "prepare", interrupt_after_the_oom)
    code, _, err = run_cli(capsys, *sweep_argv(folder, limit))
    assert code == 130 and "--resume" in err
    assert len(statuses(folder)) == 4

    measured = []
    monkeypatch.setattr(runner, "prepare",
                        lambda case, *a, **k: measured.append(case) or real(case, *a, **k))
    code, _, err = run_cli(capsys, *sweep_argv(folder, limit, "--resume"))
    assert code == 0
    assert [(c.algo, c.problem.n) for c in measured] == [("gemm", 4)]
    assert "1 not tried (their series ran out of memory)" in err
    assert len(statuses(folder)) == 5


def test_skip_larger_reads_rows_from_a_file_and_from_the_run():
    at = {n: conv3_cases(n, ["gemm", "fft"]) for n in (1, 2, 4)}
    earlier = [{**runner.row(at[2][1], "oom", "no room"), "n": "2"}]  # as read from a CSV
    skip = batchsweep.SkipLarger(earlier)
    assert [(c.algo, c.problem.n) for c in skip.pending(at[1] + at[4])] == [
        ("gemm", 1), ("fft", 1), ("gemm", 4)]
    skip.observe(runner.row(at[1][0], "oom", "no room"))
    assert list(skip.pending(at[4])) == [] and skip.skipped == 3


def test_default_limits():
    assert batchsweep.default_limit("cuda") is None
    host = batchsweep.default_limit("numpy").nbytes
    assert 0 < host <= memory.available_host_bytes()


def test_sweep_report_is_chosen_by_the_data():
    df = results.frame([runner.row(c, "unsupported", "why")
                       for n in (1, 2) for c in conv3_cases(n, ["gemm"])])
    assert sweepreport.is_batch_sweep(df) and not sweepreport.is_batch_sweep(df[df["n"] == 1])
    text = sweepreport.sweep_markdown(df, {}, "no plots")
    assert "## Not measured" in text and "## Out of memory" not in text


def test_a_sweep_shows_an_inexact_time_marked_never_the_fastest():
    """torch's inexact time at each batch is shown, marked, its peak read; the fastest mark
    goes to the fastest verified time, and an inexact row is not under Not measured."""
    rows = []
    for n in (1, 2):
        gemm, torch_cpu = conv3_cases(n, ["gemm", "torch-cpu"])
        rows.append(runner.row(gemm, "ok", check=verify.Check(True, 1e-7, 1e-6, 1e-5),
                               m=Measurement((2.0 * n,) * 3), peak_bytes=1 << 20))
        bad = verify.Check(False, 5.1e-3, 0.1, 6.75e-4)
        rows.append(runner.row(torch_cpu, "inexact", bad.reason, check=bad,
                               m=Measurement((1.0 * n,) * 3), peak_bytes=1 << 20))
    df = results.frame(rows)
    table = sweepreport.per_image_table(df)
    assert table.loc[("conv3", "torch-cpu"), 2] == "†1"
    assert table.loc[("conv3", "gemm"), 2] == "2" + BEST
    assert sweepreport.peak_batch_table(df).loc[("conv3", "torch-cpu"), 1] == "1"
    assert "## Not measured" not in sweepreport.sweep_markdown(df, {}, "no plots")


def test_json_output_of_a_sweep(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "sweep", "--layers", "conv5", "--batch", "1", "--algos",
                           "gemm", "--passes", "bwd_filter", "--layouts", "nhwc", "--budget",
                           "0.002", "--out", str(tmp_path / "s"), "--format", "json")
    assert code == 0
    (row,) = json.loads(out)
    assert row["status"] == "ok" and isinstance(row["peak_bytes"], int)


@pytest.mark.gpu
def test_cuda_sweep_records_a_real_oom(tmp_path, capsys):
    """On the GPU the limit is the allocators'. fft on AlexNet's conv4 holds, even at batch 1,
    its filter spectra and a real grid sized by the largest operand (the filters): about 237 MiB
    of workspace, and 320 MiB at batch 128. The limit is set halfway between fft's measured peak
    at batch 1 (cuFFT's work areas included) and its declared need at 128, so batch 1 fits and
    128 does not; direct, with no workspace, fits batch 256 (137 MiB of operands)."""
    conv4 = resolve("conv4").problem
    fft = registry.get("fft", "cuda")

    def need(algo, n: int) -> int:
        p = conv4.with_batch(n)
        return (memory.operand_bytes(p, "fwd", np.float32)
                + opcount.workspace_bytes(registry.get(algo, "cuda"), p, "fwd", "nchw", "fp32"))

    argv = ["--device", "cuda", "--layers", "conv4", "--passes", "fwd", "--layouts", "nchw",
            "--budget", "0.01"]
    code, _, _ = run_cli(capsys, "sweep", *argv, "--batch", "1", "--algos", "fft", "--out",
                         str(tmp_path / "free"))
    assert code == 0
    (row,) = results.read_rows(tmp_path / "free" / results.RESULTS_CSV)
    peak = int(row["peak_bytes"])
    assert 0 < peak < need("fft", 128), (peak, need("fft", 128))
    limit = (max(peak, need("fft", 1)) + need("fft", 128)) // 2
    assert need("direct", 256) < limit
    folder = tmp_path / "sweep"
    code, _, _ = run_cli(capsys, "sweep", *argv, "--batch", "1,128,256", "--algos",
                         "fft,direct", "--memory-limit", str(limit), "--out", str(folder))
    assert code == 0
    got = statuses(folder)
    assert got[("fft", 1)] == "ok" and got[("fft", 128)] == "oom" and ("fft", 256) not in got
    assert got[("direct", 256)] == "ok"
    assert fft.workspace_bytes(conv4.with_batch(1), "fwd", "nchw", "fp32") > 200 * 2**20
