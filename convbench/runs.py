"""Runs: a sweep of cases measured, each row streamed into a run folder as it is made, and the
folder's report written from every row it holds.

What `convbench layer`, `bench` and `sweep` do, as library calls with explicit parameters:

    device = devices.resolve("cpu")
    cases = runs.sweep_cases(["alexnet:conv2"], "alexnet", [None], device, ["gemm"],
                             PASSES, LAYOUTS, ["fp32"])
    folder = results.RunFolder.open(path, runs.environment(device, "alexnet", ...))
    outcome = runs.Run(cases, device.budget_s, folder).measure()

A run skips the cases its folder already holds (resume) and, as a batch sweep, the cases whose
series ran out of memory at a smaller batch (`batchsweep.SkipLarger`). Ctrl-C ends it early
with every row measured so far kept, and the report written from them; so does a case that
faults the GPU (the device is unusable after it in this process), whose row is kept as
`failed`, so a resumed run continues after it.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import envinfo, layers, memory, report, runner
from .batchsweep import SkipLarger
from .devices import Device
from .memory import MemoryLimit
from .results import RunFolder, frame, load_run, row_key


def default_folder(net: str, backend: str, kind: str = "") -> Path:
    """results/<date>-<device>-<net><kind>, the folder a run writes unless told otherwise."""
    date = datetime.date.today().isoformat()
    return Path("results") / f"{date}-{envinfo.device_slug(backend)}-{net}{kind}"


def layer_at(spec: str | layers.Layer, net: str, batch: int | None,
             device: Device) -> layers.Layer:
    """A layer by name, `net:layer` or text spec (`layers.resolve`), or a Layer as it is (a
    model's, a problem file's); a catalog layer takes `batch` or the device's default batch,
    the others keep their own n unless `batch` is given."""
    layer = spec if isinstance(spec, layers.Layer) else layers.resolve(spec, net)
    own_batch = (isinstance(spec, layers.Layer) or layer.net == "custom"
                 or layer.net in layers.OWN_BATCH)
    n = batch or (None if own_batch else device.batch)
    return dataclasses.replace(layer, problem=layer.problem.with_batch(n)) if n else layer


def sweep_cases(specs: Iterable[str | layers.Layer], net: str, batches: Iterable[int | None],
                device: Device, algos: Iterable[str], passes: Iterable[str],
                layouts: Iterable[str], precisions: Iterable[str]) -> list[runner.Case]:
    """Every case of the sweep, each layer at each batch in the order given (smallest first
    is the order `SkipLarger` relies on); ValueError naming the first bad layer."""
    chosen = [layer_at(spec, net, n, device) for spec in specs for n in batches]
    return runner.sweep(chosen, algos, device.backend, passes, layouts, precisions)


def environment(device: Device, net: str, cases: list[runner.Case], budget_s: float, *,
                batch: int | list[int] | None = None, limit: MemoryLimit | None = None,
                command: str = "", source: dict | None = None) -> dict:
    """env.json: the machine (`envinfo.collect`), and how this run was asked for; `source`
    says where layers not from a catalog came from (a model and its input, a problem file)
    and how often each occurs in the network (`occurrences`), which the report weighs by."""
    env = envinfo.collect(device.backend)
    env["run"] = {"net": net, "device": device.name, "backend": device.backend,
                  "batch": batch or device.batch or "catalog", "budget_s": budget_s,
                  "memory_limit_bytes": limit.nbytes if limit else None,
                  "algos": list(dict.fromkeys(c.algo for c in cases)),
                  "passes": list(dict.fromkeys(c.pass_ for c in cases)),
                  "layouts": list(dict.fromkeys(c.layout for c in cases)),
                  "precisions": list(dict.fromkeys(c.precision for c in cases)),
                  "command": command, **(source or {})}
    env["memory_method"] = memory.trace(device.backend).method
    return env


@dataclass
class Outcome:
    """What a run leaves: every row (the folder's, resumed ones included, or this run's when
    there is no folder), the report's markdown (None without a folder), whether Ctrl-C cut it
    short, how many cases were not tried because their series ran out of memory, and the case
    that faulted the GPU, if one did (`runner.DeviceFault`: nothing after it could run)."""

    frame: pd.DataFrame
    report: str | None
    interrupted: bool
    skipped: int
    fault: str | None = None


class Run:
    """`cases` to measure with `budget_s` seconds of timing each, into `folder` if given, under
    a memory `limit` if given. `todo` is what is left once the folder's rows are skipped."""

    def __init__(self, cases: Iterable[runner.Case], budget_s: float,
                 folder: RunFolder | None = None, limit: MemoryLimit | None = None):
        self.budget_s, self.folder, self.limit = budget_s, folder, limit
        measured = folder.measured if folder else []
        done = {row_key(r) for r in measured}
        self.todo = [c for c in cases if c.key() not in done]
        self._skip = SkipLarger(measured)

    def measure(self, on_row: Callable[[dict], None] | None = None) -> Outcome:
        """Measure what is left, streaming each row into the folder; `on_row` sees each row
        after that (a progress bar). Then the folder's report from all its rows."""
        rows: list[dict] = []

        def seen(r: dict) -> None:
            if self.folder is not None:
                self.folder.append(r)
            self._skip.observe(r)
            rows.append(r)
            if on_row is not None:
                on_row(r)

        interrupted, fault = False, None
        try:
            runner.run(self._skip.pending(self.todo), self.budget_s, on_row=seen,
                       limit=self.limit)
        except KeyboardInterrupt:
            interrupted = True
        except runner.DeviceFault as exc:
            fault = str(exc)
        return self.finish(rows, interrupted, fault)

    def finish(self, rows: list[dict], interrupted: bool, fault: str | None) -> Outcome:
        """The outcome of this run's `rows`: the folder's report from all its rows (or these
        rows alone without a folder)."""
        if self.folder is None:
            return Outcome(frame(rows), None, interrupted, self._skip.skipped, fault)
        df, _ = load_run(self.folder.path)
        text = report.write(self.folder.path, df, self.folder.env)
        return Outcome(df, text, interrupted, self._skip.skipped, fault)
