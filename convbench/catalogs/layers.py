"""Layer catalogs as data: the networks the study and its successors measured, and DeepBench's
problem lists.

Each catalog maps a layer name to a `ConvProblem` at the network's reference batch. VGG-16 and
ResNet-50 list their distinct conv shapes only (a shape repeated in the network appears once).
The DeepBench catalogs (`deepbench-train`, `deepbench-server`, `deepbench-device`) keep each
problem's own batch, and a shape a list repeats once, with its `count` (see `deepbench`). So does
`convset`, the ConvBench study's 8,498 distinct convolutions of TIMM's models at batch 1, its
`count` how many conv modules have each (see `convset`); it is read from its file the first
time it is asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from ..core.problem import ConvProblem, parse_spec
from . import convset, deepbench


@dataclass(frozen=True)
class Layer:
    """One named problem of a catalog or a problem list. `count` is how many times the list has
    that shape (DeepBench's repeated rows, a `*4` at the end of a benchdnn name): a weight for
    totals, never a reason to measure it twice."""

    net: str
    name: str
    problem: ConvProblem
    count: int = 1


def _net(name: str, batch: int, rows: list[tuple]) -> dict[str, Layer]:
    """rows: (layer, c, hw, k, rs, stride, pad) with square inputs and filters."""
    out = {}
    for layer, c, hw, k, rs, stride, pad in rows:
        p = ConvProblem(n=batch, c=c, h=hw, w=hw, k=k, r=rs, s=rs, stride=stride, pad=pad)
        out[layer] = Layer(name, layer, p)
    return out


_STATIC: dict[str, dict[str, Layer]] = {
    # The study's AlexNet (Kim et al., ISPASS 2017): Krizhevsky's channels, ungrouped, batch 256.
    "alexnet": _net("alexnet", 256, [
        ("conv1", 3, 227, 96, 11, 4, 0),
        ("conv2", 96, 27, 256, 5, 1, 2),
        ("conv3", 256, 13, 384, 3, 1, 1),
        ("conv4", 384, 13, 384, 3, 1, 1),
        ("conv5", 384, 13, 256, 3, 1, 1),
    ]),
    # convnet-benchmarks' "one weird trick" AlexNet, batch 128.
    "alexnet-owt": _net("alexnet-owt", 128, [
        ("conv1", 3, 224, 64, 11, 4, 2),
        ("conv2", 64, 27, 192, 5, 1, 2),
        ("conv3", 192, 13, 384, 3, 1, 1),
        ("conv4", 384, 13, 256, 3, 1, 1),
        ("conv5", 256, 13, 256, 3, 1, 1),
    ]),
    # VGG-16 (configuration D), distinct 3x3 pad-1 shapes, batch 64.
    "vgg16": _net("vgg16", 64, [
        ("conv1_1", 3, 224, 64, 3, 1, 1),
        ("conv1_2", 64, 224, 64, 3, 1, 1),
        ("conv2_1", 64, 112, 128, 3, 1, 1),
        ("conv2_2", 128, 112, 128, 3, 1, 1),
        ("conv3_1", 128, 56, 256, 3, 1, 1),
        ("conv3_2", 256, 56, 256, 3, 1, 1),
        ("conv4_1", 256, 28, 512, 3, 1, 1),
        ("conv4_2", 512, 28, 512, 3, 1, 1),
        ("conv5_1", 512, 14, 512, 3, 1, 1),
    ]),
    # ResNet-50 v1.5 (stride in the 3x3), distinct shapes, batch 64.
    "resnet50": _net("resnet50", 64, [
        ("conv1", 3, 224, 64, 7, 2, 3),
        ("res2_1x1a", 64, 56, 64, 1, 1, 0),
        ("res2_3x3", 64, 56, 64, 3, 1, 1),
        ("res2_1x1b", 64, 56, 256, 1, 1, 0),
        ("res2_1x1r", 256, 56, 64, 1, 1, 0),
        ("res3_1x1a", 256, 56, 128, 1, 1, 0),
        ("res3_3x3s2", 128, 56, 128, 3, 2, 1),
        ("res3_3x3", 128, 28, 128, 3, 1, 1),
        ("res3_1x1b", 128, 28, 512, 1, 1, 0),
        ("res3_proj", 256, 56, 512, 1, 2, 0),
        ("res3_1x1r", 512, 28, 128, 1, 1, 0),
        ("res4_1x1a", 512, 28, 256, 1, 1, 0),
        ("res4_3x3s2", 256, 28, 256, 3, 2, 1),
        ("res4_3x3", 256, 14, 256, 3, 1, 1),
        ("res4_1x1b", 256, 14, 1024, 1, 1, 0),
        ("res4_proj", 512, 28, 1024, 1, 2, 0),
        ("res4_1x1r", 1024, 14, 256, 1, 1, 0),
        ("res5_1x1a", 1024, 14, 512, 1, 1, 0),
        ("res5_3x3s2", 512, 14, 512, 3, 2, 1),
        ("res5_3x3", 512, 7, 512, 3, 1, 1),
        ("res5_1x1b", 512, 7, 2048, 1, 1, 0),
        ("res5_proj", 1024, 14, 2048, 1, 2, 0),
        ("res5_1x1r", 2048, 7, 512, 1, 1, 0),
    ]),
}
_STATIC.update({net: {name: Layer(net, name, p, count)
                      for name, p, count in deepbench.problems(rows)}
                for net, rows in deepbench.LISTS.items()})


def _convset() -> dict[str, Layer]:
    return {e.name: Layer(convset.NAME, e.name, e.problem, e.count)
            for e in convset.load().entries}


class _Catalogs(Mapping):
    """net -> {layer name: Layer}; a catalog kept in a file is read when first asked for."""

    def __init__(self, ready: dict[str, dict[str, Layer]],
                 lazy: dict[str, Callable[[], dict[str, Layer]]]):
        self._ready, self._lazy = ready, lazy

    def __getitem__(self, net: str) -> dict[str, Layer]:
        if net not in self._ready and net in self._lazy:
            self._ready[net] = self._lazy[net]()
        return self._ready[net]

    def __iter__(self) -> Iterator[str]:
        yield from self._ready
        yield from (net for net in self._lazy if net not in self._ready)

    def __len__(self) -> int:
        return len(set(self._ready) | set(self._lazy))


CATALOGS: Mapping[str, dict[str, Layer]] = _Catalogs(_STATIC, {convset.NAME: _convset})

NETS = tuple(CATALOGS)
#: Catalogs whose problems each keep their own batch (a list of problems, not one network at
#: one batch): a sweep's default batch does not replace it, `--batch` does.
OWN_BATCH = (*deepbench.LISTS, convset.NAME)


def net_layers(net: str) -> list[Layer]:
    """Every conv layer of `net`, in network order."""
    if net not in CATALOGS:
        raise ValueError(f"unknown net {net!r}; valid: {', '.join(NETS)}")
    return list(CATALOGS[net].values())


def resolve(spec: str, net: str = "alexnet") -> Layer:
    """A layer by name in `net` (`conv2`), by `net:layer` (`vgg16:conv3_1`), or as a text spec
    (`n=8,c=96,h=27,w=27,k=256,r=5,s=5,pad=2`)."""
    if "=" in spec:
        return Layer("custom", spec, parse_spec(spec))
    if ":" in spec:
        net, _, spec = spec.partition(":")
    layers = CATALOGS.get(net)
    if layers is None:
        raise ValueError(f"unknown net {net!r}; valid: {', '.join(NETS)}")
    if spec not in layers:
        raise ValueError(f"unknown layer {spec!r} in {net}; valid: {', '.join(layers)}")
    return layers[spec]
