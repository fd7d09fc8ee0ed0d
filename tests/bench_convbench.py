"""The harness's cases through pytest-benchmark, for people who live in pytest.

    pytest tests/bench_convbench.py --benchmark-only
    pytest tests/bench_convbench.py --benchmark-only --benchmark-autosave    # then compare:
    pytest-benchmark compare --histogram

The file name does not match pytest's `test_*.py`, so plain `pytest` (CI) never collects it; name
it to run it. Each case goes through `runner.prepare` — the same operands, the same check against
the float64 reference — so pytest-benchmark times exactly what `convbench` times, and a case that
fails its check fails here instead of being timed. By default: AlexNet conv3 at batch 1, every
algo the numpy backend has, every pass and layout, fp32. Widen it with the environment:

    CONVBENCH_BENCH_LAYERS=alexnet:conv2,vgg16:conv3_1  CONVBENCH_BENCH_BATCH=8
    CONVBENCH_BENCH_ALGOS=gemm,winograd  CONVBENCH_BENCH_PRECISION=fp64
"""

import os

import pytest

from convbench.algos import registry
from convbench.catalogs import layers
from convbench.core.problem import LAYOUTS, PASSES
from convbench.measure import runner

LAYERS = os.environ.get("CONVBENCH_BENCH_LAYERS", "alexnet:conv3").split(",")
BATCH = int(os.environ.get("CONVBENCH_BENCH_BATCH", "1"))
ALGOS = registry.expand_algos(os.environ.get("CONVBENCH_BENCH_ALGOS", "all"), "numpy")
PRECISION = os.environ.get("CONVBENCH_BENCH_PRECISION", "fp32")


def _layer(spec: str) -> layers.Layer:
    layer = layers.resolve(spec)
    return layers.Layer(layer.net, layer.name, layer.problem.with_batch(BATCH))


CASES = runner.sweep([_layer(s) for s in LAYERS], ALGOS, "numpy", PASSES, LAYOUTS, [PRECISION])
OPERANDS = runner.Operands()  # cases are grouped by (problem, pass): one reference each


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.layer}-{c.algo}-{c.pass_}-{c.layout}")
def test_conv(benchmark, case):
    try:
        ready = runner.prepare(case, OPERANDS)
    except runner.NotMeasured as nm:
        if nm.status == "unsupported":
            pytest.skip(nm.reason)
        pytest.fail(f"{nm.status}: {nm.reason}")
    benchmark.extra_info.update(flops=case.problem.flops, rel_error=ready.check.rel_error)
    benchmark(ready.call)
