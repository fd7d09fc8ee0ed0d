import math

import numpy as np
import pytest

from convbench.algos import reference
from convbench.core.problem import ConvProblem
from convbench.measure import verify

P = ConvProblem(n=2, c=3, h=7, w=6, k=4, r=3, s=3, pad=1)


def test_operands_are_random_seeded_and_shared_across_layouts():
    a1, b1 = reference.random_operands(P, "fwd", "nchw", seed=3)
    a2, b2 = reference.random_operands(P, "fwd", "nhwc", seed=3)
    assert np.count_nonzero(a1) == a1.size and a1.std() > 0.5
    np.testing.assert_array_equal(reference.to_layout(a1, "nhwc"), a2)
    np.testing.assert_array_equal(reference.from_layout(b2, "nhwc"), b1)
    assert not np.array_equal(a1, reference.random_operands(P, "fwd", "nchw", seed=4)[0])


def test_nan_output_fails_and_reference_passes():
    a, b = reference.random_operands(P, "bwd_filter", "nhwc")
    ref = reference.reference(P, "bwd_filter", "nhwc", a, b)
    assert ref.shape == P.w_shape("nhwc") and ref.dtype == np.float64
    out = reference.nan_output(P, "bwd_filter", "nhwc")
    assert not verify.check(out, ref, "direct", "fp32").ok
    assert verify.errors(out, ref) == (math.inf, math.inf)
    assert verify.check(ref.astype(np.float32), ref, "direct", "fp32").ok


def test_one_unwritten_element_fails():
    a, b = reference.random_operands(P, "fwd", "nchw")
    ref = reference.reference(P, "fwd", "nchw", a, b)
    out = ref.astype(np.float32)
    out[1, 2, 3, 4] = np.nan
    assert not verify.check(out, ref, "gemm", "fp32").ok


def test_metrics():
    ref = np.array([3.0, 4.0])
    rel, mx = verify.errors(np.array([3.0, 4.5]), ref)
    assert rel == pytest.approx(0.1) and mx == pytest.approx(0.5)
    assert verify.errors(np.zeros(3), ref)[0] == math.inf  # wrong shape


def test_tolerances_order_and_growth():
    t = {a: verify.tolerance(a, "fp32") for a in ("direct", "fft", "winograd-2x2",
                                                   "winograd-4x4")}
    assert t["direct"] < t["winograd-2x2"] < t["winograd-4x4"] and t["direct"] < t["fft"]
    assert verify.tolerance("direct", "fp64") < t["direct"] < verify.tolerance("direct", "tf32")
    big = ConvProblem(n=256, c=96, h=27, w=27, k=256, r=5, s=5, pad=2)
    assert verify.reduction_length(big, "bwd_filter") == 256 * 27 * 27
    grown = verify.tolerance("direct", "fp32", big, "bwd_filter")
    assert grown == pytest.approx(1e-5 * math.sqrt(256 * 27 * 27 / 4096))
    assert verify.tolerance("direct", "fp32", big, "fwd") == 1e-5  # 2400 terms: no growth


def test_a_winograd_tolerance_follows_the_transform_that_runs():
    """The column is the transform's size alpha = m + r - 1, with r the filter a tile
    transforms: at a stride, the phase split's (9x9 at stride 2: 5x5 phases), not the
    problem's (which would make alpha 10 and fall back to the 3x3 tile's column)."""
    three = ConvProblem(n=1, c=1, h=8, w=8, k=1, r=3, s=3)
    five = ConvProblem(n=1, c=1, h=8, w=8, k=1, r=5, s=5)
    strided = ConvProblem(n=1, c=1, h=10, w=9, k=1, r=9, s=9, stride=2)  # hypothesis found it
    conv1 = ConvProblem(n=8, c=3, h=224, w=224, k=96, r=11, s=11, stride=4, pad=2)  # 3x3 phases
    t = {a: verify.tolerance(a, "fp32", three) for a in ("winograd-2x2", "winograd-4x4",
                                                          "winograd-6x6")}
    assert verify.tolerance("winograd-2x2", "fp32", five) == t["winograd-4x4"]  # alpha 6
    assert verify.tolerance("winograd-4x4", "fp32", five) == t["winograd-6x6"]  # alpha 8
    assert verify.tolerance("winograd-2x2", "fp32", strided) == t["winograd-4x4"]
    assert verify.tolerance("winograd-4x4", "fp32", strided) == t["winograd-6x6"]
    for algo in ("winograd-2x2", "winograd-4x4"):
        assert verify.tolerance(algo, "fp32", conv1) == t[algo]


def test_an_output_whose_terms_cancel_is_judged_against_their_magnitude():
    """The case a CI run drew: one output element of 40 random terms that summed to 0.0085; an
    fp32 error of 2.5e-7 is 3e-5 of it (over direct's 1e-5), but 6e-8 of the size such a sum
    has (`magnitude_floor`). A wrong result still fails against the floor."""
    p = ConvProblem(n=1, c=4, h=5, w=5, k=1, r=5, s=2, stride=(1, 3), dilation=(1, 2))
    a, b = reference.random_operands(p, "fwd", "nchw", np.float32, 0)
    ref = reference.reference(p, "fwd", "nchw", a, b)
    floor = verify.magnitude_floor(reference.magnitudes(p, "fwd", "nchw", a, b), p, "fwd")
    assert ref.size == 1 and abs(float(ref.ravel()[0])) < 0.01 < floor
    rounded = ref + 2.54e-7  # the error the CI run saw
    assert not verify.check(rounded, ref, "direct", "fp32", p).ok
    assert verify.check(rounded, ref, "direct", "fp32", p, floor=floor).ok
    assert not verify.check(ref + 0.01 * floor, ref, "direct", "fp32", p, floor=floor).ok
    # a floor below ||ref|| changes nothing
    assert verify.errors(ref + 1e-3, ref, floor=1e-9) == verify.errors(ref + 1e-3, ref)
