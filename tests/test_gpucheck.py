"""`convbench gpu-check` in its dry form (on the CPU, a tiny batch): the one command the first GPU
session runs, kept working by CI."""

from test_cli import run_cli

from convbench import results

DRY = ["gpu-check", "--device", "cpu", "--batch", "1", "--budget", "0.002", "--layers", "conv3",
       "--pytest-args", "-m gpu -q -p no:cacheprovider -k cuda_timer_flushes"]


def test_the_gpu_check_leaves_everything_in_one_folder_and_resumes(tmp_path, capsys):
    folder = tmp_path / "check"
    code, out, err = run_cli(capsys, *DRY, "--out", str(folder))
    assert code == 0, err
    assert {p.name for p in folder.iterdir()} == {"env.json", "run", "summary.md", "tests.log"}
    df, env = results.load_run(folder / "run")
    assert set(df["layer"]) == {"conv3"} and set(df["n"]) == {1}
    assert set(df["status"]) <= {"ok", "unsupported"}  # every CPU algo, pass and layout
    algos = set(df["algo"])
    assert {"direct", "gemm", "fft", "winograd-2x2", "winograd-4x4", "torch-cpu"} <= algos
    assert len(df) == len(algos) * 3 * 2 and env["run"]["command"].startswith(
        "convbench gpu-check")
    text = (folder / "summary.md").read_text()
    assert out.startswith("# GPU check: ") and text.rstrip("\n") == out.rstrip("\n")
    for section in ("## Own SGEMM / cuBLAS", "## Best own kernel / cudnn-autotune",
                    "## NCHW / NHWC", "## Achieved FP32 TFLOP/s"):
        assert section in text
    assert "- tests: `pytest -m gpu -q -p no:cacheprovider -k cuda_timer_flushes`: 1 skipped" \
        in text
    assert "skipped" in (folder / "tests.log").read_text()

    code, _, _ = run_cli(capsys, *DRY, "--out", str(folder), "--no-tests")
    assert code == 0 and len(results.read_rows(folder / "run" / "measurements.csv")) == len(df)
    assert "- tests: `pytest -m gpu" in (folder / "summary.md").read_text()
    assert "not run (--no-tests)" in (folder / "summary.md").read_text()


def test_bad_input_is_one_line(capsys):
    for argv, words in ((["--layers", "conv9"], "unknown layer 'conv9'"),
                        (["--algos", "magic"], "unknown algo 'magic'")):
        code, _, err = run_cli(capsys, "gpu-check", "--device", "cpu", *argv)
        assert code == 2 and err.count("\n") == 1 and words in err
