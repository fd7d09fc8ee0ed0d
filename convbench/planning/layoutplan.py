"""Layout as a network decision: per-layer layouts chosen together, conversions paid between.

Consecutive layers must agree on the layout of the activation between them, or pay a conversion
(a transpose and a contiguous copy), and so must the network's input and output (NCHW by
default). Choosing each layer's fastest layout on its own can lose to keeping one layout
throughout — the study's TensorFlow paid ~15% in NHWC<->NCHW transposes. So the layouts are
chosen by dynamic programming over the layers in execution order, minimizing

    sum over layers of cost[i][layout_i] + sum over boundaries of transition(i, layout_{i-1}, layout_i)

where a layer's cost is the time of its passes in that layout and boundary i is the activation
entering layer i (boundary L, after the last layer, leads to the output layout). The network is
taken as a chain of its conv layers in execution order: branches (residual connections) are
costed along that chain only.

Nothing here measures: the costs and the transition come from measured times (`tune` measures
the conversions), so the plan is pure arithmetic on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

#: transition(boundary, from_layout, to_layout) -> ms (0 for equal layouts).
Transition = Callable[[int, str, str], float]


@dataclass(frozen=True)
class LayoutChain:
    """Layouts for a chain of layers, and what they cost."""

    layouts: tuple[str, ...]
    conv_ms: float
    conversion_ms: float

    @property
    def total_ms(self) -> float:
        return self.conv_ms + self.conversion_ms


def evaluate(costs: list[dict[str, float]], transition: Transition, layouts: Iterable[str],
             input_layout: str = "nchw", output_layout: str = "nchw") -> LayoutChain:
    """The cost of running layer i in `layouts[i]`, conversions included."""
    layouts = tuple(layouts)
    chain = (input_layout, *layouts, output_layout)
    conversion = sum(transition(i, chain[i], chain[i + 1]) for i in range(len(chain) - 1))
    return LayoutChain(layouts, sum(c[lay] for c, lay in zip(costs, layouts)), conversion)


def per_layer_best(costs: list[dict[str, float]], transition: Transition,
                   input_layout: str = "nchw", output_layout: str = "nchw") -> LayoutChain:
    """Each layer's own fastest layout, and what that costs once its conversions are paid."""
    return evaluate(costs, transition, [min(c, key=c.get) for c in costs], input_layout,
                    output_layout)


def plan_layouts(costs: list[dict[str, float]], transition: Transition,
                 input_layout: str = "nchw", output_layout: str = "nchw") -> LayoutChain:
    """The layouts that minimize the network's total: `costs[i]` maps each layout layer i can
    run in to its time; O(layers × layouts²)."""
    # best[layout] = (cost of the cheapest way to have run layers 0..i ending in layout, path)
    best: dict[str, tuple[float, tuple[str, ...]]] = {input_layout: (0.0, ())}
    for i, cost in enumerate(costs):
        best = {lay: min(((total + transition(i, prev, lay) + ms, path + (lay,))
                          for prev, (total, path) in best.items()), key=lambda tp: tp[0])
                for lay, ms in cost.items()}
    _, layouts = min(((total + transition(len(costs), path[-1] if path else input_layout,
                                          output_layout), path)
                      for total, path in best.values()), key=lambda tp: tp[0])
    return evaluate(costs, transition, layouts, input_layout, output_layout)
