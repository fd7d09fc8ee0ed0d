"""A class or a sample of a list of problems (a catalog, a problem file): so that a catalog of
thousands, such as `convset`, runs on a CPU within minutes.

The classes are ConvBench's (Alvarenga et al. 2024), each problem in exactly one, the first
that fits in this order:

- `depthwise`: groups = c > 1 (one filter channel per input channel);
- `grouped`: 1 < groups < c;
- `dilated`: dilation above 1 on some axis (groups 1);
- `pointwise`: a 1x1 filter (groups 1, ConvBench's "elementwise");
- `rectangular`: a filter, input or stride that differs between height and width;
- `dense`: the rest, a square filter larger than 1x1 over a square input.

A sample is drawn uniformly without replacement by a seeded generator (NumPy's PCG64), so the
same list, class, size and seed give the same problems, kept in the list's order. A stratified
sample (`stratify`) splits its size evenly over the classes present, so a rare class is not left
to chance (ConvBench's catalog is 60% pointwise and has 10 dilated problems of 8,498).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..core.problem import ConvProblem
from .layers import Layer

CLASSES = ("pointwise", "grouped", "depthwise", "dilated", "rectangular", "dense")


def classify(p: ConvProblem) -> str:
    """The class of `p` (see the module's docstring)."""
    if p.groups > 1:
        return "depthwise" if p.groups == p.c else "grouped"
    if max(p.dil_h, p.dil_w) > 1:
        return "dilated"
    if p.r == 1 and p.s == 1:
        return "pointwise"
    if p.r != p.s or p.h != p.w or p.stride_h != p.stride_w:
        return "rectangular"
    return "dense"


def parse_classes(text: str) -> list[str]:
    """A comma list of classes, each checked; ValueError naming the valid ones."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in CLASSES]
    if bad or not items:
        raise ValueError(f"unknown class {(bad or [text])[0]!r}; valid: {', '.join(CLASSES)}")
    return list(dict.fromkeys(items))


def select(layers: Sequence[Layer], classes: Sequence[str] | None = None,
           sample: int | None = None, seed: int = 0) -> list[Layer]:
    """The layers of `classes` (all where None), then `sample` of them drawn with `seed` (all
    where None or where there are no more than that), in their order."""
    chosen = [la for la in layers if not classes or classify(la.problem) in classes]
    if sample is None or sample >= len(chosen):
        return chosen
    picked = np.random.default_rng(seed).choice(len(chosen), size=sample, replace=False)
    return [chosen[i] for i in sorted(picked)]


def choose(layers: Sequence[Layer], classes: Sequence[str] | None = None,
           sample: int | None = None, seed: int = 0, stratify: bool = False) -> list[Layer]:
    """The layers of `classes`, then `sample` of them (`select`); with `stratify`, the sample is
    split evenly over the classes present (a class with fewer takes all it has, the rest going
    to the others), each class drawn with `seed`, all kept in the list's order."""
    chosen = select(layers, classes)
    if not stratify or sample is None or sample >= len(chosen):
        return select(chosen, None, sample, seed)
    by_class: dict[str, list[Layer]] = {}
    for la in chosen:
        by_class.setdefault(classify(la.problem), []).append(la)
    quota, left = {}, sample
    for i, (name, members) in enumerate(sorted(by_class.items(), key=lambda kv: len(kv[1]))):
        share = left // (len(by_class) - i)  # smallest classes first: what they cannot take
        quota[name] = min(share, len(members))  # goes to the larger ones
        left -= quota[name]
    keep = {id(la) for name, members in by_class.items()
            for la in select(members, None, quota[name], seed)}
    return [la for la in chosen if id(la) in keep]


def class_counts(layers: Sequence[Layer]) -> dict[str, int]:
    """class -> how many of `layers` are in it, every class named (0 where none)."""
    out = dict.fromkeys(CLASSES, 0)
    for la in layers:
        out[classify(la.problem)] += 1
    return out
