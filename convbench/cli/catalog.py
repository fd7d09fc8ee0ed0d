"""`--class`, `--sample`, `--stratify` and `--seed` of the measuring commands: a class or a sample
of the problems of a catalog or a problem file (`selection`), said on stderr and recorded in the
run's env.json (its RunSpec too, so `--resume` draws the same sample)."""

from __future__ import annotations

import sys

from ..catalogs import convset, selection
from .common import UsageError, positive, seed, usage_errors


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


def choose(args, found: list, net: str) -> tuple[list, dict]:
    """The layers of `found` that --class and --sample keep, and what to record of the choice
    in env.json's run (empty where neither is given). Says on stderr what was chosen of what,
    and for `convset` what its file leaves out and why."""
    classes = None
    if args.classes:
        with usage_errors("--class: "):
            classes = selection.parse_classes(args.classes)
    info: dict = {}
    if net == convset.NAME:
        catalog = convset.load()
        info["catalog"] = {"source": convset.SOURCE, "problems": catalog.total,
                           "left_out": catalog.skipped_counts()}
        for reason, n in catalog.skipped_counts().items():
            print(f"convbench: {net}: {n} of {catalog.total} problems left out: {reason}",
                  file=sys.stderr)
    if not classes and args.sample is None:
        return found, info
    stratify = bool(getattr(args, "stratify", False))
    classed = selection.select(found, classes)
    chosen = selection.choose(found, classes, args.sample, args.seed, stratify)
    info["selection"] = {"classes": classes, "sample": args.sample, "seed": args.seed,
                         "stratify": stratify, "of": len(found), "in_classes": len(classed),
                         "chosen": len(chosen), "by_class": selection.class_counts(chosen)}
    what = (f"{len(classed)} of class {','.join(classes)} of {len(found)}" if classes
            else f"{len(found)}")
    drawn = (f", a {'stratified ' if stratify else ''}sample drawn with seed {args.seed}"
             if args.sample is not None else "")
    print(f"convbench: {net}: {len(chosen)} of {what} problems{drawn}", file=sys.stderr)
    if not chosen:
        raise UsageError(f"no problem of {net} is of class {','.join(classes)}")
    return chosen, info
