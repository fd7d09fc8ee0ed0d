import itertools
import random

import pytest

from convbench.core.measurement import Measurement
from convbench.core.problem import LAYOUTS
from convbench.planning import layoutplan, tune


def brute_force(costs, transition, input_layout, output_layout):
    """Every assignment of allowed layouts, evaluated: the cheapest."""
    return min((layoutplan.evaluate(costs, transition, layouts, input_layout, output_layout)
                for layouts in itertools.product(*(list(c) for c in costs))),
               key=lambda plan: plan.total_ms)


def random_net(rng: random.Random):
    """1-6 layers, each allowed one or both layouts at random times, and asymmetric random
    conversion costs per boundary and direction."""
    costs = []
    for _ in range(rng.randint(1, 6)):
        allowed = rng.choice([LAYOUTS, ("nchw",), ("nhwc",)])
        costs.append({lay: rng.uniform(0, 10) for lay in allowed})
    table = {(i, a, b): rng.uniform(0, 4) for i in range(len(costs) + 1)
             for a in LAYOUTS for b in LAYOUTS if a != b}

    def transition(i, a, b):
        return 0.0 if a == b else table[i, a, b]

    return costs, transition


@pytest.mark.parametrize("seed", range(300))
def test_dp_matches_brute_force(seed):
    rng = random.Random(seed)
    costs, transition = random_net(rng)
    ends = (rng.choice(LAYOUTS), rng.choice(LAYOUTS))
    dp = layoutplan.plan_layouts(costs, transition, *ends)
    best = brute_force(costs, transition, *ends)
    assert dp.total_ms == pytest.approx(best.total_ms, rel=1e-12)
    assert all(lay in c for lay, c in zip(dp.layouts, costs))
    again = layoutplan.evaluate(costs, transition, dp.layouts, *ends)
    assert again.total_ms == pytest.approx(dp.total_ms, rel=1e-12)
    assert layoutplan.per_layer_best(costs, transition, *ends).total_ms >= dp.total_ms - 1e-9


def test_network_plan_beats_per_layer_best_when_conversions_cost():
    """The study's TensorFlow lesson: a layer slightly faster in NHWC is not worth two
    conversions."""
    costs = [{"nchw": 1.0, "nhwc": 0.9}, {"nchw": 1.0, "nhwc": 1.5}]

    def transition(i, a, b):
        return 0.0 if a == b else 0.5

    greedy = layoutplan.per_layer_best(costs, transition)
    assert greedy.layouts == ("nhwc", "nchw")
    assert greedy.conv_ms == pytest.approx(1.9) and greedy.conversion_ms == pytest.approx(1.0)
    plan = layoutplan.plan_layouts(costs, transition)
    assert plan.layouts == ("nchw", "nchw") and plan.total_ms == pytest.approx(2.0)
    # With free conversions, each layer's own best is the plan.
    free = layoutplan.plan_layouts(costs, lambda i, a, b: 0.0)
    assert free.layouts == ("nhwc", "nchw") and free.total_ms == pytest.approx(1.9)


def test_input_and_output_layouts_are_paid_for():
    costs = [{"nchw": 1.0, "nhwc": 0.5}]
    paid = []

    def transition(i, a, b):
        if a != b:
            paid.append((i, a, b))
        return 0.0 if a == b else 0.2

    plan = layoutplan.plan_layouts(costs, transition, "nchw", "nchw")
    assert plan.layouts == ("nhwc",) and plan.conversion_ms == pytest.approx(0.4)
    paid.clear()
    layoutplan.evaluate(costs, transition, ("nhwc",), "nchw", "nchw")
    assert paid == [(0, "nchw", "nhwc"), (1, "nhwc", "nchw")]
    assert layoutplan.plan_layouts(costs, transition, "nhwc", "nhwc").conversion_ms == 0


def test_an_empty_network_costs_its_input_to_output_conversion():
    plan = layoutplan.plan_layouts([], lambda i, a, b: 0.0 if a == b else 3.0, "nchw", "nhwc")
    assert plan.layouts == () and plan.total_ms == 3.0


@pytest.mark.parametrize("src, dst", [("nchw", "nhwc"), ("nhwc", "nchw")])
def test_conversion_time_is_a_measurement(src, dst):
    m = tune.conversion_time((2, 3, 8, 9), src, dst, "numpy", "fp32", 0.001)
    assert isinstance(m, Measurement) and m.reps >= 3 and m.median > 0


def test_stored_shape():
    assert tune.stored_shape((2, 3, 8, 9), "nchw") == (2, 3, 8, 9)
    assert tune.stored_shape((2, 3, 8, 9), "nhwc") == (2, 8, 9, 3)
