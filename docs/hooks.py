"""MkDocs hooks: the site is the repository's markdown as it is.

- The README is the site's home page, and the committed run folders (results/ at the top of the
  repository) join the site under results/, so every link from a page to a run's report or plot
  is checked by the strict build.
- Links are written as they work in the repository (a page in docs/pages/ links a run as
  `../../results/...`, the README a page as `docs/pages/...`); on the site the pages sit at the
  top, beside results/, so those prefixes are rewritten as each page is read.
- A run's report longer than `LONG_REPORT` characters (a whole catalog's, a column per layer)
  shows each table's first `SHOWN_ROWS` rows and `SHOWN_COLUMNS` columns on the site, saying
  how much more the report in the repository holds: rendered whole it dominates every build and
  is more than a browser shows usefully; its headings, and so every link into it, stay.
- What the code knows is not written by hand: a page's `<!-- convbench:NAME -->` line is
  replaced by the list `GENERATED[NAME]` makes from this tree's code (the algorithms and their
  traits, the tolerance columns), so the site cannot drift from the registry.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
#: What a run folder shows on the site: its pages, plots and env.json (not the raw CSVs).
KINDS = {".md", ".png", ".json"}
#: Per page of the site (its source path), the repository's link prefixes and the site's.
REWRITES = {
    "README.md": [("](docs/pages/", "](")],
    "results/README.md": [("](../docs/pages/", "](../")],
}
PAGE_REWRITES = [("](../../results/", "](results/")]
#: A run's report longer than this many characters has its tables shortened on the site.
LONG_REPORT = 1_000_000
#: The rows and columns of each table a shortened report shows.
SHOWN_ROWS = 50
SHOWN_COLUMNS = 30


def _file(path: Path, config) -> File:
    return File(str(path.relative_to(ROOT)), str(ROOT), config["site_dir"],
                config["use_directory_urls"])


def on_files(files: Files, config) -> Files:
    files.append(_file(ROOT / "README.md", config))
    for path in sorted((ROOT / "results").rglob("*")):
        if path.is_file() and path.suffix in KINDS:
            files.append(_file(path, config))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    src = page.file.src_uri
    rewrites = REWRITES.get(src) or (PAGE_REWRITES if not src.startswith("results/") else [])
    for repo, site in rewrites:
        markdown = markdown.replace(repo, site)
    if src.startswith("results/") and len(markdown) > LONG_REPORT:
        markdown = shortened(markdown)
    return MARKER.sub(lambda m: generated(m.group(1), src), markdown)


def shortened(markdown: str) -> str:
    """`markdown` with each table cut to its header and first `SHOWN_ROWS` rows and its first
    `SHOWN_COLUMNS` columns (a table per layer has one column a layer), and a line after a cut
    table saying how much more the report in the repository holds."""
    out, table = [], []
    for line in [*markdown.split("\n"), ""]:
        if line.startswith("|"):
            table.append(line)
            continue
        if table:
            out.extend(_cut(table))
            table = []
        out.append(line)
    return "\n".join(out[:-1])


def _cut(table: list[str]) -> list[str]:
    rows = len(table) - 2  # past the header and its separator
    cells = table[0].strip().strip("|").split("|")
    cut_rows, cut_cols = max(0, rows - SHOWN_ROWS), max(0, len(cells) - SHOWN_COLUMNS)
    if not (cut_rows or cut_cols):
        return table
    kept = []
    for line in table[:SHOWN_ROWS + 2]:
        parts = line.strip().strip("|").split("|")
        kept.append("|" + "|".join(parts[:SHOWN_COLUMNS]) + "|")
    more = " and ".join(f"{n:,} more {what}" for n, what in ((cut_rows, "rows"),
                                                             (cut_cols, "columns")) if n)
    note = (f"*{more}: the whole table is in this report in the repository (the site shows the "
            f"first {SHOWN_ROWS} rows and {SHOWN_COLUMNS} columns of a long report's tables).*")
    return [*kept, "", note]


# --- the lists the code knows -------------------------------------------------------------------
#: A line a page holds where a generated list goes.
MARKER = re.compile(r"^<!-- convbench:([a-z-]+) -->$", re.MULTILINE)


def _registry():
    """This tree's registry, loaded (the tree being built, not whatever convbench is
    installed: mkdocstrings reads the same tree's docstrings)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from convbench.algos import registry

    registry.load()
    return registry


def _table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def algorithms() -> str:
    """Every registered algorithm with its traits, in the registry's order."""
    registry = _registry()
    backends = {}
    for impl in registry.implementations():
        backends.setdefault(impl.algo, []).append(impl.backend)
    rows = [[f"`{a.name}`", a.family, a.origin, f"`{a.tolerance}`", a.reduction,
             "none" if a.counts is None else f"`{a.counts!r}`",
             "yes" if a.deterministic else "no",
             ", ".join(backends.get(a.name, []))] for a in registry.algorithms()]
    return _table(["algo", "family", "origin", "tolerance", "reduction", "operation count",
                   "deterministic", "backends"], rows)


def traits() -> str:
    """The vocabulary of the traits: each family, origin and reduction, and what it means."""
    from convbench.algos import traits as t

    _registry()
    out = []
    for trait, meanings in (("family", t.FAMILIES), ("origin", t.ORIGINS),
                            ("reduction", t.REDUCTIONS)):
        out += [f"- {trait}:", *(f"    - `{k}`: {v}" for k, v in meanings.items())]
    return "\n".join(out)


def tolerances() -> str:
    """The tolerance columns per precision, and the algorithms that declare each."""
    registry = _registry()
    from convbench.algos.traits import TOLERANCES
    from convbench.core.problem import PRECISIONS

    declared = {}
    for a in registry.algorithms():
        declared.setdefault(a.tolerance, []).append(f"`{a.name}`")
    rows = [[f"`{column}`", *(f"{values[p]:.0e}".replace("e-0", "e-") for p in PRECISIONS),
             ", ".join(declared.get(column, []))]
            for column, values in TOLERANCES.items()]
    return _table(["column", *PRECISIONS, "declared by"], rows)


#: What each marker is replaced by.
GENERATED = {"algorithms": algorithms, "traits": traits, "tolerances": tolerances}


def generated(name: str, page: str) -> str:
    if name not in GENERATED:
        raise PluginError(f"{page}: no generated list {name!r}; hooks.py makes "
                          f"{', '.join(GENERATED)}")
    return GENERATED[name]()
