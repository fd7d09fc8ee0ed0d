"""The `--model` door: any nn.Module from the command line, its conv layers found, deduplicated,
counted, named by module path, and measured like a catalog; bad doors are one line, exit 2."""

import dataclasses
import json
import sys
import textwrap

import pytest

from convbench import cli
from convbench.catalogs import layers
from convbench.core import results
from convbench.core.problem import ConvProblem
from convbench.planning import models

torch = pytest.importorskip("torch")

#: A small network of the user's, in a module of its own: two identical 3x3 convs (one
#: problem, two occurrences), a strided 1x1, and a module convbench cannot run (reflect pad).
USER_MODULE = textwrap.dedent('''
    import torch
    from torch import nn

    class Small(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 4, 3, padding=1)
            self.body = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(4, 4, 3, padding=1))
            self.down = nn.Conv2d(4, 8, 1, stride=2)
            self.odd = nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect")

        def forward(self, x):
            return self.odd(self.down(self.body(self.stem(x))))

    def small():
        return Small()

    class Scaled(nn.Conv2d):
        def forward(self, x):
            return super().forward(x) * 0.5

    def scaled():
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), Scaled(4, 4, 3))

    def not_a_module():
        return 42

    def broken():
        raise RuntimeError("no weights here")
''')


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "usernets.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "usernets"


def test_layers_are_deduplicated_counted_and_named_by_module_path(user_module):
    found = models.conv_layers(models.load(f"{user_module}:small"), (2, 3, 8, 8), "small")
    assert [layer.name for layer in found.layers] == ["stem", "body.0", "down"]
    assert found.occurrences == {"stem": 1, "body.0": 2, "down": 1}
    assert found.layers[1].problem == ConvProblem(n=2, c=4, h=8, w=8, k=4, r=3, s=3, pad=1)
    assert found.layers[2].problem == ConvProblem(n=2, c=4, h=8, w=8, k=8, r=1, s=1, stride=2)
    assert [u.layer for u in found.unplanned] == ["odd"]
    assert "reflect" in found.unplanned[0].reason


def test_the_catalog_net_loads_by_module_and_callable():
    """The README's `--model convbench.studies.workload:build_model`: the AlexNet-shaped model
    whose conv layers are the catalog's, named as in it, at the input's batch."""
    found = models.conv_layers(models.load("convbench.studies.workload:build_model"),
                               (1, 3, 227, 227), "alexnet")
    catalog = layers.net_layers("alexnet")
    assert [layer.name for layer in found.layers] == [layer.name for layer in catalog]
    assert [layer.problem for layer in found.layers] == [
        dataclasses.replace(layer.problem, n=1) for layer in catalog]


@pytest.mark.parametrize("spec, input_, says", [
    ("usernets", "1,3,8,8", "is not MODULE:CALLABLE"),
    ("no_such_module_here:net", "1,3,8,8", ("cannot import no_such_module_here: "
                                            "ModuleNotFoundError")),
    ("usernets:nothing", "1,3,8,8", "usernets has no nothing"),
    ("usernets:not_a_module", "1,3,8,8", "not_a_module() returned a int, not an nn.Module"),
    ("usernets:broken", "1,3,8,8", "broken() failed: RuntimeError: no weights here"),
    ("usernets:small", "1,5,8,8", "the model rejects input 1,5,8,8: RuntimeError"),
    ("usernets:small", "1,3,8", "has 3 dimensions"),
    ("usernets:small", "1,3,8,x", "is not N,C,H,W"),
    ("usernets:small", "0,3,8,8", "must be in 1..2147483647"),
])
def test_a_bad_model_door_is_one_line_and_exit_2(user_module, capsys, spec, input_, says):
    code = cli.main(["bench", "--model", spec, "--input", input_, "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and says in err and "Traceback" not in err


@pytest.mark.parametrize("argv, says", [
    (["bench", "--model", "usernets:small"], "--model needs --input N,C,H,W"),
    (["bench", "--input", "1,3,8,8"], "--input goes with --model"),
    (["bench", "--model", "usernets:small", "--input", "1,3,8,8", "--net", "vgg16"],
     "--model and --net are sources of layers: give one"),
    (["layer"], "no layer given"),
    (["layer", "conv2", "--problems", "x.csv"], "give layers, --model or --problems"),
    (["bench", "--problems", "x.csv", "--net", "vgg16"], "--problems and --net are sources"),
])
def test_model_options_that_do_not_go_together(user_module, capsys, argv, says):
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    _, err = capsys.readouterr()
    assert code == 2 and says in err and err.count("\n") == 1


def test_bench_model_sweeps_the_models_layers_into_a_run_folder(user_module, tmp_path, capsys):
    out = tmp_path / "run"
    code = cli.main(["bench", "--model", f"{user_module}:small", "--input", "2,3,8,8",
                     "--device", "cpu", "--algos", "direct,gemm", "--passes", "fwd",
                     "--layouts", "nchw", "--budget", "0.002", "--out", str(out)])
    _, err = capsys.readouterr()
    assert code == 0
    assert "odd not measured: padding_mode 'reflect'" in err
    assert "4 conv layers, 3 distinct problems" in err
    df, env = results.load_run(out)
    assert set(df["layer"]) == {"stem", "body.0", "down"} and set(df["net"]) == {"small"}
    assert set(df["status"]) == {"ok"} and (df["n"] == 2).all()
    assert env["run"]["model"] == f"{user_module}:small" and env["run"]["input"] == [2, 3, 8, 8]
    assert env["run"]["occurrences"] == {"stem": 1, "body.0": 2, "down": 1}
    report = (out / "report.md").read_text()
    assert "## Network cost" in report


def test_layer_model_takes_batch_and_prints_rows(user_module, capsys):
    code = cli.main(["layer", "--model", f"{user_module}:small", "--input", "2,3,8,8",
                     "--batch", "1", "--device", "cpu", "--algos", "gemm", "--passes", "fwd",
                     "--layouts", "nhwc", "--budget", "0.002", "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 0 and [r["layer"] for r in rows] == ["stem", "body.0", "down"]
    assert {r["n"] for r in rows} == {1}


def test_tune_cli_plans_the_model_and_writes_the_plan(user_module, tmp_path, capsys):
    from convbench.planning.plan import Plan

    out = tmp_path / "plan.json"
    code = cli.main(["tune", "--model", f"{user_module}:small", "--input", "2,3,8,8",
                     "--device", "cpu", "--algos", "direct,gemm", "--layouts", "nchw",
                     "--budget", "0.002", "--store", str(tmp_path / "store"), "--out", str(out)])
    printed, err = capsys.readouterr()
    assert code == 0 and f"plan written to {out}" in err
    plan = Plan.load(out)
    assert [lp.layer for lp in plan.layers] == ["stem", "body.0", "body.2", "down"]
    assert [u.layer for u in plan.unplanned] == ["odd"]
    assert "## Per-layer best" in printed and "body.2" in printed
    assert list((tmp_path / "store").glob("*.json"))  # and in the store


def test_tune_cli_bad_model_is_one_line(user_module, tmp_path, capsys):
    code = cli.main(["tune", "--model", f"{user_module}:broken", "--input", "2,3,8,8",
                     "--device", "cpu", "--store", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "broken() failed" in err


# --- the --problems door --------------------------------------------------------------------
BENCHDNN = """# two of AlexNet's, in benchdnn's own words
mb2ic3ih13oc4kh3ph1n"alexnet:conv3"
--mb=1
g2ic4ih9oc4kh3sh2n"grouped*3"
"""


def test_bench_problems_reads_benchdnn_lines_and_weighs_by_count(tmp_path, capsys):
    problems = tmp_path / "shapes_small"
    problems.write_text(BENCHDNN)
    out = tmp_path / "run"
    code = cli.main(["bench", "--problems", str(problems), "--device", "cpu", "--algos",
                     "direct", "--passes", "fwd", "--layouts", "nchw", "--budget", "0.002",
                     "--out", str(out)])
    capsys.readouterr()
    df, env = results.load_run(out)
    assert code == 0 and list(df["layer"]) == ["alexnet:conv3", "grouped*3"]
    assert list(df["n"]) == [2, 1] and list(df["groups"]) == [1, 2]
    assert set(df["net"]) == {"shapes_small"} and set(df["status"]) == {"ok"}
    assert env["run"]["occurrences"] == {"alexnet:conv3": 1, "grouped*3": 3}
    text = (out / "report.md").read_text()
    assert "## Network cost" in text and "| grouped*3 " in text


def test_layer_problems_csv_with_per_axis_fields_and_batch(tmp_path, capsys):
    problems = tmp_path / "mine.csv"
    problems.write_text("name,n,c,h,w,k,r,s,stride,pad\na,4,3,9,9,4,3,3,2,1\n"
                        "b,4,3,9,9,4,1,1,1,0\n")
    code = cli.main(["layer", "--problems", str(problems), "--batch", "1", "--device", "cpu",
                     "--algos", "gemm", "--passes", "fwd", "--layouts", "nchw", "--budget",
                     "0.002", "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 0 and [r["layer"] for r in rows] == ["a", "b"]
    assert [r["n"] for r in rows] == [1, 1] and [r["stride"] for r in rows] == [2, 1]


def test_a_malformed_problem_file_is_one_line_and_nothing_runs(tmp_path, capsys):
    problems = tmp_path / "bad.csv"
    problems.write_text("n,c,h,w,k,r,s\n1,3,9,9,4,3,3\n1,3,9,nine,4,3,3\n")
    out = tmp_path / "run"
    code = cli.main(["bench", "--problems", str(problems), "--device", "cpu", "--out",
                     str(out)])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and f"{problems}:3: w:" in err
    assert not out.exists()


def test_a_module_in_the_current_folder_loads_without_pythonpath(tmp_path, monkeypatch):
    """`--model mynet:net` beside mynet.py, as a newcomer types it: the current folder is
    searched after the installed packages, never before them."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cwd_model_for_test.py").write_text(
        "import torch\ndef net():\n    return torch.nn.Conv2d(3, 4, 3)\n")
    model = models.load("cwd_model_for_test:net")
    assert model.out_channels == 4
    assert sys.path[-1] == str(tmp_path)


def test_bench_model_says_which_measured_layers_apply_would_keep(user_module, capsys):
    """#35: a conv with its own forward is measured, and the run says apply leaves it to torch."""
    found = models.conv_layers(models.load(f"{user_module}:scaled"), (1, 3, 8, 8), "scaled")
    assert [layer.name for layer in found.layers] == ["0", "1"]
    assert list(found.kept) == ["1"] and "has its own forward" in found.kept["1"]
    code = cli.main(["layer", "--model", f"{user_module}:scaled", "--input", "1,3,8,8",
                     "--device", "cpu", "--algos", "gemm", "--passes", "fwd", "--layouts",
                     "nhwc", "--budget", "0.002", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0 and [r["layer"] for r in json.loads(out)] == ["0", "1"]
    assert "convbench: 1 measured; apply would keep it as it is: Scaled has its own forward" in err
