"""`--class`, `--sample`, `--stratify` and `--seed` of the measuring commands: a class or a sample
of the problems of a catalog or a problem file (`selection`), held in the run's RunSpec (so
`--resume` draws the same sample) and chosen where its layers are (`runs.source.choose`, which
says the choice on stderr and records it in env.json)."""

from __future__ import annotations

from ..catalogs import selection
from .common import positive, seed


def add_options(p) -> None:
    p.add_argument("--class", dest="classes", metavar="CLASS",
                   help="only the problems of these classes (comma list of "
                        f"{', '.join(selection.CLASSES)}; each problem is in one, see "
                        "`convbench list`)")
    p.add_argument("--sample", type=positive(int), metavar="N",
                   help="N problems drawn at random (without replacement, after --class) from "
                        "the catalog or problem file, e.g. --net convset --sample 40")
    p.add_argument("--seed", type=seed, default=0,
                   help="seed of --sample's draw (default 0: the same N problems each time)")
    p.add_argument("--stratify", action="store_true", default=None,
                   help="split --sample evenly over the classes present (a class with fewer "
                        "problems takes all it has), so every class is measured")
