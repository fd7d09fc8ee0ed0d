"""The ConvBench catalog: its file, its conversion, its classes and samples, and a run of it."""

import gzip
import json
import pickle

import pytest
from test_cli import FAST, run_cli

from convbench.catalogs import convset, layers, selection
from convbench.core.problem import ConvProblem
from convbench.tools import convert_convset


def test_the_catalog_loads_with_its_counts():
    catalog = convset.load()
    assert catalog.total == 8498  # 9,017 entries of the study, merged where only the bias differs
    assert len(catalog.entries) == 8498 and catalog.skipped == {}
    assert sum(e.count for e in catalog.entries) == 77820  # every conv module of the study
    assert len(layers.net_layers("convset")) == 8498
    # TIMM's SAME padding with an odd total pads one more after than before
    uneven = [e for e in catalog.entries if e.problem.pad_top != e.problem.pad_bottom
              or e.problem.pad_left != e.problem.pad_right]
    assert len(uneven) == 228
    cb1108 = next(e for e in catalog.entries if e.name == "cb1108")
    assert cb1108.problem == ConvProblem(1, 3, 192, 192, 16, 3, 3, stride=2, pad=((0, 1), (0, 1)))
    assert cb1108.problem.spec().endswith("stride=2,pad=0+1")
    assert len({e.problem for e in catalog.entries}) == 8498  # distinct, the sides kept
    names = [e.name for e in catalog.entries]
    assert len(set(names)) == len(names) and names[0] == "cb0001"


def test_every_conv_module_and_model_of_the_study_is_kept():
    text = gzip.decompress(convset.DATA.read_bytes()).decode().splitlines()
    rows = [line.split(",") for line in text[1:]]
    header = text[0].split(",")
    layers_, sources = header.index("layers"), header.index("sources")
    assert sum(int(r[layers_]) for r in rows) == 77820  # the study's conv modules
    models = set()
    for r in rows:
        for source in r[sources].split():
            models.add(source.partition("*")[0])
    assert len(models) == 1017  # the study's models
    first = convset.load().entries[0]  # the stem of bat_resnext26ts and 34 other models
    assert first.problem == ConvProblem(1, 3, 256, 256, 24, 3, 3, stride=2, pad=1)
    assert first.count == 35 and first.models == 35
    assert first.sources.split()[0] == "bat_resnext26ts"


def test_the_classes_of_the_catalog():
    counts = selection.class_counts(layers.net_layers("convset"))
    assert counts == {"pointwise": 5092, "grouped": 590, "depthwise": 1697, "dilated": 10,
                      "rectangular": 31, "dense": 1078}


@pytest.mark.parametrize("problem, cls", [
    (ConvProblem(1, 8, 5, 5, 8, 1, 1), "pointwise"),
    (ConvProblem(1, 8, 5, 5, 8, 3, 3, pad=1, groups=8), "depthwise"),
    (ConvProblem(1, 8, 5, 5, 16, 1, 1, groups=2), "grouped"),
    (ConvProblem(1, 8, 9, 9, 8, 3, 3, dilation=2), "dilated"),
    (ConvProblem(1, 8, 5, 5, 8, 1, 7, pad=(0, 3)), "rectangular"),
    (ConvProblem(1, 8, 5, 7, 8, 3, 3), "rectangular"),
    (ConvProblem(1, 8, 5, 5, 8, 3, 3), "dense"),
])
def test_classify(problem, cls):
    assert selection.classify(problem) == cls


def test_a_sample_is_seeded_and_kept_in_order():
    found = layers.net_layers("convset")
    a = selection.select(found, ["dense"], 20, seed=0)
    assert a == selection.select(found, ["dense"], 20, seed=0)
    assert a != selection.select(found, ["dense"], 20, seed=1)
    assert len(a) == 20 and {selection.classify(la.problem) for la in a} == {"dense"}
    assert [la.name for la in a] == sorted(la.name for la in a)
    assert len(selection.select(found, ["dilated"], 100)) == 10  # all there are
    with pytest.raises(ValueError, match="unknown class 'wide'; valid: pointwise"):
        selection.parse_classes("dense,wide")


def _key(inp, out, kernel, pad, stride, dil=(1, 1), groups=1, bias=False):
    j = lambda t: ",".join(map(str, t))
    return (f"{j(inp)}_{j(out)}_{j(kernel)}-{j(pad)}-{j(stride)}-{j(dil)}-{groups}-False_"
            f"{bias}")


def test_conversion_merges_bias_and_deduces_same_padding(tmp_path):
    convs = {
        _key((1, 3, 8, 8), (1, 4, 8, 8), (3, 3), (1, 1, 1, 1), (1, 1)): ["m1.a", "m1.b"],
        _key((1, 3, 8, 8), (1, 4, 8, 8), (3, 3), (1, 1, 1, 1), (1, 1), bias=True): ["m2.c"],
        # TIMM's Conv2dSame: padding 0 held, output 4 from 8 at stride 2: total 1, after 1
        _key((1, 3, 8, 8), (1, 4, 4, 4), (3, 3), (0, 0, 0, 0), (2, 2)): ["m3.d"],
        # an even total (5x5, stride 1: 4) is symmetric
        _key((1, 3, 8, 8), (1, 4, 8, 8), (5, 5), (0, 0, 0, 0), (1, 1)): ["m3.e"],
    }
    path = tmp_path / "conv.pkl"
    path.write_bytes(pickle.dumps(convs))
    out = tmp_path / "convset.csv.gz"
    assert convert_convset.main([str(path), "--out", str(out)]) == 0
    catalog = convset.parse(gzip.decompress(out.read_bytes()).decode())
    assert catalog.total == 3 and catalog.skipped == {}
    first, same3, same5 = catalog.entries
    assert (first.count, first.models, first.sources, first.bias) == (3, 2, "m1*2 m2", "both")
    assert same3.problem == ConvProblem(1, 3, 8, 8, 4, 3, 3, stride=2, pad=((0, 1), (0, 1)))
    assert same3.problem.p == 4
    assert same5.problem == ConvProblem(1, 3, 8, 8, 4, 5, 5, pad=2)


def test_a_row_convbench_cannot_hold_is_left_out_with_its_reason():
    header = ",".join(convert_convset.COLUMNS)
    ok = "cb0001,4,8,8,4,3,3,1,1,1,1,1,1,1,False,1,1,m1"
    bad = "cb0002,6,8,8,4,3,3,1,1,4,1,1,1,1,False,1,1,m2"  # 4 groups of 6 channels
    catalog = convset.parse(f"{header}\n{ok}\n{bad}\n")
    assert catalog.total == 2 and [e.name for e in catalog.entries] == ["cb0001"]
    assert list(catalog.skipped) == ["cb0002"] and "group" in catalog.skipped["cb0002"]


def test_conversion_refuses_a_pickle_that_names_a_class(tmp_path, capsys):
    path = tmp_path / "conv.pkl"
    path.write_bytes(pickle.dumps({"k": [ConvProblem(1, 1, 1, 1, 1, 1, 1)]}))
    assert convert_convset.main([str(path), "--out", str(tmp_path / "x.gz")]) == 2
    assert "only dicts, lists and strings" in capsys.readouterr().err
    assert not (tmp_path / "x.gz").exists()


ALGOS = ["--device", "cpu", "--algos", "gemm,torch-cpu", "--passes", "fwd", "--layouts",
         "nchw", *FAST]


def test_a_stratified_sample_takes_every_class_evenly():
    """#39: 60 of 8,498 drawn uniformly leave the 10 dilated problems to chance; stratified,
    each class gets its share, a class with fewer gives its rest to the others."""
    found = layers.net_layers("convset")
    uniform = selection.class_counts(selection.choose(found, None, 60, seed=0))
    assert uniform["dilated"] == 0 and uniform["pointwise"] > 20
    even = selection.class_counts(selection.choose(found, None, 60, seed=0, stratify=True))
    assert even == dict.fromkeys(selection.CLASSES, 10)
    skewed = selection.class_counts(selection.choose(found, None, 120, seed=0, stratify=True))
    assert skewed["dilated"] == 10 and sum(skewed.values()) == 120
    assert sorted(v for k, v in skewed.items() if k != "dilated") == [22] * 5
    chosen = selection.choose(found, ["dense", "dilated"], 12, seed=3, stratify=True)
    assert chosen == [la for la in found if la in chosen]  # the catalog's order
    assert selection.class_counts(chosen)["dense"] == 6


def test_a_sampled_run_records_its_choice_and_resumes_it(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "bench", "--net", "convset", "--class", "pointwise",
                           "--sample", "3", "--seed", "7", *ALGOS, "--out", str(out), "--quiet",
                           "--format", "csv")
    assert code == 0, err
    assert ("convbench: convset: 3 of 5092 of class pointwise of 8498 problems, a sample drawn "
            "with seed 7") in err
    assert "left out" not in err
    run = json.loads((out / "env.json").read_text())["run"]
    assert run["selection"] == {"classes": ["pointwise"], "sample": 3, "seed": 7,
                                "stratify": False, "of": 8498, "in_classes": 5092, "chosen": 3,
                                "by_class": {**dict.fromkeys(selection.CLASSES, 0),
                                             "pointwise": 3}}
    assert run["catalog"]["left_out"] == {}
    assert run["batch"] == 1  # the catalog's own batch, not the CPU's default of 8
    chosen = selection.select(layers.net_layers("convset"), ["pointwise"], 3, 7)
    assert set(run["occurrences"]) == {la.name for la in chosen}
    code, _, err = run_cli(capsys, "bench", "--resume", "--out", str(out), "--quiet")
    assert code == 0, err
    assert "0 cases" in err  # the same sample: nothing left to measure
    code, _, err = run_cli(capsys, "bench", "--resume", "--out", str(out), "--seed", "8")
    assert code == 2 and "--seed 8 contradicts the run" in err


@pytest.mark.parametrize("argv, says", [
    (["--net", "convset", "--class", "wide"], "--class: unknown class 'wide'"),
    (["--model", "torchvision.models:resnet18", "--input", "1,3,32,32", "--sample", "2"],
     "--class and --sample choose among the problems of --net or --problems"),
])
def test_bad_selection_is_one_line(capsys, argv, says):
    code, _out, err = run_cli(capsys, "bench", *argv, "--out", "/nonexistent/x")
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1
