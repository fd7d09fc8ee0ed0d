"""`convbench train-step`: a whole training step, three ways — defaults, cudnn.benchmark, the plan.

The study found that once the frameworks were tuned they differed little: what is left is the
convolution algorithms, the layouts, and everything around them. This times a full step of the
`Workload` (`studies.workload`: forward, loss, backward, SGD update) with

- `defaults`: torch as installed (cuDNN heuristics on a GPU);
- `cudnn.benchmark`: `torch.backends.cudnn.benchmark = True` (on the CPU torch never reads it,
  so that row is a control of the noise between processes);
- `plan`: `advisor.tune` on the model, then `advisor.apply`.

Each configuration runs in its own process, since cuDNN remembers the algorithm it picked for a
shape for the life of a process (per thread); every process seeds the same weights and data, so
their first-step losses agree. fp32 is fp32: TF32 is off. Steps are timed as every other time
(`convbench.measure.timing`) after one untimed step (cuDNN's autotuning), the three processes
taking turns a few rounds each, so drifting load slows all three alike. On the CPU every
process, the tuning one included, runs with idle threads sleeping (`threads.CPU_THREAD_ENV`),
and every process with glibc's malloc held to one rule (`workload.MALLOC_ENV`): left to its
thresholds, a step's page faults depended on what its process had run before, so a plan that
replaced nothing read faster than `eager`. Each row says its page faults per step.

Each speed-up over `defaults` has its 95% interval (a bootstrap of both configurations' steps)
and a verdict (`with_speedups`): on the CPU two processes running the same step differ by more
than their steps' intervals say, so there the plan wins or loses only where it does so against
the control too (what the control measured: docs/pages/studies.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ..algos import registry
from ..algos.cudnn import strict_fp32
from ..core import stats
from ..core.fmt import first_line, fmt_ms, tabulate
from ..core.measurement import Measurement
from ..machine import launch
from ..machine.devices import backend_of
from ..machine.threads import CPU_THREAD_ENV
from ..measure import timing
from ..planning import confirm, tune
from ..planning.plan import Plan
from .folder import write_study
from .workload import MALLOC_ENV, Workload, worker_environment

CONFIGS = ("defaults", "cudnn.benchmark", "plan")
#: The configuration that changes nothing on the CPU (torch's CPU convolutions never read
#: cudnn.benchmark): its distance from the baseline is the noise between two processes.
CONTROL = "cudnn.benchmark"
#: A user's model (`--model`): torch eager as installed, the control (`cudnn.benchmark`: on
#: the CPU it changes nothing), channels_last (the layout change a user would try first),
#: `torch.compile` (what a user would pick instead) and the plan.
MODEL_CONFIGS = ("eager", "cudnn.benchmark", "channels_last", "compile", "plan")
#: The step modes: training (forward, loss, backward, update) or inference (forward, eval
#: mode, no gradients).
MODES = ("train", "inference")
#: 6 s of timed steps per configuration: with the workload's CPU defaults (`CPU_STEP_BATCH`,
#: `CPU_TUNE_BUDGET_S`), `convbench train-step` ends within about three minutes on 2 cores.
STEP_BUDGET_S = 6.0
#: The configurations take turns this many times, each timing budget / ROUNDS seconds of steps.
ROUNDS = 3


class ConfigTrainer:
    """One configuration's model, data and optimizer (the workload's), ready to step (in this
    process)."""

    def __init__(self, config: str, load: Workload, batch: int, device: str,
                 plan_file: str | None = None, mode: str = "train"):
        import torch

        strict_fp32()  # the report says fp32, TF32 off (see `tune_here`)
        torch.backends.cudnn.benchmark = config == "cudnn.benchmark"
        self.run = load.prepare(batch, device, plan_file if config == "plan" else None,
                                check=True)
        if config == "channels_last":
            self.run.model.to(memory_format=torch.channels_last)
            self.run.x = self.run.x.contiguous(memory_format=torch.channels_last)
        forward = self.run.model
        if config == "compile":
            forward = torch.compile(self.run.model)
        if mode == "inference":
            self.run.model.eval()
        self.backend = backend_of(device)
        self.applied = str(self.run.applied) if config == "plan" else ""
        self.step = ((lambda: self.run.infer(forward)) if mode == "inference" else
                     (lambda: self.run.step(forward)))
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

        times = list(timing.timer_for(self.backend)(step, budget_s).times_ms)
        return times, faults


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
                 plan_file: str | None = None, mode: str = "train"):
        job = {"config": config, "net": load.name, "batch": batch, "device": device,
               "plan_file": plan_file, "mode": mode}
        self.config, self.log = config, log
        self.proc = subprocess.Popen(_command("train", job), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=worker_environment(device))
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
                      "first_step_s": trainer.first_step_s}), flush=True)
    for line in sys.stdin:
        times, faults = trainer.time(float(line))
        print(json.dumps({"times_ms": times, "faults": faults}), flush=True)


def configs_of(load: Workload) -> tuple[str, ...]:
    """The configurations a workload is timed in: a catalog net's (`CONFIGS`), a user's
    model's (`MODEL_CONFIGS`)."""
    return MODEL_CONFIGS if load.user else CONFIGS


def time_configs(load: Workload, batch: int, device: str, budget_s: float, plan_file: str,
                 log=None, mode: str = "train",
                 configs: tuple[str, ...] | None = None) -> list[dict]:
    """Each configuration's step times, in ROUNDS interleaved rounds of `budget_s / ROUNDS`
    seconds, so a change in the machine's load while timing affects all of them alike. A
    configuration that cannot start (`torch.compile` without a compiler, say) is a row of its
    own saying why; the others run."""
    configs = configs or configs_of(load)
    failed: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        workers = []
        for config in configs:  # one at a time: a first step (cuDNN's search) runs alone
            if log:
                log(f"starting {config}")
            stderr = stack.enter_context(tempfile.TemporaryFile(mode="w+"))
            w = stack.enter_context(Worker(stderr, config, load, batch, device,
                                           plan_file if config == "plan" else None, mode))
            if "failed" in w.ready:
                failed[config] = w.ready["failed"]
                if log:
                    log(f"{config} failed: {failed[config]}")
                continue
            workers.append(w)
        times: dict[str, list[float]] = {w.config: [] for w in workers}
        faults: dict[str, list[int]] = {w.config: [] for w in workers}  # a count a step
        for _ in range(ROUNDS):
            for w in workers:
                answer = w.time(budget_s / ROUNDS)
                times[w.config] += answer["times_ms"]
                faults[w.config] += answer["faults"]
    rows = []
    for w in workers:
        m = Measurement(tuple(times[w.config]))
        rows.append({"config": w.config, "median_ms": m.median, "iqr_ms": m.iqr,
                     "reps": m.reps, "noisy": m.noisy, **w.ready,
                     "faults_per_step": float(np.median(faults[w.config] or [0])),
                     "times_ms": list(m.times_ms)})
    control = CONTROL if backend_of(device) == "numpy" else None
    out = with_speedups(rows, control)
    order = {c: i for i, c in enumerate(configs)}
    out += [{"config": c, "failed": why, "median_ms": None, "iqr_ms": None, "reps": 0,
             "noisy": False, "first_loss": None, "applied": "", "faults_per_step": None,
             "times_ms": [],
             "speedup": None, "speedup_low": None, "speedup_high": None,
             "verdict": f"failed: {why}"} for c, why in failed.items()]
    return sorted(out, key=lambda r: order[r["config"]])


#: The verdict where a speed-up's interval includes 1.
TIE = "tie within noise"


def with_speedups(rows: list[dict], control: str | None = None) -> list[dict]:
    """Each row's speed-up over the first (`defaults`): the ratio of the medians with its 95%
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
              step_budget_s: float = confirm.STEP_BUDGET_S) -> None:
    """`tune.tune` on the workload's model (`net`: its text form), confirmed on its step in
    `mode`, the plan saved to `plan_file`; progress on stderr. Ctrl-C: one line, exit 130 (the
    measurements made are in the plan store). TF32 is off here as in the timed processes: left
    with torch's default TF32 convolutions, the confirmation here weighs the fp32 plan against
    TF32 steps (the case: results/2026-11-28-nvidia-h100-resnet50-tune)."""
    strict_fp32()
    run = Workload.parse(net).prepare(batch, device)
    try:
        plan = tune.tune(run.model, run.x, algos=algos, budget_s=budget_s, store=store,
                         log=lambda line: print(f"convbench: {line}", file=sys.stderr),
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
            ) -> tuple[list[dict], Plan, float]:
    """Tune the model, then time the configurations; (their rows, the plan, seconds the
    tuning took). Tuning runs in a process of its own too, with the workers' environment: with
    spinning threads, a measurement just after another thread pool's work (torch-cpu after a
    NumPy algorithm) is slowed by that pool's spinning threads (`threads`).

    `deadline` (`time.monotonic()` seconds; None: none): a lent GPU's command ends at its limit,
    and a real model's tuning there takes minutes, so at the deadline the tuning
    process gets Ctrl-C (it keeps its measurements in the store) and OutOfTime is raised, as it
    is where too little is left to time every configuration (`CONFIG_START_S` each, and its
    share of `budget_s`)."""
    registry.expand_algos(algos, backend_of(device))  # a bad list fails here, in one line
    with tempfile.TemporaryDirectory() as tmp:
        plan_file = str(Path(tmp) / "plan.json")
        started = time.monotonic()
        job = {"net": load.name, "batch": batch, "device": device, "plan_file": plan_file,
               "budget_s": tune_budget_s, "algos": algos,
               "store": None if store is None else str(store), "mode": mode,
               "step_budget_s": step_budget_s}
        code = _tuned(_command("tune", job), worker_environment(device), deadline, started)
        if code:
            raise RuntimeError(f"train-step: tuning exited with {code} (its error is above)")
        tuning_s = time.monotonic() - started
        plan = Plan.load(plan_file)
        count = len(configs or configs_of(load))
        need = count * CONFIG_START_S + budget_s
        if deadline is not None and time.monotonic() + need > deadline:
            raise OutOfTime(f"tuned in {tuning_s:.0f} s, then {deadline - time.monotonic():.0f} "
                            f"s were left, under the {need:.0f} s {count} configurations need")
        rows = time_configs(load, batch, device, budget_s, plan_file, log, mode, configs)
    return rows, plan, tuning_s


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
    notes = {"cudnn.benchmark": "no effect on the CPU: torch's CPU convolutions never read "
                                "cudnn.benchmark (a control of run-to-run noise)"
             if backend == "numpy" else "cuDNN times its algorithms on the first step",
             "channels_last": "model and input in torch.channels_last",
             "compile": "torch.compile(model), compiled in the untimed first step",
             "plan": "advisor.tune + advisor.apply (the plan below)"}
    body = [[r["config"], ("~" if r["noisy"] else "") + fmt_ms(r["median_ms"])
             if r["median_ms"] is not None else "", fmt_ms(r["iqr_ms"])
             if r["iqr_ms"] is not None else "", r["reps"], _speedup_text(r), r["verdict"],
             f"{r['first_loss']:.7g}" if r["first_loss"] is not None else "",
             _faults_text(r.get("faults_per_step")), notes.get(r["config"], "torch as installed")]
            for r in rows]
    return tabulate(body, headers=["configuration", "ms/step", "IQR ms", "steps", "speed-up",
                                   "verdict", "first loss", "page faults/step", "note"],
                    tablefmt="github", disable_numparse=True)


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


def markdown(rows: list[dict], plan: Plan, load: Workload, batch: int, device_name: str,
             backend: str, tuning_s: float, default_batch: bool, mode: str = "train") -> str:
    """The report: what was timed, the table, and the plan as applied."""
    c, h, w = load.image_shape
    why = (" (the CPU default, so the run ends in about three minutes; the study used 256)"
           if backend == "numpy" and default_batch else "")
    step = ("step: forward, cross-entropy loss (the mean square for a non-classifier's "
            "output), backward, SGD (momentum 0.9) update" if mode == "train" else
            "inference: forward in eval mode without gradients")
    facts = [f"batch {batch}{why}, {c}x{h}x{w} images, fp32 (TF32 off)",
             (f"{step}; each configuration in its own process, with the same weights and "
              "data")]
    if backend == "numpy":
        facts.append(_env_fact(CPU_THREAD_ENV, "idle threads sleep: NumPy's BLAS threads and "
                                               "torch's share the cores"))
    facts.append(_env_fact(MALLOC_ENV, "glibc's malloc serves every block from a heap it keeps: "
                                       "left to its own thresholds, whether a step's tensors "
                                       "take fresh pages, page faults and all, depends on what "
                                       "each process ran before"))
    facts.append(f"tuning took {tuning_s:.0f} s; the plan rests on {len(plan.measurements)} "
                 "measurements (plan-store hits included)")
    facts += [f"tune measured on the whole {c.text()}" for c in plan.checks]
    applied = next((r["applied"] for r in rows if r["config"] == "plan"), "")
    return "\n".join([f"# train-step: {load.name} on {device_name}", "",
                      *[f"- {f}" for f in facts], "", table(rows, backend), "",
                      f"![ms per {mode} step, each configuration]({PLOT})", "",
                      "## The plan as applied", "", applied or "(the plan did not run)"])


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


def write(folder: str | Path, rows: list[dict], plan: Plan, text: str, env: dict,
          meta: dict) -> list[str]:
    """The study's folder (`folder.write_study`): report.md (`text`), trainstep.csv (a row per
    configuration), env.json, trainstep.json (`meta`, how it was asked for, and the rows with
    their raw times) and plan.json."""
    extra = {"trainstep.json": lambda path: path.write_text(
                 json.dumps({**meta, "rows": rows}, indent=1) + "\n"),
             "plan.json": plan.save}
    plots = {PLOT: lambda path: plot(rows, path, f"{meta.get('net')}, batch "
                                     f"{meta.get('batch')}, {meta.get('mode', 'train')}")}
    return write_study(folder, "trainstep", text, summary_frame(rows), env, extra=extra,
                       plots=plots)


def summary_frame(rows: list[dict]) -> pd.DataFrame:
    """The configurations' rows without the raw times and the applied-plan text."""
    return pd.DataFrame(rows).drop(columns=["applied", "times_ms"], errors="ignore")


if __name__ == "__main__":  # a process of compare's: `tune JOB` or `train JOB`
    {"tune": tune_here, "train": serve}[sys.argv[1]](**json.loads(sys.argv[2]))
