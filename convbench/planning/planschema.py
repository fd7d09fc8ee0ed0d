"""A small schema that parses as it checks: validators for JSON read strictly (no NaN, no
duplicate keys), each turning a value into what the reader wants or naming the field and what
is wrong. The plan file is read with it (`plan`); nothing here knows a plan.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from ..core.problem import AXIS_FIELDS, FIELD_MAX, PASSES, ConvProblem
from ..core.results import PROBLEM_FIELDS


class Invalid(Exception):
    def __init__(self, path: str, what: str):
        super().__init__(what)
        self.path, self.what = path, what


Validator = Callable[[object, str], object]


def no_constant(name: str):
    raise Invalid("", f"{name} is not a number JSON allows")


def no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    out = {}
    for k, v in pairs:
        if k in out:
            raise Invalid("", f"key {k!r} appears twice in one object")
        out[k] = v
    return out


def _describe(v) -> str:
    name = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(v), "a number")
    return f"{name} ({json.dumps(v)[:40]})" if not isinstance(v, (dict, list)) else name


def _join(path: str, key) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key


def anything(v, path):
    return v


def text(v, path):
    if not isinstance(v, str):
        raise Invalid(path, f"expected a string, got {_describe(v)}")
    return v


def flag(v, path):
    if not isinstance(v, bool):
        raise Invalid(path, f"expected true or false, got {_describe(v)}")
    return v


def integer(minimum: int = 0) -> Validator:
    def check(v, path):
        if isinstance(v, bool) or not isinstance(v, int):
            raise Invalid(path, f"expected an integer, got {_describe(v)}")
        if v < minimum:
            raise Invalid(path, f"expected an integer >= {minimum}, got {v}")
        return v

    return check


def axis_value(minimum: int, sides: bool = False) -> Validator:
    """Stride, pad or dilation: one integer, or [height, width]; with `sides` (the padding),
    each of height and width may be [before, after] (after may be negative: rows no output
    reads), as a problem padded unequally is written."""
    whole = integer(minimum)
    after = integer(-FIELD_MAX)

    def side(x, path):
        if sides and isinstance(x, list):
            if len(x) != 2:
                raise Invalid(path, f"expected an integer or [before, after], got "
                                     f"{_describe(x)}")
            return (whole(x[0], f"{path}[0]"), after(x[1], f"{path}[1]"))
        return whole(x, path)

    def check(v, path):
        if isinstance(v, list):
            if len(v) != 2:
                raise Invalid(path, f"expected an integer or [height, width], got {_describe(v)}")
            return tuple(side(x, f"{path}[{i}]") for i, x in enumerate(v))
        return whole(v, path)

    return check


def number(v, path):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Invalid(path, f"expected a number, got {_describe(v)}")
    if v < 0:
        raise Invalid(path, f"expected a number >= 0, got {v}")
    return float(v)


def one_of(valid: Iterable[str], kind: str) -> Validator:
    valid = tuple(valid)

    def check(v, path):
        if text(v, path) not in valid:
            raise Invalid(path, f"unknown {kind} {v!r}; valid: {', '.join(valid)}")
        return v

    return check


def optional(inner: Validator) -> Validator:
    return lambda v, path: None if v is None else inner(v, path)


def list_of(item: Validator, length: int | None = None) -> Validator:
    def check(v, path):
        if not isinstance(v, list):
            raise Invalid(path, f"expected a list, got {_describe(v)}")
        if length is not None and len(v) != length:
            raise Invalid(path, f"expected {length} items, got {len(v)}")
        return [item(x, _join(path, i)) for i, x in enumerate(v)]

    return check


def obj(fields: dict[str, Validator], build: Callable = dict, partial: bool = False,
         optional: Iterable[str] = ()) -> Validator:
    """An object with exactly `fields` (with `partial`, at least them), each validated, built
    into `build(**values)`; `optional` ones (added after a format version) may be missing, and
    are then left to `build`'s default."""
    optional = set(optional)

    def check(v, path):
        if not isinstance(v, dict):
            raise Invalid(path, f"expected an object, got {_describe(v)}")
        missing = [k for k in fields if k not in v and k not in optional]
        if missing:
            raise Invalid(path, f"missing key {missing[0]!r}")
        unknown = [k for k in v if k not in fields]
        if unknown and not partial:
            raise Invalid(path, f"unknown key {unknown[0]!r}; expected: {', '.join(fields)}")
        return build(**{k: fn(v[k], _join(path, k)) for k, fn in fields.items() if k in v})

    return check


def problem_field(v, path):
    fields = obj({f: axis_value(AXIS_FIELDS[f], f == "pad") if f in AXIS_FIELDS else integer(1)
                   for f in PROBLEM_FIELDS})(v, path)
    try:
        return ConvProblem(**fields)
    except ValueError as exc:
        raise Invalid(path, str(exc)) from None


def passes(choice: Validator) -> Validator:
    return obj({p: optional(choice) for p in PASSES})


