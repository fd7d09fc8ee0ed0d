"""What the harness measures: a `Case`, and a `Ready` one (prepared and verified).

Their own module so that the runner, which makes them, and `rows`, which turns them into
results rows, both stand on them without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..core import results
from ..core.problem import ConvProblem
from . import verify


@dataclass(frozen=True)
class Case:
    """One measurement to make."""

    net: str
    layer: str
    problem: ConvProblem
    algo: str
    backend: str
    pass_: str
    layout: str
    precision: str

    def fields(self) -> dict:
        """The case's part of its row: the key's columns and the net."""
        return {"layer": self.layer, "net": self.net, **self.problem.axis_fields(),
                "algo": self.algo, "backend": self.backend, "pass": self.pass_,
                "layout": self.layout, "precision": self.precision}

    def key(self) -> tuple[str, ...]:
        """The row key as the CSV spells it (strings), for resume."""
        return results.row_key(self.fields())


@dataclass
class Ready:
    """A prepared pass that has just produced a checked output (correct, or a library's
    `inexact` one: `check` says which): `call()` runs it again.
    `workspace` is what it declares (None: unknown), `peak_bytes` what it was seen to allocate
    beyond its operands, read by `memory_method`."""

    impl: object
    call: Callable[[], None]
    check: verify.Check
    workspace: int | None
    peak_bytes: int
    memory_method: str
    #: the pass's phases in execution order (`convbench.algos.phases`), or None when it has none
    phase_fns: dict[str, Callable[[], None]] | None
