"""The whole step decides: a plan's replacements kept only where the model's step confirms them.

A layer's time in isolation predicts its time in the model; it is not the fact. In a model a
replaced layer also pays the module call, the autograd Function, the tensor/array hand-off, the
thread pools handing over, and caches its neighbours left cold, while torch's own convolution
runs as the model calls it. So `confirm` times the model's whole step (training: forward, a
loss, backward; or inference: forward without gradients, in eval mode; by default the mode the
model is in, `FOLLOW`) with a plan applied and without it, interleaved in rounds in one process
(`timing.time_steps`, so drifting load falls on both; on a GPU each step from an idle device,
so a step heavy on the host is not hidden behind the other's queued work), and keeps a plan's
changes only where the step is faster beyond noise (`faster`: the 95% interval of the ratio of
their medians, paired by round, below 1 by `MARGIN`):

1. the whole plan against torch's default;
2. where the plan changes layouts as well as algorithms, its layouts alone (torch's own
   algorithms in each layer's layout: `layouts_only`) against torch's default; confirmed, they
   are kept, and the replacements must beat torch in those layouts: the whole plan against its
   layouts alone. A layout can speed torch's other operations (channels_last batch norm) by as
   much as a plan's replacements seem to, and then the replacements had no gain of their own;
   and a replacement tried without its layout paid the conversions into it and back;
3. the whole plan kept if it was faster than what it is weighed against (its layouts alone
   where they were kept, else torch's default); else its replaced layers in order of
   predicted gain (torch's measured time less the plan's, from the plan's own measurements,
   torch in the layout kept), in at most `GROUPS` groups, each added to what is kept only if
   the step with it is faster than the step without it beyond noise;
4. where a group was kept, what was kept against torch's default once more: unless faster
   beyond noise, nothing is kept, and the plan runs torch's default everywhere;
5. the change a user tries first, all channels_last (`channels_last`: every layer NHWC, torch's
   own algorithms), against what was kept (torch's default where nothing was): faster beyond
   noise, the plan becomes it (measured against torch's default once more where something else
   was kept, as in 4), so a plan is never behind that one-line change.

The machine is read as `bench` reads it: a comparison whose steps' repetitions were held back
(`busy`: threads kept off their cores by another process or the hypervisor's steal, or the
GPU's clocks held down) is measured again, `TRIES` times in all. One the machine stayed busy
through decides nothing: the confirmation stops there, and the plan keeps what was confirmed
against torch's default before it (else torch's default), saying so (`StepCheck.busy`). On a
busy machine the times measure the load as much as the plan: interleaving spreads the load
over both steps, but not alike (a step whose threads wait on each other loses more).

A plan confirmed so is never slower than torch's default beyond noise, on this machine, for
this input. What was measured goes into the plan (`StepCheck`): the speed-up and its interval,
the two steps' times and, on a GPU, their hosts' times, the layers kept and dropped, the
alternative that won or the busy machine that stopped it, and `apply`'s table says it. Each
trial applies the plan to a deep copy of the model (the caller's model is never changed). On a
GPU both steps run in one process under the plan's cuDNN flags (torch's plan cache is per
thread and keyed without the benchmark flag, and backward runs on autograd's device thread for
both), so there the figure is against torch with the plan's flags, and `cudnn.benchmark=True`
cannot be weighed as an alternative in the same process: `convbench train-step` compares
against torch's own flags and against `cudnn.benchmark` in processes of their own.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable
from typing import NamedTuple

from ..core import stats
from ..core.fmt import first_line
from ..core.results import TIMED
from ..measure import timing
from .plan import LayerPlan, Plan, StepCheck

#: The step modes a plan can be confirmed for.
MODES = ("train", "inference")
#: The step mode that follows the model's own (`mode_of`): the caller put a model in eval mode
#: to run it so, and a training step could not even run on some inputs (batch 1 with batch norm).
FOLLOW = "model"
#: Seconds of timed steps per contender in each comparison.
STEP_BUDGET_S = 2.0
#: At most this many groups of changed layers are tried one by one when the whole plan is not
#: confirmed: each trial costs a comparison of two whole steps.
GROUPS = 4
#: torch's own algorithm on each backend: the default a replacement is weighed against.
DEFAULT_ALGO = {"numpy": "torch-cpu", "cuda": "cudnn"}
#: A step is faster only where its ratio's interval lies below 1 by this much (`faster`).
MARGIN = 0.02
#: Tries of a comparison in all, while the machine is busy through its repetitions (`compare`).
TRIES = 3
#: The name of the alternative that is all channels_last (`channels_last`), as a check says it.
CHANNELS_LAST = "channels_last"


def changed_layers(plan: Plan) -> list[LayerPlan]:
    """The layers the plan changes from torch's default: a pass chosen, or another layout."""
    return [lp for lp in plan.layers if lp.layout != plan.input_layout or replaced(lp)]


def predicted_gain_ms(plan: Plan, lp: LayerPlan, layout: str = "nchw") -> float:
    """torch's measured time for the layer's passes (its default algorithm, in `layout`) less
    the plan's choices' times (torch's inexact time too: it is the baseline); 0 where a time is
    missing."""
    default = DEFAULT_ALGO.get(plan.backend)
    gain = 0.0
    for pass_, choice in lp.passes.items():
        if choice is None:
            continue
        torch_ms = [e["median_ms"] for e in plan.measurements
                    if e["problem"] == lp.problem and e["pass"] == pass_
                    and e["algo"] == default and e["layout"] == layout and e["status"] in TIMED
                    and e.get("median_ms") is not None]
        if torch_ms:
            gain += min(torch_ms) - choice.median_ms
    return gain


def default_layer(plan: Plan, lp: LayerPlan, layouts: bool = False) -> LayerPlan:
    """`lp` as torch's default runs it: no pass chosen, in the plan's input layout (or in the
    layer's own, with `layouts`)."""
    return LayerPlan(lp.layer, lp.problem, lp.layout if layouts else plan.input_layout,
                     {p: None for p in lp.passes})


def subplan(plan: Plan, keep: set[str], layouts: bool = False) -> Plan:
    """The plan with only the layers named in `keep` changed; the others torch's default (in
    their planned layouts, with `layouts`)."""
    return dataclasses.replace(plan, layers=[
        lp if lp.layer in keep else default_layer(plan, lp, layouts) for lp in plan.layers])


def layouts_only(plan: Plan) -> Plan:
    """The plan's layouts with torch's own algorithms in every layer."""
    return subplan(plan, set(), layouts=True)


def channels_last(plan: Plan) -> Plan:
    """Every layer in `nhwc` with torch's own algorithms: the model in `torch.channels_last`,
    what a user tries first. The input stays as the caller gives it (a plan cannot lay it
    out): the first layer's channels_last weight makes torch convert it."""
    return dataclasses.replace(plan, layers=[
        LayerPlan(lp.layer, lp.problem, "nhwc", {p: None for p in lp.passes})
        for lp in plan.layers])


def replaced(lp: LayerPlan) -> bool:
    """Whether the layer runs one of our algorithms in some pass."""
    return any(c is not None for c in lp.passes.values())


def mode_of(model) -> str:
    """The step a model is set up for: train in training mode, inference in eval mode."""
    return "train" if model.training else "inference"


def step_function(model, example_input, mode: str) -> Callable[[], None]:
    """One step of `model` on `example_input`: training (gradients freed, forward, the mean of
    the output as the loss, backward) or inference (forward without gradients)."""
    import torch

    if mode == "inference":
        def infer() -> None:
            with torch.no_grad():
                model(example_input)
        return infer

    def train() -> None:
        for p in model.parameters():
            p.grad = None
        out = model(example_input)
        out = out[0] if isinstance(out, (tuple, list)) else out
        out.float().mean().backward()
    return train


def _applied(model, plan: Plan, mode: str):
    """A deep copy of `model` running `plan` (no check: the plan's algorithms were verified
    when measured), in the mode's train/eval state."""
    from .apply import apply

    trial = copy.deepcopy(model)
    trial.train(mode == "train")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        apply(trial, plan)
    return trial


def _with_flags(plan: Plan, fn: Callable[[], None]) -> Callable[[], None]:
    """`fn` under the plan's cuDNN flags (see the module docstring)."""
    import torch

    def call() -> None:
        torch.backends.cudnn.benchmark = plan.cudnn["benchmark"]
        torch.backends.cudnn.deterministic = plan.cudnn["deterministic"]
        fn()
    return call


class Compared(NamedTuple):
    """Two models' whole steps timed side by side: the first's median step time over the
    second's with its interval (paired by round), each one's median step time (ms), on a GPU
    each one's host's median time to issue a step (ms; None on the CPU, where the step's time
    is the host's), and what held the machine back through every try (`busy`; "": a try was
    quiet, and these are its times)."""

    ratio: stats.Ratio
    fast_ms: float
    slow_ms: float
    fast_host_ms: float | None
    slow_host_ms: float | None
    busy: str = ""

    def text(self) -> str:
        """`12.3 / 14.1 ms`, and on a GPU `(host 9.8 / 4.2 ms)`."""
        host = (f" (host {self.fast_host_ms:.4g} / {self.slow_host_ms:.4g} ms)"
                if self.fast_host_ms is not None else "")
        return f"{self.fast_ms:.4g} / {self.slow_ms:.4g} ms{host}"


def busy(timed: list[timing.Timed]) -> str:
    """What held steps' repetitions back, by the rules a row of `bench` is flagged busy by
    (`ranking.busy`): threads kept off their cores by other processes or the hypervisor's
    steal (`Measurement.contended`), or the GPU's clocks held down (`Timed.throttled`: a GPU's
    rounds read no host contention); "" where nothing did."""
    why = []
    if any(t.total.contended for t in timed):
        why.append("contended: other processes or the hypervisor held the cores")
    throttled = sorted({r for t in timed for r in t.throttled})
    if throttled:
        why.append(f"throttled: the GPU's clocks held down ({', '.join(throttled)})")
    return "; ".join(why)


def compare(plan: Plan, fast_model, slow_model, example_input, mode: str,
            budget_s: float, tries: int = TRIES,
            log: Callable[[str], None] | None = None) -> Compared:
    """`fast_model`'s step against `slow_model`'s, both timed interleaved in rounds as whole
    steps (`timing.time_steps`: on a GPU each from an idle device, so neither hides its host's
    time behind the other's queued work). Timed while the machine was busy (`busy`), they are
    timed again, `tries` times in all: the first quiet try is returned, else the last, saying
    what held it back."""
    contenders = [timing.Contender.call(_with_flags(plan, step_function(m, example_input, mode)))
                  for m in (fast_model, slow_model)]
    for attempt in range(1, tries + 1):
        timed = timing.time_steps(contenders, budget_s, plan.backend)
        why = busy(timed)
        if not why:
            break
        if log and attempt < tries:
            log(f"{mode} step: timed while the machine was busy ({why}); timing it again "
                f"(try {attempt + 1} of {tries})")
    a, b = (t.total.times_ms for t in timed)
    n = min(len(a), len(b))
    return Compared(stats.ratio(a[:n], b[:n], paired=True),
                    *(float(t.total.median) for t in timed),
                    *(t.total.host_median for t in timed), why)


def step_mode(model, example_input, mode: str) -> str:
    """`mode` (`FOLLOW`: the model's own, `mode_of`), once a step of a copy of `model` in it
    has run on `example_input`. ValueError for an unknown mode, and, in one line naming the
    fix, where torch refuses the input (a ValueError: batch norm's training step on one value
    per channel, at batch 1), rather than torch's traceback from the middle of the timing."""
    if mode == FOLLOW:
        mode = mode_of(model)
    if mode not in MODES:
        raise ValueError(f"unknown step mode {mode!r}; valid: {', '.join(MODES)}, {FOLLOW}")
    trial = copy.deepcopy(model)
    trial.train(mode == "train")
    try:
        step_function(trial, example_input, mode)()
    except ValueError as exc:
        fix = ("; give a batch of 2 or more, or confirm on inference (step='inference', "
               "--step inference, or the model in eval mode)" if mode == "train" else "")
        raise ValueError(f"the model's {mode} step cannot run on an input of shape "
                         f"{','.join(map(str, example_input.shape))}: {first_line(exc)}"
                         f"{fix}") from None
    return mode


def faster(r: stats.Ratio) -> bool:
    """Faster beyond noise: the interval of the time ratio lies below 1 by `MARGIN`. The
    paired interval holds the ratio of this run's medians; a second run on a quiet machine
    lands a little apart (fresh copies of the model, the allocator's and the caches' state,
    drift that pairing by round does not cancel), so a change decided by less than the margin
    would be kept by one run and dropped by the next."""
    return r.high is not None and r.high < 1 - MARGIN


class _Busy(Exception):
    """A comparison the machine stayed busy through: the confirmation stops."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


class _Kept(NamedTuple):
    """What the confirmation keeps: the plan that runs and the model running it, the changed
    layers it keeps, whether the plan's layouts are kept, the alternative it is ("": the
    plan's own), and its step against torch's default (None: it is torch's default)."""

    plan: Plan
    model: object
    layers: list[str]
    layouts: bool
    alternative: str
    measured: Compared | None


@dataclasses.dataclass
class _Confirmed:
    """torch's default; what was confirmed against it so far; and the whole plan's step
    against it once measured: a busy machine that stops the confirmation leaves these."""

    default: _Kept
    kept: _Kept
    whole: Compared | None = None


def confirm(model, example_input, plan: Plan, mode: str = FOLLOW,
            budget_s: float = STEP_BUDGET_S, groups: int = GROUPS,
            log: Callable[[str], None] | None = None, tries: int = TRIES) -> Plan:
    """`plan` keeping only the changes the whole step confirms (see the module docstring),
    with what was measured in its `checks`. `mode`: a step mode, or `FOLLOW` (the model's own,
    `mode_of`); `tries`: of each comparison while the machine is busy. ValueError for an
    unknown mode, or a step that cannot run on the input (`step_mode`)."""
    mode = step_mode(model, example_input, mode)
    log = log or (lambda line: None)
    changed = changed_layers(plan)
    names = [lp.layer for lp in changed]
    if not changed:
        log(f"{mode} step: the plan changes no layer; nothing to confirm")
        nothing = StepCheck(mode=mode, time_ratio=1.0, low=None, high=None, plan_ms=None,
                            default_ms=None, whole_ratio=1.0, whole_low=None, whole_high=None,
                            trials=0, kept=[], dropped=[])
        return dataclasses.replace(plan, checks=[*[c for c in plan.checks if c.mode != mode],
                                                 nothing])
    default_plan = subplan(plan, set())
    default_model = _applied(model, default_plan, mode)
    torch_default = _Kept(default_plan, default_model, [], False, "", None)
    done = _Confirmed(torch_default, torch_default)
    tried, why = 0, ""

    def weigh(fast, slow) -> Compared:
        nonlocal tried
        tried += 1
        measured = compare(plan, fast, slow, example_input, mode, budget_s, tries, log)
        if measured.busy:
            raise _Busy(measured.busy)
        return measured

    try:
        _steps(model, plan, mode, changed, groups, weigh, log, done)
        _alternative(model, plan, mode, weigh, log, done)
    except _Busy as stop:
        why = stop.why
        log(f"{mode} step: the machine stayed busy through {tries} tries ({why}): stopped; "
            f"{_kept_text(done.kept)}, torch's default for what was not confirmed")
    kept, m = done.kept, done.kept.measured
    final = m.ratio if m else stats.Ratio(1.0, None, None, False)
    whole = done.whole.ratio if done.whole else stats.Ratio(1.0, None, None, False)
    check = StepCheck(
        mode=mode, time_ratio=final.value, low=final.low, high=final.high,
        plan_ms=m.fast_ms if m else None, default_ms=m.slow_ms if m else None,
        whole_ratio=whole.value, whole_low=whole.low, whole_high=whole.high, trials=tried,
        kept=kept.layers, dropped=[n for n in names if n not in kept.layers],
        layouts_kept=kept.layouts, plan_host_ms=m.fast_host_ms if m else None,
        default_host_ms=m.slow_host_ms if m else None, busy=why, alternative=kept.alternative)
    return dataclasses.replace(kept.plan,
                               checks=[*[c for c in plan.checks if c.mode != mode], check])


def _kept_text(kept: _Kept) -> str:
    """What `kept` runs, in a few words."""
    if kept.alternative:
        return f"the plan is {kept.alternative}"
    if kept.measured is None:
        return "nothing kept"
    layouts = " and its layouts" if kept.layouts else ""
    n = len(kept.layers)
    return f"{n} {'change' if n == 1 else 'changes'} confirmed{layouts}"


def _steps(model, plan: Plan, mode: str, changed: list[LayerPlan], groups: int,
           weigh: Callable[..., Compared], log: Callable[[str], None],
           done: _Confirmed) -> None:
    """Steps 1 to 4 of the module docstring, `done` updated as each confirms a plan against
    torch's default."""
    names = [lp.layer for lp in changed]
    default_model = done.default.model
    plan_model = _applied(model, plan, mode)
    whole = done.whole = weigh(plan_model, default_model)
    whole_kept = faster(whole.ratio)
    log(f"{mode} step: the whole plan takes {whole.ratio.text()} torch's default's time "
        f"({whole.text()}): {'faster' if whole_kept else 'not faster'} beyond noise")
    if whole_kept:
        done.kept = _Kept(plan, plan_model, list(names), False, "", whole)
    kept, current, candidates, layouts = [], default_model, changed, False
    layout_plan = layouts_only(plan)
    if changed_layers(layout_plan) and any(replaced(lp) for lp in changed):
        layout_model = _applied(model, layout_plan, mode)
        alone = weigh(layout_model, default_model)
        layouts = faster(alone.ratio)
        log(f"{mode} step: the plan's layouts alone, torch's algorithms in them: "
            f"{alone.ratio.text()} torch's default's time: {'kept' if layouts else 'dropped'}")
        if layouts:
            current = layout_model
            kept = [lp.layer for lp in changed if not replaced(lp)]
            candidates = [lp for lp in changed if replaced(lp)]
            done.kept = _Kept(layout_plan, layout_model, list(kept), True, "", alone)
        if layouts and whole_kept:  # the replacements must beat torch in the layouts kept
            on_top = weigh(plan_model, layout_model).ratio
            log(f"{mode} step: the whole plan takes {on_top.text()} the time of its layouts "
                f"alone: {'faster' if faster(on_top) else 'not faster'} beyond noise")
            whole_kept = faster(on_top)
            if whole_kept:
                done.kept = _Kept(plan, plan_model, list(names), False, "", whole)
    if whole_kept:
        return
    order = sorted(candidates, key=lambda lp: predicted_gain_ms(
        plan, lp, lp.layout if layouts else "nchw"), reverse=True)
    size = -(-len(order) // max(1, min(groups, len(order))))
    added = False
    for chunk in [order[i:i + size] for i in range(0, len(order), size)]:
        trial_names = kept + [lp.layer for lp in chunk]
        trial = _applied(model, subplan(plan, set(trial_names), layouts), mode)
        r = weigh(trial, current).ratio
        log(f"{mode} step: {', '.join(lp.layer for lp in chunk)}: {r.text()} the step "
            f"without them: {'kept' if faster(r) else 'dropped'}")
        if faster(r):
            kept, current, added = trial_names, trial, True
    if not added:  # what is kept, torch's default or the layouts alone, was measured so
        return
    measured = weigh(current, default_model)
    if faster(measured.ratio):
        done.kept = _Kept(subplan(plan, set(kept), layouts), current, kept, layouts, "",
                          measured)
        return
    log(f"{mode} step: what was kept takes {measured.ratio.text()} torch's default's time "
        f"({measured.text()}): not faster beyond noise, nothing kept")
    done.kept = done.default


def _alternative(model, plan: Plan, mode: str, weigh: Callable[..., Compared],
                 log: Callable[[str], None], done: _Confirmed) -> None:
    """Step 5 of the module docstring: all channels_last against what `done` keeps."""
    alt = channels_last(plan)
    kept = done.kept
    if alt.layers in (kept.plan.layers, done.default.plan.layers):  # nothing else to weigh
        return
    alt_model = _applied(model, alt, mode)
    r = weigh(alt_model, kept.model)
    won = faster(r.ratio)
    against = "torch's default" if kept.measured is None else "what was kept"
    log(f"{mode} step: {CHANNELS_LAST} (every layer nhwc, torch's algorithms) takes "
        f"{r.ratio.text()} the time of {against} ({r.text()}): "
        f"{'faster' if won else 'not faster'} beyond noise")
    if not won:
        return
    measured = r if kept.measured is None else weigh(alt_model, done.default.model)
    if not faster(measured.ratio):
        log(f"{mode} step: {CHANNELS_LAST} takes {measured.ratio.text()} torch's default's "
            f"time: not faster beyond noise; the plan keeps what was confirmed")
        return
    if measured is not r:
        log(f"{mode} step: {CHANNELS_LAST} takes {measured.ratio.text()} torch's default's "
            f"time ({measured.text()})")
    log(f"{mode} step: the plan becomes {CHANNELS_LAST}")
    done.kept = _Kept(alt, alt_model, [], False, CHANNELS_LAST, measured)
