"""A dilated convolution as undilated phases (`algos.dilation`, `registry.DilationSplit`): the
split is exact for every pass, layout, stride that divides the dilation and padding (torch's
own convolution as the judge), FFT and Winograd run dilated problems through it, checked
against float64 like every algorithm, their phases replay, and their counts and workspace are
the phases' problem's."""

import itertools
import math

import numpy as np
import pytest

from convbench import testing
from convbench.algos import dilation, registry
from convbench.algos.phases import CONVOLUTION
from convbench.core.problem import LAYOUTS, PASSES, ConvProblem
from convbench.measure import opcount


def _layout(a, layout):
    return a if layout == "nchw" else np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def _nchw(a, layout):
    return a if layout == "nchw" else a.transpose(0, 3, 1, 2)


def _split_passes(p: ConvProblem, layout: str, seed: int):
    """The three passes of `p` through its phases, each phase problem run by torch; with
    torch's own dilated passes: (ours, torch's) for y, dx and dw."""
    import torch
    import torch.nn.functional as F

    s = dilation.split(p)
    sub = s.problem
    rng = np.random.default_rng(seed)
    x, w, dy = (rng.standard_normal(shape) for shape in
                (p.x_shape(), (p.k, p.c // p.groups, p.r, p.s), p.y_shape()))
    whole, pads = p.symmetric_part()  # torch pads both sides alike: the rest explicitly
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    F.conv2d(F.pad(xt, pads), wt, **whole.torch_args()).backward(torch.tensor(dy))
    want_y = F.conv2d(F.pad(torch.tensor(x), pads), torch.tensor(w), **whole.torch_args()).numpy()

    sym, explicit = sub.symmetric_part()

    def conv(z, weight):
        """The phases' problem, fwd, on a phase-major NCHW batch."""
        return F.conv2d(F.pad(z, explicit), weight, **sym.torch_args())

    ph = dilation.Phases(p, s, layout)  # fwd
    z = ph.split_x(_layout(x, layout))
    ph.y_target(z)[...] = _layout(conv(torch.tensor(_nchw(z, layout).copy()),
                                       torch.tensor(w)).numpy(), layout)
    y = np.full(p.y_shape(layout), np.nan)
    ph.merge_y(y)

    ph = dilation.Phases(p, s, layout)  # bwd_data
    dz = torch.zeros(sub.x_shape(), dtype=torch.float64, requires_grad=True)
    conv(dz, torch.tensor(w)).backward(torch.tensor(
        _nchw(ph.split_y(_layout(dy, layout)), layout).copy()))
    ph.x_target(dy)[...] = _layout(dz.grad.numpy(), layout)
    dx = np.full(p.x_shape(layout), np.nan)
    ph.merge_x(dx)

    ph = dilation.Phases(p, s, layout)  # bwd_filter
    ws = torch.tensor(w, requires_grad=True)
    conv(torch.tensor(_nchw(ph.split_x(_layout(x, layout)), layout).copy()), ws).backward(
        torch.tensor(_nchw(ph.split_y(_layout(dy, layout)), layout).copy()))
    return ((_nchw(y, layout), want_y), (_nchw(dx, layout), xt.grad.numpy()),
            (ws.grad.numpy(), wt.grad.numpy()))


# sizes odd and even, strides 1 and 2 (dividing the dilation), paddings below, at and past
# what keeps the size, filters even and odd, and one dilated axis with the other strided
SPLIT_PROBLEMS = [
    ConvProblem(n=2, c=3, h=h, w=w, k=4, r=r, s=r, stride=st, pad=pad, dilation=d)
    for (h, w), st, d, pad, r in itertools.product(
        [(7, 9), (8, 6)], [1, 2], [2, 4], [0, 2, 3], [3, 2])
    if h + 2 * pad >= d * (r - 1) + 1
] + [
    ConvProblem(n=1, c=2, h=9, w=10, k=3, r=3, s=2, stride=(2, 3), pad=((1, 2), (2, 0)),
                dilation=(2, 1)),
    ConvProblem(n=1, c=4, h=6, w=7, k=4, r=3, s=3, pad=2, dilation=2, groups=2),
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_phases_are_the_dilated_convolution(layout):
    for i, p in enumerate(SPLIT_PROBLEMS):
        assert dilation.split(p) is not None, p
        for got, want in _split_passes(p, layout, seed=i):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12, err_msg=str(p))


def test_the_split_problem():
    p = ConvProblem(n=1, c=32, h=56, w=56, k=64, r=3, s=3, pad=2, dilation=2)
    assert dilation.split(p).problem == ConvProblem(n=4, c=32, h=28, w=28, k=64, r=3, s=3,
                                                    pad=1)
    # stride 2 with dilation 2 reads the even rows and columns only: one phase, no batch
    p = ConvProblem(n=1, c=32, h=56, w=56, k=64, r=3, s=3, stride=2, pad=2, dilation=2)
    s = dilation.split(p)
    assert s.problem == ConvProblem(n=1, c=32, h=28, w=28, k=64, r=3, s=3, pad=1)
    assert not s.rows.covers
    # 7x7 planes: 4 and 3 outputs a phase, each phase computing 4 (the last one dropped)
    s = dilation.split(ConvProblem(n=1, c=8, h=7, w=7, k=8, r=3, s=3, pad=2, dilation=2))
    assert (s.problem.h, s.problem.pad, s.rows.lengths()) == (4, 1, [4, 3])
    # no split: undilated, or a stride that does not divide the dilation
    assert dilation.split(ConvProblem(n=1, c=1, h=9, w=9, k=1, r=3, s=3)) is None
    assert dilation.split(ConvProblem(n=1, c=1, h=9, w=9, k=1, r=3, s=3, stride=2,
                                      dilation=3)) is None


DILATED = [p for p in SPLIT_PROBLEMS if p.stride == 1 or p.stride == 2][::4]


@pytest.mark.parametrize("algo", ["fft", "winograd-2x2", "winograd-4x4"])
def test_fft_and_winograd_run_dilated_problems_through_the_phases(algo):
    impl = registry.get(algo, "numpy")
    assert isinstance(impl, registry.DilationSplit)
    ran = 0
    for p, pass_, layout in itertools.product(DILATED, PASSES, LAYOUTS):
        reason = registry.supports(impl, p, pass_, layout, "fp64")
        sub = dilation.split(p).problem
        if reason is not None:  # only what the phases' problem itself is refused
            assert reason == (f"{impl.inner.supports(sub, pass_, layout, 'fp64')} (dilation "
                              f"{p.dilation} runs as {dilation.split(p).phases} undilated "
                              "phases)"), p
            continue
        chk = testing.run_and_check(impl, p, pass_, layout, "fp64", seed=2)
        assert chk.ok, f"{algo} {pass_} {layout} {p}: {chk.reason}"
        assert "undilated phases (space to batch)" in impl.describe(p, pass_, layout, "fp64")
        ran += 1
    assert ran >= 12


@pytest.mark.parametrize("pass_", PASSES)
def test_the_phases_replay_and_count(pass_):
    p = ConvProblem(n=1, c=4, h=9, w=8, k=5, r=3, s=3, pad=2, dilation=2)
    sub = dilation.split(p).problem
    for algo in ("fft", "winograd-4x4"):
        impl = registry.get(algo, "numpy")
        names = impl.phases(p, pass_, "nhwc", "fp32")
        inner = impl.phases(sub, pass_, "nhwc", "fp32") or [CONVOLUTION]
        tail = [] if pass_ == "bwd_filter" else [dilation.MERGE]
        assert names == [dilation.SPLIT, *inner, *tail]
        testing.assert_phases_replay(impl, p, pass_, "nhwc")
        # counted as the problem that runs; its workspace adds the phases' two buffers
        assert opcount.op_count(algo, p, pass_) == opcount.op_count(algo, sub, pass_)
        copies = dilation.workspace_bytes(dilation.split(p), "fp32")
        assert copies == 4 * (math.prod(sub.x_shape()) + math.prod(sub.y_shape()))
        assert (opcount.theoretical_workspace(algo, p, pass_)
                == opcount.theoretical_workspace(algo, sub, pass_) + copies)
        assert (impl.workspace_bytes(p, pass_, "nhwc", "fp32")
                == impl.inner.workspace_bytes(sub, pass_, "nhwc", "fp32") + copies)


def test_what_runs_dilation_itself_is_not_split():
    for algo in ("direct", "gemm", "torch-cpu"):
        assert not isinstance(registry.get(algo, "numpy"), registry.DilationSplit)
