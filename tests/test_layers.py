import re

import pytest

from convbench.catalogs.layers import CATALOGS, NETS, net_layers, resolve
from convbench.core.problem import ConvProblem


def test_alexnet_is_the_studys():
    got = {layer.name: layer.problem for layer in net_layers("alexnet")}
    c1, c2, c3 = got["conv1"], got["conv2"], got["conv3"]
    assert (c1.c, c1.k, c1.r, c1.stride, c1.h, c1.p) == (3, 96, 11, 4, 227, 55)
    assert (c2.c, c2.k, c2.r, c2.pad, c2.h, c2.p) == (96, 256, 5, 2, 27, 27)
    assert [(got[f"conv{i}"].c, got[f"conv{i}"].k) for i in (3, 4, 5)] == \
        [(256, 384), (384, 384), (384, 256)]
    assert all(p.n == 256 and p.groups == 1 for p in got.values())
    assert (c3.r, c3.pad, c3.h, c3.p) == (3, 1, 13, 13)


def test_alexnet_owt_is_convnet_benchmarks():
    got = [(lay.problem.c, lay.problem.k) for lay in net_layers("alexnet-owt")]
    assert got == [(3, 64), (64, 192), (192, 384), (384, 256), (256, 256)]
    assert net_layers("alexnet-owt")[0].problem.p == 55
    assert {lay.problem.n for lay in net_layers("alexnet-owt")} == {128}


@pytest.mark.parametrize("net", NETS)
def test_catalog_shapes_are_distinct_and_chain(net):
    problems = [lay.problem for lay in net_layers(net)]
    assert len(set(problems)) == len(problems)
    assert all(lay.net == net for lay in CATALOGS[net].values())


def test_vgg16_and_resnet50_shapes():
    vgg = CATALOGS["vgg16"]
    assert vgg["conv4_2"].problem.c == 512 and vgg["conv1_1"].problem.h == 224
    res = CATALOGS["resnet50"]
    assert res["res3_3x3s2"].problem.p == 28 and res["conv1"].problem.p == 112


def test_resolve_by_name_net_layer_and_spec():
    assert resolve("conv2").problem.k == 256
    assert resolve("conv2", "alexnet-owt").problem.k == 192
    assert resolve("vgg16:conv3_1").problem.c == 128
    assert resolve("n=8,c=96,h=27,w=27,k=256,r=5,s=5,pad=2").problem.n == 8


@pytest.mark.parametrize("spec, net, msg", [
    ("conv9", "alexnet", "unknown layer 'conv9' in alexnet; valid: conv1, conv2"),
    ("conv1", "lenet", "unknown net 'lenet'; valid: alexnet"),
    ("n=8,c=96", "alexnet", "missing"),
])
def test_resolve_errors(spec, net, msg):
    with pytest.raises(ValueError, match=msg):
        resolve(spec, net)


# --- DeepBench ------------------------------------------------------------------------------
#: Rows in conv_problems.h's training_set, inference_server_set and inference_device_set, and
#: the distinct shapes among them.
DEEPBENCH = {"deepbench-train": (94, 90), "deepbench-server": (107, 103),
             "deepbench-device": (16, 15)}


@pytest.mark.parametrize("net, rows, distinct", [(k, *v) for k, v in DEEPBENCH.items()])
def test_deepbench_lists_have_the_headers_rows(net, rows, distinct):
    layers = net_layers(net)
    assert sum(lay.count for lay in layers) == rows
    assert len(layers) == len({lay.problem for lay in layers}) == distinct
    assert all(re.fullmatch(r"(speech|ocr|face|vision|speaker|resnet)_\d\d", lay.name)
               and lay.net == net for lay in layers)


def test_deepbench_shapes_against_the_header():
    train, server = CATALOGS["deepbench-train"], CATALOGS["deepbench-server"]
    # (700, 161, 1, 4, 32, 20, 5, 0, 0, 2, 2): w, h, c, n, k, s, r, pad_w, pad_h, strides
    speech = train["speech_01"].problem
    assert speech == ConvProblem(n=4, c=1, h=161, w=700, k=32, r=5, s=20, stride=2)
    assert (speech.p, speech.q) == (79, 341)  # the next row's input: (341, 79, 32, ...)
    # (700, 161, 1, 16, 64, 5, 5, 1, 1, 2, 2)
    assert train["speaker_01"].problem == ConvProblem(16, 1, 161, 700, 64, 5, 5, stride=2, pad=1)
    # (224, 224, 3, 16, 64, 7, 7, 3, 3, 2, 2)
    assert train["vision_13"].problem == ConvProblem(16, 3, 224, 224, 64, 7, 7, stride=2, pad=3)
    # (7, 7, 2048, 8, 512, 1, 1, 3, 3, 2, 2): a 1x1 filter over 3 rows of padding, as written
    assert train["face_14"].problem == ConvProblem(8, 2048, 7, 7, 512, 1, 1, stride=2, pad=3)
    # (108, 108, 3, 1, 64, 3, 3, 1, 1, 2, 2)
    assert server["face_01"].problem == ConvProblem(1, 3, 108, 108, 64, 3, 3, stride=2, pad=1)
    # (14, 14, 256, 8, 1024, 1, 1, 0, 0, 1, 1) is the 8th and 11th Resnet row
    assert train["resnet_08"].count == 2 and "resnet_11" not in train
    # (7, 7, 512, 8, 512, 3, 3, 1, 1, 1, 1): a Vision row first, then a Resnet row
    assert train["vision_06"].count == 2 and "resnet_29" not in train
    assert {lay.count for lay in net_layers("alexnet")} == {1}


def test_deepbench_device_is_the_servers_batch_one_resnet():
    server = {lay.problem for lay in net_layers("deepbench-server")}
    device = {lay.problem for lay in net_layers("deepbench-device")}
    assert device <= server and {p.n for p in device} == {1}
    assert resolve("deepbench-device:resnet_13").problem == \
        ConvProblem(1, 512, 7, 7, 512, 3, 3, pad=1)
