"""`convbench train-step`: a whole training step in the configurations users ask about.

The study found that once the frameworks were tuned they differed little: what is left is the
convolution algorithms, the layouts, and everything around them. This times a full step of the
`Workload` (`studies.workload`: forward, loss, backward, SGD update) in configurations
(`CONFIGURATIONS`), each the flags and environment a user would set:

- `eager`: torch as installed (cuDNN's heuristics on a GPU), the baseline;
- `cudnn.benchmark`: cuDNN times its algorithms on the first step (on the CPU torch never reads
  it, so that row is a control of the noise between processes);
- `legacy-find`, `cudnn.benchmark_limit=0`: cuDNN's own searches (GPU only);
- `channels_last`, `compile`: what a user tries first instead;
- `plan`: the advisor's plan, tuned here (`advisor.tune`) or saved (`plan_file`), then
  `advisor.apply`; tuning runs only where `plan` is timed and no saved plan is given.

All run at one precision (`PRECISIONS`: strict fp32, TF32, bf16 autocast), as a plan is
measured in one. Each configuration runs in its own process, since cuDNN remembers the
algorithm it picked for a shape for the life of a process (per thread) and torch reads some
settings once (`TORCH_CUDNN_V8_API_DISABLED`); every process seeds the same weights and data,
so their first-step losses agree. Steps are timed as whole steps
(`timing.time_step`: on a GPU each from an idle device, so a step's host time shows) after one
untimed step (cuDNN's autotuning), the processes taking
turns a few rounds each, so drifting load slows all alike; each configuration's row goes to
`LINES` in the output folder as its last round ends, so a run cut short keeps what finished.
On the CPU every process, the tuning one included, runs with idle threads sleeping
(`threads.CPU_THREAD_ENV`), and every process with glibc's malloc held to one rule
(`workload.MALLOC_ENV`): left to its thresholds, a step's page faults depended on what its
process had run before, so a plan that replaced nothing read faster than `eager`. Each row
says its page faults per step, and the flags its process ran with, read back from torch.

Each speed-up over `eager` has its 95% interval (a bootstrap of both configurations' steps)
and a verdict (`with_speedups`): on the CPU two processes running the same step differ by more
than their steps' intervals say, so there the plan wins or loses only where it does so against
the control too (what the control measured: docs/pages/studies.md).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..algos import registry
from ..algos.cudnn import conv_runs_tf32, set_tf32
from ..core import stats
from ..core.fmt import first_line, fmt_ms, tabulate
from ..core.measurement import Measurement
from ..core.problem import check_choice
from ..machine import launch
from ..machine.devices import backend_of
from ..machine.threads import CPU_THREAD_ENV
from ..measure import timing
from ..planning import confirm, tune
from ..planning.plan import Plan
from .folder import write_study
from .workload import MALLOC_ENV, Workload, worker_environment


@dataclass(frozen=True)
class Config:
    """One configuration of the step: the flags its process sets before the model is built,
    `env` (variables torch reads once, at its first convolution, so they are in the process's
    environment from its start), what it does to the model, and the report's note. `gpu_only`:
    it sets only what cuDNN reads, so on the CPU it would time `eager` under another name."""

    name: str
    note: str
    benchmark: bool = False
    benchmark_limit: int | None = None  # None: torch's default (its own process's)
    env: tuple[tuple[str, str], ...] = ()
    channels_last: bool = False
    compile: bool = False
    plan: bool = False
    gpu_only: bool = False


#: Every configuration, in the order they are timed and shown; the first is the baseline.
CONFIGURATIONS = {c.name: c for c in (
    Config("eager", "torch as installed (cuDNN's heuristics on a GPU)"),
    Config("cudnn.benchmark", "cuDNN times its algorithms on the first step", benchmark=True),
    Config("legacy-find", "TORCH_CUDNN_V8_API_DISABLED=1 with cudnn.benchmark: torch's cuDNN "
           "v7 path, cudnnFind timing every algorithm on the first step", benchmark=True,
           env=(("TORCH_CUDNN_V8_API_DISABLED", "1"),), gpu_only=True),
    Config("cudnn.benchmark_limit=0", "cudnn.benchmark trying every engine configuration "
           "cuDNN offers (torch's default tries 10)", benchmark=True, benchmark_limit=0,
           gpu_only=True),
    Config("channels_last", "model and input in torch.channels_last", channels_last=True),
    Config("compile", "torch.compile(model), compiled in the untimed first step",
           compile=True),
    Config("plan", "the plan below, applied with advisor.apply", plan=True),
)}
#: The configuration every speed-up is read against: the first.
BASELINE = next(iter(CONFIGURATIONS))
#: The environment variables configurations set: each is its configuration's alone, so one a
#: shell exported is left out of the others' processes (else every row would time it).
CONFIG_ENV = tuple(dict.fromkeys(k for c in CONFIGURATIONS.values() for k, _ in c.env))
#: What a catalog net is timed in unless told: the baseline, the control and the plan.
CONFIGS = ("eager", "cudnn.benchmark", "plan")
#: The configuration that changes nothing on the CPU (torch's CPU convolutions never read
#: cudnn.benchmark): its distance from the baseline is the noise between two processes.
CONTROL = "cudnn.benchmark"
#: What a user's model (`--model`) is timed in unless told: torch eager as installed, the
#: control (`cudnn.benchmark`: on the CPU it changes nothing), channels_last (the layout change
#: a user would try first), `torch.compile` (what a user would pick instead) and the plan.
MODEL_CONFIGS = ("eager", "cudnn.benchmark", "channels_last", "compile", "plan")
#: The precisions every configuration of a run steps in: `fp32` strict (TF32 off), `tf32`
#: (TF32 on for convolutions and products; torch's default for convolutions on a GPU), `bf16`
#: (`torch.autocast` to bfloat16 around forward and loss; what it leaves in fp32 runs strict).
#: One for the whole run, as a plan is measured in one precision (`apply` refuses another).
PRECISIONS = ("fp32", "tf32", "bf16")
_PRECISION_TEXT = {"fp32": "fp32 (TF32 off)",
                   "tf32": "TF32 (on for convolutions and matrix products)",
                   "bf16": "bf16 autocast (torch.autocast around forward and loss; what it "
                           "leaves in fp32 runs with TF32 off)"}
#: The step modes: training (forward, loss, backward, update) or inference (forward, eval
#: mode, no gradients).
MODES = ("train", "inference")
#: 6 s of timed steps per configuration: with the workload's CPU defaults (`CPU_STEP_BATCH`,
#: `CPU_TUNE_BUDGET_S`), `convbench train-step` ends within about three minutes on 2 cores.
STEP_BUDGET_S = 6.0
#: The configurations take turns this many times, each timing budget / ROUNDS seconds of steps.
ROUNDS = 3
#: The output folder's file of finished configurations: each one's row, a JSON line, written
#: as its timing ends, so a run cut short (Ctrl-C, a lent GPU's time limit) keeps them.
LINES = "configs.jsonl"


def check(configs: tuple[str, ...], backend: str, precision: str, plan_file=None) -> Plan | None:
    """The saved plan of `plan_file` (None: none given), once everything asked for is known to
    run here; else ValueError, in one line: an unknown configuration or precision, one that
    sets only what cuDNN reads (`Config.gpu_only`) or TF32 on the CPU (it would time fp32 under
    another name), a saved plan without `plan` among the configurations, or one made for another backend or
    precision (`apply` would refuse it in the plan's process)."""
    for name in configs:
        check_choice("configuration", name, tuple(CONFIGURATIONS))
        if backend == "numpy" and CONFIGURATIONS[name].gpu_only:
            raise ValueError(f"configuration {name!r} sets only what cuDNN reads: on the CPU "
                             "it would time eager under another name (run it on a GPU)")
    check_choice("precision", precision, PRECISIONS)
    if backend == "numpy" and precision == "tf32":
        raise ValueError("precision tf32 is a GPU's tensor-core mode: on the CPU it would time "
                         "fp32 under another name (use fp32 or bf16)")
    if plan_file is None:
        return None
    if "plan" not in configs:
        raise ValueError(f"the saved plan {plan_file} is timed as the configuration 'plan', "
                         "which is not among those chosen")
    try:
        plan = Plan.load(plan_file)
    except OSError as exc:
        raise ValueError(f"cannot read the plan {plan_file}: {exc.strerror}") from None
    if plan.backend != backend:
        raise ValueError(f"the plan {plan_file} was made for {plan.backend}; this run is on "
                         f"{backend}")
    if plan.precision != precision:
        raise ValueError(f"the plan {plan_file} was measured in {plan.precision}, this run "
                         f"steps in {precision}: run it at precision {plan.precision}")
    return plan


class ConfigTrainer:
    """One configuration's model, data and optimizer (the workload's), ready to step (in this
    process, whose flags it sets: a configuration runs in a process of its own, so what it
    leaves alone is torch's default), at `precision` (`PRECISIONS`)."""

    def __init__(self, config: str, load: Workload, batch: int, device: str,
                 plan_file: str | None = None, mode: str = "train", precision: str = "fp32"):
        import torch

        from ..nn import autocast_for

        cfg = CONFIGURATIONS[config]
        set_tf32(precision == "tf32")  # fp32 is strict; bf16 autocast's fp32 ops too
        torch.backends.cudnn.benchmark = cfg.benchmark
        if cfg.benchmark_limit is not None:
            torch.backends.cudnn.benchmark_limit = cfg.benchmark_limit
        self.run = load.prepare(batch, device, plan_file if cfg.plan else None, check=True)
        if cfg.channels_last:
            self.run.model.to(memory_format=torch.channels_last)
            self.run.x = self.run.x.contiguous(memory_format=torch.channels_last)
        forward = self.run.model
        if cfg.compile:
            forward = torch.compile(self.run.model)
        if mode == "inference":
            self.run.model.eval()
        self.backend = backend_of(device)
        self.applied = str(self.run.applied) if cfg.plan else ""
        self.settings = settings()  # after `apply`, which sets the plan's cuDNN flags
        around = functools.partial(autocast_for, precision, torch.device(device).type)
        self.step = ((lambda: self.run.infer(forward, around)) if mode == "inference" else
                     (lambda: self.run.step(forward, around)))
        # untimed: cuDNN autotunes, torch.compile compiles here
        started = time.perf_counter()
        self.first_loss = self.step().item()
        self.first_step_s = time.perf_counter() - started

    def time(self, budget_s: float) -> tuple[list[float], list[int]]:
        """The step times of `budget_s` seconds of steps, and the minor page faults the process
        took in each step run (the timer's warm-up steps included; counting costs a
        microsecond a step)."""
        faults = []

        def step():
            before = minor_faults()
            loss = self.step()
            faults.append(minor_faults() - before)
            return loss

        times = list(timing.time_step(step, budget_s, self.backend).times_ms)
        return times, faults


def settings() -> str:
    """What this process steps with, read back from torch and the environment (not from the
    configuration that asked for it): cudnn.benchmark (with its limit where on), TF32 for
    convolutions, and the configurations' variables that are set."""
    import torch

    cudnn = torch.backends.cudnn
    parts = [f"cudnn.benchmark={cudnn.benchmark}"]
    if cudnn.benchmark:
        parts.append(f"cudnn.benchmark_limit={cudnn.benchmark_limit}")
    parts.append(f"tf32={'on' if conv_runs_tf32() else 'off'}")
    parts += [f"{k}={os.environ[k]}" for k in CONFIG_ENV if k in os.environ]
    return " ".join(parts)


def minor_faults() -> int:
    """This process's minor page faults so far (pages the kernel mapped, and zeroed, on first
    touch); 0 where the platform does not count them."""
    try:
        import resource
    except ImportError:  # not on this platform
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class Worker:
    """A `ConfigTrainer` in its own Python process (see the module docstring for why), asked for
    timings one round at a time over a pipe: one JSON line per answer."""

    def __init__(self, log, config: str, load: Workload, batch: int, device: str,
                 plan_file: str | None = None, mode: str = "train", precision: str = "fp32"):
        job = {"config": config, "net": load.name, "batch": batch, "device": device,
               "plan_file": plan_file, "mode": mode, "precision": precision}
        self.config, self.log = config, log
        self.proc = subprocess.Popen(_command("train", job), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=config_environment(config, device))
        self.ready = self._answer()

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.log.seek(0)
            tail = (self.log.read().strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"train-step {self.config}: worker exited with "
                               f"{self.proc.returncode}: {tail}")
        return json.loads(line)

    def time(self, budget_s: float) -> dict:
        """One round: {"times_ms", "faults"} (`ConfigTrainer.time`)."""
        self.proc.stdin.write(f"{budget_s}\n")
        self.proc.stdin.flush()
        return self._answer()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()


def config_environment(config: str, device: str) -> dict:
    """The environment of `config`'s process: the workers' (`worker_environment`) with its own
    variables set, and those of other configurations (`CONFIG_ENV`) left out."""
    env = {k: v for k, v in worker_environment(device).items() if k not in CONFIG_ENV}
    return {**env, **dict(CONFIGURATIONS[config].env)}


def _command(kind: str, job: dict) -> list[str]:
    return launch.module_command(__name__, kind, json.dumps(job))


def serve(net: str, **job) -> None:
    """The worker's side: build the ConfigTrainer, say it is ready, then answer each budget
    read from stdin with that round's step times."""
    try:
        trainer = ConfigTrainer(load=Workload.parse(net), **job)
    except Exception as exc:  # noqa: BLE001 - this configuration's row says why, the rest run
        print(json.dumps({"failed": f"{type(exc).__name__}: {first_line(exc)}"}), flush=True)
        return
    print(json.dumps({"first_loss": trainer.first_loss, "applied": trainer.applied,
                      "first_step_s": trainer.first_step_s, "settings": trainer.settings}),
          flush=True)
    for line in sys.stdin:
        times, faults = trainer.time(float(line))
        print(json.dumps({"times_ms": times, "faults": faults}), flush=True)


def configs_of(load: Workload) -> tuple[str, ...]:
    """The configurations a workload is timed in: a catalog net's (`CONFIGS`), a user's
    model's (`MODEL_CONFIGS`)."""
    return MODEL_CONFIGS if load.user else CONFIGS


def time_configs(load: Workload, batch: int, device: str, budget_s: float,
                 plan_file: str | None = None, log=None, mode: str = "train",
                 configs: tuple[str, ...] | None = None, precision: str = "fp32",
                 on_row=None) -> list[dict]:
    """Each configuration's step times, in ROUNDS interleaved rounds of `budget_s / ROUNDS`
    seconds, so a change in the machine's load while timing affects all of them alike. A
    configuration that cannot start (`torch.compile` without a compiler, say) is a row of its
    own saying why; the others run. `on_row` receives each row as it is final: a failed one as
    its process gives up, a timed one as its last round ends, its speed-up read against the
    rows before it (the baseline and the control come first, so it is the one returned)."""
    configs = configs or configs_of(load)
    control = CONTROL if backend_of(device) == "numpy" else None
    on_row = on_row or (lambda row: None)
    failed: list[dict] = []
    with contextlib.ExitStack() as stack:
        workers = []
        for config in configs:  # one at a time: a first step (cuDNN's search) runs alone
            if log:
                log(f"starting {config}")
            stderr = stack.enter_context(tempfile.TemporaryFile(mode="w+"))
            w = stack.enter_context(Worker(stderr, config, load, batch, device,
                                           plan_file if config == "plan" else None, mode,
                                           precision))
            if "failed" in w.ready:
                if log:
                    log(f"{config} failed: {w.ready['failed']}")
                failed.append(_failed_row(config, w.ready["failed"], precision))
                on_row(failed[-1])
                continue
            workers.append(w)
        times: dict[str, list[float]] = {w.config: [] for w in workers}
        faults: dict[str, list[int]] = {w.config: [] for w in workers}  # a count a step
        timed: list[dict] = []
        for last in [False] * (ROUNDS - 1) + [True]:
            for w in workers:
                answer = w.time(budget_s / ROUNDS)
                times[w.config] += answer["times_ms"]
                faults[w.config] += answer["faults"]
                if last:
                    row = _timed_row(w, times[w.config], faults[w.config], precision)
                    timed.append(with_speedups([*timed, row], control)[-1])
                    on_row(timed[-1])
    order = {c: i for i, c in enumerate(configs)}
    return sorted(timed + failed, key=lambda r: order[r["config"]])


def _timed_row(w: Worker, times: list[float], faults: list[int], precision: str) -> dict:
    """A configuration's row from its steps (before its speed-up)."""
    m = Measurement(tuple(times))
    return {"config": w.config, "precision": precision, "median_ms": m.median,
            "iqr_ms": m.iqr, "reps": m.reps, "noisy": m.noisy, **w.ready,
            "faults_per_step": float(np.median(faults or [0])), "times_ms": list(m.times_ms)}


def _failed_row(config: str, why: str, precision: str) -> dict:
    """The row of a configuration whose process could not start stepping."""
    return {"config": config, "precision": precision, "failed": why, "median_ms": None,
            "iqr_ms": None, "reps": 0, "noisy": False, "first_loss": None, "applied": "",
            "settings": "", "faults_per_step": None, "times_ms": [], "speedup": None,
            "speedup_low": None, "speedup_high": None, "verdict": f"failed: {why}"}


def line_writer(folder: str | Path):
    """`time_configs`'s `on_row` that appends each row to `folder`/`LINES` as a JSON line,
    the file emptied first (a folder written again holds this run's rows only)."""
    path = Path(folder) / LINES
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")

    def write(row: dict) -> None:
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    return write


#: The verdict where a speed-up's interval includes 1.
TIE = "tie within noise"


def with_speedups(rows: list[dict], control: str | None = None) -> list[dict]:
    """Each row's speed-up over the first (`eager`): the ratio of the medians with its 95%
    interval (a bootstrap of each one's steps), and a verdict: the first row is the `baseline`;
    another is `faster` or `slower` where the interval excludes 1, else a `tie within noise`.

    `control` names a configuration that changes nothing (on the CPU, `cudnn.benchmark`): its
    distance from the baseline is the noise between two processes running the same step, which
    the step-to-step intervals do not see. Its verdict says whether the processes differed, and
    another row wins or loses only where it does so against the control as well, else it is a
    `tie within noise of the control`."""
    base = rows[0]["times_ms"]
    ctrl = next((r for r in rows if r["config"] == control), None)
    out = []
    for i, r in enumerate(rows):
        ratio = stats.ratio(base, r["times_ms"])
        verdict = "baseline" if i == 0 else _verdict(ratio)
        if i and r is ctrl:
            verdict = ("control: tie within noise" if not ratio.decided else
                       f"control: the processes differ by {abs(ratio.value - 1):.0%}")
        elif (i and ctrl is not None and verdict != TIE
              and _verdict(stats.ratio(ctrl["times_ms"], r["times_ms"])) != verdict):
            verdict = f"{TIE} of the control"
        out.append({**r, "speedup": ratio.value, "speedup_low": ratio.low,
                    "speedup_high": ratio.high, "verdict": verdict})
    return out


def _verdict(ratio: stats.Ratio) -> str:
    """`faster`, `slower` (the interval of old/new excludes 1) or a tie."""
    return TIE if not ratio.decided else "faster" if ratio.low > 1 else "slower"


def tune_here(net: str, batch: int, device: str, plan_file: str, budget_s: float | None,
              algos: str, store: str | None, mode: str = "train",
              step_budget_s: float = confirm.STEP_BUDGET_S, precision: str = "fp32") -> None:
    """`tune.tune` on the workload's model (`net`: its text form), confirmed on its step in
    `mode`, the plan saved to `plan_file`; progress on stderr. Ctrl-C: one line, exit 130 (the
    measurements made are in the plan store). It measures and confirms in the run's
    `precision`, set as in the timed processes (TF32 on only for tf32; bf16 under autocast):
    a plan measured in another setting than the steps it is timed in is refused by `apply`
    (the case that showed why: results/2026-11-28-nvidia-h100-resnet50-tune)."""
    from ..nn import precision_setting

    set_tf32(precision == "tf32")
    run = Workload.parse(net).prepare(batch, device)
    try:
        with precision_setting(precision, run.x.device.type):
            plan = tune.tune(run.model, run.x, algos=algos, budget_s=budget_s, store=store,
                             step=mode, step_budget_s=step_budget_s)
    except tune.TuneInterrupted as stop:
        print(f"convbench: tuning interrupted: {tune.interrupted_text(stop)}", file=sys.stderr)
        sys.exit(130)
    plan.save(plan_file)


#: Seconds a configuration's process is allowed to start in (torch, the model, its first step)
#: when a deadline is weighed: the timing starts only where every configuration fits.
CONFIG_START_S = 15.0
#: Seconds a tuning process has, after its Ctrl-C at the deadline, to save what it measured.
TUNE_GRACE_S = 20.0


class OutOfTime(RuntimeError):
    """compare's deadline came first: the tuning process was interrupted (what it measured is in
    the plan store), or too little time was left to time the configurations."""


def compare(load: Workload, batch: int, device: str, *, budget_s: float = STEP_BUDGET_S,
            tune_budget_s: float | None = None, algos: str = "all", store=None,
            log=None, mode: str = "train", configs: tuple[str, ...] | None = None,
            deadline: float | None = None, step_budget_s: float = confirm.STEP_BUDGET_S,
            precision: str = "fp32", plan_file: str | Path | None = None,
            folder: str | Path | None = None) -> tuple[list[dict], Plan | None, float | None]:
    """Tune the model where `plan` is timed and no saved plan (`plan_file`) is given, then time
    the configurations at `precision`; (their rows, the plan or None where none is timed,
    seconds the tuning took or None where nothing was tuned). What cannot run here is a
    ValueError before anything starts (`check`). Tuning runs in a process of its own too, with
    the workers' environment: with spinning threads, a measurement just after another thread
    pool's work (torch-cpu after a NumPy algorithm) is slowed by that pool's spinning threads
    (`threads`).

    `folder`: the output folder, which gets the tuned plan (plan.json) as soon as it is made
    and each configuration's row as it ends (`LINES`), so a run cut short keeps both.

    `deadline` (`time.monotonic()` seconds; None: none): a lent GPU's command ends at its limit,
    and a real model's tuning there takes minutes, so at the deadline the tuning
    process gets Ctrl-C (it keeps its measurements in the store) and OutOfTime is raised, as it
    is where too little is left to time every configuration (`CONFIG_START_S` each, and its
    share of `budget_s`)."""
    configs = configs or configs_of(load)
    backend = backend_of(device)
    plan = check(configs, backend, precision, plan_file)
    registry.expand_algos(algos, backend)  # a bad list fails here, in one line
    on_row = line_writer(folder) if folder is not None else None
    how = dict(load=load, batch=batch, device=device, budget_s=budget_s, log=log, mode=mode,
               configs=configs, precision=precision, on_row=on_row)
    if plan is not None or "plan" not in configs:
        _enough_time(deadline, len(configs), budget_s, "")
        return time_configs(plan_file=plan_file, **how), plan, None
    with tempfile.TemporaryDirectory() as tmp:
        plan_file = str(Path(folder if folder is not None else tmp) / "plan.json")
        started = time.monotonic()
        job = {"net": load.name, "batch": batch, "device": device, "plan_file": plan_file,
               "budget_s": tune_budget_s, "algos": algos,
               "store": None if store is None else str(store), "mode": mode,
               "step_budget_s": step_budget_s, "precision": precision}
        code = _tuned(_command("tune", job), worker_environment(device), deadline, started)
        if code:
            raise RuntimeError(f"train-step: tuning exited with {code} (its error is above)")
        tuning_s = time.monotonic() - started
        plan = Plan.load(plan_file)
        _enough_time(deadline, len(configs), budget_s, f"tuned in {tuning_s:.0f} s, then ")
        rows = time_configs(plan_file=plan_file, **how)
    return rows, plan, tuning_s


def _enough_time(deadline: float | None, count: int, budget_s: float, before: str) -> None:
    """OutOfTime where less is left before `deadline` than `count` configurations need
    (`CONFIG_START_S` each and `budget_s`); `before`: what the message says came first."""
    need = count * CONFIG_START_S + budget_s
    if deadline is not None and time.monotonic() + need > deadline:
        raise OutOfTime(f"{before}{deadline - time.monotonic():.0f} s were left, under the "
                        f"{need:.0f} s {count} configurations need")


def _tuned(command: list[str], env, deadline: float | None, started: float) -> int:
    """The tuning process's exit code; OutOfTime where the deadline came first (it was sent
    Ctrl-C, and killed if it did not end `TUNE_GRACE_S` later)."""
    proc = subprocess.Popen(command, env=env)
    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    try:
        timed_out = launch.wait_or_interrupt(proc, left, TUNE_GRACE_S)
    except BaseException:  # Ctrl-C here: the child has it too; wait for it to save and end
        launch.wait_or_interrupt(proc, TUNE_GRACE_S, 0.0)
        raise
    if timed_out:
        raise OutOfTime(f"tuning interrupted at the deadline, after "
                        f"{time.monotonic() - started:.0f} s; what it measured is in the plan "
                        "store, and tuning again reuses it")
    return proc.returncode


def table(rows: list[dict], backend: str) -> str:
    """The configurations side by side. `first loss` is the loss of each configuration's first
    (untimed) step: every process starts from the same weights and data, so a configuration
    whose numbers differ (a plan that computes something else) shows there."""
    body = [[r["config"], ("~" if r["noisy"] else "") + fmt_ms(r["median_ms"])
             if r["median_ms"] is not None else "", fmt_ms(r["iqr_ms"])
             if r["iqr_ms"] is not None else "", r["reps"], _speedup_text(r), r["verdict"],
             f"{r['first_loss']:.7g}" if r["first_loss"] is not None else "",
             _faults_text(r.get("faults_per_step")), _note(r["config"], backend)]
            for r in rows]
    return tabulate(body, headers=["configuration", "ms/step", "IQR ms", "steps", "speed-up",
                                   "verdict", "first loss", "page faults/step", "note"],
                    tablefmt="github", disable_numparse=True)


def _note(config: str, backend: str) -> str:
    """The table's note on a configuration: its own, but the control's on the CPU."""
    if config == CONTROL and backend == "numpy":
        return ("no effect on the CPU: torch's CPU convolutions never read cudnn.benchmark (a "
                "control of run-to-run noise)")
    return CONFIGURATIONS[config].note


def _faults_text(per_step: float | None) -> str:
    """A step's minor page faults (the median step's), whole; blank where not measured."""
    return "" if per_step is None else f"{per_step:,.0f}"


def _speedup_text(row: dict) -> str:
    """`1.04x [0.98, 1.10]`: the speed-up over defaults and its 95% interval."""
    if row["speedup"] is None:
        return ""
    if row["verdict"] == "baseline" or row["speedup_low"] is None:
        return f"{row['speedup']:.2f}x"
    return f"{row['speedup']:.2f}x [{row['speedup_low']:.2f}, {row['speedup_high']:.2f}]"


def markdown(rows: list[dict], plan: Plan | None, load: Workload, batch: int,
             device_name: str, backend: str, tuning_s: float | None, default_batch: bool,
             mode: str = "train", precision: str = "fp32",
             plan_file: str | Path | None = None) -> str:
    """The report: what was timed, the table, the flags each process ran with, and the plan
    as applied (`plan`: None where none was timed; `tuning_s`: None where it was not tuned
    here but read from `plan_file`)."""
    c, h, w = load.image_shape
    why = (" (the CPU default, so the run ends in about three minutes; the study used 256)"
           if backend == "numpy" and default_batch else "")
    step = ("step: forward, cross-entropy loss (the mean square for a non-classifier's "
            "output), backward, SGD (momentum 0.9) update" if mode == "train" else
            "inference: forward in eval mode without gradients")
    facts = [f"batch {batch}{why}, {c}x{h}x{w} images, {_PRECISION_TEXT[precision]}",
             (f"{step}; each configuration in its own process, with the same weights and "
              "data")]
    if backend == "numpy":
        facts.append(_env_fact(CPU_THREAD_ENV, "idle threads sleep: NumPy's BLAS threads and "
                                               "torch's share the cores"))
    facts.append(_env_fact(MALLOC_ENV, "glibc's malloc serves every block from a heap it keeps: "
                                       "left to its own thresholds, whether a step's tensors "
                                       "take fresh pages, page faults and all, depends on what "
                                       "each process ran before"))
    if plan is not None:
        made = (f"tuning took {tuning_s:.0f} s; the plan" if tuning_s is not None else
                f"the plan is {plan_file} as saved (not tuned here); it")
        facts.append(f"{made} rests on {len(plan.measurements)} measurements (plan-store hits "
                     "included)")
        facts += [f"tune measured on the whole {c.text()}" for c in plan.checks]
    flags = [f"- {r['config']}: {r['settings']}" for r in rows if r.get("settings")]
    applied = next((r["applied"] for r in rows if r["config"] == "plan"), "")
    return "\n".join([f"# train-step: {load.name} on {device_name}", "",
                      *[f"- {f}" for f in facts], "", table(rows, backend), "",
                      f"![ms per {mode} step, each configuration]({PLOT})", "",
                      *(["## Each process's flags, read back from torch", "", *flags, ""]
                        if flags else []),
                      *(["## The plan as applied", "", applied or "(the plan did not run)"]
                        if plan is not None else [])])


def _env_fact(env: dict[str, str], why: str) -> str:
    """The report's line for variables every process runs with (as set here, else ours)."""
    return ("every process runs with "
            + " ".join(f"{k}={os.environ.get(k, v)}" for k, v in env.items()) + f" ({why})")


PLOT = "trainstep.png"


def plot(rows: list[dict], path: Path, title: str) -> None:
    """ms per step of each configuration that ran, with whiskers to its fastest and slowest
    step, and its median written past the whisker's end, in room the axis keeps for it (written
    at the bar's end, it ran into the whisker and past the frame), the whole laid out so the
    title and labels stay within the figure."""
    from ..core.fmt import save_figure

    ran = [r for r in rows if r["median_ms"] is not None]
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.9 + 0.45 * max(1, len(ran))), layout="constrained")
    names = [r["config"] for r in ran]
    medians = [r["median_ms"] for r in ran]
    q = [[r["median_ms"] - min(r["times_ms"]) if r["times_ms"] else 0 for r in ran],
         [max(r["times_ms"]) - r["median_ms"] if r["times_ms"] else 0 for r in ran]]
    ax.barh(names, medians, xerr=q, color="#4c72b0", capsize=3)
    ends = [m + above for m, above in zip(medians, q[1])]
    for i, (m, end) in enumerate(zip(medians, ends)):
        ax.annotate(f"{m:.4g}", (end, i), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.set_xlim(0, max(ends, default=1.0) * 1.2)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (median; whiskers: fastest and slowest step)")
    ax.set_title(title, fontsize=9)
    save_figure(fig, path, legend=False)


def write(folder: str | Path, rows: list[dict], plan: Plan | None, text: str, env: dict,
          meta: dict) -> list[str]:
    """The study's folder (`folder.write_study`): report.md (`text`), trainstep.csv (a row per
    configuration), env.json, trainstep.json (`meta`, how it was asked for, and the rows with
    their raw times) and plan.json where a plan was timed."""
    extra = {"trainstep.json": lambda path: path.write_text(
                 json.dumps({**meta, "rows": rows}, indent=1) + "\n"),
             **({"plan.json": plan.save} if plan is not None else {})}
    plots = {PLOT: lambda path: plot(rows, path, f"{meta.get('net')}, batch "
                                     f"{meta.get('batch')}, {meta.get('mode', 'train')}")}
    return write_study(folder, "trainstep", text, summary_frame(rows), env, extra=extra,
                       plots=plots)


def summary_frame(rows: list[dict]) -> pd.DataFrame:
    """The configurations' rows without the raw times and the applied-plan text."""
    return pd.DataFrame(rows).drop(columns=["applied", "times_ms"], errors="ignore")


if __name__ == "__main__":  # a process of compare's: `tune JOB` or `train JOB`
    {"tune": tune_here, "train": serve}[sys.argv[1]](**json.loads(sys.argv[2]))
