"""One 2-D convolution, its passes and layouts: the key every result is grouped by.

`ConvProblem` is frozen and hashable (like PyTorch's benchmark `TaskSpec`) so a results table can
be grouped by it and a plan can be looked up by it. It is validated at construction: a problem
that exists is a problem that can be run.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass

PASSES = ("fwd", "bwd_data", "bwd_filter")
LAYOUTS = ("nchw", "nhwc")
PRECISIONS = ("fp64", "fp32", "tf32", "fp16", "bf16")

#: Filter layout that goes with each activation layout, as cuDNN and CUTLASS pair them.
FILTER_LAYOUT = {"nchw": "kcrs", "nhwc": "krsc"}

#: The precision of an array by its dtype's name (NumPy's, CuPy's and torch's agree).
PRECISION_OF_DTYPE = {"float64": "fp64", "float32": "fp32", "float16": "fp16",
                      "bfloat16": "bf16"}

#: Bytes per element of each precision's storage type (tf32 is stored as fp32).
ELEMENT_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}

_FIELDS_POSITIVE = ("n", "c", "h", "w", "k", "r", "s", "stride", "dilation", "groups")


def check_choice(kind: str, value: str, valid: tuple[str, ...] | list[str]) -> str:
    """Return `value` if it is one of `valid`, else raise a ValueError naming both."""
    if value not in valid:
        raise ValueError(f"unknown {kind} {value!r}; valid: {', '.join(valid)}")
    return value


@dataclass(frozen=True)
class ConvProblem:
    """y = conv(x, w): x is N×C×H×W, w is K×(C/groups)×R×S, y is N×K×P×Q.

    `stride`, `pad` and `dilation` are the same along both spatial axes.
    """

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: int = 1
    pad: int = 0
    dilation: int = 1
    groups: int = 1

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise ValueError(f"ConvProblem.{f.name} must be an integer, got {v!r}")
            object.__setattr__(self, f.name, int(v))
        for name in _FIELDS_POSITIVE:
            if getattr(self, name) <= 0:
                raise ValueError(f"ConvProblem.{name} must be positive, got {getattr(self, name)}")
        if self.pad < 0:
            raise ValueError(f"ConvProblem.pad must be >= 0, got {self.pad}")
        if self.c % self.groups:
            raise ValueError(f"ConvProblem.groups={self.groups} does not divide c={self.c}")
        if self.k % self.groups:
            raise ValueError(f"ConvProblem.groups={self.groups} does not divide k={self.k}")
        for axis, size, extent in (("h", self.h, self.eff_r), ("w", self.w, self.eff_s)):
            if extent > size + 2 * self.pad:
                filt = "r" if axis == "h" else "s"
                raise ValueError(
                    f"ConvProblem.{filt}: filter extent {extent} is larger than the padded input "
                    f"{axis}={size}+2*{self.pad}"
                )

    # --- geometry -------------------------------------------------------------------------
    @property
    def eff_r(self) -> int:
        """Filter height as it covers the input, dilation included."""
        return (self.r - 1) * self.dilation + 1

    @property
    def eff_s(self) -> int:
        return (self.s - 1) * self.dilation + 1

    @property
    def p(self) -> int:
        """Output height."""
        return (self.h + 2 * self.pad - self.eff_r) // self.stride + 1

    @property
    def q(self) -> int:
        """Output width."""
        return (self.w + 2 * self.pad - self.eff_s) // self.stride + 1

    @property
    def cg(self) -> int:
        """Input channels per group (the filter's channel extent)."""
        return self.c // self.groups

    def x_shape(self, layout: str = "nchw") -> tuple[int, int, int, int]:
        check_choice("layout", layout, LAYOUTS)
        n, c, h, w = self.n, self.c, self.h, self.w
        return (n, c, h, w) if layout == "nchw" else (n, h, w, c)

    def w_shape(self, layout: str = "nchw") -> tuple[int, int, int, int]:
        check_choice("layout", layout, LAYOUTS)
        k, c, r, s = self.k, self.cg, self.r, self.s
        return (k, c, r, s) if layout == "nchw" else (k, r, s, c)

    def y_shape(self, layout: str = "nchw") -> tuple[int, int, int, int]:
        check_choice("layout", layout, LAYOUTS)
        n, k, p, q = self.n, self.k, self.p, self.q
        return (n, k, p, q) if layout == "nchw" else (n, p, q, k)

    def operand_shapes(self, pass_: str, layout: str = "nchw"):
        """(first input, second input, output) shapes of a pass, in `layout`.

        fwd: (x, w) -> y;  bwd_data: (dy, w) -> dx;  bwd_filter: (x, dy) -> dw.
        """
        check_choice("pass", pass_, PASSES)
        x, w, y = self.x_shape(layout), self.w_shape(layout), self.y_shape(layout)
        return {"fwd": (x, w, y), "bwd_data": (y, w, x), "bwd_filter": (x, y, w)}[pass_]

    # --- cost -----------------------------------------------------------------------------
    @property
    def flops(self) -> int:
        """Direct-convolution FLOPs (a multiply and an add per MAC); the same for every pass."""
        return 2 * self.n * self.k * self.p * self.q * self.cg * self.r * self.s

    def min_bytes(self, precision: str = "fp32") -> int:
        """Fewest bytes a pass must move: each of x, w, y read or written once."""
        check_choice("precision", precision, PRECISIONS)
        elems = self.n * self.c * self.h * self.w + self.k * self.cg * self.r * self.s
        elems += self.n * self.k * self.p * self.q
        return elems * ELEMENT_BYTES[precision]

    def with_batch(self, n: int) -> ConvProblem:
        return dataclasses.replace(self, n=n)

    # --- text -----------------------------------------------------------------------------
    def spec(self) -> str:
        """The text form `parse_spec` reads back; defaults are left out."""
        parts = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                 if f.default is dataclasses.MISSING or getattr(self, f.name) != f.default]
        return ",".join(parts)

    def __str__(self) -> str:
        return self.spec()


_SPEC_ALIASES = {"padding": "pad", "stride": "stride", "dil": "dilation", "g": "groups"}


def parse_spec(text: str) -> ConvProblem:
    """Read `n=8,c=96,h=27,w=27,k=256,r=5,s=5,pad=2` into a ConvProblem.

    Raises ValueError with one line naming what is wrong.
    """
    fields = {f.name for f in dataclasses.fields(ConvProblem)}
    values: dict[str, int] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        key, sep, val = (t.strip() for t in item.partition("="))
        key = _SPEC_ALIASES.get(key, key)
        if not sep or key not in fields:
            raise ValueError(
                f"malformed layer spec {text!r}: {item!r} is not FIELD=INT with FIELD one of "
                f"{', '.join(sorted(fields))}"
            )
        if key in values:
            raise ValueError(f"malformed layer spec {text!r}: {key} given twice")
        try:
            values[key] = int(val)
        except ValueError:
            raise ValueError(f"malformed layer spec {text!r}: {key}={val!r} is not an integer") \
                from None
    required = [f.name for f in dataclasses.fields(ConvProblem) if f.default is dataclasses.MISSING]
    missing = [f for f in required if f not in values]
    if missing:
        raise ValueError(f"malformed layer spec {text!r}: missing {', '.join(missing)}")
    return ConvProblem(**values)
