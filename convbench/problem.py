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

_FIELDS_POSITIVE = ("n", "c", "h", "w", "k", "r", "s", "groups")
#: The fields that may differ between the two spatial axes: an int where they agree, an
#: (height, width) pair where they do not; each with its least value.
AXIS_FIELDS = {"stride": 1, "pad": 0, "dilation": 1}
#: Every field's largest value (a 32-bit index, as cuDNN's descriptors take): a problem larger
#: than any machine holds is still a problem, measured as `oom` with the bytes it would need.
FIELD_MAX = 2**31 - 1

Pair = int | tuple[int, int]


def _integer(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError(f"ConvProblem.{name} must be an integer, got {v!r}")
    return int(v)


def axis_pair(name: str, value) -> Pair:
    """`value` of the per-axis field `name` in its one form: an int where both axes agree, else
    (height, width). Takes an int, an (h, w) pair, or the text forms `2` and `2x1`."""
    if isinstance(value, str):
        parts = value.strip().split("x")
        try:
            nums = [int(t) for t in parts]
        except ValueError:
            raise ValueError(f"ConvProblem.{name}: {value!r} is not an integer or HxW "
                             "(e.g. 2 or 2x1)") from None
        value = nums[0] if len(nums) == 1 else tuple(nums)
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"ConvProblem.{name} must be one integer or (height, width), got "
                             f"{value!r}")
        h, w = (_integer(name, v) for v in value)
        return h if h == w else (h, w)
    return _integer(name, value)


def pair_text(value: Pair) -> str:
    """A per-axis value in its shortest text form: `2`, or `2x1` (height x width)."""
    return f"{value[0]}x{value[1]}" if isinstance(value, tuple) else str(value)


def axes(value: Pair) -> tuple[int, int]:
    """A per-axis value as its (height, width) pair, whichever form it is kept in."""
    return value if isinstance(value, tuple) else (value, value)


def check_choice(kind: str, value: str, valid: tuple[str, ...] | list[str]) -> str:
    """Return `value` if it is one of `valid`, else raise a ValueError naming both."""
    if value not in valid:
        raise ValueError(f"unknown {kind} {value!r}; valid: {', '.join(valid)}")
    return value


@dataclass(frozen=True)
class ConvProblem:
    """y = conv(x, w): x is N×C×H×W, w is K×(C/groups)×R×S, y is N×K×P×Q.

    `stride`, `pad` and `dilation` are each one int where the two spatial axes agree, else a
    (height, width) pair: `stride=(2, 1)`. They are kept in that one form (`(2, 2)` becomes
    `2`), so equal problems are equal and hash alike however they were spelled; `stride_h`,
    `stride_w`, `pad_h`, `pad_w`, `dil_h` and `dil_w` read one axis.
    """

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: Pair = 1
    pad: Pair = 0
    dilation: Pair = 1
    groups: int = 1

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            v = axis_pair(f.name, v) if f.name in AXIS_FIELDS else _integer(f.name, v)
            object.__setattr__(self, f.name, v)
        for name in _FIELDS_POSITIVE:
            if getattr(self, name) <= 0:
                raise ValueError(f"ConvProblem.{name} must be positive, got {getattr(self, name)}")
        for name, least in AXIS_FIELDS.items():
            if min(axes(getattr(self, name))) < least:
                raise ValueError(f"ConvProblem.{name} must be >= {least}, got "
                                 f"{pair_text(getattr(self, name))}")
        for f in dataclasses.fields(self):
            if max(axes(getattr(self, f.name))) > FIELD_MAX:
                raise ValueError(f"ConvProblem.{f.name} must be at most {FIELD_MAX}, got "
                                 f"{pair_text(getattr(self, f.name))}")
        if self.c % self.groups:
            raise ValueError(f"ConvProblem.groups={self.groups} does not divide c={self.c}")
        if self.k % self.groups:
            raise ValueError(f"ConvProblem.groups={self.groups} does not divide k={self.k}")
        for axis, size, extent, pad in (("h", self.h, self.eff_r, self.pad_h),
                                        ("w", self.w, self.eff_s, self.pad_w)):
            if extent > size + 2 * pad:
                filt = "r" if axis == "h" else "s"
                raise ValueError(
                    f"ConvProblem.{filt}: filter extent {extent} is larger than the padded input "
                    f"{axis}={size}+2*{pad}"
                )

    # --- per axis -------------------------------------------------------------------------
    stride_h = property(lambda self: axes(self.stride)[0], doc="Stride along the height.")
    stride_w = property(lambda self: axes(self.stride)[1], doc="Stride along the width.")
    pad_h = property(lambda self: axes(self.pad)[0], doc="Zeros above and below the input.")
    pad_w = property(lambda self: axes(self.pad)[1], doc="Zeros left and right of the input.")
    dil_h = property(lambda self: axes(self.dilation)[0], doc="Dilation along the height.")
    dil_w = property(lambda self: axes(self.dilation)[1], doc="Dilation along the width.")

    @property
    def per_axis(self) -> bool:
        """Whether stride, padding or dilation differ between the axes."""
        return any(isinstance(getattr(self, f), tuple) for f in AXIS_FIELDS)

    def axis_fields(self) -> dict:
        """The fields as a results row spells them: per-axis ones in their text form (`2x1`)
        where the axes differ, so a row's key reads the same from the runner and the CSV."""
        return {f.name: pair_text(getattr(self, f.name)) if f.name in AXIS_FIELDS
                and isinstance(getattr(self, f.name), tuple) else getattr(self, f.name)
                for f in dataclasses.fields(self)}

    # --- geometry -------------------------------------------------------------------------
    @property
    def eff_r(self) -> int:
        """Filter height as it covers the input, dilation included."""
        return (self.r - 1) * self.dil_h + 1

    @property
    def eff_s(self) -> int:
        """Filter width as it covers the input, dilation included."""
        return (self.s - 1) * self.dil_w + 1

    @property
    def p(self) -> int:
        """Output height."""
        return (self.h + 2 * self.pad_h - self.eff_r) // self.stride_h + 1

    @property
    def q(self) -> int:
        """Output width."""
        return (self.w + 2 * self.pad_w - self.eff_s) // self.stride_w + 1

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
        """The text form `parse_spec` reads back, in its shortest form: defaults left out, a
        per-axis field as one number where the axes agree, else as `HxW` (`stride=2x1`)."""
        parts = [f"{f.name}={pair_text(getattr(self, f.name))}" for f in dataclasses.fields(self)
                 if f.default is dataclasses.MISSING or getattr(self, f.name) != f.default]
        return ",".join(parts)

    def __str__(self) -> str:
        return self.spec()


_SPEC_ALIASES = {"padding": "pad", "dil": "dilation", "g": "groups"}
#: One axis of a per-axis field: `stride_h=2,stride_w=1` (also pad_h, dilation_w, dil_h, ...).
_AXIS_SUFFIX = {"_h": 0, "_w": 1}


def _spec_key(key: str) -> tuple[str, int | None]:
    """(field, axis) of a spec key: axis 0 or 1 for `stride_h`/`stride_w`, None for both."""
    for suffix, axis in _AXIS_SUFFIX.items():
        base = _SPEC_ALIASES.get(key[: -len(suffix)], key[: -len(suffix)])
        if key.endswith(suffix) and base in AXIS_FIELDS:
            return base, axis
    return _SPEC_ALIASES.get(key, key), None


def parse_spec(text: str) -> ConvProblem:
    """Read `n=8,c=96,h=27,w=27,k=256,r=5,s=5,pad=2` into a ConvProblem. A per-axis field
    takes `stride=2x1` (height x width) or `stride_h=2,stride_w=1`.

    Raises ValueError with one line naming what is wrong.
    """
    fields = {f.name for f in dataclasses.fields(ConvProblem)}
    values: dict[str, object] = {}
    axes: dict[str, list] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        key, sep, val = (t.strip() for t in item.partition("="))
        name, axis = _spec_key(key)
        if not sep or name not in fields:
            raise ValueError(
                f"malformed layer spec {text!r}: {item!r} is not FIELD=INT with FIELD one of "
                f"{', '.join(sorted(fields))} (per axis: stride=2x1 or stride_h=2,stride_w=1)"
            )
        given = axes.setdefault(name, [None, None]) if axis is not None else None
        if name in values or (given is not None and given[axis] is not None):
            raise ValueError(f"malformed layer spec {text!r}: {key} given twice")
        try:
            number = axis_pair(name, val) if name in AXIS_FIELDS and axis is None else int(val)
        except ValueError:
            raise ValueError(f"malformed layer spec {text!r}: {key}={val!r} is not an integer"
                             + (" or HxW" if name in AXIS_FIELDS else "")) from None
        if given is None:
            values[name] = number
        else:
            given[axis] = number
    for name, (h, w) in axes.items():
        if name in values:
            raise ValueError(f"malformed layer spec {text!r}: {name} given both whole and per "
                             "axis")
        if h is None or w is None:
            raise ValueError(f"malformed layer spec {text!r}: {name}_h and {name}_w go "
                             "together")
        values[name] = (h, w)
    required = [f.name for f in dataclasses.fields(ConvProblem) if f.default is dataclasses.MISSING]
    missing = [f for f in required if f not in values]
    if missing:
        raise ValueError(f"malformed layer spec {text!r}: missing {', '.join(missing)}")
    return ConvProblem(**values)
