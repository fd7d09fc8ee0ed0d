"""The first GPU check: one command for a first visit, and the two it is made of.

    convbench gpu-first --out DIR             # everything a first visit needs, in < 8 minutes
    convbench gpu-check [--out DIR]           # the whole run and its summary (3.5-8 min,
                                              # then 2-5 min of convset's classes)
    convbench gpu-check --tests [--out DIR]   # every `gpu` test, into DIR/tests.log (4-6.5 min)
    convbench gpu-first --device cpu --batch 1 --layers conv3 ...   # the dry form CI runs

`gpu-check` runs a net with every algorithm (cuDNN's one by one too: `cudnn-find`), pass and
layout, and writes env.json (the machine, its ceilings), the run folder and summary.md
(`summary`: the ratios and the study's tables), with the host seconds of each stage of the run
(`runner.stage_seconds`) so the next check knows where its minutes went. It streams its rows: a
command cut short keeps them and the same command resumes the run. `fft-tiled` is left out where
it would not tile (`fft` runs the same transforms). `--tests` runs the `gpu` tests in a process
of their own (a GPU fault in the run leaves only that process's device unusable), under a time
limit, and adds their line to summary.md.

After the net, `gpu-check` runs a second part into `classes/` (`run_classes`): a stratified
sample (`selection.choose`, seed 0) of `CLASSES_SAMPLE` of convset's problems of `CLASSES`
(depthwise, grouped, pointwise: the classes AlexNet has none of), at their own batch unless
told one, with every algo the device has (`CLASSES_ALGOS`: on CUDA cudnn, cudnn-autotune and
our kernels, `direct` running kernels/depthwise.cu where groups = C; not cuDNN's one by one),
every pass and layout; summary.md gets its per-class table (`classes_markdown`: speed-up over
the device's baseline, `speedup.summary`). It resumes like the net's run. `gpu-first` leaves it
out (`first`: its deadline goes to AlexNet).

`gpu-first` (`first`) fits a lent GPU's 15 minutes, machine start included: the machine's probe
and a log of the visit go into the folder given first and stay whatever fails after (`probe`,
`FIRST_LOG`); then a wall-time budget (`FIRST_BUDGET_S`) shared by, in this order, the `gpu`
tests (`FIRST_TESTS`: the pins of the reviews' predictions before the parametrised suites,
interrupted as Ctrl-C at `FIRST_TESTS_TIMEOUT_S`), the environment and the device's ceilings, and
the AlexNet check in `FIRST_LAYERS` order — every algo, cuDNN's one by one, pass and layout —
until the time left is the `FIRST_RESERVE_S` the summary and the packing need: it stops between
competing groups, says which layers and passes it reached, and `gpu-check --out` on its run
folder resumes the rest. Everything comes back as at most `MAX_FILES` files of at most
`MAX_FILE_BYTES` in the folder given: probe.json, gpu-first.log, summary.md, tests.log and one
tar.gz of the run folder. `--no-tests` and the same `--work` make a second, short visit that
resumes the check.
Where CUDA cannot be used it refuses at once, in one line (`cuda_refusal`); the CPU dry form is
asked for by name (`--device cpu`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..algos import registry
from ..analysis import speedup, summary
from ..catalogs import layers as catalogs
from ..catalogs import selection
from ..core.fmt import first_line, md_table
from ..core.problem import LAYOUTS, PASSES, PRECISIONS, check_choice
from ..core.results import ENV_JSON, RunFolder, row_key
from ..core.runspec import RunSpec
from ..machine import backends, devices, launch
from ..machine.devices import Device
from ..measure import envinfo, runner
from ..measure.timing import TARGET_NOISE
from .run import FINDINGS, Outcome, Run, cases, default_folder, environment

RUN = "run"
TESTS_LOG = "tests.log"
SUMMARY_MD = "summary.md"
#: What the tests run: the `gpu` marker's tests, quietly, without a cache in the checkout.
PYTEST_ARGS = ("-m", "gpu", "-q", "-p", "no:cacheprovider")
#: What `gpu-check` runs by default: every algo, and on a GPU cuDNN's algorithms one by one.
ALGOS = {"cuda": "all,cudnn-find"}
#: The precisions a check measures unless told others (`--precisions`): fp32, TF32 off.
PRECISIONS_DEFAULT = ("fp32",)
#: Seconds the tests may take (`--tests-timeout`): within a ten-minute command.
TESTS_TIMEOUT_S = 480

# --- gpu-first's budget --------------------------------------------------------------------
#: gpu-first's wall time (s), every stage included: under the 8 minutes a first visit may
#: spend of its 15 (the machine's start and the transfers take the rest), with a minute spare.
FIRST_BUDGET_S = 420.0
#: The tests' share: the `gpu` tests that pin the reviews' predictions first (the `gpu_pins`
#: marker: timer, cuDNN's first call, peak, TF32 and kernel naming, its find, the runner on the
#: device, memory, nn's dispatch, the depthwise kernel), then the parametrised suites
#: (`gpu_suites`: our GEMM and cuBLAS's, cuDNN against the reference), so that the time limit
#: cuts a suite, never a pin. Which tests those are the tests say, each where it is defined
#: (the markers are declared in pyproject.toml; tests/conftest.py puts the pins first).
#: `-v` names every test in the log, `--durations` says where the time went.
FIRST_TESTS_TIMEOUT_S = 120.0
FIRST_MARKERS = "gpu and (gpu_pins or gpu_suites)"
FIRST_TESTS = ("-m", FIRST_MARKERS, "-v", "-p", "no:cacheprovider", "--durations=15")
#: Seconds pytest gets, once interrupted at its time limit (SIGINT, as Ctrl-C), to print its
#: summary before it is killed.
INTERRUPT_GRACE_S = 15.0
#: Seconds kept back after the run for its report, the summary and the packing.
FIRST_RESERVE_S = 60.0
#: Seconds the whole-step stage (`first`'s `extra`: one model's training step, its plan tuned
#: and confirmed, each configuration in a process of its own) needs before the deadline.
EXTRA_MIN_S = 150.0
#: The order AlexNet's layers are checked in: the 5x5 and the 3x3 layers where FFT and
#: Winograd compete first, conv1 (stride 4, 11x11: GEMM and direct only) last.
FIRST_LAYERS = ("conv2", "conv3", "conv4", "conv5", "conv1")
FIRST_ARCHIVE = "gpu-first.tar.gz"
#: Written into the folder given before anything else, and kept whatever happens after: what
#: the machine is (`probe`), and a log of every stage as it starts and ends, with the traceback
#: of anything that failed.
PROBE_JSON, FIRST_LOG = "probe.json", "gpu-first.log"
#: What comes back from a lent machine: at most 8 files of at most 16 MiB each.
MAX_FILES, MAX_FILE_BYTES = 8, 16 << 20

# --- gpu-check's second part: the classes AlexNet lacks --------------------------------------
CLASSES_RUN = "classes"
CLASSES_NET = "convset"
#: The classes of convset the second part samples: the new CUDA paths (the depthwise kernel,
#: grouped and pointwise problems through the existing kernels).
CLASSES = ("depthwise", "grouped", "pointwise")
#: Problems in the stratified sample (8 a class), and its seed.
CLASSES_SAMPLE, CLASSES_SEED = 24, 0
#: What the second part runs: every algo the device has, without cuDNN's one by one.
CLASSES_ALGOS = {"cuda": "all"}
#: The lines of the per-class table, each against the device's baseline (`speedup`).
CLASSES_LINES = (speedup.BEST_OF_OURS, "direct", "cudnn")


@dataclass
class Tests:
    """How the tests went: pytest's exit code (None: not run), its last line, its arguments."""

    returncode: int | None
    line: str
    args: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.returncode in (None, 0, 5)  # 5: nothing collected


@dataclass
class CheckRun:
    """What the run left in its folder: its outcome, the summary's text, where its time went
    and what a deadline left out."""

    folder: Path
    outcome: Outcome
    text: str
    seconds: dict[str, float] = field(default_factory=dict)
    not_reached: list[str] = field(default_factory=list)
    #: whether the run stopped at its deadline (not Ctrl-C, not a fault)
    stopped: bool = False
    #: the second part's outcome (`run_classes`); None where it did not run
    classes: Outcome | None = None

    @property
    def fault(self) -> str | None:
        return self.outcome.fault or (self.classes.fault if self.classes else None)

    @property
    def ok(self) -> bool:
        return self.fault is None and (not self.outcome.interrupted or self.stopped) and not (
            self.classes and self.classes.interrupted)


def cuda_refusal() -> str | None:
    """Why the check cannot run on CUDA here (one line), or None: no CuPy or GPU, a torch
    without CUDA or cuDNN, or a CuPy told to use per-thread default streams."""
    reason = backends.available("cuda")
    if reason:
        return reason
    from ..algos.cudnn import CuDNN, per_thread_stream_refusal

    return per_thread_stream_refusal() or CuDNN().available()


def source_checkout() -> Path | None:
    """The checkout convbench runs from, when it has its tests (not an installed wheel)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "tests").is_dir() and (root / "pyproject.toml").is_file() else None


def run_tests(log: Path, pytest_args: tuple[str, ...] = PYTEST_ARGS,
              timeout_s: float = TESTS_TIMEOUT_S,
              grace_s: float = INTERRUPT_GRACE_S) -> Tests:
    """pytest with `pytest_args` in a process of its own, from the checkout, its output in
    `log`; the last line of its report. At `timeout_s` it is interrupted as Ctrl-C would
    (SIGINT), so it names the test it was in and prints its summary, and killed only if it has
    not ended `grace_s` later."""
    root = source_checkout()
    if root is None:
        return Tests(None, "not run: convbench is installed without its tests", pytest_args)
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", PYTEST_WITH_SIGINT, *pytest_args],
                                cwd=root, stdout=out, stderr=subprocess.STDOUT)
        timed_out = launch.wait_or_interrupt(proc, timeout_s, grace_s)
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    last = (lines or ["no output"])[-1].strip("= ")
    if timed_out:
        return Tests(-1, f"interrupted at its limit of {timeout_s:g} s: {last} (see "
                     f"{log.name})", pytest_args, time.monotonic() - started)
    return Tests(proc.returncode, last, pytest_args, time.monotonic() - started)


#: The tests' process: pytest with SIGINT raising KeyboardInterrupt, as in a terminal. A command
#: started in the background by a shell without job control inherits SIGINT ignored, and Python
#: then leaves it ignored, so the interrupt at the time limit would do nothing and the tests
#: would be killed without their summary (seen in a backgrounded CI run). Set in the child's
#: own code, not by a `preexec_fn`, which is unsafe where this process runs threads (NVML's
#: sampler).
PYTEST_WITH_SIGINT = ("import signal, sys\n"
                      "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
                      "import pytest\n"
                      "sys.exit(pytest.main(sys.argv[1:]))")


def never_tiles(case: runner.Case) -> bool:
    """Whether `case` is `fft-tiled` on a problem it runs as one tile: `fft`'s transforms."""
    if case.algo != "fft-tiled":
        return False
    impl = registry.get(case.algo, case.backend)
    return isinstance(impl, registry.TransformGrid) and \
        impl.transform_grid(case.problem, case.pass_)[2] == 1


class _Deadline:
    """`on_row` of a run that stops it (as Ctrl-C does: every row kept) before a group that
    would end past `deadline`, at the end of a competing group, never inside one: a group's
    rows are timed together, and a group cut short would lose the rows it had timed. A group's
    time is predicted from the last one's, per case (groups of one pass differ mostly in how
    many cases they hold), so the run ends before the deadline rather than up to a whole group
    after it."""

    def __init__(self, cases: list[runner.Case], deadline: float,
                 clock: Callable[[], float] = time.monotonic):
        self.deadline, self.clock, self.stopped = deadline, clock, False
        self.left: dict[int, int] = {}
        self.size: dict[int, int] = {}
        self.group_of: dict[tuple, int] = {}
        for i, group in enumerate(runner.competing(cases)):
            self.left[i] = self.size[i] = len(group)
            self.group_of.update((c.key(), i) for c in group)
        self.since = clock()
        #: the seconds a case of the last group took (None: no group done yet)
        self.per_case: float | None = None

    def predicted(self) -> float:
        """Seconds the next group is expected to take."""
        return 0.0 if self.per_case is None or not self.left else \
            self.per_case * self.size[min(self.left)]

    def __call__(self, row: dict) -> None:
        i = self.group_of.get(row_key(row))
        if i is None:
            return
        self.left[i] -= 1
        if self.left[i] == 0:
            del self.left[i]
            now = self.clock()
            self.per_case, self.since = (now - self.since) / self.size[i], now
            if self.left and now + self.predicted() >= self.deadline:
                self.stopped = True
                raise KeyboardInterrupt


def check_spec(device: Device, net: str, layers: list[str] | None, algos: str | None,
               batch: int | None, budget_s: float | None = None,
               precisions: Sequence[str] = PRECISIONS_DEFAULT) -> RunSpec:
    """The run of a check as data: `layers` of `net` (all where None), every algo of `algos`
    (`ALGOS` by default), pass and layout, in each of `precisions` (fp32 by default), at
    `batch` (the device's default where None), with `budget_s` (the device's); ValueError for a
    bad net, layer, algo or precision list."""
    for precision in precisions:
        check_choice("precision", precision, PRECISIONS)
    names = layers or [layer.name for layer in catalogs.net_layers(net)]
    return RunSpec(device=device.name, algos=tuple(registry.expand_algos(
        algos or ALGOS.get(device.backend, "all"), device.backend)), passes=PASSES,
        layouts=LAYOUTS, precisions=tuple(precisions), budget_s=budget_s or device.budget_s,
        target_noise=TARGET_NOISE, net=net, layers=tuple(f"{net}:{name}" for name in names),
        batches=(batch,) if batch else ())


def tiled(spec: RunSpec) -> tuple[RunSpec, list[runner.Case], list[runner.Case]]:
    """(`spec` with the algos its cases keep, its cases, the fft-tiled ones left out where
    they never tile); ValueError for a bad layer."""
    every = cases(spec)
    kept = [c for c in every if not never_tiles(c)]
    algos = tuple(dict.fromkeys(c.algo for c in kept)) or spec.algos
    return dataclasses.replace(spec, algos=algos), kept, [c for c in every if never_tiles(c)]


def class_spec(spec: RunSpec, classes: Sequence[str], sample: int,
               algos: str | None) -> RunSpec:
    """The second part's run, beside the net's `spec`: `sample` of convset's problems of
    `classes`, stratified, at their own batch unless the spec's, every algo
    (`CLASSES_ALGOS`), pass and layout; ValueError for a bad class or algo list."""
    backend = devices.resolve(spec.device).backend
    return dataclasses.replace(
        spec, net=CLASSES_NET, layers=(), algos=tuple(registry.expand_algos(
            algos or CLASSES_ALGOS.get(backend, "all"), backend)),
        classes=tuple(selection.parse_classes(",".join(classes))), sample=sample,
        seed=CLASSES_SEED, stratify=True)


def run_classes(folder: Path, spec: RunSpec, env: dict, cases: list[runner.Case]
                ) -> tuple[Outcome, dict]:
    """The second part (`spec`, `class_spec`'s, with the algos its `cases` keep) into
    `folder`/classes (resumed where it has rows): (its outcome, its env.json: the net's, with
    the run's own spec, batch and class counts)."""
    layers_run = list(dict.fromkeys((c.layer, c.problem) for c in cases))
    ran = sorted({c.problem.n for c in cases})
    counts = selection.class_counts([catalogs.Layer(CLASSES_NET, name, p)
                                     for name, p in layers_run])
    env = {**env, "run": {
        **env.get("run", {}), **spec.to_dict(), "batch": ran[0] if len(ran) == 1 else ran,
        "class_counts": {k: v for k, v in counts.items() if v}}}
    run = Run(spec, cases, RunFolder.open(folder / CLASSES_RUN, env, resume=True))
    return run.measure(), env


def classes_markdown(outcome: Outcome, env: dict, backend: str,
                     seconds: float) -> str:
    """summary.md's section of the second part: what ran, and per class and pass (and
    precision, where it ran several: a speed-up is within one) the speed-up of `CLASSES_LINES`
    over the device's baseline (`speedup.summary`)."""
    run = env.get("run", {})
    baseline = speedup.default_baseline(backend)
    counts = outcome.frame["status"].value_counts() if len(outcome.frame) else {}
    counted = run.get("class_counts", {})
    sample = (f"{sum(counted.values())} problems of {CLASSES_NET} ("
              + ", ".join(f"{k} {v}" for k, v in counted.items()))
    lines = [f"## {', '.join(run.get('classes', CLASSES)).capitalize()} ({CLASSES_NET})", "",
             f"{CLASSES_RUN}/ ({CLASSES_RUN}/report.md): {sample}: a stratified sample, "
             f"seed {run.get('seed', CLASSES_SEED)}) at batch "
             f"{run.get('batch')}, algos {', '.join(run.get('algos', []))}, every pass and "
             f"layout in {', '.join(run.get('precisions', PRECISIONS_DEFAULT))}: "
             + ", ".join(f"{counts[s]} {s}" for s in getattr(counts, "index", []))
             + f", in {seconds:.0f} s" + (", interrupted" if outcome.interrupted else "")
             + (f"; GPU fault: {outcome.fault}" if outcome.fault else "") + ".", "",
             (f"Speed-up over {baseline} per class and pass (and precision, where it ran "
              "several), each in its fastest layout: "
              f"{speedup.BEST_OF_OURS}, direct (kernels/depthwise.cu where groups = C) and "
              "cudnn (the heuristic's pick through torch's dispatch; its rows' notes name "
              "the kernel that ran)."), ""]
    sp = speedup.speedups(outcome.frame, baseline) if len(outcome.frame) else pd.DataFrame()
    sp = sp[sp["algo"].isin(CLASSES_LINES)] if len(sp) else sp
    several = len(sp) > 0 and sp["precision"].nunique() > 1
    by = (["precision"] if several else []) + ["class", "pass", "algo"]
    table = speedup.summary(speedup.class_order(sp), by) if len(sp) else pd.DataFrame()
    lines += [md_table(table) if not table.empty else "(no rows to compare in this run)", ""]
    return "\n".join(lines)


def run_check(folder: str | Path, device: Device, *, net: str = "alexnet",
              layers: list[str] | None = None, algos: str | None = None,
              batch: int | None = None, budget_s: float | None = None, command: str = "",
              deadline: float | None = None, classes: Sequence[str] = CLASSES,
              sample: int = CLASSES_SAMPLE, class_algos: str | None = None,
              precisions: Sequence[str] = PRECISIONS_DEFAULT,
              clock: Callable[[], float] = time.monotonic) -> CheckRun:
    """Run the check into `folder` (a resumed run if it has one), then its second part
    (`run_classes`: `sample` of convset's `classes`, with `class_algos`; none where `classes`
    is empty, or the first part faulted or was cut short) and write its summary; both parts
    in each of `precisions`. See the module docstring. `deadline` (a `clock` time): stop
    between groups once it has passed. ValueError for a bad net, layer, class, algo or
    precision list, before anything runs."""
    folder = Path(folder)
    spec, cases, untiled = tiled(check_spec(device, net, layers, algos, batch, budget_s,
                                            precisions))
    second_spec, more, _ = (tiled(class_spec(spec, classes, sample, class_algos)) if classes
                            else (spec, [], []))
    folder.mkdir(parents=True, exist_ok=True)
    started = clock()
    env = environment(spec, cases, command=command)
    (folder / ENV_JSON).write_text(json.dumps(env, indent=1) + "\n")
    seconds = {"environment and ceilings": clock() - started}
    started = clock()
    runner.stage_seconds(reset=True)
    run = Run(spec, cases, RunFolder.open(folder / RUN, env, resume=True))
    stop = _Deadline(run.todo, deadline, clock) if deadline is not None else None
    outcome = run.measure(on_row=stop)
    seconds = {**seconds, "run": clock() - started, **runner.stage_seconds(reset=True)}
    measured = {row_key(r) for r in outcome.frame.to_dict("records")} if len(
        outcome.frame) else set()
    missing = [c for c in cases if c.key() not in measured]
    stopped = stop is not None and stop.stopped
    not_reached = reached_text(missing) if stopped else []
    notes = [(f"fft-tiled left out of {len(untiled)} cases where it runs one tile (fft's "
               "transforms)")] if untiled else []
    if not_reached:
        notes.append(f"stopped at the deadline with {len(missing)} of {len(cases)} cases "
                     f"left: {'; '.join(not_reached)}; `convbench gpu-check --out {folder}` "
                     "resumes them")
    text = markdown(env, outcome, seconds, notes)
    second = None
    if more and outcome.fault is None and not outcome.interrupted:
        started = clock()
        second, env2 = run_classes(folder, second_spec, env, more)
        text = text.rstrip("\n") + "\n\n" + classes_markdown(second, env2, device.backend,
                                                             clock() - started)
    (folder / SUMMARY_MD).write_text(text)
    return CheckRun(folder, outcome, text, seconds, not_reached, stopped, second)


def reached_text(missing: list[runner.Case]) -> list[str]:
    """`conv1 (fwd, bwd_data)`: per layer, the passes with cases left."""
    left: dict[str, dict[str, None]] = {}
    for c in missing:
        left.setdefault(c.layer, {})[c.pass_] = None
    return [f"{layer} ({', '.join(passes)})" for layer, passes in left.items()]


def tests(folder: str | Path, pytest_args=PYTEST_ARGS,
          timeout_s: float = TESTS_TIMEOUT_S) -> Tests:
    """The `gpu` tests into `folder`/tests.log; their line replaces summary.md's (where a run
    left one)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tested = run_tests(folder / TESTS_LOG, tuple(pytest_args), timeout_s)
    path = folder / SUMMARY_MD
    if path.is_file():
        path.write_text(with_tests_line(path.read_text(), tested))
    return tested


def with_tests_line(text: str, tested: Tests) -> str:
    """summary.md's text with `tested`'s line in its head (replacing one there)."""
    text = re.sub(r"(?m)^- tests: .*\n", "", text)
    head, sep, rest = text.partition("\n\n")
    return f"{head}\n{tests_line(tested)}{sep}{rest}"


def tests_line(tested: Tests) -> str:
    return (f"- tests: `pytest {' '.join(tested.args)}`: {tested.line}"
            + (f", in {tested.seconds:.0f} s ({TESTS_LOG})" if tested.returncode is not None
               else ""))


def markdown(env: dict, outcome: Outcome, seconds: dict[str, float],
             notes: list[str] = ()) -> str:
    """summary.md: what ran where, how the run went and where its host time went, then the
    ratios and the study's tables."""
    gpu = env.get("gpu") or {}
    torch = env.get("torch") or {}
    counts = outcome.frame["status"].value_counts() if len(outcome.frame) else {}
    stages = ", ".join(f"{name} {seconds[name]:.1f} s" for name in runner.STAGES
                       if name in seconds)
    facts = [
        ("device", env.get("device")),
        ("versions", f"driver {gpu.get('driver')}, CUDA runtime {gpu.get('cuda_runtime')}, "
                     f"cuDNN {torch.get('cudnn')}, torch {torch.get('version')}, "
                     f"CuPy {env.get('cupy')}" if gpu else None),
        ("FP32 peak", f"{gpu['fp32_peak_tflops']:.4g} TFLOP/s ({gpu['sm_count']} SMs at "
                      f"{gpu['clock_khz'] / 1e6:.3g} GHz)" if gpu.get("fp32_peak_tflops")
         else None),
        ("ceilings", ceilings_text(env)),
        ("run", f"{RUN}/ ({RUN}/report.md): " + ", ".join(
            f"{counts[s]} {s}" for s in getattr(counts, "index", [])) +
         f", in {seconds.get('run', 0):.0f} s" + (", interrupted" if outcome.interrupted
                                                  else "")),
        ("environment and ceilings", f"{seconds['environment and ceilings']:.1f} s"
         if "environment and ceilings" in seconds else None),
        ("host stages of the run", stages or None),
        ("GPU fault", outcome.fault),
        *(("note", n) for n in notes),
        ("command", env.get("run", {}).get("command")),
    ]
    lines = [f"# GPU check: {env.get('device')}", ""]
    lines += [f"- {k}: {v}" for k, v in facts if v]
    return "\n".join(lines + ["", summary.markdown(outcome.frame, env)])


def ceilings_text(env: dict) -> str | None:
    """The device's ceilings as env.json holds them, in a line; or why they are missing."""
    c = env.get("ceilings")
    if not c:
        return env.get("ceilings_note")
    parts = [f"{what} {c[k]:.4g} {unit}" for k, unit, what in (
        ("gflops_attainable", "GFLOP/s", "attainable FP32 GEMM"),
        ("gflops_peak_theoretical", "GFLOP/s", "peak"),
        ("bandwidth_gbs_dram", "GB/s", "memory bandwidth"),
        ("clock_mhz", "MHz", "SM clock while measured"))
        if isinstance(c.get(k), (int, float))]
    return ", ".join(parts) or None


# --- gpu-first -----------------------------------------------------------------------------
@dataclass
class First:
    """What `first` left: the files in the folder given, the summary's text, and whether the
    run and the tests went through."""

    files: list[Path]
    text: str
    ok: bool


def first(out: str | Path, device: Device, *, work: str | Path | None = None,
          net: str = "alexnet", layers: list[str] | None = None, algos: str | None = None,
          batch: int | None = None, budget_s: float | None = None,
          wall_s: float = FIRST_BUDGET_S, pytest_args=FIRST_TESTS,
          tests_timeout_s: float = FIRST_TESTS_TIMEOUT_S, reserve_s: float = FIRST_RESERVE_S,
          command: str = "", clock: Callable[[], float] = time.monotonic,
          tests: bool = True, extra: Callable[[Path, float], str] | None = None,
          extra_min_s: float = EXTRA_MIN_S,
          precisions: Sequence[str] = PRECISIONS_DEFAULT) -> First:
    """A first GPU visit in `wall_s` seconds (see the module docstring): the probe and the log
    into `out`, the tests (none where not `tests`: a resumed visit), the environment and
    ceilings, the check in `FIRST_LAYERS` order up to the deadline, the summary, then `out`
    packed (`pack`). A failure of any stage is logged with its traceback and the stages after
    it still run: the probe, the log and the tests' summary come back whatever happens. `work`:
    the check's folder (default results/<date>-<device>-<net>-gpu-first), which `gpu-check
    --out` or `gpu-first --work` resumes. The check measures each of `precisions`. ValueError
    for a bad layer, algo or precision list, before anything runs."""
    started = clock()
    out = Path(out)
    work = Path(work) if work else default_folder(net, device.backend, "-gpu-first", FINDINGS)
    names = layers or [n for n in FIRST_LAYERS if n in
                       {layer.name for layer in catalogs.net_layers(net)}] or None
    # bad input is refused before anything runs
    tiled(check_spec(device, net, names, algos, batch, precisions=precisions))
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    log = _logger(out / FIRST_LOG)
    log.info("gpu-first: %s s of wall time, work folder %s, out %s", f"{wall_s:g}", work, out)
    with _stage_logged(log, "probe"):
        (out / PROBE_JSON).write_text(json.dumps(probe(device), indent=1, default=str) + "\n")
    tested = Tests(None, "not run (--no-tests)", tuple(pytest_args))
    tests_s = max(1.0, min(tests_timeout_s, wall_s - reserve_s))
    if tests:
        with _stage_logged(log, "tests"):
            tested = run_tests(out / TESTS_LOG, tuple(pytest_args), tests_s)
            (work / TESTS_LOG).write_bytes((out / TESTS_LOG).read_bytes())
        log.info("tests: %s", tests_line(tested))
    done: CheckRun | None = None
    with _stage_logged(log, "check"):
        done = run_check(work, device, net=net, layers=names, algos=algos, batch=batch,
                         budget_s=budget_s, command=command, classes=(),
                         deadline=started + wall_s - reserve_s, clock=clock,
                         precisions=precisions)
    if done is not None:
        log.info("check: %s", "; ".join(f"{k} {v:.1f} s" for k, v in done.seconds.items()))
    extra_text = "" if extra is None else _extra_stage(
        extra, work, log, started + wall_s - reserve_s - clock(), extra_min_s)
    text = _first_summary(device, done, tested, extra_text, wall_s, tests_s, tests, names,
                          algos, precisions)
    text = text.rstrip("\n") + "\n" + \
        f"\n(total {clock() - started:.0f} s before packing)\n"
    (work / SUMMARY_MD).write_text(text)
    (out / SUMMARY_MD).write_text(text)
    files = pack(work, out, log)
    log.info("packed %s in %.0f s", ", ".join(p.name for p in files), clock() - started)
    _close(log)
    return First(files, text, done is not None and done.ok and tested.passed)


def _extra_stage(extra: Callable[[Path, float], str], work: Path, log: logging.Logger,
                 left: float, extra_min_s: float) -> str:
    """gpu-first's whole-step stage (`extra` on `work`, told the `left` seconds it must end
    within) where they are at least the `extra_min_s` it needs, else the line saying it was
    not run."""
    if left >= extra_min_s:
        with _stage_logged(log, "the whole step"):
            return extra(work, left)
        return ""  # failed: its traceback is in the log
    log.info("the whole step: not run, %.0f s left", left)
    return (f"## The whole training step\n\nnot run: {left:.0f} s were left before the "
            f"deadline, under the {extra_min_s:.0f} s it needs\n")


def _first_summary(device: Device, done: CheckRun | None, tested: Tests, extra_text: str,
                   wall_s: float, tests_s: float, tests: bool, names: list[str] | None,
                   algos: str | None, precisions: Sequence[str] = PRECISIONS_DEFAULT) -> str:
    """gpu-first's summary.md, less its last line: the check's summary (or that it failed)
    under what the visit spent and reached, then the whole step's section."""
    spent = {"tests": tested.seconds, **(done.seconds if done else {})}
    head = [f"- gpu-first: {wall_s:.0f} s of wall time: "
            + (f"tests (at most {tests_s:.0f} s), " if tests else "no tests (a resumed visit), ")
            + "environment and ceilings, the check up to the deadline, then this summary and "
            "the packing; spent " + ", ".join(f"{k} {v:.0f} s" for k, v in spent.items()
                                              if k in ("tests", "environment and ceilings",
                                                       "run")),
            f"- checked: layers {', '.join(names or ['all'])} in this order, every algo "
            f"({algos or ALGOS.get(device.backend, 'all')}), pass and layout in "
            f"{', '.join(precisions)}"
            + (f"; not reached: {'; '.join(done.not_reached)}" if done and done.not_reached
               else ""),
            tests_line(tested)]
    if done is None:
        text = "\n".join([f"# GPU check: {device.name}", "", *head,
                          f"- the check failed: see {FIRST_LOG}", ""])
    else:
        body = done.text.split("\n", 2)
        text = "\n".join([body[0], "", *head, *body[2:]]) if len(body) == 3 else done.text
    if extra_text:
        text = text.rstrip("\n") + "\n\n" + extra_text
    return text


def pack(work: Path, out: Path, log: logging.Logger | None = None) -> list[Path]:
    """`out` gets summary.md, tests.log and `FIRST_ARCHIVE` (the whole of `work`), beside the
    probe and the log already there; the archive leaves the plots out where they would take it
    past `MAX_FILE_BYTES`. Where what comes back would still exceed its limits (files of
    others in `out`, a log grown too large) it is said in the log and on stderr, not raised:
    the files are written by then, and an error would lose the summary."""
    archive = out / FIRST_ARCHIVE
    for plots in (True, False):
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(work, arcname=work.name,
                    filter=None if plots else
                    (lambda info: None if info.name.endswith(".png") else info))
        if archive.stat().st_size <= MAX_FILE_BYTES:
            break
    for name in (SUMMARY_MD, TESTS_LOG):
        if (work / name).is_file() and not (out / name).is_file():
            (out / name).write_bytes((work / name).read_bytes())
    files = [out / name for name in (FIRST_ARCHIVE, SUMMARY_MD, TESTS_LOG, PROBE_JSON,
                                     FIRST_LOG) if (out / name).is_file()]
    present = list(out.iterdir())
    big = [p.name for p in files if p.stat().st_size > MAX_FILE_BYTES]
    if len(present) > MAX_FILES or big:
        warning = (f"{out} holds {len(present)} entries, {len(files)} of them ours (at most "
                   f"{MAX_FILES} come back)" + (f"; {', '.join(big)} over "
                                                f"{MAX_FILE_BYTES >> 20} MiB" if big else ""))
        print(f"convbench: warning: {warning}", file=sys.stderr)
        if log is not None:
            log.warning(warning)
    return files


# --- the probe and the log ------------------------------------------------------------------
#: The packages whose versions the probe reads (distribution names).
PROBE_PACKAGES = ("torch", "cupy-cuda13x", "cupy-cuda12x", "numpy", "pandas", "tabulate",
                  "matplotlib", "threadpoolctl", "numba", "llvmlite", "nvidia-ml-py", "pyfftw",
                  "hypothesis", "pytest", "pytest-xdist", "nvidia-cuda-nvrtc",
                  "nvidia-cudnn-cu13", "nvidia-cublas", "nvidia-cufft", "triton",
                  "torchvision", "timm")
#: The commands the probe looks for on PATH (the first-visit command needs none of them).
PROBE_COMMANDS = ("make", "nvcc", "ncu", "nvidia-smi", "git")


def probe(device: Device) -> dict:
    """What the machine is, each fact read on its own, so that one that cannot be read is its
    error and the others stand: Python, packages, commands, the GPU through torch, CuPy, NVRTC
    and NVML (clocks, power, temperature, free memory), and why CUDA cannot be used, if so."""
    import importlib.metadata as md
    import os
    import platform
    import shutil

    facts: dict = {"device": device.name, "python": sys.version.split()[0],
                   "platform": platform.platform(), "cpus": os.cpu_count(),
                   "commit": envinfo.git_commit()}

    def read(name: str, fn: Callable[[], object]) -> None:
        try:
            facts[name] = fn()
        except Exception as exc:  # noqa: BLE001 - the fact is the error
            facts[name] = f"unreadable: {type(exc).__name__}: {first_line(exc)}"

    def version(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    facts["packages"] = {d: version(d) for d in PROBE_PACKAGES}
    facts["commands"] = {c: shutil.which(c) for c in PROBE_COMMANDS}
    read("cuda_refusal", cuda_refusal)
    read("torch", _probe_torch)
    read("cupy", _probe_cupy)
    read("nvml", _probe_nvml)
    return facts


def _probe_torch() -> dict:
    import torch

    info = {"version": torch.__version__, "cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(),
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
            else None}
    if torch.cuda.is_available():
        info.update(name=torch.cuda.get_device_name(),
                    capability=list(torch.cuda.get_device_capability()))
    return info


def _probe_cupy() -> dict:
    import cupy
    from cupy.cuda import nvrtc

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    free, total = cupy.cuda.Device().mem_info
    return {"version": cupy.__version__, "runtime": cupy.cuda.runtime.runtimeGetVersion(),
            "driver": cupy.cuda.runtime.driverGetVersion(), "nvrtc": list(nvrtc.getVersion()),
            "name": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
            "sms": props["multiProcessorCount"], "l2_bytes": props["l2CacheSize"],
            "shared_per_block_optin": props.get("sharedMemPerBlockOptin"),
            "clock_khz": props["clockRate"], "free_bytes": free, "total_bytes": total}


def _probe_nvml() -> dict:
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        clocks = {name: (pynvml.nvmlDeviceGetClockInfo(h, kind),
                         pynvml.nvmlDeviceGetMaxClockInfo(h, kind))
                  for name, kind in (("sm", pynvml.NVML_CLOCK_SM),
                                     ("memory", pynvml.NVML_CLOCK_MEM))}
        return {"driver": pynvml.nvmlSystemGetDriverVersion(),
                "clocks_mhz_now_max": clocks,
                "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
                "temperature_c": pynvml.nvmlDeviceGetTemperature(h,
                                                                 pynvml.NVML_TEMPERATURE_GPU),
                "throttle_reasons": pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)}
    finally:
        pynvml.nvmlShutdown()


def _logger(path: Path) -> logging.Logger:
    """A log of the visit into `path`, each line written as it happens (it comes back even if
    the command is killed after)."""
    log = logging.getLogger(f"convbench.gpu-first.{path}")
    log.setLevel(logging.INFO)
    log.propagate = False
    handler = logging.FileHandler(path, mode="a")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    return log


def _close(log: logging.Logger) -> None:
    for handler in list(log.handlers):
        handler.close()
        log.removeHandler(handler)


@contextlib.contextmanager
def _stage_logged(log: logging.Logger, name: str):
    """Log a stage's start and end; an exception in it is logged with its traceback and
    swallowed, so the stages after it run (Ctrl-C is not swallowed)."""
    started = time.monotonic()
    log.info("%s: started", name)
    try:
        yield
    except Exception:  # logged whole; the visit goes on to pack what it has
        log.exception("%s: failed after %.1f s", name, time.monotonic() - started)
        print(f"convbench: error: gpu-first's {name} failed (its traceback is in "
              f"{FIRST_LOG})", file=sys.stderr)
    else:
        log.info("%s: done in %.1f s", name, time.monotonic() - started)
