"""Batch sweeps: time per image and peak memory of each algorithm as the batch grows, until it
no longer fits — the batch-size figures of Torres et al. and the limit SuperNeurons works under.

A sweep is the runner's sweep with a batch axis: the cases of each layer at every batch, smallest
first, measured, verified, memory-traced and streamed to measurements.csv exactly as `bench`
does. What the batch axis adds is one rule, kept by `SkipLarger`: a *series* — one layer, algo,
backend, pass, layout and precision — that ran out of memory at some batch is not tried at a
larger one (it would only run out again, slowly, and on the host push the machine towards
swapping), while every other series goes on. The rule reads the `oom` rows already in a results
file too, so a resumed sweep keeps skipping what the first run found too large.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..core.results import KEY, row_key
from . import memory
from .case import Case

#: Default batches per device: the study's sizes around its 256 on a GPU; on 2 CPU cores a
#: range that finishes in minutes.
DEFAULT_BATCHES = {"cpu": (1, 2, 4, 8), "cuda": (32, 64, 128, 256, 512), "emu": (1, 2)}
#: Share of the host memory available at the start that a host sweep may use unless told
#: otherwise: enough for the batches above, and never the whole machine.
HOST_LIMIT_FRACTION = 0.5


def default_limit(backend: str) -> memory.MemoryLimit | None:
    """The memory limit of a sweep not given one: on the host a share of what is available now;
    on the GPU none (the device's own memory is the limit, and running out is harmless)."""
    if backend == "cuda":
        return None
    return memory.MemoryLimit(int(memory.available_host_bytes() * HOST_LIMIT_FRACTION))


_SERIES = [KEY.index(c) for c in ("layer", "algo", "backend", "pass", "layout", "precision")]


def series(key: tuple[str, ...]) -> tuple[str, ...]:
    """What a row key measures apart from the batch (the layer's name fixes the rest of its
    shape): the series the row belongs to."""
    return tuple(key[i] for i in _SERIES)


class SkipLarger:
    """The smallest batch at which each series ran out of memory, from rows seen so far."""

    def __init__(self, rows: Iterable[dict] = ()):
        self.first_oom: dict[tuple[str, ...], int] = {}
        self.skipped = 0
        for r in rows:
            self.observe(r)

    def observe(self, row: dict) -> None:
        """Note a results row (from the runner, or read back from a CSV)."""
        if row["status"] == "oom":
            key, n = series(row_key(row)), int(row["n"])
            self.first_oom[key] = min(n, self.first_oom.get(key, n))

    def pending(self, cases: Iterable[Case]) -> Iterator[Case]:
        """The cases, less those whose series ran out of memory at a smaller batch — decided as
        each case comes up, so an `oom` observed during the run counts at once."""
        for case in cases:
            first = self.first_oom.get(series(case.key()))
            if first is not None and case.problem.n > first:
                self.skipped += 1
                continue
            yield case

    def pending_groups(self, groups: Iterable[list[Case]]) -> Iterator[list[Case]]:
        """`pending` for groups of competing cases (`runner.competing`): each group's cases
        decided when the group comes up, after the rows of the groups before it were seen;
        a group left empty is not yielded."""
        for group in groups:
            kept = list(self.pending(group))
            if kept:
                yield kept
