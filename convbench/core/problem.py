"""One 2-D convolution, its passes and layouts: the key every result is grouped by.

`ConvProblem` is frozen and hashable (like PyTorch's benchmark `TaskSpec`) so a results table can
be grouped by it and a plan can be looked up by it. It is validated at construction: a problem
that exists is a problem that can be run.
"""

from __future__ import annotations

import dataclasses
import functools
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
#: One axis's padding: an int where both sides agree, else (before, after).
Sides = int | tuple[int, int]
#: The padding: an int or (h, w) where each axis pads both sides alike, else the full
#: ((top, bottom), (left, right)).
Pad = Pair | tuple[tuple[int, int], tuple[int, int]]


def _integer(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError(f"ConvProblem.{name} must be an integer, got {v!r}")
    return int(v)


def _sides(name: str, value) -> Sides:
    """One axis's value: an int, or for `pad` also (before, after) (an int where they agree)."""
    if isinstance(value, (tuple, list)):
        if name != "pad" or len(value) != 2:
            raise ValueError(f"ConvProblem.{name} must be one integer or (height, width)"
                             f"{', each an integer or (before, after)' if name == 'pad' else ''}"
                             f", got {value!r}")
        before, after = (_integer(name, v) for v in value)
        return before if before == after else (before, after)
    return _integer(name, value)


def _text_sides(name: str, part: str) -> Sides:
    nums = part.split("+") if name == "pad" else [part]
    if len(nums) > 2:
        raise ValueError
    values = [int(t) for t in nums]
    return values[0] if len(values) == 1 else tuple(values)


def axis_pair(name: str, value) -> Pad:
    """`value` of the per-axis field `name` in its one form: an int where both axes agree, else
    (height, width); for `pad`, where an axis pads its two sides unequally, the full
    ((top, bottom), (left, right)). Takes an int, an (h, w) pair (for `pad`, each an int or a
    (before, after) pair), or the text forms `2`, `2x1` and, for `pad`, `0+1` (before+after,
    both axes) and `0+1x1` (height 0 before and 1 after, width 1 both sides)."""
    if isinstance(value, str):
        parts = value.strip().split("x")
        try:
            if len(parts) > 2:
                raise ValueError
            sides = [_text_sides(name, t) for t in parts]
        except ValueError:
            raise ValueError(f"ConvProblem.{name}: {value!r} is not an integer or HxW "
                             "(e.g. 2 or 2x1" + (", before+after: 0+1 or 0+1x1"
                                                 if name == "pad" else "") + ")") from None
        value = sides[0] if len(sides) == 1 else tuple(sides)
        if isinstance(value, tuple) and len(parts) == 1:  # `0+1`: both axes
            value = (value, value)
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"ConvProblem.{name} must be one integer or (height, width), got "
                             f"{value!r}")
        h, w = (_sides(name, v) for v in value)
        if isinstance(h, tuple) or isinstance(w, tuple):
            return pad_sides((h, w))
        return h if h == w else (h, w)
    return _integer(name, value)


def pad_sides(value: Pad) -> tuple[tuple[int, int], tuple[int, int]]:
    """A padding in its full form ((top, bottom), (left, right)), whichever form it is kept in."""
    if isinstance(value, tuple):
        return tuple((v, v) if not isinstance(v, tuple) else tuple(v)  # type: ignore[misc]
                     for v in value)
    return ((value, value), (value, value))


def _side_text(v: Sides) -> str:
    return f"{v[0]}+{v[1]}" if isinstance(v, tuple) else str(v)


def pair_text(value: Pad) -> str:
    """A per-axis value in its shortest text form: `2`, or `2x1` (height x width); a padding
    whose axis pads unequally writes that axis `before+after`: `0+1` (both axes), `0+1x1`."""
    if not isinstance(value, tuple):
        return str(value)
    h, w = (_side_text(v) if not isinstance(v, tuple) or v[0] != v[1] else str(v[0])
            for v in value)
    return h if h == w else f"{h}x{w}"


def _nested(value: Pad) -> bool:
    """Whether a padding is kept in its full form (an axis pads its sides unequally)."""
    return isinstance(value, tuple) and any(isinstance(v, tuple) for v in value)


def axes(value: Pair) -> tuple[int, int]:
    """A per-axis value as its (height, width) pair, whichever form it is kept in. A padding
    with unequal sides has no one value per axis: ValueError (read `pad_sides`)."""
    if _nested(value):
        raise ValueError(f"padding {pair_text(value)} differs before and after: read its "
                         "sides (pad_top, pad_bottom, pad_left, pad_right)")
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

    The padding of an axis may differ before and after (benchdnn's shape files and TensorFlow's
    SAME padding need it): `pad=((0, 1), (1, 1))` is 0 rows above, 1 below, 1 column each side
    (text `0+1x1`; `0+1` pads both axes 0 before and 1 after). The padding after may be
    negative: input rows or columns that no output reads (benchdnn's deduced padding). It is
    kept in one form too: the padding after is the one the output size needs exactly
    ((P-1)·stride + extent − size − before), or equal to the padding before where that gives
    the same output (rows past the last window are never read), so equal convolutions are equal
    problems. `pad_top`, `pad_bottom`, `pad_left` and `pad_right` read each side; `pad_h` and
    `pad_w` raise ValueError on an axis whose sides differ.
    """

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: Pair = 1
    pad: Pad = 0
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
        sides = pad_sides(self.pad)
        for name, least in AXIS_FIELDS.items():
            value = getattr(self, name)
            low = min(b for b, _ in sides) if name == "pad" else min(axes(value))
            if low < least:
                where = " before" if name == "pad" and _nested(value) else ""
                raise ValueError(f"ConvProblem.{name} must be >= {least}{where}, got "
                                 f"{pair_text(value)}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            values = [abs(v) for side in sides for v in side] if f.name == "pad" \
                else axes(value)
            if max(values) > FIELD_MAX:
                raise ValueError(f"ConvProblem.{f.name} must be at most {FIELD_MAX}, got "
                                 f"{pair_text(value)}")
        if self.c % self.groups:
            raise ValueError(f"ConvProblem.groups={self.groups} does not divide c={self.c}")
        if self.k % self.groups:
            raise ValueError(f"ConvProblem.groups={self.groups} does not divide k={self.k}")
        kept = []
        for axis, size, extent, stride, (before, after) in (
                ("h", self.h, self.eff_r, self.stride_h, sides[0]),
                ("w", self.w, self.eff_s, self.stride_w, sides[1])):
            if extent > size + before + after:
                filt = "r" if axis == "h" else "s"
                padded = f"2*{before}" if before == after else f"{before}+{after}"
                raise ValueError(
                    f"ConvProblem.{filt}: filter extent {extent} is larger than the padded input "
                    f"{axis}={size}+{padded}"
                )
            out = (size + before + after - extent) // stride + 1
            if size + 2 * before >= extent and (size + 2 * before - extent) // stride + 1 == out:
                after = before
            else:
                after = (out - 1) * stride + extent - size - before
            kept.append((before, after))
        object.__setattr__(self, "pad", axis_pair("pad", kept))

    # --- per axis -------------------------------------------------------------------------
    stride_h = property(lambda self: axes(self.stride)[0], doc="Stride along the height.")
    stride_w = property(lambda self: axes(self.stride)[1], doc="Stride along the width.")
    pad_h = property(lambda self: axes(self.pad)[0], doc="Zeros above and below the input "
                     "(ValueError where the two differ: read pad_top and pad_bottom).")
    pad_w = property(lambda self: axes(self.pad)[1], doc="Zeros left and right of the input "
                     "(ValueError where the two differ: read pad_left and pad_right).")
    pad_top = property(lambda self: pad_sides(self.pad)[0][0], doc="Zero rows above the input.")
    pad_bottom = property(lambda self: pad_sides(self.pad)[0][1],
                          doc="Zero rows below the input (negative: input rows never read).")
    pad_left = property(lambda self: pad_sides(self.pad)[1][0],
                        doc="Zero columns left of the input.")
    pad_right = property(lambda self: pad_sides(self.pad)[1][1],
                         doc="Zero columns right of the input (negative: columns never read).")
    dil_h = property(lambda self: axes(self.dilation)[0], doc="Dilation along the height.")
    dil_w = property(lambda self: axes(self.dilation)[1], doc="Dilation along the width.")

    @property
    def per_axis(self) -> bool:
        """Whether stride, padding or dilation differ between the axes."""
        return any(isinstance(getattr(self, f), tuple) for f in AXIS_FIELDS)

    @property
    def asymmetric(self) -> bool:
        """Whether an axis pads its two sides unequally."""
        return _nested(self.pad)

    def axis_fields(self) -> dict:
        """The fields as a results row spells them: per-axis ones in their text form (`2x1`,
        `0+1x1`) where the axes or sides differ, so a row's key reads the same from the runner
        and the CSV."""
        return {f.name: pair_text(getattr(self, f.name)) if f.name in AXIS_FIELDS
                and isinstance(getattr(self, f.name), tuple) else getattr(self, f.name)
                for f in dataclasses.fields(self)}

    # --- padding both sides alike ---------------------------------------------------------
    def symmetric_part(self, whole: bool = False) -> tuple[ConvProblem, tuple[int, int, int, int]]:
        """(the same convolution with each axis padded alike, the explicit pad of x that
        turns this problem into it): the explicit pad is (left, right, top, bottom), as
        `torch.nn.functional.pad` takes it, negative where it crops input rows no output reads.

        Per axis the padding both sides keep is the smaller one (0 where the padding after is
        negative), and x is padded (or cropped) explicitly by the rest: fwd and bwd_filter pad
        x, then run the symmetric problem; bwd_data runs it and crops its dx by the same
        amounts (padding back zeros for the rows no output reads, whose gradient is 0).
        A problem padded alike already is its own symmetric part, with (0, 0, 0, 0). With
        `whole`, a problem padded unequally is padded explicitly on every side, keeping no
        padding (for an implementation that takes one padding for both axes)."""
        if not _nested(self.pad):  # each axis pads its sides alike: its own part
            return self, (0, 0, 0, 0)
        # kept once computed (the problem is frozen; every implementation's route asks)
        key = "_symmetric_whole" if whole else "_symmetric"
        if key not in self.__dict__:
            self.__dict__[key] = self._symmetric_part(whole)
        return self.__dict__[key]

    def _symmetric_part(self, whole: bool) -> tuple[ConvProblem, tuple[int, int, int, int]]:
        (top, bottom), (left, right) = pad_sides(self.pad)
        keep_h, keep_w = max(0, min(top, bottom)), max(0, min(left, right))
        if whole and self.asymmetric:
            keep_h = keep_w = 0
        explicit = (left - keep_w, right - keep_w, top - keep_h, bottom - keep_h)
        if not any(explicit):
            return self, explicit
        sym = dataclasses.replace(self, h=self.h + explicit[2] + explicit[3],
                                  w=self.w + explicit[0] + explicit[1], pad=(keep_h, keep_w))
        return sym, explicit

    def torch_args(self) -> dict:
        """The keywords torch's convolutions take for this problem (`F.conv2d`,
        `torch.nn.grad.conv2d_input/weight`, `aten.convolution`): stride, padding, dilation,
        groups. torch pads both sides alike, so for a problem whose sides differ these are
        the keywords of `symmetric_part()`'s problem, which runs after its explicit pad."""
        sym = self.symmetric_part()[0]
        return {"stride": (sym.stride_h, sym.stride_w), "padding": (sym.pad_h, sym.pad_w),
                "dilation": (sym.dil_h, sym.dil_w), "groups": sym.groups}

    # --- geometry -------------------------------------------------------------------------
    @property
    def eff_r(self) -> int:
        """Filter height as it covers the input, dilation included."""
        return (self.r - 1) * self.dil_h + 1

    @property
    def eff_s(self) -> int:
        """Filter width as it covers the input, dilation included."""
        return (self.s - 1) * self.dil_w + 1

    @functools.cached_property
    def p(self) -> int:
        """Output height (kept once computed: the problem is frozen)."""
        return (self.h + self.pad_top + self.pad_bottom - self.eff_r) // self.stride_h + 1

    @functools.cached_property
    def q(self) -> int:
        """Output width (kept once computed)."""
        return (self.w + self.pad_left + self.pad_right - self.eff_s) // self.stride_w + 1

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
            if name in AXIS_FIELDS:
                number = axis_pair(name, val) if axis is None else _text_sides(name, val)
            else:
                number = int(val)
        except ValueError:
            raise ValueError(f"malformed layer spec {text!r}: {key}={val!r} is not an integer"
                             + (" or HxW" if name in AXIS_FIELDS and axis is None else "")
                             + (" (before+after: 0+1)" if name == "pad" else "")) from None
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
