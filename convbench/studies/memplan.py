"""`convbench memplan`: what each memory technique buys in batch size, and what it costs in speed.

The memory papers convbench grows from each propose a technique. SuperNeurons (PPoPP 2018)
recomputes cheap layers' outputs instead of keeping them, keeping the convolutions'; vDNN and
Kim et al. (Cluster Computing 2019) move the feature maps kept for backward to host memory and
bring them back for the backward pass. For one network on one device, this measures for each
strategy the largest batch whose training step fits a memory budget and the images per second
it trains at, with what PyTorch provides:

- `none`: the plain step;
- `checkpoint`: `torch.utils.checkpoint` around every stage (a heavy layer and the cheap ones
  after it, `trainstep.build_model`): only each stage's input is kept, the whole stage is
  recomputed in backward;
- `recompute-cheap`: the SuperNeurons policy, `checkpoint` around the cheap layers (ReLU,
  pooling) only: the heavy layers' outputs are kept, the cheap ones recomputed;
- `offload`: `torch.autograd.graph.save_on_cpu(pin_memory=True)`: every tensor kept for backward
  waits in pinned host memory. On the CPU there is no second memory to move to: unsupported.
- `workspace`: the SuperNeurons policy for convolutions, the fastest algorithms the memory left
  allows. The model's conv passes are measured once (every algorithm and layout, verified,
  at `REFERENCE_BATCH`); at each batch the step first runs without it (the base strategy: the
  others named with it, or `none`), and what that step leaves of the budget is the workspace
  left for algorithm choice. The advisor's plan (`advice.advise`, `apply`) takes the fastest
  algorithms (as ranked at the reference batch) whose workspaces, as they declare them at this
  batch, all fit in it together: convbench holds a planned pass's workspace from its first
  call on, so it is their sum that must fit. The step then runs under that plan; where the
  plan overshoots (running convbench's passes takes more than their workspaces), under the
  plan for a quarter of that room, then for none, and last as the base step.
- `A+B`: both, e.g. `recompute-cheap+offload` or `checkpoint+workspace`.

Every probe is a real training step (forward, cross-entropy, backward, SGD with momentum; the
second step, when the momentum buffers exist) in a process of its own, its peak read from the
allocators (`memory.trace`) from before the model exists, so weights, gradients and optimizer
state count. The largest batch is searched without a probe beyond the budget: batch 1 first
(refused before it runs when the model on `meta` says even it does not fit), then from the
largest batch that fits, as many images more as the room left holds at a bound on the growth
per image (1.5 times what the model on `meta` keeps per image; on the GPU torch's allocator is also
held to the budget, so a probe beyond it fails rather than takes more). Then each strategy is
timed at 1, half of its limit, its limit, and the common batch. Its gradients are
checked against the plain step's at batch 2 (relative error, fp32).

This module measures; `memplan_report` writes the study's folder from what it returns.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..core.measurement import Measurement
from ..machine import launch
from ..machine.devices import backend_of
from ..measure import memory, timing
from .footprint import modelled_peak
from .workload import Training, Workload, worker_environment
from .workspace import (
    Choices,
    budgeted_plan,
    measure_choices,
    plan_summary,
    plan_tolerance,
)

STRATEGIES = ("none", "checkpoint", "recompute-cheap", "offload", "workspace")
WORKSPACE = "workspace"
#: A plan that overshoots the budget is chosen again for the room divided by this.
ROOM_SHRINK = 4
#: Relative gradient error a strategy may introduce (it reorders nothing: recomputation repeats
#: the same arithmetic, offloading copies bits; this is fp32 rounding's room).
GRADIENT_TOLERANCE = 1e-5
#: The bound on the per-image growth of the peak the search steps by: this many times what the
#: model on `meta` keeps per image, for the allocator and temporaries the model does not see
#: (docs/pages/studies.md has the growth measured, and what of the room a probe leaves).
SLOPE_MARGIN = 1.5
#: Batch at which the gradients are compared.
CHECK_BATCH = 2
MAX_BATCH = 1 << 16


# --- strategies -----------------------------------------------------------------------------
def parse_strategies(text: str) -> list[str]:
    """`none,checkpoint,recompute-cheap+offload` -> the strategies, each checked; ValueError
    naming the first bad one."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        parts = item.split("+")
        for part in parts:
            if part not in STRATEGIES:
                raise ValueError(f"unknown strategy {part!r}; valid: {', '.join(STRATEGIES)} "
                                 "and their combinations with +")
        if len(parts) != len(set(parts)) or ("none" in parts and len(parts) > 1):
            raise ValueError(f"strategy {item!r} repeats itself or combines none")
        if {"checkpoint", "recompute-cheap"} <= set(parts):
            raise ValueError(f"strategy {item!r}: checkpoint recomputes the cheap layers already")
        if item not in out:
            out.append(item)
    if not out:
        raise ValueError(f"no strategy given; valid: {', '.join(STRATEGIES)}")
    return out


def unsupported(strategy: str, device: str) -> str | None:
    """Why `strategy` cannot run on `device`, or None."""
    if "offload" in strategy.split("+") and backend_of(device) != "cuda":
        return ("offload moves saved activations to host memory: on the CPU they are there "
                "already")
    return None


def _stage_runner(parts: set[str]) -> Callable:
    """How each stage of the model runs under the strategy's recomputation (none: as is)."""
    from torch.utils.checkpoint import checkpoint

    if "checkpoint" in parts:
        return lambda heavy, cheap, x: checkpoint(lambda t: cheap(heavy(t)), x,
                                                  use_reentrant=False)
    if "recompute-cheap" in parts:
        return lambda heavy, cheap, x: checkpoint(cheap, heavy(x), use_reentrant=False)
    return lambda heavy, cheap, x: cheap(heavy(x))


def base(strategy: str) -> str:
    """The strategy without its workspace choice: what the step is when the plan is not
    applied (`none` for `workspace` alone)."""
    parts = [p for p in strategy.split("+") if p != WORKSPACE]
    return "+".join(parts) or "none"


#: The layers SuperNeurons calls cheap to recompute (activations, pooling, normalisation), as
#: `recompute-cheap` finds them in a user's model.
CHEAP = ("ReLU", "ReLU6", "LeakyReLU", "SiLU", "GELU", "Hardswish", "Hardsigmoid", "Sigmoid",
         "Tanh", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "AdaptiveMaxPool2d",
         "BatchNorm2d", "GroupNorm", "LayerNorm", "LocalResponseNorm")


def _wrap_modules(model, parts: set[str]) -> None:
    """Recomputation for a user's model, whose forward has no stages: `checkpoint` around each
    of its top-level children (the segments its author made), `recompute-cheap` around each
    cheap leaf module (`CHEAP`; an in-place one made out-of-place, since a checkpoint recomputes
    from the input it keeps, which an in-place op would have overwritten)."""
    from torch.utils.checkpoint import checkpoint

    if "checkpoint" in parts:
        targets = [m for _, m in model.named_children()]
    elif "recompute-cheap" in parts:
        targets = [m for m in model.modules() if type(m).__name__ in CHEAP]
    else:
        return
    for m in targets:
        if getattr(m, "inplace", False):
            m.inplace = False
        m.forward = (lambda *a, _f=m.forward, **k:
                     checkpoint(_f, *a, use_reentrant=False, **k))


def step_function(run: Training, strategy: str) -> Callable[[], object]:
    """One training step of the workload (`Training.step`) under `strategy`: forward recomputed
    and offloaded as the strategy says; returns the loss. The `workspace` part is the plan
    applied to the model beforehand (`Workload.prepare`). A catalog model runs its stages
    through the strategy; a user's model has its modules wrapped (`_wrap_modules`)."""
    import torch

    parts = set(strategy.split("+"))
    model = run.model
    forward = None
    if hasattr(model, "stages"):
        stage = _stage_runner(parts)

        def forward(x):
            return model(x, stage)
    else:
        _wrap_modules(model, parts)

    def saving():
        if "offload" in parts:
            return torch.autograd.graph.save_on_cpu(pin_memory=True)
        return contextlib.nullcontext()

    return lambda: run.step(forward, saving)


def gradient_error(load: Workload, strategy: str, device: str, batch: int = CHECK_BATCH,
                   plan_file: str | None = None) -> float:
    """‖g − g_plain‖ / ‖g_plain‖ over all parameters' gradients after one step's backward,
    from the same weights and data (in this process); the strategy's step runs `plan_file`'s
    plan if given."""
    grads = []
    for how, plan in (("none", None), (strategy, plan_file)):
        run = load.prepare(batch, device, plan)
        step_function(run, how)()
        grads.append(run.gradient())
    return float((grads[1] - grads[0]).norm() / grads[0].norm())


# --- one probe ------------------------------------------------------------------------------
@dataclass
class Probe:
    """A training step at one batch: the peak bytes the allocators held (from before the model
    existed), or `oom` where the GPU's allocator refused it the budget; the step's times when
    timed."""

    batch: int
    peak: int
    times_ms: list[float] = field(default_factory=list)
    oom: bool = False
    note: str = ""

    def fits(self, budget: int) -> bool:
        return not self.oom and self.peak <= budget

    @property
    def images_per_s(self) -> float | None:
        if not self.times_ms:
            return None
        return self.batch / (Measurement(tuple(self.times_ms)).median / 1e3)


def probe_here(net: str, strategy: str, batch: int, device: str, budget: int,
               time_s: float, plan_file: str | None = None) -> Probe:
    """The probe, in this process (`probe` runs it in a fresh one; `net`: the workload's text
    form). On the GPU torch's allocator is held to the budget, so a step beyond it fails
    instead of taking more."""
    import torch

    backend = backend_of(device)
    if backend == "cuda":
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total))
    try:
        with memory.trace(backend) as trace:
            step = step_function(Workload.parse(net).prepare(batch, device, plan_file),
                                 strategy)
            step()  # the momentum buffers appear here
            trace.mark()
            step()
    except torch.cuda.OutOfMemoryError:
        return Probe(batch, budget + 1, oom=True)
    peak = max(p.peak for p in trace.points)
    times = list(timing.time_step(step, time_s, backend).times_ms) if time_s > 0 else []
    return Probe(batch, peak, times)


def probe(load: Workload, strategy: str, batch: int, device: str, budget: int,
          time_s: float = 0.0, plan_file: str | None = None) -> Probe:
    """One probe in a process of its own: a fresh allocator, nothing left from the last probe."""
    job = {"net": load.name, "strategy": strategy, "batch": batch, "device": device,
           "budget": budget, "time_s": time_s, "plan_file": plan_file}
    proc = subprocess.run(launch.module_command(__name__, json.dumps(job)),
                          capture_output=True, text=True, check=False,
                          env=worker_environment(device))
    if proc.returncode:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"memplan probe {strategy} at batch {batch} exited with "
                           f"{proc.returncode}: {tail}")
    return Probe(**json.loads(proc.stdout.strip().splitlines()[-1]))


# --- the search -----------------------------------------------------------------------------
@dataclass
class Search:
    """The largest batch whose measured peak fits, and every probe made on the way."""

    batch: int
    probes: dict[int, Probe]

    @property
    def peak(self) -> int:
        return self.probes[self.batch].peak


def largest_measured_batch(measure: Callable[[int], Probe], budget: int, slope_bound: float,
                           max_batch: int = MAX_BATCH) -> Search:
    """The largest batch whose peak fits `budget`, found by probes that each stay within it as
    long as the peak grows by no more than `slope_bound` bytes per image: from the largest batch
    that fits, the next probe is as many images larger as the room left holds at that rate.
    The room shrinks by a constant factor each probe, so few are needed; the search stops when
    the room is less than one image at `slope_bound`, at most `slope_bound` / (the true growth)
    batches short of the true limit (none when the bound is the true growth). A probe that
    overshoots anyway (a bound too low) is recorded, and the search closes in below it by
    halves. ValueError when batch 1 does not fit."""
    probes: dict[int, Probe] = {1: measure(1)}
    if not probes[1].fits(budget):
        raise ValueError(f"even batch 1 needs {memory.format_size(probes[1].peak)}, over the "
                         f"budget of {memory.format_size(budget)}")
    over = max_batch + 1  # the smallest batch seen not to fit
    while True:
        best = max(b for b, p in probes.items() if p.fits(budget))
        room = int((budget - probes[best].peak) // max(slope_bound, 1.0))
        nxt = best + room if best + room < over else (best + over) // 2
        if nxt <= best:
            return Search(best, probes)
        probes[nxt] = measure(nxt)
        if not probes[nxt].fits(budget):
            over = nxt


def per_image_bound(load: Workload, batch: int = 8) -> float:
    """`SLOPE_MARGIN` × the bytes per image the plain step's model on `meta` holds at its
    peak: an upper bound on how fast the measured peak grows with the batch, for any strategy
    (recomputation and offloading only keep less)."""
    at = modelled_peak(load, {})
    return SLOPE_MARGIN * (at(2 * batch).total - at(batch).total) / batch


# --- the whole plan -------------------------------------------------------------------------
@dataclass
class StrategyResult:
    """One strategy: why it does not run here, or its limit, its probes (the search's, and the
    timed ones along its curve), its gradient error and the common batch."""

    strategy: str
    reason: str = ""
    search: Search | None = None
    gradient_error: float | None = None
    timed: dict[int, Probe] = field(default_factory=dict)
    tolerance: float = GRADIENT_TOLERANCE

    @property
    def largest(self) -> Probe | None:
        return self.timed.get(self.search.batch) if self.search else None


def curve(limit: int, common: int | None) -> list[int]:
    """The batches a strategy is timed at: 1, half its limit, the limit, and the common batch
    where it fits."""
    points = {1, max(1, limit // 2), limit}
    if common is not None and common <= limit:
        points.add(common)
    return sorted(points)


class Prober:
    """(batch, seconds to time) -> a strategy's probe, each in a process of its own (`probe`).
    A step's peak is read once per strategy and batch (`peaks`, shared by the strategies' probers):
    a step already probed is not probed again unless it is to be timed."""

    def __init__(self, load: Workload, strategy: str, device: str, budget: int,
                 peaks: dict[tuple[str, int], Probe]):
        self.load, self.strategy, self.device, self.budget = load, strategy, device, budget
        self.peaks = peaks

    def plain(self, how: str, b: int, time_s: float = 0.0) -> Probe:
        """Strategy `how`'s step at batch `b`, no plan applied."""
        if time_s or (how, b) not in self.peaks:
            self.peaks[how, b] = probe(self.load, how, b, self.device, self.budget, time_s)
        return self.peaks[how, b]

    def __call__(self, b: int, time_s: float = 0.0) -> Probe:
        return self.plain(self.strategy, b, time_s)

    def search(self, bound: float, max_batch: int) -> Search:
        """The strategy's largest batch: probes that stay within the budget as long as the
        peak grows by no more than `bound` per image (`largest_measured_batch`)."""
        return largest_measured_batch(self, self.budget, bound, max_batch)


class WorkspaceProber(Prober):
    """A strategy with `workspace`: the base strategy's step says what it leaves of the budget,
    then the step runs under the plan chosen for that room (saved in `folder`), its note saying
    what was chosen. Running a plan takes more than its workspaces (convbench's passes convert
    between torch and their arrays), so a plan that fills the room can overshoot the budget:
    then the plan for a quarter of the room is tried, then the plan for none (every pass left to
    torch, its layouts still the plan's), and last the base step itself, which fits: the
    strategy never trains a smaller batch than its base."""

    def __init__(self, load: Workload, strategy: str, device: str, budget: int,
                 peaks: dict[tuple[str, int], Probe], choices: Choices, folder: Path):
        super().__init__(load, strategy, device, budget, peaks)
        self.choices, self.folder, self.base = choices, folder, base(strategy)

    def __call__(self, b: int, time_s: float = 0.0) -> Probe:
        before = self.plain(self.base, b)
        if not before.fits(self.budget):
            return Probe(b, before.peak, oom=before.oom, note=f"{self.base} alone does not fit")
        left = self.budget - before.peak
        for room in (left, left // ROOM_SHRINK, 0):
            chosen, held = budgeted_plan(self.choices, b, room)
            path = chosen.save(self.folder / f"{self.strategy}-{b}-{room}.json")
            got = probe(self.load, self.strategy, b, self.device, self.budget, time_s,
                        str(path))
            if got.fits(self.budget):
                got.note = (f"workspace left {memory.format_size(left)}, planned for "
                            f"{memory.format_size(room)}, the plan holds "
                            f"{memory.format_size(held)}: {plan_summary(chosen)}")
                return got
        # Even the plan for no workspace overshot (its layouts cost conversions): the base
        # step, which fits, is what the strategy runs at this batch.
        got = self.plain(self.base, b, time_s)
        return Probe(got.batch, got.peak, got.times_ms, got.oom,
                     f"workspace left {memory.format_size(left)}: no plan fits, the "
                     f"{self.base} step runs")

    def search(self, bound: float, max_batch: int) -> Search:
        """The strategy fills whatever room its base step leaves, so its own peak says nothing
        of the next batch: its limit is its base's (searched on the base step's peaks, already
        read when the base was searched itself), where it always fits, and its one probe is
        there."""
        limit = largest_measured_batch(lambda b: self.plain(self.base, b), self.budget, bound,
                                       max_batch).batch
        return Search(limit, {limit: self(limit)})


def prober(load: Workload, strategy: str, device: str, budget: int, choices: Choices | None,
           folder: Path, peaks: dict[tuple[str, int], Probe]) -> Prober:
    """The prober of `strategy`: a `WorkspaceProber` where it chooses algorithms."""
    if WORKSPACE in strategy.split("+"):
        return WorkspaceProber(load, strategy, device, budget, peaks, choices, folder)
    return Prober(load, strategy, device, budget, peaks)


def plan(load: Workload, device: str, budget: int, strategies: list[str], *,
         time_s: float = 1.0, common_batch: int | None = None, max_batch: int = MAX_BATCH,
         algos: str = "all", log: Callable[[str], None] = lambda line: None
         ) -> tuple[list[StrategyResult], int | None]:
    """Every strategy measured on `device` under `budget`; (their results, the common batch:
    `common_batch`, else the largest batch every supported strategy fits). `algos` are the
    `workspace` strategy's candidates."""
    modelled = modelled_peak(load, {})(1).total
    if modelled > budget:
        raise ValueError(f"{load.name}'s training step at batch 1 needs about "
                         f"{memory.format_size(modelled)} (weights, gradients, optimizer state, "
                         f"activations), over the budget of {memory.format_size(budget)}")
    bound = per_image_bound(load)
    choices = None
    if any(WORKSPACE in s.split("+") and not unsupported(s, device) for s in strategies):
        choices = measure_choices(load, device, algos, log=log)
    out, probers, peaks = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in strategies:
            reason = unsupported(strategy, device)
            if reason:
                out.append(StrategyResult(strategy, reason))
                log(f"{strategy}: unsupported ({reason})")
                continue
            probers[strategy] = prober(load, strategy, device, budget, choices, Path(tmp),
                                       peaks)
            log(f"{strategy}: searching the largest batch")
            search = probers[strategy].search(bound, max_batch)
            error, tolerance = _gradient_check(load, strategy, device, choices, Path(tmp))
            out.append(StrategyResult(strategy, "", search, error, tolerance=tolerance))
            log(f"{strategy}: batch {search.batch} ({memory.format_size(search.peak)}) after "
                f"{len(search.probes)} probes")
        ran = [r for r in out if r.search]
        common = common_batch or (min(r.search.batch for r in ran) if ran else None)
        for r in ran:
            batches = curve(r.search.batch, common)
            log(f"{r.strategy}: timing batches {', '.join(map(str, batches))}")
            r.timed = {b: probers[r.strategy](b, time_s) for b in batches}
    return out, common


def _gradient_check(load: Workload, strategy: str, device: str, choices: Choices | None,
                    folder: Path) -> tuple[float, float]:
    """(the gradients' error against the plain step's, what it may be): with `workspace`,
    under the plan the whole budget allows at `CHECK_BATCH` (the fastest)."""
    if strategy == "none":
        return 0.0, GRADIENT_TOLERANCE
    if WORKSPACE not in strategy.split("+"):
        return gradient_error(load, strategy, device), GRADIENT_TOLERANCE
    fastest, _ = budgeted_plan(choices, CHECK_BATCH, 1 << 62)
    path = fastest.save(folder / f"{strategy}-check.json")
    return (gradient_error(load, strategy, device, plan_file=str(path)),
            plan_tolerance(fastest, GRADIENT_TOLERANCE))


if __name__ == "__main__":  # a probe of `probe`'s: memplan JOB
    print(json.dumps(asdict(probe_here(**json.loads(sys.argv[1])))), flush=True)
