"""The layers a run spec names, and where they came from: the one path from a `RunSpec` to its
layers, which a new run (`convbench layer`, `bench`, `sweep`) and a resumed one both take.

`layers_of(spec)` gives its layer specs, or its problem file's problems, or its catalog's
layers, with its choice of classes and sample among them (`selection.choose`), what env.json
records of them (`Source.record`: where they came from, how often each occurs, the choice), and
the spec with the net its rows carry (a problem file's). What it chose and left out it says
through `say` (the command line prints it on stderr; the library says nothing). A model's
layers are not found here: the library below planning cannot load a model, so its caller
passes them (`planning.models.conv_layers`) to `run.cases` or `run.resume`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from ..catalogs import convset, layers, problemfile, selection
from ..core.runspec import RunSpec

#: Where `layers_of` says what it chose: nowhere unless told.
Say = Callable[[str], None]


def _quiet(_text: str) -> None:
    pass


@dataclass
class Source:
    """The layers of a spec as `run.cases` takes them (specs or Layers), what env.json's run
    records of them (None for a catalog of one network with no choice made), and the spec with
    the net its rows carry."""

    found: list
    record: dict | None
    spec: RunSpec


def layers_of(spec: RunSpec, say: Say = _quiet) -> Source:
    """The layers `spec` names (see the module docstring); ValueError for a model's run, a
    problem file that cannot be read, or a class none of the problems is of."""
    if spec.model:
        raise ValueError(f"the run measures the model {spec.model}: give its layers "
                         "(planning.models.conv_layers) to resume it")
    if spec.layers:
        return Source(list(spec.layers), None, spec)
    if spec.problems:
        skipped: list[problemfile.Skipped] = []
        found = problemfile.read(spec.problems, net=spec.net, skipped=skipped)
        net = found[0].net
        found, chosen = choose(spec, found, net, say)
        record = {"problems": spec.problems, "occurrences": counts(found), **chosen}
        if skipped:
            # Lines that read as convolutions convbench cannot hold (3-D ones): said, kept in
            # env.json with their reasons, and the file's other problems run.
            say(f"{spec.problems}: {len(skipped)} of its convolutions skipped (the first: "
                f"{skipped[0]}); env.json lists them")
            record["skipped"] = [str(s) for s in skipped]
        return Source(found, record, dataclasses.replace(spec, net=net))
    net = spec.net or layers.NETS[0]
    found, chosen = choose(spec, layers.net_layers(net), net, say)
    if net in layers.OWN_BATCH:  # a list of problems, weighed by how often each occurs
        return Source(found, {"occurrences": counts(found), **chosen}, spec)
    return Source([f"{net}:{layer.name}" for layer in found], chosen or None, spec)


def counts(found: list[layers.Layer]) -> dict[str, int]:
    """How often each layer occurs in its network, by name: env.json's `occurrences`."""
    return {layer.name: layer.count for layer in found}


def choose(spec: RunSpec, found: list, net: str, say: Say = _quiet) -> tuple[list, dict]:
    """The layers of `found` that the spec's classes and sample keep, and what env.json's run
    records of the choice (empty where neither is given; convset's own record, what its file
    leaves out and why, always). Says what was chosen of what; ValueError where no problem is
    of the classes given."""
    classes = list(spec.classes) if spec.classes else None
    info: dict = {}
    if net == convset.NAME:
        catalog = convset.load()
        info["catalog"] = {"source": convset.SOURCE, "problems": catalog.total,
                           "left_out": catalog.skipped_counts()}
        for reason, n in catalog.skipped_counts().items():
            say(f"{net}: {n} of {catalog.total} problems left out: {reason}")
    if not classes and spec.sample is None:
        return found, info
    stratify = bool(spec.stratify)
    classed = selection.select(found, classes)
    chosen = selection.choose(found, classes, spec.sample, spec.seed, stratify)
    info["selection"] = {"classes": classes, "sample": spec.sample, "seed": spec.seed,
                         "stratify": stratify, "of": len(found), "in_classes": len(classed),
                         "chosen": len(chosen), "by_class": selection.class_counts(chosen)}
    what = (f"{len(classed)} of class {','.join(classes)} of {len(found)}" if classes
            else f"{len(found)}")
    drawn = (f", a {'stratified ' if stratify else ''}sample drawn with seed {spec.seed}"
             if spec.sample is not None else "")
    say(f"{net}: {len(chosen)} of {what} problems{drawn}")
    if not chosen:
        raise ValueError(f"no problem of {net} is of class {','.join(classes or ())}")
    return chosen, info
