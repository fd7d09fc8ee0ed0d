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
- `A+B`: both, e.g. `recompute-cheap+offload`.

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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import memory, memprofile, timing, trainstep
from .devices import backend_of
from .measurement import Measurement

STRATEGIES = ("none", "checkpoint", "recompute-cheap", "offload")
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


def step_function(model, opt, x, target, strategy: str) -> Callable[[], object]:
    """One training step of `model` under `strategy`: zero the gradients, forward (recomputed
    and offloaded as the strategy says), cross-entropy, backward, SGD update; returns the loss."""
    import torch
    import torch.nn.functional as F

    parts = set(strategy.split("+"))
    run = _stage_runner(parts)

    def step():
        opt.zero_grad(set_to_none=True)
        with (torch.autograd.graph.save_on_cpu(pin_memory=True) if "offload" in parts
              else contextlib.nullcontext()):
            loss = F.cross_entropy(model(x, run), target)
        loss.backward()
        opt.step()
        return loss

    return step


def _setup(net: str, batch: int, device: str):
    """The model, its SGD optimizer and a batch, seeded as `trainstep` seeds them."""
    import torch

    torch.manual_seed(0)
    model = trainstep.build_model(net).to(device)
    x, target = trainstep.example_batch(net, batch, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, opt, x, target


def gradient_error(net: str, strategy: str, device: str, batch: int = CHECK_BATCH) -> float:
    """‖g − g_plain‖ / ‖g_plain‖ over all parameters' gradients after one step's backward,
    from the same weights and data (in this process)."""
    import torch

    grads = []
    for how in ("none", strategy):
        model, opt, x, target = _setup(net, batch, device)
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

    def fits(self, budget: int) -> bool:
        return not self.oom and self.peak <= budget

    @property
    def images_per_s(self) -> float | None:
        if not self.times_ms:
            return None
        return self.batch / (Measurement(tuple(self.times_ms)).median / 1e3)


def probe_here(net: str, strategy: str, batch: int, device: str, budget: int,
               time_s: float) -> Probe:
    """The probe, in this process (`probe` runs it in a fresh one). On the GPU torch's
    allocator is held to the budget, so a step beyond it fails instead of taking more."""
    import torch

    backend = backend_of(device)
    if backend == "cuda":
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total))
    try:
        with memory.trace(backend) as trace:
            model, opt, x, target = _setup(net, batch, device)
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
          time_s: float = 0.0) -> Probe:
    """One probe in a process of its own: a fresh allocator, nothing left from the last probe."""
    job = {"net": net, "strategy": strategy, "batch": batch, "device": device,
           "budget": budget, "time_s": time_s}
    proc = subprocess.run([sys.executable, "-m", "convbench.memplan", json.dumps(job)],
                          capture_output=True, text=True, check=False,
                          env=trainstep.worker_environment(device))
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


def plan(net: str, device: str, budget: int, strategies: list[str], *, time_s: float = 1.0,
         common_batch: int | None = None, max_batch: int = MAX_BATCH,
         log: Callable[[str], None] = lambda line: None) -> tuple[list[Result], int | None]:
    """Every strategy measured on `device` under `budget`; (their results, the common batch:
    `common_batch`, else the largest batch every supported strategy fits)."""
    modelled = memprofile.modelled_peak(net, {})(1).total
    if modelled > budget:
        raise ValueError(f"{net}'s training step at batch 1 needs about "
                         f"{memory.format_size(modelled)} (weights, gradients, optimizer state, "
                         f"activations), over the budget of {memory.format_size(budget)}")
    bound = per_image_bound(net)
    out = []
    for strategy in strategies:
        reason = unsupported(strategy, device)
        if reason:
            out.append(Result(strategy, reason))
            log(f"{strategy}: unsupported ({reason})")
            continue
        log(f"{strategy}: searching the largest batch")
        search = largest_batch(lambda b, s=strategy: probe(net, s, b, device, budget), budget,
                               bound, max_batch)
        error = gradient_error(net, strategy, device) if strategy != "none" else 0.0
        out.append(Result(strategy, "", search, error))
        log(f"{strategy}: batch {search.batch} ({memory.format_size(search.peak)}) after "
            f"{len(search.probes)} probes")
    ran = [r for r in out if r.search]
    common = common_batch or (min(r.search.batch for r in ran) if ran else None)
    for r in ran:
        log(f"{r.strategy}: timing batches {', '.join(map(str, curve(r.search.batch, common)))}")
        r.timed = {b: probe(net, r.strategy, b, device, budget, time_s)
                   for b in curve(r.search.batch, common)}
    return out, common


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
                        "times_ms": " ".join(f"{t:.6g}" for t in p.times_ms)})
    return out


def _mib(nbytes: float | None) -> str:
    return "" if nbytes is None else f"{nbytes / 2**20:.0f}"


def _rate(p: Probe | None) -> str:
    return "" if p is None or p.images_per_s is None else f"{p.images_per_s:.3g}"


def table(results: list[Result], common: int | None) -> str:
    from tabulate import tabulate

    body = []
    for r in results:
        if r.search is None:
            body.append([r.strategy, "unsupported", "", "", "", "", "", r.reason])
            continue
        at = r.timed.get(common)
        body.append([r.strategy, r.search.batch, _mib(r.search.peak), _rate(r.largest),
                     _mib(at.peak if at else None), _rate(at), f"{r.gradient_error:.1e}",
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
        (f"gradient error: against the plain step's at batch {CHECK_BATCH} (tolerance "
         f"{GRADIENT_TOLERANCE:g})"),
    ]
    lines = [f"# memplan: {net} on {env.get('device', device)}", "",
             *[f"- {f}" for f in facts], "", table(results, common), "",
             "![images/s against batch size](memplan.png)"]
    return "\n".join(lines) + "\n"


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
