import math

import numpy as np
import pytest

from convbench import reference, verify
from convbench.problem import ConvProblem

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
