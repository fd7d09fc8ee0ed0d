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

from . import (
    apply,
    devices,
    memory,
    memprofile,
    opcount,
    registry,
    results,
    runner,
    timing,
    trainstep,
    tune,
    verify,
)
from .advice import advise, build_plan
from .devices import backend_of
from .measurement import Measurement
from .plan import Constraints, Plan, current_env_key
from .problem import LAYOUTS

STRATEGIES = ("none", "checkpoint", "recompute-cheap", "offload", "workspace")
WORKSPACE = "workspace"
#: The batch the conv passes are measured at for the `workspace` strategy's choices.
REFERENCE_BATCH = 2
#: A plan that overshoots the budget is chosen again for the room divided by this.
ROOM_SHRINK = 4
#: Relative gradient error a strategy may introduce (it reorders nothing: recomputation repeats
#: the same arithmetic, offloading copies bits; this is fp32 rounding's room).
GRADIENT_TOLERANCE = 1e-5
#: The bound on the per-image growth of the peak the search steps by: this many times what the
#: model on `meta` keeps per image (the measured growth of AlexNet's step on the CPU was 1.18
#: times that: allocator and temporaries the model does not see). Each probe leaves at most
#: 1 - 1/1.18/1.5 = 44% of the room before it.
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


def step_function(model, opt, x, target, strategy: str) -> Callable[[], object]:
    """One training step of `model` under `strategy`: zero the gradients, forward (recomputed
    and offloaded as the strategy says), the loss (`trainstep.loss`), backward, SGD update;
    returns the loss. The `workspace` part is the plan applied to the model beforehand
    (`_setup`). A catalog model runs its stages through the strategy; a user's model has its
    modules wrapped (`_wrap_modules`)."""
    import torch

    parts = set(strategy.split("+"))
    staged = hasattr(model, "stages")
    run = _stage_runner(parts)
    if not staged:
        _wrap_modules(model, parts)

    def step():
        opt.zero_grad(set_to_none=True)
        with (torch.autograd.graph.save_on_cpu(pin_memory=True) if "offload" in parts
              else contextlib.nullcontext()):
            loss = trainstep.loss(model(x, run) if staged else model(x), target)
        loss.backward()
        opt.step()
        return loss

    return step


def _setup(net: str, batch: int, device: str, plan_file: str | None = None):
    """The model (running `plan_file`'s plan, if given), its SGD optimizer and a batch, seeded
    as `trainstep` seeds them."""
    import torch

    torch.manual_seed(0)
    model = trainstep.build_model(net).to(device)
    if plan_file:
        apply.apply(model, plan_file)
    x, target = trainstep.example_batch(net, batch, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, opt, x, target


def gradient_error(net: str, strategy: str, device: str, batch: int = CHECK_BATCH,
                   plan_file: str | None = None) -> float:
    """‖g − g_plain‖ / ‖g_plain‖ over all parameters' gradients after one step's backward,
    from the same weights and data (in this process); the strategy's step runs `plan_file`'s
    plan if given."""
    import torch

    grads = []
    for how, plan in (("none", None), (strategy, plan_file)):
        model, opt, x, target = _setup(net, batch, device, plan)
        step_function(model, opt, x, target, how)()
        grads.append(torch.cat([p.grad.flatten().double() for p in model.parameters()]))
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
    """The probe, in this process (`probe` runs it in a fresh one). On the GPU torch's
    allocator is held to the budget, so a step beyond it fails instead of taking more."""
    import torch

    backend = backend_of(device)
    if backend == "cuda":
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total))
    try:
        with memory.trace(backend) as trace:
            model, opt, x, target = _setup(net, batch, device, plan_file)
            step = step_function(model, opt, x, target, strategy)
            step()  # the momentum buffers appear here
            trace.mark()
            step()
    except torch.cuda.OutOfMemoryError:
        return Probe(batch, budget + 1, oom=True)
    peak = max(p.peak for p in trace.points)
    times = list(timing.timer_for(backend)(step, time_s).times_ms) if time_s > 0 else []
    return Probe(batch, peak, times)


def probe(net: str, strategy: str, batch: int, device: str, budget: int,
          time_s: float = 0.0, plan_file: str | None = None) -> Probe:
    """One probe in a process of its own: a fresh allocator, nothing left from the last probe."""
    job = {"net": net, "strategy": strategy, "batch": batch, "device": device,
           "budget": budget, "time_s": time_s, "plan_file": plan_file}
    proc = subprocess.run([sys.executable, "-m", "convbench.memplan", json.dumps(job)],
                          capture_output=True, text=True, check=False,
                          env=trainstep.worker_environment(device))
    if proc.returncode:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"memplan probe {strategy} at batch {batch} exited with "
                           f"{proc.returncode}: {tail}")
    return Probe(**json.loads(proc.stdout.strip().splitlines()[-1]))


# --- workspace choice -----------------------------------------------------------------------
@dataclass
class Choices:
    """The rows of every algorithm and layout of the model's conv passes, measured and verified
    at batch `reference` on `backend`: what the `workspace` strategy chooses from."""

    rows: list[dict]
    reference: int
    backend: str


def measure_choices(net: str, device: str, algos: str = "all", budget_s: float | None = None,
                    log: Callable[[str], None] = lambda line: None) -> Choices:
    """Every algorithm × layout of each conv pass the model's training step runs (`find_convs`:
    no bwd_data for the first layer), measured by the runner at `REFERENCE_BATCH` (for
    `budget_s` seconds each: by default the device's, on the CPU train-step's tuning budget,
    so the ranking is made in seconds, not minutes)."""
    backend = backend_of(device)
    algo_list = registry.expand_algos(algos, backend)
    model = trainstep.build_model(net).to(device)
    x, _ = trainstep.example_batch(net, REFERENCE_BATCH, device)
    sites, _ = tune.find_convs(model, x)
    cases = [runner.Case(net, site.name, site.problem, algo, backend, pass_, layout, "fp32")
             for site in sites for pass_ in site.passes for layout in LAYOUTS
             for algo in algo_list]
    log(f"workspace: measuring {len(cases)} conv passes at batch {REFERENCE_BATCH}")
    rows: list[dict] = []
    default = (trainstep.CPU_TUNE_BUDGET_S if backend == "numpy"
               else devices.of_backend(backend).budget_s)
    runner.run(cases, budget_s or default, on_row=rows.append)
    return Choices(rows, REFERENCE_BATCH, backend)


def _at_batch(row: dict, batch: int, choices: Choices) -> dict:
    """A reference row as the choice at `batch` sees it: its problem at that batch, its
    workspace as the implementation declares it there (a measured peak, for an algorithm that
    declares none, grown in proportion to the batch); its time stays the reference's."""
    problem = results.problem_from_row(row).with_batch(batch)
    out = {**row, **problem.axis_fields()}
    if row["status"] == "ok":
        impl = registry.get(row["algo"], choices.backend)
        out["workspace_bytes"] = opcount.workspace_bytes(impl, problem, row["pass"],
                                                         row["layout"], row["precision"])
        if out["workspace_bytes"] is None and row.get("peak_bytes") is not None:
            out["peak_bytes"] = float(row["peak_bytes"]) * batch / choices.reference
    return out


def held_workspace(plan: Plan) -> int:
    """Bytes of workspace the plan's convbench passes hold together (each from its first call
    on: `functional.run` keeps a prepared pass with its buffers)."""
    problems = {lp.layer: lp.problem for lp in plan.layers}
    return sum(opcount.workspace_bytes(registry.get(algo, backend), problems[layer], pass_,
                                       layout, plan.precision) or 0
               for (layer, pass_), (algo, backend, layout)
               in memprofile.plan_algos(plan).items())


def budgeted_plan(choices: Choices, batch: int, room: int) -> tuple[Plan, int]:
    """The advisor's plan at `batch` whose held workspace fits `room`: the largest per-pass
    workspace limit (bisected over the workspaces the choices have) under which the plan's
    passes fit together; (the plan, the bytes it holds). A limit of 0 always fits: every pass
    then needs no workspace, or is left to torch."""
    df = results.frame([_at_batch(r, batch, choices) for r in choices.rows])
    used = df["workspace_bytes"].fillna(df["peak_bytes"]).dropna()
    limits = sorted({0, *(int(v) for v in used)})
    env = current_env_key(choices.backend)

    def planned(limit: int) -> tuple[Plan, int]:
        chosen = build_plan(advise(df, Constraints(limit, False, None), "fp32"), env, None,
                            measurements=[])
        return chosen, held_workspace(chosen)

    lo, hi = 0, len(limits) - 1  # limits[lo] fits; find the largest that does
    best = planned(limits[lo])
    while lo < hi:
        mid = (lo + hi + 1) // 2
        candidate = planned(limits[mid])
        if candidate[1] <= room:
            lo, best = mid, candidate
        else:
            hi = mid - 1
    return best


def plan_summary(plan: Plan) -> str:
    """`conv1 nchw: gemm, -, direct; ...`: each layer's layout and its passes' algorithms."""
    return "; ".join(f"{lp.layer} {lp.layout}: " + ", ".join(
        c.algo if c else "torch" for c in lp.passes.values()) for lp in plan.layers)


def plan_tolerance(plan: Plan) -> float:
    """The loosest verification tolerance among the plan's passes: what its gradients may
    differ by from the plain step's (FFT and Winograd round differently from direct sums)."""
    return max([GRADIENT_TOLERANCE, *(verify.tolerance(c.algo, plan.precision, lp.problem, p)
                                      for lp in plan.layers for p, c in lp.passes.items()
                                      if c is not None)])


# --- the search -----------------------------------------------------------------------------
@dataclass
class Search:
    """The largest batch whose measured peak fits, and every probe made on the way."""

    batch: int
    probes: dict[int, Probe]

    @property
    def peak(self) -> int:
        return self.probes[self.batch].peak


def largest_batch(measure: Callable[[int], Probe], budget: int, slope_bound: float,
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


def per_image_bound(net: str, batch: int = 8) -> float:
    """`SLOPE_MARGIN` × the bytes per image the plain step's model on `meta` holds at its
    peak: an upper bound on how fast the measured peak grows with the batch, for any strategy
    (recomputation and offloading only keep less)."""
    at = memprofile.modelled_peak(net, {})
    return SLOPE_MARGIN * (at(2 * batch).total - at(batch).total) / batch


# --- the whole plan -------------------------------------------------------------------------
@dataclass
class Result:
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


def _prober(net: str, strategy: str, device: str, budget: int, choices: Choices | None,
            folder: Path, peaks: dict[tuple[str, int], Probe]) -> Callable[..., Probe]:
    """(batch, seconds to time) -> the strategy's probe. With `workspace`, more: the base
    strategy's step says what it leaves of the budget, then the step runs under the plan
    chosen for that room (saved in `folder`), its note saying what was chosen. Running a plan
    takes more than its workspaces (convbench's passes convert between torch and their arrays),
    so a plan that fills the room can overshoot the budget: then the plan for a quarter of the
    room is tried, then the plan for none (every pass left to torch, its layouts still the
    plan's), and last the base step itself, which fits: the strategy never trains a smaller
    batch than its base. A
    step's peak is read once per strategy and batch (`peaks`, shared by the strategies): the
    base step's at a batch its own search probed is not probed again."""
    def plain(how: str, b: int, time_s: float = 0.0) -> Probe:
        if time_s or (how, b) not in peaks:
            peaks[how, b] = probe(net, how, b, device, budget, time_s)
        return peaks[how, b]

    if WORKSPACE not in strategy.split("+"):
        return lambda b, time_s=0.0: plain(strategy, b, time_s)

    def run(b: int, time_s: float = 0.0) -> Probe:
        before = plain(base(strategy), b)
        if not before.fits(budget):
            return Probe(b, before.peak, oom=before.oom,
                         note=f"{base(strategy)} alone does not fit")
        left = budget - before.peak
        for room in (left, left // ROOM_SHRINK, 0):
            chosen, held = budgeted_plan(choices, b, room)
            path = chosen.save(folder / f"{strategy}-{b}-{room}.json")
            got = probe(net, strategy, b, device, budget, time_s, str(path))
            if got.fits(budget):
                got.note = (f"workspace left {memory.format_size(left)}, planned for "
                            f"{memory.format_size(room)}, the plan holds "
                            f"{memory.format_size(held)}: {plan_summary(chosen)}")
                return got
        # Even the plan for no workspace overshot (its layouts cost conversions): the base
        # step, which fits, is what the strategy runs at this batch.
        got = plain(base(strategy), b, time_s)
        return Probe(got.batch, got.peak, got.times_ms, got.oom,
                     f"workspace left {memory.format_size(left)}: no plan fits, the "
                     f"{base(strategy)} step runs")

    run.base = lambda b: plain(base(strategy), b)
    return run


def plan(net: str, device: str, budget: int, strategies: list[str], *, time_s: float = 1.0,
         common_batch: int | None = None, max_batch: int = MAX_BATCH, algos: str = "all",
         log: Callable[[str], None] = lambda line: None) -> tuple[list[Result], int | None]:
    """Every strategy measured on `device` under `budget`; (their results, the common batch:
    `common_batch`, else the largest batch every supported strategy fits). `algos` are the
    `workspace` strategy's candidates."""
    modelled = memprofile.modelled_peak(net, {})(1).total
    if modelled > budget:
        raise ValueError(f"{net}'s training step at batch 1 needs about "
                         f"{memory.format_size(modelled)} (weights, gradients, optimizer state, "
                         f"activations), over the budget of {memory.format_size(budget)}")
    bound = per_image_bound(net)
    choices = None
    if any(WORKSPACE in s.split("+") and not unsupported(s, device) for s in strategies):
        choices = measure_choices(net, device, algos, log=log)
    out, probers, peaks = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in strategies:
            reason = unsupported(strategy, device)
            if reason:
                out.append(Result(strategy, reason))
                log(f"{strategy}: unsupported ({reason})")
                continue
            probers[strategy] = _prober(net, strategy, device, budget, choices, Path(tmp),
                                        peaks)
            log(f"{strategy}: searching the largest batch")
            search = _search(probers[strategy], budget, bound, max_batch)
            error, tolerance = _gradient_check(net, strategy, device, choices, Path(tmp))
            out.append(Result(strategy, "", search, error, tolerance=tolerance))
            log(f"{strategy}: batch {search.batch} ({memory.format_size(search.peak)}) after "
                f"{len(search.probes)} probes")
        ran = [r for r in out if r.search]
        common = common_batch or (min(r.search.batch for r in ran) if ran else None)
        for r in ran:
            batches = curve(r.search.batch, common)
            log(f"{r.strategy}: timing batches {', '.join(map(str, batches))}")
            r.timed = {b: probers[r.strategy](b, time_s) for b in batches}
    return out, common


def _search(prober: Callable[..., Probe], budget: int, bound: float,
            max_batch: int) -> Search:
    """The strategy's largest batch. A `workspace` strategy fills whatever room its base step
    leaves, so its own peak says nothing of the next batch: its limit is its base's (searched
    on the base step's peaks, already read when the base was searched itself), where it always
    fits (`_prober`), and its one probe is there."""
    if not hasattr(prober, "base"):
        return largest_batch(prober, budget, bound, max_batch)
    limit = largest_batch(prober.base, budget, bound, max_batch).batch
    return Search(limit, {limit: prober(limit)})


def _gradient_check(net: str, strategy: str, device: str, choices: Choices | None,
                    folder: Path) -> tuple[float, float]:
    """(the gradients' error against the plain step's, what it may be): with `workspace`,
    under the plan the whole budget allows at `CHECK_BATCH` (the fastest)."""
    if strategy == "none":
        return 0.0, GRADIENT_TOLERANCE
    if WORKSPACE not in strategy.split("+"):
        return gradient_error(net, strategy, device), GRADIENT_TOLERANCE
    fastest, _ = budgeted_plan(choices, CHECK_BATCH, 1 << 62)
    path = fastest.save(folder / f"{strategy}-check.json")
    return gradient_error(net, strategy, device, plan_file=str(path)), plan_tolerance(fastest)


# --- output ---------------------------------------------------------------------------------
def rows(results: list[Result]) -> list[dict]:
    """One row per strategy and probed batch: peak bytes and images/s."""
    out = []
    for r in results:
        if r.search is None:
            out.append({"strategy": r.strategy, "status": "unsupported", "reason": r.reason})
            continue
        for batch in sorted({*r.search.probes, *r.timed}):
            p = r.timed.get(batch) or r.search.probes[batch]
            out.append({"strategy": r.strategy, "status": "ok" if not p.oom else "oom",
                        "reason": "", "batch": batch, "peak_bytes": None if p.oom else p.peak,
                        "images_per_s": p.images_per_s, "largest": batch == r.search.batch,
                        "search_probe": batch in r.search.probes,
                        "gradient_error": r.gradient_error,
                        "gradient_tolerance": r.tolerance,
                        "times_ms": " ".join(f"{t:.6g}" for t in p.times_ms),
                        "note": p.note})
    return out


def _mib(nbytes: float | None) -> str:
    return "" if nbytes is None else f"{nbytes / 2**20:.0f}"


def _rate(p: Probe | None) -> str:
    return "" if p is None or p.images_per_s is None else f"{p.images_per_s:.3g}"


def table(results: list[Result], common: int | None) -> str:
    from .tables import tabulate

    body = []
    for r in results:
        if r.search is None:
            body.append([r.strategy, "unsupported", "", "", "", "", "", r.reason])
            continue
        at = r.timed.get(common)
        body.append([r.strategy, r.search.batch, _mib(r.search.peak), _rate(r.largest),
                     _mib(at.peak if at else None), _rate(at),
                     f"{r.gradient_error:.1e} (<= {r.tolerance:.0e})",
                     f"{len(r.search.probes)} search probes"])
    return tabulate(body, headers=["strategy", "largest batch", "peak MiB", "images/s",
                                   f"peak MiB at {common}", f"images/s at {common}",
                                   "gradient error", "note"],
                    tablefmt="github", disable_numparse=True)


def markdown(net: str, device: str, budget: int, results: list[Result], common: int | None,
             env: dict) -> str:
    facts = [
        (f"budget: {memory.format_size(budget)} for the whole training step (weights, "
         "gradients, SGD momentum, the batch, what is kept for backward, temporaries)"),
        (f"peaks read from the allocators ({memory.trace(backend_of(device)).method}) in a "
         "fresh process per probe, from before the model exists"),
        f"images/s: the median of timed steps at that batch; common batch {common}",
        (f"gradient error: against the plain step's at batch {CHECK_BATCH}, and its tolerance: "
         f"{GRADIENT_TOLERANCE:g} where the same arithmetic is repeated or copied, the loosest "
         "of the chosen algorithms' verification tolerances under a plan"),
    ]
    lines = [f"# memplan: {net} on {env.get('device', device)}", "",
             *[f"- {f}" for f in facts], "", table(results, common), "",
             *_workspace_notes(results), "![images/s against batch size](memplan.png)"]
    return "\n".join(lines) + "\n"


def _workspace_notes(results: list[Result]) -> list[str]:
    """What the `workspace` strategies chose at their largest batch and at the smallest."""
    out = []
    for r in results:
        if r.search is None or WORKSPACE not in r.strategy.split("+"):
            continue
        if not out:
            out = ["## Workspace choice", "",
                   (f"The conv passes were measured at batch {REFERENCE_BATCH}, every algorithm "
                    "and layout; at each batch the plan takes the fastest whose workspaces fit "
                    "together in what the step without it left of the budget."), ""]
        for batch in (min(r.timed), r.search.batch):
            out.append(f"- {r.strategy} at batch {batch}: {r.timed[batch].note}")
        out.append("")
    return out


def plot(results: list[Result], path: Path, title: str) -> str | None:
    """Images/s against batch size per strategy, each line ending at its largest batch."""
    from . import report

    plt = report.pyplot()
    if plt is None:
        return report.NO_MATPLOTLIB
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    for r in results:
        if r.search is None:
            continue
        points = [(b, p.images_per_s) for b, p in sorted(r.timed.items()) if p.images_per_s]
        if points:
            ax.plot(*zip(*points), marker="o", label=f"{r.strategy} (≤ {r.search.batch})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("images/s")
    ax.set_title(title)
    report.save_figure(fig, path)
    return None


def write(folder: Path, text: str, results: list[Result], env: dict, title: str) -> list[str]:
    """memplan.md, memplan.csv, memplan.png and env.json in `folder`."""
    import pandas as pd

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "memplan.md").write_text(text)
    pd.DataFrame(rows(results)).to_csv(folder / "memplan.csv", index=False)
    (folder / "env.json").write_text(json.dumps(env, indent=1) + "\n")
    note = plot(results, folder / "memplan.png", title)
    return ["memplan.md", "memplan.csv", "env.json"] + ([] if note else ["memplan.png"])


if __name__ == "__main__":  # a probe of `probe`'s: memplan JOB
    print(json.dumps(asdict(probe_here(**json.loads(sys.argv[1])))), flush=True)
