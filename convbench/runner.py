"""The harness: a sweep of cases -> one verified, timed results row each, streamed to disk.

A sweep is data (layers × algos × passes × layouts × precisions, like Triton's `perf_report`),
each case one `Case`, each result one row of `COLUMNS`. For every case the implementation is
first run on seeded random operands into a NaN-filled output and checked against the float64
reference; only a pass that checks out is timed. Whatever happens to one case — unsupported, a
wrong answer, an exception, out of memory — becomes that case's row and the sweep goes on.

The reference is computed once per (problem, pass, precision): operands are drawn in NCHW and
transposed, so both layouts and every algorithm share the same numbers and the same reference.

Rows are appended to `measurements.csv` and flushed one at a time (`CsvSink`), so an interrupted
run keeps everything it measured and a resumed one skips the keys the file already holds.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import opcount, reference, registry, verify
from .layers import Layer
from .measurement import Measurement
from .problem import ConvProblem
from .timing import timer_for

PROBLEM_FIELDS = tuple(f.name for f in dataclasses.fields(ConvProblem))
#: What identifies a row: a second row with the same key is the same measurement.
KEY = ("layer", *PROBLEM_FIELDS, "algo", "backend", "pass", "layout", "precision")
#: The results table: DESIGN.md §5's columns first, then what the reports and compare use.
COLUMNS = (*KEY, "status", "reason", "median_ms", "iqr_ms", "reps", "gflops", "rel_error",
           "workspace_bytes", "net", "min_ms", "noisy", "times_ms", "algo_ops", "max_abs_error",
           "tolerance", "note")
STATUSES = ("ok", "unsupported", "failed", "oom")
RESULTS_CSV = "measurements.csv"

#: Array types the harness can make for each precision (tf32 computes on fp32 storage).
DTYPES = {"fp64": np.float64, "fp32": np.float32, "tf32": np.float32, "fp16": np.float16}


@dataclass(frozen=True)
class Device:
    """What `--device` means: the backend, and the defaults `convbench bench` uses there."""

    name: str
    backend: str
    batch: int | None  # None: the catalog's own batch (the study's 256 for alexnet)
    budget_s: float  # seconds of timed repetitions per measurement


#: Batch of the default CPU sweep: small enough that the AlexNet sweep (5 layers, every algo,
#: 3 passes, 2 layouts) ends within 15 minutes on 2 cores.
CPU_BATCH = 8
#: Timing budget per CPU measurement (each also gets at least `timing.MIN_REPS` repetitions).
CPU_BUDGET_S = 0.5
DEVICES = {
    "cpu": Device("cpu", "numpy", CPU_BATCH, CPU_BUDGET_S),
    "cuda": Device("cuda", "cuda", None, 0.1),  # do_bench's 100 ms of repetitions
    "emu": Device("emu", "emu", 1, 0.05),  # emulated kernels are slow: tiny problems only
}


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

    def key(self) -> tuple[str, ...]:
        """The row key as the CSV spells it (strings), for resume."""
        return tuple(str(v) for v in (self.layer, *dataclasses.astuple(self.problem), self.algo,
                                      self.backend, self.pass_, self.layout, self.precision))


def sweep(layers: Iterable[Layer], algos: Iterable[str], backend: str, passes: Iterable[str],
          layouts: Iterable[str], precisions: Iterable[str]) -> list[Case]:
    """Every case of the product, ordered so each (problem, pass, precision) is contiguous:
    its reference is computed once."""
    return [Case(layer.net, layer.name, layer.problem, algo, backend, pass_, layout, precision)
            for layer in layers for precision in precisions for pass_ in passes
            for layout in layouts for algo in algos]


def array_module(backend: str):
    """NumPy for `numpy` and `emu`, CuPy for `cuda`: where the operands of a backend live."""
    if backend == "cuda":
        import cupy

        return cupy
    return np


class Operands:
    """Seeded operands and their float64 reference for the current (problem, pass, precision),
    handed out as fresh copies in the layout and array module asked for, so an implementation
    that scribbles on its inputs cannot spoil the next one's."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self._key = None
        self._nchw = None

    def get(self, case: Case, xp):
        """(a, b) in `case.layout` on the backend's device, and the reference in that layout."""
        key = (case.problem, case.pass_, case.precision)
        if key != self._key:
            self._key = self._nchw = None  # drop the old arrays before making new ones
            a, b = reference.random_operands(case.problem, case.pass_, "nchw",
                                             DTYPES[case.precision], self.seed)
            self._nchw = a, b, reference.reference(case.problem, case.pass_, "nchw", a, b)
            self._key = key
        a, b, ref = (reference.to_layout(v, case.layout) for v in self._nchw)
        return xp.array(a), xp.array(b), ref


class NotMeasured(Exception):
    """Why a case has no time: its status (`unsupported`, `failed`, `oom`) and one-line reason."""

    def __init__(self, status: str, reason: str, check: verify.Check | None = None):
        super().__init__(reason)
        self.status, self.reason, self.check = status, reason, check


@dataclass
class Ready:
    """A prepared pass that has just produced a correct output: `call()` runs it again."""

    impl: object
    call: Callable[[], None]
    check: verify.Check


def _is_oom(exc: BaseException) -> bool:
    """MemoryError (CuPy's OutOfMemoryError is one) or torch.cuda.OutOfMemoryError, by name so
    neither library has to be imported to ask."""
    return isinstance(exc, MemoryError) or any(
        cls.__name__ == "OutOfMemoryError" for cls in type(exc).__mro__)


def _release_device_memory(backend: str) -> None:
    """After an OOM on the GPU, give the pools' cached blocks back so the next case can run."""
    if backend != "cuda":
        return
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    if "torch" in sys.modules:
        sys.modules["torch"].cuda.empty_cache()


def _not_measured(exc: Exception, backend: str) -> NotMeasured:
    lines = str(exc).strip().splitlines()
    reason = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    if _is_oom(exc):
        _release_device_memory(backend)
        return NotMeasured("oom", reason)
    return NotMeasured("failed", reason)


def prepare(case: Case, operands: Operands, impl=None) -> Ready:
    """Prepare `case`, run it once into a NaN-filled output and check it against the reference;
    raise NotMeasured unless it is supported and correct. `impl` replaces the registry's
    implementation (tests inject fakes this way)."""
    impl = impl if impl is not None else registry.get(case.algo, case.backend)
    p, args = case.problem, (case.problem, case.pass_, case.layout, case.precision)
    reason = registry.impl_available(impl) or registry.supports(impl, *args)
    if reason:
        raise NotMeasured("unsupported", reason)
    if case.precision not in DTYPES:
        raise NotMeasured("unsupported", f"no {case.precision} array type in NumPy or CuPy")
    xp = array_module(case.backend)
    try:
        a, b, ref = operands.get(case, xp)
        out = reference.nan_output(p, case.pass_, case.layout, DTYPES[case.precision], xp)
        fn = impl.prepare(*args)
        fn(a, b, out)
    except Exception as exc:
        raise _not_measured(exc, case.backend) from exc
    chk = verify.check(out, ref, case.algo, case.precision, p, case.pass_)
    if not chk.ok:
        raise NotMeasured("failed", chk.reason, chk)
    return Ready(impl, lambda: fn(a, b, out), chk)


def measure(case: Case, operands: Operands, budget_s: float, impl=None) -> dict:
    """One results row for `case`: verified and timed, or the reason it is not."""
    try:
        ready = prepare(case, operands, impl)
        args = (case.problem, case.pass_, case.layout, case.precision)
        try:
            m = timer_for(case.backend)(ready.call, budget_s)
            note = ready.impl.describe(*args) if hasattr(ready.impl, "describe") else ""
            workspace = opcount.workspace_bytes(ready.impl, *args)
        except Exception as exc:
            raise _not_measured(exc, case.backend) from exc
    except NotMeasured as nm:
        return row(case, nm.status, nm.reason, nm.check)
    return row(case, "ok", "", ready.check, m, note, workspace)


def row(case: Case, status: str, reason: str = "", check: verify.Check | None = None,
        m: Measurement | None = None, note: str = "", workspace: int | None = None) -> dict:
    """A results row; columns that do not apply (a time for a failed case) are None."""
    ops = opcount.op_count(case.algo, case.problem, case.pass_, case.precision)
    out = dict.fromkeys(COLUMNS)
    out.update(dataclasses.asdict(case.problem))
    out.update(layer=case.layer, net=case.net, algo=case.algo, backend=case.backend,
               precision=case.precision, layout=case.layout, status=status, reason=reason,
               note=note, workspace_bytes=workspace, algo_ops=ops.total if ops else None)
    out["pass"] = case.pass_
    if check is not None:
        out.update(rel_error=check.rel_error, max_abs_error=check.max_abs_error,
                   tolerance=check.tolerance)
    if m is not None:
        out.update(median_ms=m.median, iqr_ms=m.iqr, min_ms=m.min, reps=m.reps, noisy=m.noisy,
                   times_ms=m.times_text(), gflops=case.problem.flops / (m.median * 1e6))
    return out


def run(cases: Iterable[Case], budget_s: float, impls: dict | None = None,
        on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Measure each case in order; `on_row` sees each row as soon as it exists (to stream it).
    `impls` maps algo names to implementation objects that replace the registry's."""
    operands, rows = Operands(), []
    for case in cases:
        r = measure(case, operands, budget_s, (impls or {}).get(case.algo))
        rows.append(r)
        if on_row is not None:
            on_row(r)
    return rows


# --- measurements.csv -----------------------------------------------------------------------
def _drop_partial_line(path: Path) -> None:
    """Cut a last line that a crash left half written, so appending starts on a fresh line."""
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def read_rows(path: str | os.PathLike) -> list[dict]:
    """The complete rows of a results CSV (a half-written last line is left out)."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path, newline="") as f:
        text = f.read()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    return list(csv.DictReader(text.splitlines()))


def done_keys(path: str | os.PathLike) -> set[tuple[str, ...]]:
    """Keys of the rows a results CSV already holds."""
    return {tuple(r[c] for c in KEY) for r in read_rows(path)}


class CsvSink:
    """measurements.csv, appended to one row at a time. The file is opened and closed for each
    row, so a row is on disk the moment it is appended, whatever happens next."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            _drop_partial_line(self.path)
        if not self.path.exists() or self.path.stat().st_size == 0:
            self._write(None)

    def _write(self, r: dict | None) -> None:
        with open(self.path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            if r is None:
                writer.writeheader()
            else:
                writer.writerow(r)

    def append(self, r: dict) -> None:
        self._write(r)
