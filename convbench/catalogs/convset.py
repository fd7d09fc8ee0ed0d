"""The ConvBench catalog (`--net convset`): every distinct `nn.Conv2d` of TIMM's models, as data
(`layers` makes it a catalog; `selection` takes a class or a sample of it).

The 2024 ConvBench study (Alvarenga et al., arXiv 2407.10730) ran every model TIMM lists once at
batch 1 and kept each distinct convolution with the modules that have it; without the bias
(convbench has none) they are 8,498 problems, shipped as `data/convset.csv.gz` with each one's
sources (how many modules and models have it, each model with its count), converted from the
study's own file by `convbench.tools.convert_convset` (docs/pages/problems.md has the counts).

Each problem keeps its batch of 1 (the study's) unless `--batch` gives another, and its padding
per side: TIMM's "SAME" padding with an odd total pads one more after than before (`pad=0+1`).
A row that `ConvProblem` refuses would be left out, counted, with its reason (the shipped file
has none).
"""

from __future__ import annotations

import csv
import functools
import gzip
import io
from dataclasses import dataclass
from pathlib import Path

from ..core.problem import ConvProblem

NAME = "convset"
DATA = Path(__file__).resolve().parent / "data" / "convset.csv.gz"
SOURCE = ("ConvBench (Alvarenga et al. 2024, arXiv 2407.10730; "
          "github.com/LucasFernando-aes/ConvBench): every distinct nn.Conv2d of TIMM's models "
          "at batch 1")


@dataclass(frozen=True)
class Entry:
    """One problem of the set with its sources: `count` is how many conv modules have it (over
    all models), `models` how many models, `sources` each model with its count (`name*3`)."""

    name: str
    problem: ConvProblem
    count: int
    models: int
    sources: str
    bias: str


@dataclass(frozen=True)
class Catalog:
    """The set as convbench runs it: its entries, and the problems it leaves out with why."""

    entries: tuple[Entry, ...]
    skipped: dict[str, str]  # name -> reason
    total: int  # problems in the file

    def skipped_counts(self) -> dict[str, int]:
        """reason -> how many problems it leaves out."""
        out: dict[str, int] = {}
        for reason in self.skipped.values():
            out[reason] = out.get(reason, 0) + 1
        return out


def _pad(row: dict) -> tuple[tuple[int, int], tuple[int, int]]:
    """ConvProblem's `pad` of a row: (before, after) of height, then of width."""
    top, bottom, left, right = (int(row[k]) for k in ("pad_top", "pad_bottom", "pad_left",
                                                      "pad_right"))
    return (top, bottom), (left, right)


def parse(text: str) -> Catalog:
    """The catalog from the file's CSV text."""
    entries, skipped, total = [], {}, 0
    for row in csv.DictReader(io.StringIO(text)):
        total += 1
        try:
            problem = ConvProblem(n=1, c=int(row["c"]), h=int(row["h"]), w=int(row["w"]),
                                  k=int(row["k"]), r=int(row["r"]), s=int(row["s"]),
                                  stride=row["stride"], pad=_pad(row),
                                  dilation=row["dilation"], groups=int(row["groups"]))
        except ValueError as exc:
            skipped[row["name"]] = str(exc)
            continue
        entries.append(Entry(row["name"], problem, int(row["layers"]), int(row["models"]),
                             row["sources"], row["bias"]))
    return Catalog(tuple(entries), skipped, total)


@functools.lru_cache(maxsize=1)
def load() -> Catalog:
    """The shipped catalog (read once)."""
    return parse(gzip.decompress(DATA.read_bytes()).decode())
