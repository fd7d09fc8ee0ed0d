"""Problem lists from outside: a file of convolutions, as CSV or as oneDNN benchdnn descriptors,
read into named `Layer`s, so that benchdnn's own shape files run unchanged.

The form is told by the first line that is not blank or a `#` comment: CSV when it has a comma
(and does not start with `--`), else benchdnn descriptors. A CSV has a header of ConvProblem's
fields (per-axis fields as `2x1` or as `stride_h`/`stride_w` columns, optional `name` and
`count`). benchdnn descriptors are read as benchdnn reads them (oneDNN's `knobs_desc.md`,
`driver_conv.md` and `conv_aux.cpp`): its defaults, its deduction of the output size and the
padding, its square rule, names from `n"..."` and counts from a trailing `*N`, `--mb=N`; the
knobs that choose how benchdnn runs a problem are skipped (convbench's own options choose
those), other options refused. The padding after is benchdnn's, whatever it is; `ConvProblem`
keeps it in its one form. docs/pages/problems.md, problem files, has every rule.

Names: from `n"..."` or the name column, else `line<N>`; a name met again gets `#2`, `#3`, ...,
so every layer of a file has its own name.

Errors: the first malformed entry ends the read with a `ProblemFileError`, one line `FILE:LINE:
field: what is wrong`, and nothing is returned before the whole file is read. With `skipped`
(the command line gives it), a well-formed line convbench cannot hold (3-D, a size past a
32-bit index, a kernel larger than its padded input) is listed there with its reason instead,
and a file of skipped lines only is refused for having no problems convbench runs. This
module's one I/O is `read` taking the text of its file.
"""

from __future__ import annotations

import csv
import dataclasses
import re
from pathlib import Path

from ..core.problem import AXIS_FIELDS, ConvProblem, axis_pair
from .layers import Layer


class ProblemFileError(ValueError):
    """A problem file that cannot be read: `FILE:LINE: field: what is wrong`, one line."""

    def __init__(self, source: str, line: int | None, field: str, what: str) -> None:
        self.source, self.line, self.field, self.what = source, line, field, what
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {field}: {what}")


class _Bad(ValueError):
    """What is wrong with one entry; the reader adds the file and line."""

    def __init__(self, field: str, what: str) -> None:
        self.field, self.what = field, what
        super().__init__(f"{field}: {what}")


class _Unrunnable(_Bad):
    """A well-formed entry naming a convolution convbench cannot hold (3-D, a size past a
    32-bit index, a kernel larger than its padded input): skipped with its reason when the
    reader is given a `skipped` list, else an error like any other."""


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A line of a problem file that reads as a convolution convbench does not run, and why:
    `FILE:LINE: field: what` as `ProblemFileError` would say it."""

    source: str
    line: int
    name: str | None
    field: str
    what: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.field}: {self.what}"


# --- reading a file ---------------------------------------------------------------------------
def read(path: str | Path, *, net: str | None = None, batch: int | None = None,
         skipped: list[Skipped] | None = None) -> list[Layer]:
    """The problems of the file at `path`, in file order, as layers of `net` (default: the
    file's name without its suffix); `batch`, if given, replaces every problem's n.

    A well-formed line naming a convolution convbench cannot hold (3-D, a size past a 32-bit
    index, a kernel larger than its padded input) is an error, unless `skipped` is a list:
    then it is appended there as a `Skipped` (its reason in one line) and the rest is read."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not a UTF-8 text file"
        raise ProblemFileError(str(path), None, "file", f"cannot read it: {why}") from None
    return parse(text, str(path), net=net, batch=batch, skipped=skipped)


def parse(text: str, source: str = "<problems>", *, net: str | None = None,
          batch: int | None = None, skipped: list[Skipped] | None = None) -> list[Layer]:
    """`read` on text already read; `source` names it in errors (and is the default net)."""
    lines = [(i, line) for i, line in enumerate(text.splitlines(), 1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise ProblemFileError(source, 1, "file", "no problems in it (empty, or only blank "
                               "lines and comments)")
    first = re.sub(r"(^|\s)#.*", "", lines[0][1]).strip()  # a benchdnn comment aside
    is_csv = "," in first and not first.startswith("--")
    entries = (_csv if is_csv else _benchdnn)(lines, source, skipped)
    if not entries:
        raise ProblemFileError(source, lines[-1][0], "file", "no problems in it" + (
            " that"
            f" convbench runs ({len(skipped)} skipped, the first: {skipped[0].field}: "
            f"{skipped[0].what})" if skipped else ""))
    net = net or Path(source).stem
    layers, taken = [], set()
    for line, name, problem, count in entries:
        name = _unique(name or f"line{line}", taken)
        if batch is not None:
            problem = problem.with_batch(batch)
        layers.append(Layer(net, name, problem, count))
    return layers


def _unique(name: str, taken: set[str]) -> str:
    out, i = name, 1
    while out in taken:
        i += 1
        out = f"{name}#{i}"
    taken.add(out)
    return out


def _problem(fields: dict, labels: dict[str, str]) -> ConvProblem:
    """ConvProblem(**fields), its complaint as a `_Bad` on the field, named as `labels` says."""
    try:
        return ConvProblem(**fields)
    except ValueError as exc:
        m = re.match(r"ConvProblem\.(\w+)", str(exc))
        if not m:
            raise _Unrunnable("problem", str(exc)) from None
        field, rest = m.group(1), str(exc)[m.end():]
        what = f"{field}{rest}" if rest.startswith("=") else rest.lstrip(": ")
        raise _Unrunnable(labels.get(field, field), what) from None


# --- CSV --------------------------------------------------------------------------------------
_FIELDS = [f.name for f in dataclasses.fields(ConvProblem)]
_REQUIRED = [f.name for f in dataclasses.fields(ConvProblem) if f.default is dataclasses.MISSING]
_CSV_ALIASES = {"padding": "pad", "dil": "dilation", "g": "groups", "layer": "name"}
_AXIS_SUFFIX = {"_h": 0, "_w": 1}
_VALID_COLUMNS = ("n, c, h, w, k, r, s, stride, pad, dilation, groups (per axis: stride_h, "
                  "stride_w, pad_h, pad_w, dilation_h, dilation_w), name (or layer), count")


def _column(text: str) -> tuple[str, int | None]:
    """(field, axis) a header cell names: axis 0/1 for `pad_h`/`pad_w`, None for one column."""
    key = text.strip().lower()
    for suffix, axis in _AXIS_SUFFIX.items():
        base = _CSV_ALIASES.get(key[: -len(suffix)], key[: -len(suffix)])
        if key.endswith(suffix) and base in AXIS_FIELDS:
            return base, axis
    key = _CSV_ALIASES.get(key, key)
    if key not in (*_FIELDS, "name", "count"):
        raise _Bad(text.strip() or "(empty)", f"unknown column; valid: {_VALID_COLUMNS}")
    return key, None


def _header(cells: list[str]) -> list[tuple[str, int | None]]:
    columns = [_column(c) for c in cells]
    seen: dict[tuple[str, int | None], str] = {}
    for col, cell in zip(columns, cells):
        if col in seen:
            raise _Bad(cell.strip(), f"given twice (as {seen[col]!r} and {cell.strip()!r})")
        seen[col] = cell.strip()
    for field in AXIS_FIELDS:
        h, w, whole = ((field, 0) in seen, (field, 1) in seen, (field, None) in seen)
        if (h or w) and whole:
            raise _Bad(field, "given both as one column and per axis")
        if h != w:
            raise _Bad(seen.get((field, 0)) or seen[(field, 1)],
                       f"{field}_h and {field}_w go together")
    missing = [f for f in _REQUIRED if (f, None) not in seen]
    if missing:
        raise _Bad(missing[0], f"required column missing (the header needs "
                               f"{', '.join(_REQUIRED)})")
    return columns


#: One axis's padding in a cell: a whole number, or before+after (after may be negative).
_SIDES = r"\d+(\+-?\d+)?"


def _cell_side(field: str, label: str, cell: str):
    """One axis of a per-axis column: a whole number, or for `pad_h`/`pad_w` also `0+1`."""
    if field != "pad":
        return _cell_int(label, cell)
    if not re.fullmatch(_SIDES, cell):
        raise _Bad(label, f"{cell!r} is not a whole number or before+after (0+1)")
    before, _, after = cell.partition("+")
    return (int(before), int(after)) if after else int(before)


def _cell_int(field: str, cell: str) -> int:
    if not re.fullmatch(r"\d+", cell):
        raise _Bad(field, f"{cell!r} is not a whole number")
    return int(cell)


def _csv(lines: list[tuple[int, str]], source: str, skipped: list | None) -> list[tuple]:
    (head_line, head), *rows = lines
    try:
        columns = _header(next(csv.reader([head])))
    except _Bad as bad:
        raise ProblemFileError(source, head_line, bad.field, bad.what) from None
    labels = [f"{f}_{'hw'[axis]}" if axis is not None else f for f, axis in columns]
    out = []
    for line, text in rows:
        try:
            cells = [c.strip() for c in next(csv.reader([text]))]
            if len(cells) != len(columns):
                raise _Bad("row", f"{len(cells)} cells for the header's {len(columns)} columns")
            fields: dict = {}
            axes: dict[str, list] = {}
            name, count = None, 1
            for (field, axis), label, cell in zip(columns, labels, cells):
                if field == "name":
                    name = cell or None
                elif axis is not None:
                    axes.setdefault(field, [None, None])[axis] = (_cell_side(field, label, cell)
                                                                  if cell else None)
                elif not cell:
                    if field in _REQUIRED:
                        raise _Bad(label, "empty")
                elif field == "count":
                    count = _cell_int(label, cell)
                    if count < 1:
                        raise _Bad(label, "must be at least 1")
                elif field in AXIS_FIELDS:
                    side = _SIDES if field == "pad" else r"\d+"
                    if not re.fullmatch(rf"{side}(x{side})?", cell):
                        raise _Bad(label, f"{cell!r} is not a whole number or HxW (2 or 2x1"
                                   + (", before+after: 0+1 or 0+1x1" if field == "pad" else "")
                                   + ")")
                    fields[field] = axis_pair(field, cell)
                else:
                    fields[field] = _cell_int(label, cell)
            for field, hw in axes.items():
                if hw.count(None) == 1:
                    given, empty = ("h", "w") if hw[1] is None else ("w", "h")
                    raise _Bad(f"{field}_{empty}", f"empty while {field}_{given} is given")
                if None not in hw:
                    fields[field] = tuple(hw)
            out.append((line, name, _problem(fields, {}), count))
        except _Unrunnable as bad:
            if skipped is None:
                raise ProblemFileError(source, line, bad.field, bad.what) from None
            skipped.append(Skipped(source, line, name, bad.field, bad.what))
        except _Bad as bad:
            raise ProblemFileError(source, line, bad.field, bad.what) from None
    return out


# --- benchdnn ---------------------------------------------------------------------------------
_KEYS = ("g", "mb", "ic", "id", "ih", "iw", "oc", "od", "oh", "ow", "kd", "kh", "kw",
         "sd", "sh", "sw", "pd", "ph", "pw", "dd", "dh", "dw")
#: An entry and its value, and the one `_` that may follow it (no key is a prefix of another).
_ENTRY = re.compile(rf"({'|'.join(_KEYS)})(\d+)_?")
#: How convbench's fields are called in a descriptor, for errors ConvProblem raises.
_DESC_LABELS = {"n": "mb", "c": "ic", "k": "oc", "h": "ih", "w": "iw", "r": "kh", "s": "kw",
                "groups": "g", "stride": "sh", "pad": "ph", "dilation": "dh"}
#: benchdnn's options that choose how a problem runs, not what it is: the driver, direction,
#: data types, memory tags and strides, algorithm, attributes (`--attr-*`), implementation
#: filters. convbench's own --passes, --layouts, --precision and --algos choose those.
SKIPPED_OPTIONS = ("conv", "dir", "dt", "cfg", "stag", "wtag", "dtag", "strides", "bia-dt",
                   "alg", "allow-enum-tags-only", "skip-impl", "impl", "check-ref-impl",
                   "cpu-isa-hints")
_AXIS_WORDS = {"h": "height", "w": "width"}


def _benchdnn(lines: list[tuple[int, str]], source: str, skipped: list | None) -> list[tuple]:
    out, mb = [], 0
    for line, text in lines:
        try:
            for token in text.split():
                if token.startswith("#"):
                    break
                if token.endswith("\\"):
                    raise _Bad("line", "continues on the next (`\\`): write the entry on one "
                                       "line")
                if token.startswith("--"):
                    mb = _option(token, mb)
                    continue
                try:
                    problem, name = descriptor(token, mb=mb or None)
                except _Unrunnable as bad:
                    if skipped is None:
                        raise
                    skipped.append(Skipped(source, line, _entries(token)[1], bad.field,
                                           bad.what))
                    continue
                count = re.search(r"\*(\d+)$", name or "")
                if count and int(count.group(1)) < 1:
                    raise _Bad("n", f"a count of {count.group(1)} in the name {name!r}")
                out.append((line, name, problem, int(count.group(1)) if count else 1))
        except _Bad as bad:
            raise ProblemFileError(source, line, bad.field, bad.what) from None
    return out


def _option(token: str, mb: int) -> int:
    """The batch after the benchdnn option `token`, given the batch `mb` before it."""
    key, _, value = token[2:].partition("=")
    if key == "mb":
        if not re.fullmatch(r"\d+", value):
            raise _Bad("--mb", f"{value!r} is not one batch size"
                       + (" (a list runs each problem at each batch: give one, or use "
                          "convbench's --batch)" if "," in value else ""))
        return int(value)
    if key == "reset":
        return 0
    if key in SKIPPED_OPTIONS or key.startswith("attr-"):
        return mb
    if key == "batch":
        raise _Bad("--batch", f"{value!r}: includes another file; give that file itself")
    if key == "match":
        raise _Bad("--match", "filters problems by a regular expression; convbench reads "
                              "every problem of a file (leave the filter out)")
    raise _Bad(f"--{key}", "not an option convbench reads in a problem file (it takes --mb and "
                           f"--reset, and skips --{', --'.join(SKIPPED_OPTIONS)}, --attr-*)")


def descriptor(text: str, *, mb: int | None = None) -> tuple[ConvProblem, str | None]:
    """(problem, name or None) of one benchdnn conv descriptor, with benchdnn's defaults and
    deductions (see the module's docstring); `mb`, if given, replaces its batch as benchdnn's
    `--mb` does. ValueError `field: what is wrong` for a descriptor ConvProblem cannot hold."""
    values, name = _entries(text)
    g = values.get("g", 1)
    for key, value in (("g", g), ("ic", values.get("ic", 0)), ("oc", values.get("oc", 0))):
        if value < 1:
            raise _Bad(key, "not given, or 0" if key != "g" else "must be at least 1")
    for key in ("ic", "oc"):
        if values[key] % g:
            raise _Bad("g", f"{g} groups do not divide {key}={values[key]}")
    axes = {a: _axis(values, a) for a in "dhw"}
    d, h, w = (axes[a] for a in "dhw")
    if not (d or h or w):
        raise _Bad("ih", "no spatial size: give ih and kh (or iw and kw for 1-D)")
    if d:
        if h is None and w is None:
            h = w = d
        elif h is None or w is None:
            raise _Bad("iw" if w is None else "ih", "a descriptor with depth gives both "
                       "height and width entries, or neither")
        if (d["i"], d["k"], d["o"], d["p"]) != (1, 1, 1, 0):
            raise _Unrunnable("id", f"3-D convolution (id={d['i']}, kd={d['k']}, od={d['o']}): "
                       "convbench runs 2-D")
    elif w is None:
        w = h
    elif h is None:
        h = {"i": 1, "k": 1, "o": 1, "s": 1, "p": 0, "d": 0}
    for a, ax in (("h", h), ("w", w)):
        _check_padding(a, ax)
    fields = dict(n=mb or values.get("mb", 2), c=values["ic"], h=h["i"], w=w["i"], k=values["oc"],
                  r=h["k"], s=w["k"], stride=(h["s"], w["s"]),
                  pad=((h["p"], _after(h)), (w["p"], _after(w))),
                  dilation=(h["d"] + 1, w["d"] + 1), groups=g)
    return _problem(fields, _DESC_LABELS), name


def _entries(text: str) -> tuple[dict[str, int], str | None]:
    """The entries of a descriptor and its name."""
    values: dict[str, int] = {}
    pos = 0
    while pos < len(text):
        m = _ENTRY.match(text, pos)
        if m:
            key = m.group(1)
            if key in values:
                raise _Bad(key, f"given twice in {text!r}")
            values[key] = int(m.group(2))
            pos = m.end()
        elif text[pos] == "n":
            return values, _name(text[pos + 1:])
        else:
            key = next((k for k in _KEYS if text.startswith(k, pos)), None)
            if key and re.match(r"-\d", text[pos + len(key):]):
                raise _Bad(key, f"must not be negative, in {text!r}")
            if key:
                raise _Bad(key, f"no value in {text!r}")
            raise _Bad("descriptor", f"unrecognized entry at {text[pos:]!r} in {text!r} "
                       f"(entries: {' '.join(_KEYS)}, then n\"name\")")
    return values, None


def _name(text: str) -> str | None:
    if text and text[0] in "\"'":
        if len(text) < 2 or text[-1] != text[0]:
            raise _Bad("n", f"unbalanced quote in the name {text!r}")
        text = text[1:-1]
    return text or None


def _cdiv(a: int, b: int) -> int:
    """a / b truncated toward zero, as C divides (benchdnn's deductions are C)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _axis(values: dict[str, int], a: str) -> dict[str, int] | None:
    """Input, kernel, output, stride, left padding and dilation (benchdnn's, 0 = none) of axis
    `a` (d, h or w), deduced as benchdnn does; None if the descriptor does not give the axis."""
    i, k, o, dil = (values.get(x + a, 0) for x in "ikod")
    s, p = values.get("s" + a, 1), values.get("p" + a)
    if not (i or k or o or dil or s != 1 or (p or 0) >= 1):
        return None
    if s < 1:
        raise _Bad("s" + a, "must be at least 1")
    for key, value in (("i" + a, i), ("k" + a, k)):
        if value < 1:
            raise _Bad(key, f"not given, or 0, though the descriptor gives the "
                            f"{_AXIS_WORDS.get(a, 'depth')} axis")
    extent = (k - 1) * (dil + 1) + 1
    if not o:
        p = p or 0
        o = _cdiv(i - extent + 2 * p, s) + 1
        if o < 1:
            raise _Unrunnable("k" + a, f"kernel extent {extent} is larger than the padded input "
                                f"i{a}={i}+2*{p} (o{a} would be {o})")
    elif p is None:
        p = _cdiv((o - 1) * s - i + extent, 2)
    return {"i": i, "k": k, "o": o, "s": s, "p": p, "d": dil}


def _after(ax: dict[str, int]) -> int:
    """benchdnn's padding after (right, bottom) of an axis: what the output size leaves over,
    (o-1)*s - i + (k-1)*(d+1) + 1 - p; negative where input rows are never read."""
    i, k, o, s, p, dil = (ax[x] for x in "ikospd")
    return (o - 1) * s - i + (k - 1) * (dil + 1) + 1 - p


def _check_padding(a: str, ax: dict[str, int]) -> None:
    """Refuse a padding before that benchdnn deduced negative (rows before the first window)."""
    i, k, o, s, p = (ax[x] for x in "ikosp")
    if p < 0:
        raise _Unrunnable("p" + a, f"deduced as {p} from o{a}={o}, i{a}={i}, k{a}={k}, s{a}={s}: "
                            "negative padding")
