"""Shared checks for implementations: used by the test suite, usable for a new algorithm.

`assert_matches_reference` is the one checker every algorithm's tests go through (and the one a
deliberately wrong implementation is shown to fail).
"""

from __future__ import annotations

import numpy as np

from .algos import reference, registry
from .algos.reference import DTYPES
from .catalogs.layers import net_layers
from .core.problem import ConvProblem
from .measure import verify


def small_catalog_problems(max_channels: int = 8, batch: int = 2,
                           max_hw: int = 20) -> list[tuple[str, ConvProblem]]:
    """Every catalog layer, cut down to run in milliseconds: batch 1-2, few channels, the
    layer's filter, stride and padding kept, the input shrunk (but never below the filter)."""
    out = []
    for net in ("alexnet", "alexnet-owt", "vgg16", "resnet50"):
        for layer in net_layers(net):
            out.append((f"{net}:{layer.name}", shrunk(layer.problem, max_channels, batch,
                                                      max_hw)))
    return out


def shrunk(p: ConvProblem, max_channels: int = 8, batch: int = 2,
           max_hw: int = 20) -> ConvProblem:
    """`p` cut down to run in milliseconds: batch, channels and each spatial axis shrunk (never
    below the filter), the filter, stride, padding and dilation of each axis kept."""
    h, w = (max(min(size, max_hw), eff - pads, stride + eff - pads)
            for size, eff, pads, stride in ((p.h, p.eff_r, p.pad_top + p.pad_bottom, p.stride_h),
                                            (p.w, p.eff_s, p.pad_left + p.pad_right, p.stride_w)))
    return ConvProblem(n=min(p.n, batch), c=min(p.c, max_channels), h=h, w=w,
                       k=min(p.k, max_channels + 1), r=p.r, s=p.s, stride=p.stride, pad=p.pad,
                       dilation=p.dilation)


#: Per-axis geometry every algorithm that takes it is tested on, small enough for the emulator:
#: Inception's 1x7 and 7x1 filters with their one-sided padding, a 3x3 padded along the height
#: only, a stride and a dilation that differ between the axes, and all three at once (with
#: groups).
PER_AXIS_PROBLEMS = (
    ConvProblem(n=2, c=3, h=6, w=9, k=4, r=1, s=7, pad=(0, 3)),
    ConvProblem(n=2, c=3, h=9, w=6, k=4, r=7, s=1, pad=(3, 0)),
    ConvProblem(n=2, c=3, h=7, w=8, k=4, r=3, s=3, pad=(1, 0)),
    ConvProblem(n=2, c=3, h=9, w=7, k=4, r=3, s=3, stride=(2, 1), pad=1),
    ConvProblem(n=1, c=3, h=7, w=9, k=4, r=3, s=3, pad=(1, 2), dilation=(1, 2)),
    ConvProblem(n=2, c=4, h=11, w=8, k=6, r=3, s=2, stride=(1, 3), pad=(2, 1),
                dilation=(2, 1), groups=2),
)


#: Padding that differs before and after, every algorithm tested on it (small enough for the
#: emulator): more after than before (TensorFlow's SAME, stride 1: FFT and Winograd run it
#: after an explicit pad), more before than after with a stride, input rows no output reads
#: (a negative padding after) with groups, all at once per axis with dilation, and one axis
#: only, the other padded alike.
ASYMMETRIC_PROBLEMS = (
    ConvProblem(n=2, c=3, h=7, w=6, k=4, r=3, s=3, pad=((0, 1), (0, 1))),
    ConvProblem(n=1, c=3, h=9, w=8, k=4, r=3, s=3, stride=2, pad=((2, 0), (1, 1))),
    ConvProblem(n=2, c=4, h=10, w=9, k=2, r=3, s=2, pad=((1, -2), (0, 1)), groups=2),
    ConvProblem(n=1, c=2, h=8, w=11, k=3, r=2, s=3, stride=(2, 3), pad=((1, 2), (2, -1)),
                dilation=(2, 1)),
    ConvProblem(n=2, c=3, h=6, w=7, k=4, r=3, s=3, pad=((2, 1), (1, 1))),
)


def run_and_check(impl, problem: ConvProblem, pass_: str, layout: str, precision: str = "fp64",
                  seed: int = 0) -> verify.Check:
    """Run `impl` on seeded random operands into a NaN-filled output and check it against the
    float64 reference (relative to no less than `verify.magnitude_floor`: these problems are
    small, some with one output element, whose random terms may cancel)."""
    a, b = reference.random_operands(problem, pass_, layout, DTYPES[precision], seed)
    ref = reference.reference(problem, pass_, layout, a, b)
    floor = verify.magnitude_floor(
        reference.magnitudes(problem, pass_, layout, a, b), problem, pass_)
    xp = np
    if impl.backend == "cuda":
        import cupy as xp

        a, b = xp.asarray(a), xp.asarray(b)
    out = reference.nan_output(problem, pass_, layout, DTYPES[precision], xp=xp)
    impl.prepare(problem, pass_, layout, precision)(a, b, out)
    return verify.check(out, ref, impl.algo, precision, problem, pass_, floor)


def assert_matches_reference(algo: str, backend: str, problem: ConvProblem, pass_: str,
                             layout: str, precision: str = "fp64", seed: int = 0) -> None:
    """Fail with the error and tolerance unless the implementation matches the reference; skip
    (return) if it declares the combination unsupported."""
    impl = registry.get(algo, backend)
    if registry.supports(impl, problem, pass_, layout, precision):
        return
    chk = run_and_check(impl, problem, pass_, layout, precision, seed)
    assert chk.ok, f"{algo}/{backend} {pass_} {layout} {precision} {problem}: {chk.reason}"


def problem_strategy(max_stride: int = 4, max_pad: int = 3, max_dilation: int = 1,
                     max_groups: int = 1, square_filter: bool = False, per_axis: bool = False):
    """Hypothesis strategy for small valid problems: odd sizes, rectangular inputs and filters.
    With `per_axis`, stride, padding and dilation are drawn for each axis apart."""
    from hypothesis import assume
    from hypothesis import strategies as st

    @st.composite
    def problems(draw):
        def axis_value(least: int, most: int):
            v = draw(st.integers(least, most))
            return (v, draw(st.integers(least, most))) if per_axis else (v, v)

        groups = draw(st.integers(1, max_groups))
        r = draw(st.integers(1, 5))
        s = r if square_filter else draw(st.integers(1, 5))
        d = axis_value(1, max_dilation)
        pad = axis_value(0, max_pad)
        h = draw(st.integers(max(1, (r - 1) * d[0] + 1 - 2 * pad[0]), 12))
        w = draw(st.integers(max(1, (s - 1) * d[1] + 1 - 2 * pad[1]), 12))
        p = dict(n=draw(st.integers(1, 2)), c=groups * draw(st.integers(1, 4)), h=h, w=w,
                 k=groups * draw(st.integers(1, 4)), r=r, s=s,
                 stride=axis_value(1, max_stride), pad=pad, dilation=d, groups=groups)
        try:
            return ConvProblem(**p)
        except ValueError:
            assume(False)

    return problems()


def runnable(algo: str, backend: str):
    """The implementation, or skip the calling test with the reason it cannot run here (no GPU,
    no compiler)."""
    import pytest

    impl = registry.get(algo, backend)
    reason = registry.impl_available(impl)
    if reason:
        pytest.skip(reason)
    return impl


def assert_phases_replay(impl, problem: ConvProblem, pass_: str, layout: str, xp=np) -> None:
    """The phase contract (`convbench.algos.phases`): after a full call, the phase functions run in
    order into a NaN-filled output give the full call's bits, twice over (a phase consumes what
    the previous one left, so every round runs them all)."""
    a, b = (xp.asarray(v) for v in reference.random_operands(problem, pass_, layout))
    run = impl.prepare(problem, pass_, layout, "fp32")
    assert list(run.phase_fns) == impl.phases(problem, pass_, layout, "fp32")
    out = reference.nan_output(problem, pass_, layout, xp=xp)
    run(a, b, out)
    full = out.copy()
    for _ in range(2):
        out.fill(np.nan)
        for phase in run.phase_fns.values():
            phase()
        assert bool((out == full).all())


def matmul_dtypes(impl, problem: ConvProblem, pass_: str, layout: str,
                  precision: str = "fp32") -> list[tuple]:
    """Run and check `impl`, recording the (left, right, out) dtypes, as NumPy dtypes, of every
    `np.matmul` and `torch.matmul` it makes (the CPU algorithms multiply through either):
    benchmarking fp32 means multiplying in fp32, never silently in float64."""
    from unittest import mock

    import torch

    seen = []
    np_matmul, torch_matmul = np.matmul, torch.matmul

    def np_spy(a, b, **kw):
        seen.append((a.dtype, b.dtype, kw["out"].dtype))
        return np_matmul(a, b, **kw)

    def torch_spy(a, b, **kw):
        seen.append(tuple(torch.empty(0, dtype=t.dtype).numpy().dtype
                          for t in (a, b, kw["out"])))
        return torch_matmul(a, b, **kw)

    with mock.patch.object(np, "matmul", np_spy), mock.patch.object(torch, "matmul", torch_spy):
        assert run_and_check(impl, problem, pass_, layout, precision).ok
    return seen
