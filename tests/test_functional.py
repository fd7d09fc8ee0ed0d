"""The functional API on the always-present torch-cpu implementation, and its error messages."""

import numpy as np
import pytest
import torch

import convbench
from convbench.algos import registry
from convbench.core.problem import LAYOUTS, PASSES
from convbench.testing import (
    PER_AXIS_PROBLEMS,
    assert_matches_reference,
    small_catalog_problems,
)


def _t(a):
    return torch.from_numpy(a)


#: One geometry for both axes, and torch's per-axis pairs (stride, padding, dilation (h, w)).
GEOMETRIES = [dict(stride=2, padding=1, dilation=1, groups=2),
              dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2),
              dict(stride=[1, 3], padding=[0, 2], dilation=1, groups=1)]


@pytest.mark.parametrize("algo", ["torch-cpu", "direct", "gemm"])
@pytest.mark.parametrize("kw", GEOMETRIES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_conv2d_and_gradients_match_torch_autograd(layout, kw, algo):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 9, 8))
    w = rng.standard_normal((6, 4 // kw["groups"], 3, 2))
    tx, tw = _t(x).requires_grad_(), _t(w).requires_grad_()
    ty = torch.nn.functional.conv2d(tx, tw, **kw)
    dy = rng.standard_normal(ty.shape)
    ty.backward(_t(dy))

    def lay(a):
        return np.ascontiguousarray(a.transpose(0, 2, 3, 1)) if layout == "nhwc" else a

    def unlay(a):
        return a.transpose(0, 3, 1, 2) if layout == "nhwc" else a

    api = dict(algo=algo, layout=layout, **kw)
    y = convbench.conv2d(lay(x), lay(w), **api)
    dx = convbench.conv2d_backward_data(lay(dy), lay(w), lay(x).shape, **api)
    dw = convbench.conv2d_backward_filter(lay(x), lay(dy), lay(w).shape, **api)
    np.testing.assert_allclose(unlay(y), ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(unlay(dx), tx.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(unlay(dw), tw.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name, problem", small_catalog_problems(), ids=lambda v: str(v))
def test_torch_cpu_on_every_catalog_layer(name, problem):
    for pass_ in PASSES:
        for layout in LAYOUTS:
            for precision in ("fp64", "fp32"):
                assert_matches_reference("torch-cpu", "numpy", problem, pass_, layout, precision)


@pytest.mark.parametrize("problem", PER_AXIS_PROBLEMS, ids=str)
def test_torch_cpu_on_per_axis_problems(problem):
    for pass_ in PASSES:
        for layout in LAYOUTS:
            assert_matches_reference("torch-cpu", "numpy", problem, pass_, layout, "fp32")


def test_out_buffer_is_written_in_place():
    x = np.ones((1, 2, 5, 5), np.float32)
    w = np.ones((3, 2, 3, 3), np.float32)
    out = np.full((1, 3, 3, 3), np.nan, np.float32)
    res = convbench.conv2d(x, w, algo="torch-cpu", out=out)
    assert res is out and np.all(out == 18)


@pytest.mark.parametrize("call, msg", [
    (lambda x, w: convbench.conv2d(x, w, algo="nope"), "unknown algo 'nope'; valid: direct"),
    (lambda x, w: convbench.conv2d(x, w, algo="torch-cpu", layout="chwn"),
     "unknown layout 'chwn'; valid: nchw, nhwc"),
    (lambda x, w: convbench.conv2d(x, w, algo="torch-cpu", backend="tpu"), "unknown backend"),
    (lambda x, w: convbench.conv2d(x[0], w, algo="torch-cpu"), "x must be 4-D"),
    (lambda x, w: convbench.conv2d(x, w[:, :1], algo="torch-cpu"),
     "weight has 1 input channels per group, input has 2"),
    (lambda x, w: convbench.conv2d(x, w.astype(np.float64), algo="torch-cpu"),
     "operands must share one dtype"),
    (lambda x, w: convbench.conv2d(x.astype(int), w.astype(int), algo="torch-cpu"),
     "dtype int64 is not supported"),
    (lambda x, w: convbench.conv2d(x, w, stride=(1, 2, 1), algo="torch-cpu"),
     r"stride must be an int or an \(h, w\) pair"),
    (lambda x, w: convbench.conv2d(x, w, padding=(1, 0.5), algo="torch-cpu"),
     "padding must be an int, got 0.5"),
    (lambda x, w: convbench.conv2d(x, w, padding=(-1, 0), algo="torch-cpu"),
     "pad must be >= 0, got -1x0"),
    (lambda x, w: convbench.conv2d(x, w, padding=-1, algo="torch-cpu"), "pad must be >= 0"),
    (lambda x, w: convbench.conv2d_backward_data(np.ones((1, 3, 4, 4), np.float32), w,
                                                 (1, 2, 5, 5), algo="torch-cpu"),
     r"first operand has shape \(1, 3, 4, 4\), expected \(1, 3, 3, 3\)"),
    (lambda x, w: convbench.conv2d(x, w, algo="torch-cpu", out=np.empty((1, 1, 1, 1))),
     "out has shape"),
])
def test_bad_calls_raise_one_clear_error(call, msg):
    x = np.ones((1, 2, 5, 5), np.float32)
    w = np.ones((3, 2, 3, 3), np.float32)
    with pytest.raises(ValueError, match=msg):
        call(x, w)


def test_unsupported_raises_with_the_reason():
    impl = registry.get("torch-cpu", "numpy")
    assert registry.supports(impl, convbench.ConvProblem(1, 1, 3, 3, 1, 1, 1), "fwd", "nchw",
                             "fp16") == "torch-cpu on numpy runs fp64/fp32/bf16, not fp16"


def test_a_memoized_pass_keeps_no_array_of_its_last_call():
    """The prepared pass is memoized (its workspace and plans are reused), but not the arrays
    of its last call: a phased pass (torch's, here) forgets them, so a training step's
    activations do not stay alive into the next step's memory."""
    import gc
    import weakref

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 8, 8), dtype=np.float32)
    w = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    y = convbench.conv2d(x, w, padding=1, algo="torch-cpu")
    alive = [weakref.ref(v) for v in (x, w, y)]
    del x, w, y
    gc.collect()
    assert [r() is None for r in alive] == [True, True, True]
