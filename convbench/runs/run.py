"""Runs: a sweep of cases measured, each row streamed into a run folder as it is made, and the
folder's report written from every row it holds.

What `convbench layer`, `bench` and `sweep` do, as library calls: the run as data
(`RunSpec`), its cases (of its layers, `source.layers_of`), its folder, and resuming it, each
taking the spec whole:

    spec = RunSpec(device="cpu", algos=("gemm",), passes=PASSES, layouts=LAYOUTS,
                   precisions=("fp32",), budget_s=0.1, target_noise=0.02, net="alexnet",
                   layers=("conv2",))
    cases = runs.cases(spec)
    outcome = runs.Run(spec, cases, runs.open_folder(spec, cases, path)).measure()
    ...
    outcome = runs.resume(path).measure()  # the rest of the run, after Ctrl-C

env.json stores the spec under `run` (with what the run found: `occurrences`, the `command`);
`resume` reads it back (`RunSpec.load`), on the machine the rows were measured on.

env.json carries the device's ceilings (`ceilings.measure` on the run's backend and thread
count: the attainable fp32 GEMM rate, the theoretical peak, the bandwidth beyond and within
cache), measured once per machine and cached, or None with the reason where they cannot be
measured; the run reads them back to guard its rows (`rows.plausibility`: a row faster than
the device can go is `failed`, never a win), and the report states each row's share of them.

A run skips the cases its folder already holds (resume) and, as a batch sweep, the cases whose
series ran out of memory at a smaller batch (`batchsweep.SkipLarger`). Asked to `remeasure`
rows flagged busy or noisy, it measures their cases again, each with every competitor it was
timed beside (the rows a winner is named from share their rounds), and each new row replaces
the old in place (`RunFolder.replace`). Ctrl-C ends it early with every row measured so far
kept, and the report written from them; so does a case that faults the GPU (the device is
unusable after it in this process), whose row is kept as `failed`, so a resumed run continues
after it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..analysis import report
from ..analysis.ranking import busy
from ..catalogs import layers
from ..core import stats
from ..core.fmt import first_line
from ..core.measurement import CONTENDED_SHARE
from ..core.results import ENV_JSON, SCHEMA, TIMED, Row, RunFolder, frame, load_run, row_key
from ..core.runspec import RunSpec
from ..machine import contention, devices, nvml, threads
from ..machine.devices import Device
from ..measure import ceilings as ceilings_
from ..measure import envinfo, memory, runner, timing
from ..measure.batchsweep import SkipLarger
from ..measure.ceilings import Ceilings
from ..measure.memory import MemoryLimit
from . import source

#: Where a run goes unless told otherwise: the user's own runs, beside a clone's committed
#: findings (`FINDINGS`, each indexed in results/README.md) but apart from them, and ignored by
#: git (.gitignore), so a user's run neither shows as a change nor reads as a finding.
MY_RUNS = Path("my-runs")
#: The committed findings: where a run made to be one writes by default (the GPU checks).
FINDINGS = Path("results")


def default_folder(net: str, backend: str, kind: str = "", root: Path = MY_RUNS) -> Path:
    """<root>/<date>-<device>-<net><kind>, the folder a run writes unless told otherwise
    (`MY_RUNS`; `FINDINGS` for a run made to be committed)."""
    date = datetime.date.today().isoformat()
    return Path(root) / f"{date}-{envinfo.device_slug(backend)}-{net}{kind}"


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


def cases(spec: RunSpec, found: list | None = None) -> list[runner.Case]:
    """Every case of `spec` (`sweep_cases`), of the layers `found` where given (a model's),
    else of those it names (`source.layers_of`); ValueError naming the first bad layer."""
    device = devices.resolve(spec.device)
    return sweep_cases(source.layers_of(spec).found if found is None else found,
                       spec.net or layers.NETS[0], list(spec.batches) or [None], device,
                       spec.algos, spec.passes, spec.layouts, spec.precisions)


def same_machine(env: dict, folder: str | Path) -> None:
    """ValueError where this machine is not the one a run folder's rows were measured on:
    resuming there would mix two machines' times in one table."""
    backend = env.get("backend") or env.get("run", {}).get("backend", "numpy")
    now, was = envinfo.device_name(backend), env.get("device")
    if was and now != was:
        raise ValueError(f"{folder} was measured on {was}, this machine is {now}: its rows "
                         "would mix two machines; start another run folder")


def resume(folder: str | Path, found: list | None = None,
           remeasure: Iterable[str] = ()) -> Run:
    """The rest of the run in `folder`, ready to `measure`: its spec read back
    (`RunSpec.load`), its cases (`cases`; a model's run needs its layers, `found`) less those
    the folder holds, on the threads and under the memory limit it was made with, and with
    `remeasure` (REMEASURE) its flagged rows again. ValueError, in one line, where there is
    no run to resume, a newer convbench wrote it, or it was measured on another machine."""
    spec = RunSpec.load(folder)
    same_machine(json.loads((Path(folder) / ENV_JSON).read_text()), folder)
    todo = cases(spec, found)
    if spec.threads and spec.threads != threads.count():  # the run's own thread count
        threads.use(threads.check(spec.threads))
    return Run(spec, todo, open_folder(spec, todo, folder, resume=True), remeasure)


def open_folder(spec: RunSpec, cases: list[runner.Case], folder: str | Path, *,
                resume: bool = False, command: str = "", source: dict | None = None,
                opener: Callable[..., RunFolder] = RunFolder.open) -> RunFolder:
    """The run folder of `spec` at `folder`, through `opener` (`RunFolder.open`, or a sharded
    run's): a new run's with its env.json (`environment`: `command` and the layers' `source`
    recorded), or, resuming a folder that has one, that folder with its own env.json and the
    machine's load now. The one way a run, new or resumed, from the command line or the
    library, gets its folder; FolderInUse, ValueError and OSError as `RunFolder.open`."""
    if resume and (Path(folder) / ENV_JSON).exists():
        env = {"load": [load_reading("start", devices.resolve(spec.device).backend)]}
    else:
        env = environment(spec, cases, command=command, source=source)
    return opener(folder, env, resume)


#: The keys env.json's `run` starts with, in their order since before run specs.
_RUN_HEAD = ("device", "backend", "batch", "budget_s", "memory_limit_bytes", "algos", "passes",
             "layouts", "precisions", "target_noise")


def environment(spec: RunSpec, cases: list[runner.Case], *, command: str = "",
                source: dict | None = None) -> dict:
    """env.json: its `schema`, the machine (`envinfo.collect`), its load now, and how this run
    was asked for: `spec`, the run as data (which `resume` reads back), with what the spec
    leaves to the run as the run resolved it (the batch its cases have, the threads in effect:
    a caller applies a spec's own with `threads.use` first), the `command`, and `source`: where
    layers not from a catalog came from (a model and its input, a problem file) and how often
    each occurs in the network (`occurrences`), which the report weighs by."""
    device = devices.resolve(spec.device)
    env = {"schema": SCHEMA, **envinfo.collect(device.backend)}
    # without a batch, the batch the cases have: a problem list keeps each problem's own
    batch = (None if not spec.batches else spec.batches[0] if len(spec.batches) == 1
             else list(spec.batches))
    ran = sorted({c.problem.n for c in cases})
    env["run"] = {**dict.fromkeys(_RUN_HEAD), **spec.to_dict(), "backend": device.backend,
                  "batch": batch or (ran[0] if len(ran) == 1 else ran) or device.batch
                  or "catalog", "threads": threads.count(), "command": command,
                  **(source or {})}
    env["memory_method"] = memory.trace(device.backend).method
    env["threads"] = threads.policy()
    env["statistics"] = {"median_interval": stats.MEDIAN_INTERVAL_METHOD,
                         "ratio_interval": stats.RATIO_INTERVAL_METHOD,
                         "timing": "competing cases (every algo and layout of a problem, pass "
                                   "and precision) timed in shuffled interleaved rounds"
                                   + (f"; {timing.WARM_POOLS}"
                                      if runner.warm_pools(device.backend) else "")}
    env["contention"] = {
        "method": ("per repetition, the share of its threads' ready time on a core "
                   "(/proc/self/task/*/schedstat), times the share of the machine's busy "
                   "ticks over its repetitions the hypervisor did not steal (/proc/stat); "
                   f"contended below {CONTENDED_SHARE}" if contention.available()
                   else "unavailable: this kernel reports no per-thread schedstat"),
    }
    env["load"] = [load_reading("start", device.backend)]
    env["ceilings"], env["ceilings_note"] = device_ceilings(device.backend, threads.count())
    return env


#: What env.json's `ceilings_note` says of an emulated backend's ceilings.
EMU_CEILINGS = ("the emu backend's kernels are emulated on the host: these are the CPU's "
                "ceilings, not a GPU's")


def device_ceilings(backend: str, n_threads: int) -> tuple[dict | None, str | None]:
    """env.json's `ceilings` and `ceilings_note` for a run on `backend` with `n_threads`
    threads: `ceilings.measure(...).to_dict()` (cached per machine, threads and library
    versions) and a note where the figures need one (the emu backend's are the CPU's); or
    None and why, where they cannot be measured (no GPU library, a failing probe): a run goes
    on without them, unguarded (`rows.plausibility`)."""
    try:
        measured = ceilings_.measure(backend, n_threads)
    except Exception as exc:  # noqa: BLE001 - the run goes on without its ceilings
        return None, f"not measured: {type(exc).__name__}: {first_line(exc)}"
    return measured.to_dict(), EMU_CEILINGS if backend == "emu" else None


def load_reading(when: str, backend: str) -> dict:
    """The machine's load now (`contention.machine_load`), and on a GPU its NVML snapshot."""
    reading = {"when": when, **contention.machine_load()}
    if backend == "cuda":
        reading["gpu"] = nvml.snapshot()
    return reading


#: What a resumed run may measure again: rows timed on a busy machine (contended, throttled),
#: which advice and the report's winners leave out; and noisy rows, whose wide intervals leave
#: their columns a tie.
REMEASURE = ("busy", "noisy")


def _flagged(row: dict, flags: Iterable[str]) -> bool:
    """Whether a row (typed, `results.frame`) is timed (`ok` or `inexact`) and carries one of
    `flags` (REMEASURE)."""
    tests = {"busy": busy, "noisy": lambda r: r.get("noisy") is True}
    return row.get("status") in TIMED and any(tests[f](row) for f in flags)


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
    #: this run's own rows (every rank's, on rank 0 of a sharded run), and its seconds
    rows: list[Row] = field(default_factory=list)
    seconds: float = 0.0


class Run:
    """The cases of `spec` (`cases`: all of them, or a resumed run's) to measure with its
    budget of timing each, its target noise and memory limit, into `folder` if given. `todo`
    is what is left once the folder's rows are skipped, and with `remeasure` (flags of
    REMEASURE) every case of a competing group where the folder has a row so flagged: such a
    group is timed again whole, in rounds, as the first run timed it. `ceilings` guard every
    timed row (`rows.plausibility`); None: the folder's env.json's (`ceilings.from_env`), and
    without a folder or ceilings there, no guard."""

    def __init__(self, spec: RunSpec, cases: Iterable[runner.Case],
                 folder: RunFolder | None = None, remeasure: Iterable[str] = (),
                 ceilings: Ceilings | None = None):
        self.spec, self.folder = spec, folder
        self.budget_s, self.target = spec.budget_s, spec.target_noise
        self.limit = MemoryLimit(spec.memory_limit_bytes) if spec.memory_limit_bytes else None
        self.ceilings = ceilings or ceilings_.from_env(folder.env if folder else None)
        self.started = time.monotonic()
        measured = folder.measured if folder else []
        self._done = {row_key(r) for r in measured}
        flags = list(remeasure)
        again = {row_key(r) for r, typed in zip(measured, frame(measured).to_dict("records"))
                 if _flagged(typed, flags)} if flags else set()
        self.todo = [c for group in runner.competing(cases)
                     for c in (group if any(c.key() in again for c in group)
                               else [c for c in group if c.key() not in self._done])]
        self._skip = SkipLarger(measured)

    def measure(self, on_row: Callable[[Row], None] | None = None) -> Outcome:
        """Measure what is left, streaming each row into the folder; `on_row` sees each row
        after that (a progress bar). Then the folder's report from all its rows."""
        rows: list[Row] = []

        def seen(r: Row) -> None:
            if self.folder is not None and row_key(r) in self._done:  # measured again
                self.folder.replace(r)
            elif self.folder is not None:
                self.folder.append(r)
            self._skip.observe(r)
            rows.append(r)
            if on_row is not None:
                on_row(r)

        interrupted, fault = False, None
        try:
            runner.run_groups(self._skip.pending_groups(runner.competing(self.todo)),
                              self.budget_s, on_row=seen, limit=self.limit, target=self.target,
                              ceilings=self.ceilings)
        except KeyboardInterrupt:
            interrupted = True
        except runner.DeviceFault as exc:
            fault = str(exc)
        return self.finish(rows, interrupted, fault)

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def note_load(self, when: str) -> None:
        """Add the machine's load now to the folder's env.json (`when`: start, end), and on a
        GPU its clocks and state (NVML)."""
        if self.folder is not None:
            self.folder.env.setdefault("load", []).append(load_reading(
                when, self.folder.env.get("backend", "")))
            self.folder.save_env()

    def finish(self, rows: list[Row], interrupted: bool, fault: str | None) -> Outcome:
        """The outcome of this run's `rows`: the folder's report from all its rows (or these
        rows alone without a folder), after the machine's load at the end is noted."""
        if self.folder is None:
            return Outcome(frame(rows), None, interrupted, self._skip.skipped, fault, rows,
                           self.seconds())
        try:
            self.note_load("end")
        except KeyboardInterrupt:  # Ctrl-C (or a deadline's SIGINT) after the last row: the
            interrupted = True  # end's load reading, which sleeps a window, is left out; the
            # report from every row is still written (seen on an H200: it was lost)
        df, _ = load_run(self.folder.path)
        text = report.write(self.folder.path, df, self.folder.env)
        return Outcome(df, text, interrupted, self._skip.skipped, fault, rows, self.seconds())
