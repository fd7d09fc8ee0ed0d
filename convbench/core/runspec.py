"""The run as data: `RunSpec`, what a sweep measures, as env.json stores it and a resumed run
reads it back.

A run (`convbench layer`, `bench`, `sweep`, or `runs.Run` from the library) is a sweep of
layers × batches × algos × passes × layouts × precisions on one device, timed with one budget
and target noise, on a number of threads, under a memory limit. `RunSpec` holds exactly that,
frozen, the way Triton's `Benchmark` holds a sweep: the command line builds one from its options
(defaults resolved: the device, its budget, `all` algos expanded), `runs.cases` turns one into
cases, env.json keeps it under `run` as plain JSON beside what the run found out (`occurrences`,
`command`, `unmeasured`, ...: `from_dict` leaves those keys alone), and a resumed run reads it
back (`load`) and compares what it is given with it field by field (`conflict`), from the
library as from the command line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from . import results

#: Fields whose order does not change what is measured: compared as sets.
UNORDERED = ("layers", "algos", "passes", "layouts", "precisions", "classes")
#: Fields held as tuples (JSON lists).
_SEQUENCES = (*UNORDERED, "batches", "input")


@dataclass(frozen=True)
class RunSpec:
    """What a run measures. `net` names the layers' catalog, or, for a problem file or a model,
    the name their rows carry; `layers` the layers wanted (names in `net`, `NET:LAYER` or text
    specs; empty: every layer of the source), `classes`, `sample` and `seed` a choice among
    them; `batches` the batch sizes (empty: each layer's own, or the device's default);
    `threads` None: the thread policy's default; `subcommand` the convbench command that made
    it (empty from the library), which a resumed command must match."""

    device: str
    algos: tuple[str, ...]
    passes: tuple[str, ...]
    layouts: tuple[str, ...]
    precisions: tuple[str, ...]
    budget_s: float
    target_noise: float
    net: str | None = None
    layers: tuple[str, ...] = ()
    problems: str | None = None
    model: str | None = None
    input: tuple[int, ...] | None = None
    classes: tuple[str, ...] | None = None
    sample: int | None = None
    seed: int = 0
    stratify: bool = False
    batches: tuple[int, ...] = ()
    memory_limit_bytes: int | None = None
    threads: int | None = None
    subcommand: str = ""

    def __post_init__(self):
        for name in _SEQUENCES:  # lists from JSON or a caller: tuples, so the spec hashes
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        if self.model and self.problems:
            raise ValueError("a run measures a model or a problem file, not both")
        if (self.input is None) != (self.model is None):
            raise ValueError("a model's run needs its input's shape, and only a model's does")
        for name in ("algos", "passes", "layouts", "precisions"):
            if not getattr(self, name):
                raise ValueError(f"a run spec needs {name}: none given")
        if not self.budget_s > 0 or not self.target_noise > 0:
            raise ValueError("a run spec's budget_s and target_noise are positive")

    # --- plain JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The spec as plain JSON (lists for tuples), env.json's `run` keys."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, run: Mapping) -> RunSpec:
        """The spec in env.json's `run` (its other keys, what the run found, left alone);
        ValueError naming a field it lacks or cannot hold."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        required = [n for n, f in fields.items() if f.default is dataclasses.MISSING]
        missing = [n for n in required if n not in run]
        if missing:
            raise ValueError(f"the run lacks {', '.join(missing)}")
        try:
            return cls(**{n: run[n] for n in fields if n in run})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the run's spec cannot be read: {exc}") from None

    @classmethod
    def load(cls, folder: str | Path) -> RunSpec:
        """The spec of the run in `folder` (`results.resumable_env`, its schema checked);
        ValueError in one line where there is none: no folder or env.json, a newer schema, or
        a folder from before run specs (schema 0), which the command line resumes from its
        recorded command."""
        env = results.resumable_env(folder)
        where = Path(folder) / results.ENV_JSON
        if results.schema_of(env, where) < 1:
            command = (env.get("run") or {}).get("command") or "convbench ..."
            raise ValueError(f"{where} was written before run specs (schema 0): resume it with "
                             f"`{command} --resume --out {folder}`")
        try:
            return cls.from_dict(env["run"])
        except (KeyError, TypeError):
            raise ValueError(f"{where} has no run; start another run folder") from None
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None

    # --- comparing ----------------------------------------------------------------------------
    def conflict(self, given: Mapping) -> tuple[str, object, object] | None:
        """The first of `given` (field: value, the fields a resumed run was given) that
        contradicts this spec, as (field, given, recorded); None where all agree. Lists
        agree in any order; an unknown field is a ValueError."""
        for name, value in given.items():
            if not hasattr(self, name):
                raise ValueError(f"a run spec has no field {name!r}")
            if not same(name, value, getattr(self, name)):
                return name, value, getattr(self, name)
        return None


def same(name: str, given, recorded) -> bool:
    """Whether a `given` value of field `name` says what `recorded` does."""
    def norm(v):
        if isinstance(v, (list, tuple)):
            return frozenset(v) if name in UNORDERED else tuple(v)
        return v

    return norm(given) == norm(recorded)
