import pytest

from convbench.layers import CATALOGS, NETS, net_layers, resolve


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
