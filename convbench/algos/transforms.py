"""Winograd minimal-filtering matrices F(m, r), generated exactly by the Cook–Toom construction.

F(m, r) computes m outputs of an r-tap correlation from alpha = m + r - 1 inputs with alpha
multiplications::

    y = AT @ ((G @ g) * (BT @ d))          y[i] = sum_k d[i + k] g[k]

and nests to 2-D as ``Y = AT [(G g Gᵀ) ⊙ (Bᵀ d B)] A``. The matrices come from evaluating
polynomials at alpha - 1 finite points plus the point at infinity (the leading coefficient):
a linear convolution s = g * h is ``E_alpha⁻¹ [(E_r g) ⊙ (E_m h)]`` with ``E_n`` the alpha×n
evaluation matrix, and correlation is its transpose, so

    AT = E_mᵀ,   G = D⁻¹ E_r,   BT = D E_alphaᵀ⁻¹

for any invertible diagonal D. Like Andrew Lavin's wincnn, D holds f_i = ∏_{j≠i}(a_i − a_j)
(1 at infinity, the first sign made positive), which moves the fractions into G — the filter is
transformed once, the data on every tile, so BT stays integral for integer points.

Everything is computed in `fractions.Fraction` and never typed in: the tests check the identities
exactly, and `c_source` renders the same numbers for CUDA kernels compiled with them baked in.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import NamedTuple

import numpy as np

_C_TYPES = {"float": (np.float32, "f"), "double": (np.float64, "")}
#: Filter sizes the CPU Winograd passes take (`algos.winograd`), and so the sizes a strided
#: problem's phase split may round its filter up to: 5x5 too, as cuDNN's WINOGRAD_NONFUSED does
#: — F(4x4, 5x5) does a fifth of a direct 5x5 convolution's multiplications (AlexNet's conv2) —
#: except with 5x5 and 6x6 tiles: F(6x6, 5x5)'s alpha = 10 needs the points ±3, and its fp32
#: error is too large to call a convolution (measured: docs/pages/cpu-algorithms.md, Winograd).
CPU_FILTER_SIZES = (3, 5)


class WinogradTransform(NamedTuple):
    """AT (m×alpha), G (alpha×r), BT (alpha×alpha), read-only; exact Fractions (object arrays)
    as `winograd_matrices` returns them, floats after `astype`."""

    AT: np.ndarray
    G: np.ndarray
    BT: np.ndarray

    @property
    def m(self) -> int:
        return self.AT.shape[0]

    @property
    def r(self) -> int:
        return self.G.shape[1]

    @property
    def alpha(self) -> int:
        return self.BT.shape[0]

    def astype(self, dtype) -> WinogradTransform:
        """The same matrices rounded to a float dtype (each entry rounded once from its exact
        value by way of float64)."""
        return WinogradTransform(*(_read_only(a.astype(dtype)) for a in self))


def default_points(count: int) -> tuple[Fraction, ...]:
    """The first `count` finite points of wincnn's order: 0, 1, -1, 2, -2, 1/2, -1/2, 3, -3,
    1/3, -1/3, ... — small magnitudes and their reciprocals keep the coefficients small."""
    return tuple(itertools.islice(_point_sequence(), count))


def _point_sequence() -> Iterator[Fraction]:
    yield from (Fraction(0), Fraction(1), Fraction(-1))
    for k in itertools.count(2):
        yield from (Fraction(k), Fraction(-k), Fraction(1, k), Fraction(-1, k))


def winograd_matrices(m: int, r: int, points: Sequence | None = None) -> WinogradTransform:
    """AT, G, BT of F(m, r) from alpha - 1 distinct finite `points` (default `default_points`)
    and infinity; exact and memoized."""
    if m < 1 or r < 1:
        raise ValueError(f"F(m, r) needs m >= 1 and r >= 1, got F({m}, {r})")
    count = m + r - 2
    pts = default_points(count) if points is None else tuple(Fraction(p) for p in points)
    if len(pts) != count:
        raise ValueError(f"F({m}, {r}) needs {count} finite points, got {len(pts)}")
    if len(set(pts)) != count:
        raise ValueError(f"interpolation points must be distinct, got {', '.join(map(str, pts))}")
    return _cook_toom(m, r, pts)


@functools.cache
def _cook_toom(m: int, r: int, points: tuple[Fraction, ...]) -> WinogradTransform:
    alpha = m + r - 1
    f = [_product(a - b for b in points if b != a) for a in points] + [Fraction(1)]
    if f[0] < 0:
        f[0] = -f[0]
    e_inv_t = _inverse(_evaluation(points, alpha)).T
    at = _evaluation(points, m).T
    g = _evaluation(points, r) / np.array(f, dtype=object)[:, None]
    bt = e_inv_t * np.array(f, dtype=object)[:, None]
    return WinogradTransform(*(_read_only(a) for a in (at, g, bt)))


def _evaluation(points: tuple[Fraction, ...], n: int) -> np.ndarray:
    """alpha×n: row i evaluates a degree-(n-1) polynomial at points[i]; the last row, at
    infinity, picks its leading coefficient."""
    rows = [[p ** j for j in range(n)] for p in points]
    rows.append([Fraction(int(j == n - 1)) for j in range(n)])
    return np.array(rows, dtype=object)


def _inverse(a: np.ndarray) -> np.ndarray:
    """Exact Gauss–Jordan inverse of a square Fraction matrix (the evaluation matrix is
    invertible because the points are distinct)."""
    n = a.shape[0]
    aug = np.concatenate([a, np.array([[Fraction(int(i == j)) for j in range(n)]
                                       for i in range(n)], dtype=object)], axis=1)
    for col in range(n):
        pivot = next(i for i in range(col, n) if aug[i, col] != 0)
        aug[[col, pivot]] = aug[[pivot, col]]
        aug[col] = aug[col] / aug[col, col]
        for i in range(n):
            if i != col and aug[i, col] != 0:
                aug[i] = aug[i] - aug[i, col] * aug[col]
    return aug[:, n:]


def _product(values) -> Fraction:
    out = Fraction(1)
    for v in values:
        out *= v
    return out


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def c_source(m: int, r: int, dtype: str = "float", qualifier: str = "static const",
             points: Sequence | None = None) -> str:
    """C text defining F(m, r): ``#define WINO_F<m>X<r>_{M,R,ALPHA}`` and the arrays
    ``WINO_F<m>X<r>_{AT,G,BT}[rows][cols]`` in `dtype` ("float" or "double"), declared with
    `qualifier` (e.g. ``__constant__ const`` for CUDA constant memory).

    Each literal is the shortest decimal that reads back as the entry rounded to `dtype`, so
    the compiled kernel holds exactly `winograd_matrices(m, r).astype(dtype)`.
    """
    if dtype not in _C_TYPES:
        raise ValueError(f"unknown C dtype {dtype!r}; valid: {', '.join(_C_TYPES)}")
    np_dtype, suffix = _C_TYPES[dtype]
    t = winograd_matrices(m, r, points)
    name = f"WINO_F{m}X{r}"
    pts = ", ".join(map(str, default_points(m + r - 2) if points is None else points))
    header = (f"/* Winograd F({m}, {r}), alpha = {t.alpha}, points {pts}, inf; "
              "generated by convbench.algos.transforms */")
    lines = [header,
             f"#define {name}_M {m}", f"#define {name}_R {r}", f"#define {name}_ALPHA {t.alpha}"]
    for label, exact in zip(t._fields, t):
        rows = exact.astype(np_dtype)
        body = ",\n".join("    {" + ", ".join(c_literal(v, suffix) for v in row) + "}"
                          for row in rows)
        lines.append(f"{qualifier} {dtype} {name}_{label}[{rows.shape[0]}][{rows.shape[1]}] = {{"
                     f"\n{body}\n}};")
    return "\n".join(lines) + "\n"


def c_literal(value, suffix: str = "f") -> str:
    """`value` as the shortest C literal that reads back as the same number in its dtype."""
    return np.format_float_positional(value, unique=True, trim="0") + suffix


def phase_split(problem, sizes: Sequence[int]):
    """A stride-s convolution as a stride-1 one over its s×s phases (the polyphase
    decomposition, as DWM — Huang et al., AAAI 2020 — takes strided layers to Winograd), or
    None where there is none with a filter in `sizes`.

    Tap t = s·a + b of an axis reads padded input s·(o + a) + b for output o: with the phase
    planes X'[i, b] = x_pad[s·i + b] and W'[a, b] = w[s·a + b] (zero past the filter), y is
    the stride-1 correlation of X' with W' over the s² phases as channels, C·s² of them, and
    a filter of ceil(r/s) taps per axis, rounded up to the least size in `sizes` (zero taps
    again). The phase planes span P + r' - 1 rows and columns, unpadded: padding and input
    past the last window live in X' (zeros, or rows never read). A stride-1 problem is its own
    split; the split needs one stride and padding for both axes, a square filter, dilation 1,
    groups 1, and a phase filter of at least the least size in `sizes` (3x3 at stride 2 would
    be 2x2 per phase, padded to 3x3: more work than it saves)."""
    from ..core.problem import ConvProblem

    p = problem
    if (isinstance(p.stride, tuple) or isinstance(p.pad, tuple) or p.r != p.s
            or p.dilation != 1 or p.groups != 1):
        return None
    if p.stride == 1:
        return p if p.r in sizes else None
    taps = -(-p.r // p.stride)
    fits = [size for size in sorted(sizes) if size >= taps]
    if taps < min(sizes) or not fits:
        return None
    r = fits[0]
    return ConvProblem(n=p.n, c=p.c * p.stride ** 2, h=p.p + r - 1, w=p.q + r - 1, k=p.k,
                       r=r, s=r)
