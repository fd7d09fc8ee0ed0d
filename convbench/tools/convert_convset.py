"""Convert the ConvBench study's convolution set into convbench's `convset` catalog file.

ConvBench (Alvarenga et al., arXiv 2407.10730; github.com/LucasFernando-aes/ConvBench, MIT
licence) ran every model of TIMM's `timm.list_models()` once at batch 1, hooking every
`nn.Conv2d`. Its `tmp/conv.pkl` (the version converted: docs/pages/problems.md, catalogs) maps
a key per distinct convolution to the `model.module` paths that have it:

    "C_in-shape_out-shape_kernel-padding-stride-dilation-groups-transposed_bias"
    e.g. "1,3,256,256_1,24,128,128_3,3-1,1,1,1-2,2-1,1-1-False_False"

shapes as N,C,H,W, the kernel as (kh, kw), the padding as torch's
`_reversed_padding_repeated_twice` (left, right, top, bottom), stride and dilation as (h, w).
A key's padding is the module's own, except TIMM's `Conv2dSame` (TensorFlow's SAME), which pads
in its forward and holds 0: there it is deduced from the shapes as TIMM's `pad_same` does, the
total (o-1)*s + (k-1)*d + 1 - i, half before and the odd row after. Keys that differ only in
the bias are one problem (`bias`: yes, no, both); each problem keeps `layers`, `models` and
`sources` (each model with its count, `model*3`), named `cb0001`, ... in the set's order.

The pickle is read by an unpickler that builds only dicts, lists and strings, so a tampered file
cannot run code. The output is gzip'd CSV (`convbench/catalogs/data/convset.csv.gz`), read by
`convbench.catalogs.convset`.

    python -m convbench.tools.convert_convset path/to/ConvBench/tmp/conv.pkl [--out FILE]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import pickle
import sys
from pathlib import Path

#: Columns of the catalog file, in order.
COLUMNS = ("name", "c", "h", "w", "k", "r", "s", "stride", "dilation", "groups", "pad_top",
           "pad_bottom", "pad_left", "pad_right", "bias", "layers", "models", "sources")
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "catalogs" / "data" / "convset.csv.gz"


class _PlainUnpickler(pickle.Unpickler):
    """Builds plain containers only: a pickle naming any class or function is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"the set holds {module}.{name}: only dicts, lists and "
                                     "strings are expected")


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",")]


def _axis_padding(i: int, o: int, k: int, s: int, d: int, before: int, after: int,
                  key: str) -> tuple[int, int]:
    """(before, after) padding of one axis: the module's own where it gives output `o`, else
    TIMM's "SAME" padding deduced from the shapes."""
    extent = (k - 1) * d + 1
    if (i + before + after - extent) // s + 1 == o:
        return before, after
    total = (o - 1) * s + extent - i
    if (before, after) != (0, 0) or total < 0:
        raise ValueError(f"{key}: output {o} follows neither its padding nor SAME padding")
    return total // 2, total - total // 2


def parse_key(key: str) -> tuple[tuple, bool]:
    """(the problem's fields, whether it has a bias) of one key of the set."""
    shape_in, shape_out, kernel, bias = key.split("_")
    _, c, h, w = _ints(shape_in)
    _, k, p, q = _ints(shape_out)
    size, padding, stride, dilation, groups, transposed = kernel.split("-")
    if transposed != "False":
        raise ValueError(f"{key}: a transposed convolution")
    (r, s), (sh, sw), (dh, dw) = _ints(size), _ints(stride), _ints(dilation)
    left, right, top, bottom = _ints(padding)
    top, bottom = _axis_padding(h, p, r, sh, dh, top, bottom, key)
    left, right = _axis_padding(w, q, s, sw, dw, left, right, key)
    pair = lambda a, b: str(a) if a == b else f"{a}x{b}"
    fields = (c, h, w, k, r, s, pair(sh, sw), pair(dh, dw), int(groups), top, bottom, left,
              right)
    return fields, bias == "True"


def convert(convs: dict[str, list[str]]) -> list[dict]:
    """The catalog's rows from the set's dict."""
    merged: dict[tuple, dict] = {}
    for key, paths in convs.items():
        fields, bias = parse_key(key)
        entry = merged.setdefault(fields, {"bias": set(), "paths": []})
        entry["bias"].add(bias)
        entry["paths"] += paths
    rows = []
    for i, (fields, entry) in enumerate(merged.items(), 1):
        per_model: dict[str, int] = {}
        for path in entry["paths"]:
            model = path.partition(".")[0]
            per_model[model] = per_model.get(model, 0) + 1
        bias = {frozenset({True}): "yes", frozenset({False}): "no"}.get(
            frozenset(entry["bias"]), "both")
        sources = " ".join(m if n == 1 else f"{m}*{n}" for m, n in per_model.items())
        rows.append(dict(zip(COLUMNS, (f"cb{i:04d}", *fields, bias, len(entry["paths"]),
                                       len(per_model), sources))))
    return rows


def write(rows: list[dict], out: Path) -> None:
    text = io.StringIO()
    writer = csv.DictWriter(text, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    # mtime 0: the same set gives the same bytes
    out.write_bytes(gzip.compress(text.getvalue().encode(), mtime=0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pickle", type=Path, help="ConvBench's tmp/conv.pkl")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    try:
        with args.pickle.open("rb") as f:
            convs = _PlainUnpickler(f).load()
        if not isinstance(convs, dict):
            raise ValueError("not a dict of keys to module paths")
        rows = convert(convs)
    except (OSError, ValueError, pickle.UnpicklingError) as exc:
        print(f"convert_convset: error: {args.pickle}: {exc}", file=sys.stderr)
        return 2
    write(rows, args.out)
    print(f"{len(convs)} keys, {sum(len(v) for v in convs.values())} conv modules -> "
          f"{len(rows)} problems in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
