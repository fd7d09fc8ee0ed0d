"""`convbench.algos.products`: the CPU algorithms' products on either GEMM library give results
within tolerance of float64, the probe picks the faster library of a shape within its bounds,
and the row's note names the library the products ran on."""

import itertools
from unittest import mock

import numpy as np
import pytest
import torch

from convbench.algos import gemm, products, registry
from convbench.core.problem import LAYOUTS, PASSES, ConvProblem
from convbench.testing import run_and_check

ALGOS = ("gemm", "winograd-4x4")
#: 3x3 stride 1 (both algorithms), a strided 5x5 (Winograd as its phase split), groups (gemm)
PROBLEMS = (
    ConvProblem(n=2, c=5, h=9, w=8, k=6, r=3, s=3, pad=1),
    ConvProblem(n=2, c=3, h=11, w=11, k=4, r=5, s=5, stride=2, pad=2),
    ConvProblem(n=2, c=4, h=7, w=7, k=6, r=3, s=3, pad=1, groups=2),
)
#: nhwc with a block of one image at a time in gemm (`_blocked`), as conv1 runs
BLOCKED = ConvProblem(n=3, c=3, h=8, w=8, k=4, r=3, s=3, pad=1)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """No choice, force or route left from another test, and no library named outside."""
    monkeypatch.setattr(products, "_choices", {})
    monkeypatch.setattr(products, "_routes", {})
    monkeypatch.setattr(products, "_forced", None)
    monkeypatch.delenv(products.GEMM_ENV, raising=False)


def _matmul_calls(impl, problem, pass_, layout, precision) -> tuple[int, int]:
    """Run and check `impl`, counting NumPy's and torch's matmul calls."""
    counts = {"numpy": 0, "torch": 0}
    np_matmul, torch_matmul = np.matmul, torch.matmul

    def np_spy(*args, **kw):
        counts["numpy"] += 1
        return np_matmul(*args, **kw)

    def torch_spy(*args, **kw):
        counts["torch"] += 1
        return torch_matmul(*args, **kw)

    with mock.patch.object(np, "matmul", np_spy), mock.patch.object(torch, "matmul", torch_spy):
        chk = run_and_check(impl, problem, pass_, layout, precision)
    assert chk.ok, f"{impl.algo} {pass_} {layout} {precision} {problem}: {chk.reason}"
    return counts["numpy"], counts["torch"]


@pytest.mark.parametrize("library", sorted(products.BACKENDS))
@pytest.mark.parametrize("precision", ["fp32", "fp64"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("algo", ALGOS)
def test_each_library_matches_reference(algo, pass_, layout, precision, library, monkeypatch):
    """CONVBENCH_GEMM=torch|numpy: every pass within the algorithm's tolerance of float64, its
    products on that library (NumPy's matmul called only where it is forced: the transforms'
    small GEMMs stay on torch), and the note names it."""
    monkeypatch.setenv(products.GEMM_ENV, library)
    impl = registry.get(algo, "numpy")
    ran = 0
    for problem in PROBLEMS:
        if registry.supports(impl, problem, pass_, layout, precision):
            continue
        ran += 1
        numpy_calls, _ = _matmul_calls(impl, problem, pass_, layout, precision)
        assert (numpy_calls > 0) == (library == "numpy"), (problem, numpy_calls)
        note = impl.describe(problem, pass_, layout, precision)
        assert (f"products: {products.library(library)} [{products.GEMM_ENV}={library}]"
                in note), note
    assert ran >= 2


@pytest.mark.parametrize("library", sorted(products.BACKENDS))
@pytest.mark.parametrize("pass_", ["fwd", "bwd_filter"])
def test_gemm_blocks_on_each_library(pass_, library, monkeypatch):
    """gemm's blocked nhwc passes (a block of one image at a time) on each library, within
    tolerance; bwd_filter's blocks after the first add into dw on torch, which the note says
    where the products ran on NumPy."""
    per_image = BLOCKED.p * BLOCKED.q * BLOCKED.r * BLOCKED.s * BLOCKED.c * 4
    monkeypatch.setattr(gemm, "BLOCK_MIN_ROWS", 1)
    monkeypatch.setattr(gemm, "BLOCK_BYTES", per_image)
    products.force(library)
    impl = registry.get("gemm", "numpy")
    numpy_calls, _ = _matmul_calls(impl, BLOCKED, pass_, "nhwc", "fp32")
    assert (numpy_calls == BLOCKED.n if pass_ == "fwd" else 1) if library == "numpy" else \
        numpy_calls == 0
    note = impl.describe(BLOCKED, pass_, "nhwc", "fp32")
    assert f"products: {products.library(library)} [forced]" in note
    adds = pass_ == "bwd_filter" and library != "torch"
    assert (f"those adding into their output: {products.library('torch')}" in note) == adds


class _Fakes:
    """Two fake libraries of known cost per call on a fake clock; each still computes the
    product (torch's matmul) so the passes stay right."""

    def __init__(self, monkeypatch, costs: dict[str, float], runs=lambda a, b, out: True):
        self.now, self.calls = 0.0, {name: 0 for name in costs}
        monkeypatch.setattr(products, "clock", lambda: self.now)

        def make(name):
            def matmul(a, b, out):
                self.calls[name] += 1
                self.now += costs[name]
                torch.matmul(a, b, out=out)
            return products.Backend(matmul, runs, lambda: f"fake {name}")

        monkeypatch.setattr(products, "BACKENDS", {name: make(name) for name in costs})


def _operands(m=6, k=5, n=7):
    a, b = torch.ones(m, k), torch.ones(k, n)
    return a, b, torch.empty(m, n)


@pytest.mark.parametrize("costs, winner", [
    ({"torch": 0.003, "numpy": 0.001}, "numpy"),
    ({"torch": 0.001, "numpy": 0.003}, "torch"),
])
def test_probe_picks_the_faster_and_keeps_it(costs, winner, monkeypatch):
    """The faster fake wins; the probe makes at most `PROBE_ROUNDS` calls of each, interleaved
    (alternating which goes first); its choice is kept for the key: the next call of the same
    shape probes nothing, a transposed operand (another key) probes again."""
    fakes = _Fakes(monkeypatch, costs)
    a, b, out = _operands()
    assert products.choose(a, b, out) == winner
    assert all(1 <= c <= products.PROBE_ROUNDS for c in fakes.calls.values())
    assert fakes.calls["torch"] == fakes.calls["numpy"]
    probed = dict(fakes.calls)
    assert products.choose(a, b, out) == winner
    assert fakes.calls == probed
    products.choose(a, torch.ones(7, 5).t(), out)
    assert fakes.calls != probed


@pytest.mark.parametrize("cost, rounds", [
    (0.001, products.PROBE_ROUNDS),
    (products.PROBE_CAP / 4, products.PROBE_ROUNDS),
    (products.PROBE_CAP / 1.5, 1),  # a first round this long decides alone
])
def test_probe_is_bounded(cost, rounds, monkeypatch):
    fakes = _Fakes(monkeypatch, {"torch": cost, "numpy": cost / 2})
    assert products.choose(*_operands()) == "numpy"
    assert fakes.calls == {"torch": rounds, "numpy": rounds}


def test_probe_counts_medians_and_keeps_near_ties_on_torch(monkeypatch):
    """A library fast in one round of three but slow in the others loses (a best time would
    pick it); one less than `PROBE_MARGIN` faster leaves the product on torch, the first."""
    now, costs = [0.0], {"torch": iter([0.002] * 3), "numpy": iter([0.0005, 0.004, 0.004])}

    def make(name):
        def matmul(a, b, out):
            now[0] += next(costs[name])
        return products.Backend(matmul, lambda a, b, out: True, lambda: name)

    monkeypatch.setattr(products, "clock", lambda: now[0])
    monkeypatch.setattr(products, "BACKENDS", {n: make(n) for n in costs})
    assert products.choose(*_operands()) == "torch"
    products._choices.clear()
    _Fakes(monkeypatch, {"torch": 0.001, "numpy": 0.001 * (1 - products.PROBE_MARGIN / 2)})
    assert products.choose(*_operands()) == "torch"


def test_a_library_without_blas_for_the_shape_is_not_probed():
    """NumPy's matmul runs a column-major output, or a vector, as a plain loop: not a
    candidate. Torch runs everything."""
    a, b, out = _operands()
    runs = products.BACKENDS["numpy"].runs
    assert runs(a, b, out) and runs(a.t().contiguous().t(), b, out)
    assert not runs(a, b, torch.empty(7, 6).t())
    assert not runs(a, torch.ones(5, 1), torch.empty(6, 1))
    assert not runs(a, torch.ones(5, 14)[:, ::2], out)  # no axis of unit stride
    assert products.BACKENDS["torch"].runs(a, b, torch.empty(7, 6).t())


@pytest.mark.parametrize("winner", sorted(products.BACKENDS))
@pytest.mark.parametrize("algo", ALGOS)
def test_note_names_the_library_the_probe_chose(algo, winner, monkeypatch):
    """The probe, not a force, picks the library (the other fake made slower); the pass is right
    and the note names the winner as probed; before any run the note says the choice is made
    on the first call."""
    costs = dict(zip(products.BACKENDS, itertools.repeat(0.002)))
    costs[winner] = 0.001
    _Fakes(monkeypatch, costs)
    impl = registry.get(algo, "numpy")
    problem = PROBLEMS[0]
    assert "[probed on first call]" in impl.describe(problem, "fwd", "nhwc", "fp32")
    assert run_and_check(impl, problem, "fwd", "nhwc", "fp32").ok
    assert f"products: fake {winner} [probed]" in impl.describe(problem, "fwd", "nhwc", "fp32")


def test_force_takes_known_libraries_only(monkeypatch):
    with pytest.raises(ValueError, match="none of torch, numpy"):
        products.force("blis")
    monkeypatch.setenv(products.GEMM_ENV, "mkl")
    with pytest.raises(ValueError, match="CONVBENCH_GEMM: GEMM library 'mkl'"):
        products.choose(*_operands())
    products.force("numpy")  # force outranks the environment
    assert products.choose(*_operands()) == "numpy"
    assert products.forced() == ("numpy", "forced")


def test_probe_on_real_libraries_writes_the_product():
    """The real libraries, probed on the call's own operands: the output is the product."""
    a, b = torch.randn(40, 30), torch.randn(30, 20)
    out = torch.full((40, 20), float("nan"))
    b_columns = b.t().contiguous().t()  # b column-major: read transposed by both libraries
    route = products.Route(("test",))
    route.matmul(a, b_columns, out)
    torch.testing.assert_close(out, a @ b)
    assert list(route.ran) == [products._choices[products.key(a, b_columns, out)]]
