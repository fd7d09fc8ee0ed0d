"""Winograd matrices: the F(m, r) identities hold exactly, in Fractions, and the C text reads
back as the same numbers."""

import random
import re
from fractions import Fraction

import numpy as np
import pytest

from convbench.algos.transforms import (
    WinogradTransform,
    c_source,
    default_points,
    winograd_matrices,
)

SIZES = [(2, 3), (4, 3), (3, 2), (3, 4), (5, 3), (6, 3)]

# Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks" (2016), F(2,3) and F(4,3),
# typed in here (and only here) to compare against.
LAVIN_GRAY = {
    (2, 3): WinogradTransform(
        AT=[[1, 1, 1, 0], [0, 1, -1, -1]],
        G=[[1, 0, 0], ["1/2", "1/2", "1/2"], ["1/2", "-1/2", "1/2"], [0, 0, 1]],
        BT=[[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]),
    (4, 3): WinogradTransform(
        AT=[[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
        G=[["1/4", 0, 0], ["-1/6", "-1/6", "-1/6"], ["-1/6", "1/6", "-1/6"],
           ["1/24", "1/12", "1/6"], ["1/24", "-1/12", "1/6"], [0, 0, 1]],
        BT=[[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
            [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]),
}


def _exact(t: WinogradTransform) -> WinogradTransform:
    return WinogradTransform(*(np.array([[Fraction(v) for v in row] for row in a], dtype=object)
                               for a in t))


def _rationals(rng: random.Random, *shape) -> np.ndarray:
    values = [Fraction(rng.randint(-50, 50), rng.randint(1, 9)) for _ in range(np.prod(shape))]
    return np.array(values, dtype=object).reshape(shape)


def _winograd_1d(t, d, g):
    return t.AT.dot(t.G.dot(g) * t.BT.dot(d))


def _correlate_1d(d, g, m):
    return np.array([sum(d[i + k] * g[k] for k in range(len(g))) for i in range(m)],
                    dtype=object)


@pytest.mark.parametrize("m, r", SIZES)
def test_shapes_and_exact_entries(m, r):
    t = winograd_matrices(m, r)
    assert (t.m, t.r, t.alpha) == (m, r, m + r - 1)
    assert t.AT.shape == (m, m + r - 1) and t.G.shape == (m + r - 1, r)
    assert t.BT.shape == (m + r - 1, m + r - 1)
    assert all(isinstance(v, Fraction) for a in t for v in a.flat)


@pytest.mark.parametrize("m, r", SIZES)
def test_1d_identity_holds_for_every_basis_pair(m, r):
    """The identity is bilinear in (d, g), so checking it on every pair of unit vectors proves it
    for all inputs — the exact, symbolic statement."""
    t, alpha = winograd_matrices(m, r), m + r - 1
    unit = [np.array([Fraction(int(i == j)) for j in range(n)], dtype=object)
            for n in (alpha, r) for i in range(n)]
    ds, gs = unit[:alpha], unit[alpha:]
    for d in ds:
        for g in gs:
            assert list(_winograd_1d(t, d, g)) == list(_correlate_1d(d, g, m))


@pytest.mark.parametrize("m, r", SIZES)
def test_1d_identity_on_random_rationals(m, r):
    t, rng = winograd_matrices(m, r), random.Random(m * 10 + r)
    for _ in range(20):
        d, g = _rationals(rng, m + r - 1), _rationals(rng, r)
        assert list(_winograd_1d(t, d, g)) == list(_correlate_1d(d, g, m))


@pytest.mark.parametrize("m, r", SIZES)
def test_2d_nested_identity_on_random_rationals(m, r):
    """Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A is the 2-D correlation of an alpha×alpha tile with r×r."""
    t, rng = winograd_matrices(m, r), random.Random(m * 100 + r)
    for _ in range(5):
        d, g = _rationals(rng, m + r - 1, m + r - 1), _rationals(rng, r, r)
        y = t.AT.dot(t.G.dot(g).dot(t.G.T) * t.BT.dot(d).dot(t.BT.T)).dot(t.AT.T)
        ref = [[sum(d[i + u, j + v] * g[u, v] for u in range(r) for v in range(r))
                for j in range(m)] for i in range(m)]
        assert y.tolist() == ref


@pytest.mark.parametrize("m, r", sorted(LAVIN_GRAY))
def test_matches_lavin_gray_up_to_scaling(m, r):
    """Lavin–Gray's matrices are a valid F(m, r) (checked like ours), and equal ours up to the
    freedom the identity leaves: per frequency position i, scalars a_i, g_i, b_i with
    a_i·g_i·b_i = 1 such that AT_lg[:, i] = a_i AT[:, i], G_lg[i] = g_i G[i], BT_lg[i] = b_i BT[i].
    (Same points in the same order; F(2,3) differs by a sign at infinity, F(4,3) not at all.)"""
    ours, lg = winograd_matrices(m, r), _exact(LAVIN_GRAY[(m, r)])
    rng = random.Random(7)
    for _ in range(10):
        d, g = _rationals(rng, m + r - 1), _rationals(rng, r)
        assert list(_winograd_1d(lg, d, g)) == list(_correlate_1d(d, g, m))
    for i in range(m + r - 1):
        a, gs, b = (_ratio(x, y) for x, y in ((lg.AT[:, i], ours.AT[:, i]), (lg.G[i], ours.G[i]),
                                              (lg.BT[i], ours.BT[i])))
        assert a * gs * b == 1, f"position {i}: scalings {a}, {gs}, {b}"


def _ratio(theirs, ours) -> Fraction:
    """The scalar s with theirs == s * ours (asserting there is one)."""
    k = next(j for j, v in enumerate(ours) if v != 0)
    s = theirs[k] / ours[k]
    assert list(theirs) == [s * v for v in ours]
    return s


def test_f23_is_exactly_the_wincnn_output():
    """wincnn's F(2,3) from points 0, 1, -1 (fractions in G, first sign made positive)."""
    t = winograd_matrices(2, 3)
    assert t.AT.tolist() == [[1, 1, 1, 0], [0, 1, -1, 1]]
    assert t.G.tolist() == [[1, 0, 0], [Fraction(1, 2)] * 3,
                            [Fraction(1, 2), Fraction(-1, 2), Fraction(1, 2)], [0, 0, 1]]
    assert t.BT.tolist() == [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, -1, 0, 1]]


def test_default_points_follow_wincnn_order():
    assert default_points(9) == tuple(Fraction(p) for p in
                                      ("0", "1", "-1", "2", "-2", "1/2", "-1/2", "3", "-3"))


def test_explicit_points_and_memoization():
    t = winograd_matrices(2, 3, points=[0, -1, 1])
    assert _winograd_1d(t, np.array([Fraction(v) for v in (1, 2, 3, 4)], dtype=object),
                        np.array([Fraction(v) for v in (1, 0, -1)], dtype=object)).tolist() \
        == [-2, -2]
    assert winograd_matrices(4, 3) is winograd_matrices(4, 3)
    with pytest.raises(ValueError):
        winograd_matrices(4, 3).BT[0, 0] = 7


@pytest.mark.parametrize("kwargs, msg", [
    ({"m": 0, "r": 3}, "m >= 1"),
    ({"m": 2, "r": 3, "points": [0, 1]}, "needs 3 finite points, got 2"),
    ({"m": 2, "r": 3, "points": [0, 1, 1]}, "distinct"),
])
def test_bad_arguments(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        winograd_matrices(**kwargs)


def test_astype_rounds_each_entry_once():
    t = winograd_matrices(4, 3)
    f32 = t.astype(np.float32)
    assert f32.G.dtype == np.float32 and not f32.G.flags.writeable
    assert f32.G[1, 0] == np.float32(-1 / 6)
    np.testing.assert_array_equal(t.astype(np.float64).BT, t.BT.astype(float))


def _parse_c(text: str) -> tuple[dict[str, int], dict[str, list[str]], dict[str, np.ndarray]]:
    """#defines, each array's literals as written, each array's values."""
    defines = {k: int(v) for k, v in re.findall(r"#define (\w+) (\d+)", text)}
    literals, arrays = {}, {}
    for name, rows, cols, body in re.findall(
            r"(\w+)\[(\d+)\]\[(\d+)\] = \{(.*?)\n\};", text, flags=re.DOTALL):
        literals[name] = re.findall(r"[^\s{},]+", body)
        values = [float(v.rstrip("f")) for v in literals[name]]
        arrays[name] = np.array(values).reshape(int(rows), int(cols))
    return defines, literals, arrays


@pytest.mark.parametrize("dtype, np_dtype", [("float", np.float32), ("double", np.float64)])
@pytest.mark.parametrize("m, r", SIZES)
def test_c_source_reads_back_as_the_same_numbers(m, r, dtype, np_dtype):
    text = c_source(m, r, dtype=dtype)
    defines, literals, arrays = _parse_c(text)
    name = f"WINO_F{m}X{r}"
    assert defines == {f"{name}_M": m, f"{name}_R": r, f"{name}_ALPHA": m + r - 1}
    t = winograd_matrices(m, r).astype(np_dtype)
    for label, expected in zip(t._fields, t):
        got = arrays[f"{name}_{label}"].astype(np_dtype)
        np.testing.assert_array_equal(got, expected)
    assert f"static const {dtype} {name}_BT[" in text
    # float literals carry the f suffix (no double arithmetic in the kernel); all have a point.
    suffix = "f" if dtype == "float" else ""
    assert all(re.fullmatch(r"-?\d+\.\d+" + suffix, v) for vs in literals.values() for v in vs)


def test_c_source_qualifier_and_errors():
    assert "__constant__ const float WINO_F2X3_G[4][3]" in c_source(2, 3,
                                                                     qualifier="__constant__ const")
    with pytest.raises(ValueError, match="unknown C dtype 'half'"):
        c_source(2, 3, dtype="half")


@pytest.mark.parametrize("stride, r, pad, h, w", [(4, 11, 0, 27, 23), (2, 7, 3, 11, 12),
                                                   (3, 9, 4, 10, 14), (2, 5, 1, 9, 9)])
def test_phase_split_is_the_strided_convolution(stride, r, pad, h, w):
    """x's phase planes X'[i, b] = x_pad[s·i + b] correlated (stride 1) with W'[a, b] =
    w[s·a + b] give the strided convolution exactly, in float64 (the definition the CPU
    Winograd runs strided layers by)."""
    from convbench.algos import reference
    from convbench.algos.transforms import phase_split
    from convbench.core.problem import ConvProblem

    p = ConvProblem(n=2, c=3, h=h, w=w, k=4, r=r, s=r, stride=stride, pad=pad)
    split = phase_split(p, (3, 5))
    assert split.p == p.p and split.q == p.q and split.c == 3 * stride ** 2
    rng = np.random.default_rng(0)
    x, wt = rng.standard_normal(p.x_shape()), rng.standard_normal(p.w_shape())
    s, e_h, e_w, taps = stride, split.h, split.w, split.r
    xp = np.zeros((p.n, p.c, s * e_h, s * e_w))
    rows, cols = min(h, s * e_h - pad), min(w, s * e_w - pad)
    xp[:, :, pad:pad + rows, pad:pad + cols] = x[:, :, :rows, :cols]
    planes = xp.reshape(p.n, p.c, e_h, s, e_w, s).transpose(0, 3, 5, 1, 2, 4)
    wp = np.zeros((p.k, p.c, s * taps, s * taps))
    wp[:, :, :r, :r] = wt
    wsplit = wp.reshape(p.k, p.c, taps, s, taps, s).transpose(0, 3, 5, 1, 2, 4)
    got = reference.reference(split, "fwd", "nchw",
                              planes.reshape(p.n, split.c, e_h, e_w),
                              wsplit.reshape(p.k, split.c, taps, taps))
    np.testing.assert_allclose(got, reference.reference(p, "fwd", "nchw", x, wt), atol=1e-12)


def test_phase_split_refuses_what_it_cannot_split():
    from convbench.algos.transforms import phase_split
    from convbench.core.problem import ConvProblem

    base = dict(n=1, c=1, h=16, w=16, k=1)
    assert phase_split(ConvProblem(**base, r=3, s=3, stride=2), (3, 5)) is None  # 2x2 phases
    assert phase_split(ConvProblem(**base, r=11, s=11, stride=2), (3, 5)) is None  # 6x6
    assert phase_split(ConvProblem(**base, r=5, s=5, stride=(2, 1)), (3, 5)) is None
    assert phase_split(ConvProblem(**base, r=7, s=7, stride=2), (3, 5)).r == 5  # 4 taps, up
    assert phase_split(ConvProblem(**base, r=7, s=7, stride=2), (3,)) is None
    same = ConvProblem(**base, r=3, s=3, pad=1)
    assert phase_split(same, (3,)) is same
