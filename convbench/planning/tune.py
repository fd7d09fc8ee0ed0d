"""Tuning: measure what the advice needs and the plan store lacks, then hand it to advice.

    plan = tune(model, example_input)    # a model's conv layers, measured (or reused), planned
    plan, advice, note = advise_run(RUN) # a bench run folder, planned

`tune` finds the convolutions a model computes (`models.find_convs`), so any `nn.Module` works;
it looks each (problem, pass) up in the plan store and measures the rest with the runner (CPU
input: backend `numpy`; CUDA input: `cuda`), then measures the NCHW<->NHWC conversions the
layout plan weighs, and hands the results table to `advice`, which chooses; then the model's
whole step decides which of the plan's changes stay (`confirm`). `advise_run` does the same for
the rows of a run folder, measuring the conversions only where this machine is the run's: a
conversion time is valid only beside the passes it is weighed against.

`tune` says what it does through `logging` (`LOG`, under the `convbench` logger), a few lines at
INFO: what the store holds and how long the rest should take, what was measured, each step of
the confirmation with its verdict, the plan's verdict and where it went; a caller's own logging
takes them, and where none is set up they go to stderr (`reporting`). The cases themselves
show as a progress bar on a terminal (tqdm), not a line each: a real model has thousands.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..algos import registry
from ..algos.reference import DTYPES, array_module
from ..algos.registry import TORCH_ALGOS
from ..core.fmt import fmt_duration
from ..core.measurement import Measurement
from ..core.problem import (
    LAYOUTS,
    PASSES,
    PRECISION_OF_DTYPE,
    PRECISIONS,
    ConvProblem,
    check_choice,
)
from ..core.results import entry_from_row, frame, load_run, problem_from_row, row_from_entry
from ..machine import backends, devices, threads
from ..measure import runner, timing
from . import confirm
from .advice import (
    NO_CONSTRAINTS,
    Advice,
    advise,
    boundaries,
    build_plan,
    layer_costs,
    needed_conversions,
)
from .models import find_convs
from .plan import (
    Constraints,
    Plan,
    PlanStore,
    current_env_key,
    env_key,
    stale_fields,
)

#: Seconds of timed repetitions per NCHW<->NHWC conversion: they are memory-bound copies whose
#: times hardly vary, so a tenth of a second of repetitions is plenty on CPU and GPU.
CONVERSION_BUDGET_S = 0.1
#: Axis order that turns an array stored in the first layout into the second.
_PERMUTATION = {("nchw", "nhwc"): (0, 2, 3, 1), ("nhwc", "nchw"): (0, 3, 1, 2)}
#: Where `tune` says what it does, a line per step at INFO (see the module docstring).
LOG = logging.getLogger(__name__)
#: The most comparisons of two whole steps `confirm.confirm` makes: the whole plan, its layouts
#: alone, the whole plan over its layouts, one per group of layers, what was kept against
#: torch's default once more, and all-channels_last against what was kept and against the
#: default. What the estimate before a tune counts (a busy machine's tries not included).
CONFIRM_COMPARISONS = confirm.GROUPS + 6


# --- conversions ----------------------------------------------------------------------------
def stored_shape(shape_nchw: tuple[int, ...], layout: str) -> tuple[int, ...]:
    n, c, h, w = shape_nchw
    return (n, c, h, w) if layout == "nchw" else (n, h, w, c)


def conversion_time(shape_nchw: tuple[int, ...], src: str, dst: str, backend: str,
                    precision: str, budget_s: float) -> Measurement:
    """Time converting an activation of NCHW dims `shape_nchw` stored in `src` to `dst`: a
    transpose into a preallocated output (the steady state of a caching allocator), in the
    backend's array module, timed like any other operation (`convbench.measure.timing`)."""
    xp = array_module(backend)
    rng = np.random.default_rng(0)
    a = xp.asarray(rng.standard_normal(stored_shape(shape_nchw, src)).astype(DTYPES[precision]))
    out = xp.empty(stored_shape(shape_nchw, dst), dtype=a.dtype)
    view = a.transpose(_PERMUTATION[src, dst])
    return timing.timer_for(backend)(lambda: xp.copyto(out, view), budget_s)


def measure_conversions(keys, backend: str, precision: str) -> list[dict]:
    """Time each (shape, from, to) conversion; the plan's conversion entries."""
    out = []
    for shape, src, dst in sorted(keys):
        m = conversion_time(shape, src, dst, backend, precision, CONVERSION_BUDGET_S)
        out.append({"shape": list(shape), "from": src, "to": dst, "median_ms": m.median,
                    "iqr_ms": m.iqr})
    return out


def _backend_precision(example_input, named: str | None = None) -> tuple[str, str]:
    """The backend the input's device measures on, and the precision to measure in: the
    setting of the call (`nn.live_precision`: an active autocast's dtype, else the input's,
    fp32 as tf32 where torch runs convolutions in TF32). `named` must be that setting: a plan
    is measured, confirmed and applied in the precision it trains in, so one line says what
    to set where they differ."""
    from ..nn import live_precision

    backend = {"cpu": "numpy", "cuda": "cuda"}.get(example_input.device.type)
    if backend is None:
        raise ValueError(f"convbench measures on cpu or cuda, not {example_input.device.type}")
    dtype = str(example_input.dtype).removeprefix("torch.")
    if dtype not in PRECISION_OF_DTYPE:
        raise ValueError(f"dtype {dtype} has no convbench precision")
    live = live_precision(example_input.device.type, example_input.dtype)
    if named is None or check_choice("precision", named, PRECISIONS) == live:
        return backend, live
    if named == "tf32" and backend != "cuda":
        raise ValueError("precision tf32 is cuDNN's TF32 on a GPU: on the CPU convolutions run "
                         "fp32 (use fp32, or bf16 under autocast)")
    how = {"tf32": "turn TF32 on (torch.backends.cudnn.allow_tf32 = True) on a GPU",
           "fp32": "with an fp32 input, TF32 off (torch.backends.cudnn.allow_tf32 = False) "
                   "on a GPU and no autocast",
           "bf16": "call tune inside torch.autocast(dtype=torch.bfloat16), or give a bf16 "
                   "input",
           "fp16": "call tune inside torch.autocast(dtype=torch.float16), or give an fp16 "
                   "input"}.get(named, f"give a {named} input")
    raise ValueError(f"precision {named} asked, and this call runs convolutions in {live}: "
                     f"{how} (a plan is measured and confirmed in the setting it trains in)")


class TuneInterrupted(KeyboardInterrupt):
    """Ctrl-C while `tune` measured, or while it confirmed the plan on the whole step
    (`confirming`): the `made` measurements (of `planned`) are in the plan store (`path`, None if
    none was made yet), and tuning again measures only the rest."""

    def __init__(self, made: int, planned: int, path: Path | None, confirming: bool = False):
        super().__init__(f"{made} of {planned} measurements made")
        self.made, self.planned, self.path = made, planned, path
        self.confirming = confirming


def interrupted_text(stop: TuneInterrupted) -> str:
    """What an interrupted tune kept and what the same command does next, in one line."""
    if not stop.path:
        return "nothing was measured yet"
    kept = f"{stop.made} of {stop.planned} measurements kept in the plan store ({stop.path})"
    return kept + ("; the same command reuses them and confirms the plan on the step again"
                   if stop.confirming else "; the same command measures the rest")


@contextlib.contextmanager
def reporting(always: bool = False):
    """`LOG`'s lines on stderr, as `convbench: ...`, while the block runs: `always` (the command
    line, whose stderr is its log), else only where the caller has set up no logging handler,
    as a tune of minutes that says nothing reads as hung; a caller's own logging otherwise
    decides what it shows and where."""
    package = logging.getLogger("convbench")
    if not always and LOG.hasHandlers():
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("convbench: %(message)s"))
    level = package.level
    package.addHandler(handler)
    if always or level == logging.NOTSET:
        package.setLevel(logging.INFO)
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(level)


def tune(model, example_input, *, algos: str = "all", layouts: tuple[str, ...] = LAYOUTS,
         budget_s: float | None = None, constraints: Constraints = NO_CONSTRAINTS,
         store: PlanStore | str | Path | None = None, input_layout: str = "nchw",
         output_layout: str = "nchw", progress: bool | None = None,
         step: str | None = confirm.FOLLOW, step_budget_s: float = confirm.STEP_BUDGET_S,
         cold: bool = False, precision: str | None = None) -> Plan:
    """Measure the conv layers of `model` as `example_input` exercises them, and plan them
    (`tune_advice`'s plan; its arguments are this one's, spelt out so a misspelt one is a
    TypeError at the call)."""
    return tune_advice(model, example_input, algos=algos, layouts=layouts, budget_s=budget_s,
                       constraints=constraints, store=store, input_layout=input_layout,
                       output_layout=output_layout, progress=progress, step=step,
                       step_budget_s=step_budget_s, cold=cold, precision=precision)[0]


def tune_advice(model, example_input, *, algos: str = "all",
                layouts: tuple[str, ...] = LAYOUTS, budget_s: float | None = None,
                constraints: Constraints = NO_CONSTRAINTS,
                store: PlanStore | str | Path | None = None, input_layout: str = "nchw",
                output_layout: str = "nchw", progress: bool | None = None,
                step: str | None = confirm.FOLLOW,
                step_budget_s: float = confirm.STEP_BUDGET_S,
                cold: bool = False, precision: str | None = None) -> tuple[Plan, Advice]:
    """Measure the conv layers of `model` as `example_input` exercises them, and plan them:
    the plan, and the advice it was built from (what `convbench tune` prints).

    `step` (train, inference; `confirm.FOLLOW`, the default: the model's own mode, inference
    for a model in eval mode; None: not at all): the plan is then confirmed on the model's
    whole step (`confirm.confirm`, `step_budget_s` seconds of steps per contender and
    comparison): a change is kept only where the step is faster with it beyond noise, so the
    plan is never slower than torch's default beyond noise; what was measured is in the plan's
    `checks`; ValueError, in one line and before anything is measured, where that step cannot
    run on the input (`confirm.step_mode`). `cold`: each repetition of the per-layer
    measurements on the CPU is timed from cold caches (`timing.cold_caches`), as a layer finds
    them in a model. `precision`: the one to measure and plan in (`PRECISIONS`); None: the
    setting the call is made in (`nn.live_precision`: an active autocast's dtype, else the input's,
    fp32 as tf32 where torch runs convolutions in TF32), as the plan must hold where it trains.

    Measurements the plan store holds for this environment are reused; the rest are made by the
    runner on the input's device (`algos`: a comma list as on the command line; `budget_s`:
    seconds of timed repetitions per measurement, the device's default if None), and so are the
    NCHW<->NHWC conversions the layout plan weighs. The plan is saved in the store (`store`: a
    PlanStore or its folder; None: the default one) and returned.

    It says what it does at INFO on `LOG` (on stderr where the caller set up no logging:
    `reporting`), and nothing on stdout: store hits and the time it expects, what was measured,
    the layers `apply` leaves to torch, each step of the confirmation and its verdict, where
    the plan went. `progress`: a bar over the cases on stderr (tqdm) if True, none if False;
    None: where stderr is a terminal. Where NumPy passes were measured in a process started
    without `CPU_THREAD_ENV`, a warning says so: their times, torch's beside them too, are
    off."""
    with reporting():
        return _tune(model, example_input, algos, layouts, budget_s, constraints, store,
                     input_layout, output_layout, progress, step, step_budget_s, cold,
                     precision)


def _tune(model, example_input, algos, layouts, budget_s, constraints, store, input_layout,
          output_layout, progress, step, step_budget_s, cold,
          precision) -> tuple[Plan, Advice]:
    """`tune_advice`, said on `LOG`."""
    log = LOG.info
    _check_layouts(layouts, input_layout, output_layout)
    backend, precision = _backend_precision(example_input, precision)
    if step is not None:  # before minutes of measurements, a step that cannot run says so
        step = confirm.step_mode(model, example_input, step)
    algo_list = registry.expand_algos(algos, backend)
    if backend == "cuda" and "all" in (a.strip() for a in algos.split(",")):
        # cuDNN's algorithms one by one, which a plan pins: torch's own pick misses some
        algo_list += [a for a in registry.expand_algos("cudnn-find", backend)
                      if a not in algo_list]
    store = store if isinstance(store, PlanStore) else PlanStore(store)
    sites, unplanned = _find_sites(model, example_input)
    env = current_env_key(backend)
    stored = store.lookup(env, backend, precision)
    for path, changed in stored.stale:
        log(f"stale plan {path.name} not used: {', '.join(changed)} changed")
    known = _Measurements(type(model).__name__, sites, backend, precision)
    cases = known.reuse(stored, algo_list, layouts)
    log(f"{known.count()} measurements from the plan store {store.folder}, "
        f"{len(cases)} to make")
    budget = budget_s or devices.of_backend(backend).budget_s
    if cases or step is not None:
        log(expected_text(len(cases), budget, step, step_budget_s))
    _log_unmeasured(sites, log)

    def save_interrupted() -> Path:
        # Each layer in its own best layout, no conversions measured: the next tune reuses
        # the measurements.
        return store.save(known.plan(known.advice(constraints), env, None, unplanned,
                                     input_layout, output_layout))

    _measure(cases, budget, cold, known, progress, save_interrupted)
    _warn_threads(known.made, store)
    advice = known.advice(constraints)
    conversions = _conversions(advice, stored.conversions, input_layout, output_layout,
                               backend, precision)
    plan = known.plan(advice, env, conversions, unplanned, input_layout, output_layout)
    if step is not None:
        plan = _confirmed(model, example_input, plan, step, step_budget_s, store,
                          (len(known.made), len(cases)))
    log(f"plan saved to {store.save(plan)}")
    return plan, advice


def expected_text(cases: int, budget_s: float, step: str | None, step_budget_s: float) -> str:
    """The time a tune expects before it starts, and how it is reckoned: each case to measure
    its budget of timed repetitions and their warm-up, and the confirmation its most
    comparisons of two whole steps (`CONFIRM_COMPARISONS`), each step its budget and warm-up.
    An estimate, said as one: the budgets are ceilings (a case or a comparison stops sooner
    once its interval is narrow), and a case's float64 reference and check come on top."""
    per = 1 + timing.WARMUP_FRACTION
    measuring = cases * budget_s * per
    parts = [f"{cases} cases to measure × {budget_s:g} s of timed repetitions"] if cases else []
    confirming = 0.0
    if step is not None:
        confirming = CONFIRM_COMPARISONS * 2 * step_budget_s * per
        parts.append(f"then confirming on the {step} step, at most {CONFIRM_COMPARISONS} "
                     f"comparisons of two steps × {step_budget_s:g} s")
    return (f"expected to take up to about {fmt_duration(measuring + confirming)}: "
            f"{', '.join(parts)} (warm-up included)")


def _confirmed(model, example_input, plan: Plan, step: str, step_budget_s: float,
               store: PlanStore, counts: tuple[int, int]) -> Plan:
    """`confirm.confirm`, the measurements saved in the store first: a Ctrl-C while the whole
    steps are timed (minutes on a real model) keeps them (TuneInterrupted). Each comparison's
    verdict is a line on `LOG`, and the plan's in the end (`StepCheck.text`)."""
    path = store.save(plan)
    try:
        plan = confirm.confirm(model, example_input, plan, step, step_budget_s, log=LOG.info)
    except KeyboardInterrupt:
        raise TuneInterrupted(*counts, path, confirming=True) from None
    for check in plan.checks:
        if check.mode == step:
            LOG.info(check.text())
    return plan


def _warn_threads(made: list[dict], store: PlanStore) -> None:
    """One warning where NumPy passes were measured here in a process started without
    `threads.CPU_THREAD_ENV`: NumPy's and torch's idle threads then spin, each pool slowing the
    other's next call, so the times measured, torch's among them, are not the ones a process
    with the settings gets (design §5: one thread policy for every algorithm)."""
    unset = threads.unset_settings()
    ours = any(r["backend"] == "numpy" and r["algo"] not in TORCH_ALGOS
               and r["status"] != "unsupported" for r in made)
    if ours and unset:
        warnings.warn("NumPy passes were measured with idle threads spinning beside torch's, so "
                      f"their times and torch's are off: start Python with {unset} and tune "
                      f"into a fresh plan store (these times are kept in {store.folder})",
                      stacklevel=_caller_level())


def _caller_level() -> int:
    """The `stacklevel` that names, for a warning raised by the caller of this function, the
    first frame outside this module: the line of the user's code that called tune, as
    `skip_file_prefixes` (Python 3.12) would."""
    level, frame = 2, sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        level, frame = level + 1, frame.f_back
    return level


def _check_layouts(layouts, input_layout: str, output_layout: str) -> None:
    for what, value in [*(("layout", lay) for lay in layouts), ("input layout", input_layout),
                        ("output layout", output_layout)]:
        check_choice(what, value, LAYOUTS)


def _find_sites(model, example_input) -> tuple[list, list]:
    """`models.find_convs`; ValueError where the input reaches no conv layer."""
    sites, unplanned = find_convs(model, example_input)
    if not sites and not unplanned:
        raise ValueError(f"{type(model).__name__} has no nn.Conv2d layer that an input of "
                         f"shape {','.join(map(str, example_input.shape))} reaches: nothing to "
                         "tune")
    return sites, unplanned


class _Measurements:
    """What a tune plans from, per (problem, pass) of the model's `sites`: the plan store's
    measurements and those it makes, each kept as the plan's entry and as the results row advice
    reads, converted once when it arrives (not on every advice)."""

    def __init__(self, net: str, sites: list, backend: str, precision: str):
        self.net, self.sites, self.backend, self.precision = net, sites, backend, precision
        self.entries: dict[tuple[ConvProblem, str], list[dict]] = {}
        #: The rows of each key's entries, for no layer: each site's are these with its name.
        self.rows: dict[tuple[ConvProblem, str], list[dict]] = {}
        self.made: list[dict] = []

    def reuse(self, stored, algo_list: list[str], layouts) -> list[runner.Case]:
        """Take the store's measurements of the sites' passes (of `algo_list` in `layouts`) and
        return the cases still to measure."""
        cases = []
        for site in self.sites:
            for pass_ in site.passes:
                key = (site.problem, pass_)
                if key in self.entries:
                    continue
                self.entries[key], self.rows[key] = [], []
                for e in stored.measurements.get(key, []):
                    if e["algo"] in algo_list and e["layout"] in layouts:
                        self._add(key, e)
                have = {(e["algo"], e["layout"]) for e in self.entries[key]}
                cases += [runner.Case(self.net, site.name, site.problem, algo, self.backend,
                                      pass_, layout, self.precision)
                          for layout in layouts for algo in algo_list
                          if (algo, layout) not in have]
        return cases

    def _add(self, key: tuple[ConvProblem, str], entry: dict) -> None:
        self.entries[key].append(entry)
        self.rows[key].append(row_from_entry(entry, "", self.net, self.precision))

    def measured(self, row: dict) -> None:
        """A row the runner made: kept as an entry (and the row advice reads of it)."""
        self._add((problem_from_row(row), row["pass"]), entry_from_row(row))
        self.made.append(row)

    def count(self) -> int:
        return sum(map(len, self.entries.values()))

    def advice(self, constraints: Constraints) -> Advice:
        rows = [{**r, "layer": site.name} for site in self.sites for p in site.passes
                for r in self.rows[site.problem, p]]
        return (advise(frame(rows), constraints, self.precision) if rows else
                Advice(self.backend, self.precision, constraints, [], {}, set(), Counter()))

    def plan(self, advice: Advice, env, conversions, unplanned, input_layout: str,
             output_layout: str) -> Plan:
        return build_plan(advice, env, conversions,
                          measurements=[e for es in self.entries.values() for e in es],
                          unplanned=unplanned, input_layout=input_layout,
                          output_layout=output_layout)


def _conversions(advice: Advice, stored: dict, input_layout: str, output_layout: str,
                 backend: str, precision: str) -> list[dict]:
    """The NCHW<->NHWC conversions the layout plan of `advice` weighs: the store's, and the
    rest measured."""
    keys = needed_conversions(layer_costs(advice, input_layout), boundaries(advice),
                              input_layout, output_layout)
    conversions = [stored[k] for k in sorted(keys & stored.keys())]
    return conversions + measure_conversions(keys - stored.keys(), backend, precision)


def _log_unmeasured(sites: list, log: Callable[[str], None]) -> None:
    """Log the passes training does not run, and the layers apply leaves as they are."""
    unneeded = [f"{site.name} {p}" for site in sites for p in PASSES if p not in site.passes]
    if unneeded:
        log(f"{len(unneeded)} {'pass' if len(unneeded) == 1 else 'passes'} not measured, "
            "training does not run them (an input or weight that needs no gradient): "
            f"{', '.join(unneeded)}")
    for site in sites:
        if site.kept:
            log(f"{site.name}: measured, but apply leaves it as is, torch runs it "
                f"({site.kept})")


def _bar(total: int, progress: bool | None):
    """A tqdm bar over `total` cases on stderr (`progress`: True, False, or None for where
    stderr is a terminal); None without tqdm, which a GPU machine's own environment may lack:
    the bar is a nicety, never a reason a tune fails."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="convbench: measuring", unit="case", file=sys.stderr,
                leave=False, disable=None if progress is None else not progress)


def _measure(cases: list[runner.Case], budget: float, cold: bool, known: _Measurements,
             progress: bool | None, save_interrupted: Callable[[], Path]) -> None:
    """Run `cases` into `known`, a bar over them (`_bar`) and a line on `LOG` when done;
    Ctrl-C keeps what was measured (a plan of it in the store, `save_interrupted`) and raises
    TuneInterrupted."""
    bar = _bar(len(cases), progress) if cases else None

    def measured(row: dict) -> None:
        known.measured(row)
        if bar is not None:
            bar.set_postfix_str(f"{row['layer']} {row['pass']}", refresh=False)
            bar.update()

    started = time.monotonic()
    try:
        with timing.cold_caches() if cold else contextlib.nullcontext():
            runner.run(cases, budget, on_row=measured)
    except KeyboardInterrupt:
        path = save_interrupted() if known.made else None
        raise TuneInterrupted(len(known.made), len(cases), path) from None
    finally:
        if bar is not None:
            bar.close()
    if not cases:
        return
    status = Counter(r["status"] for r in known.made)
    LOG.info(f"measured {len(known.made)} of {len(cases)} in "
             f"{fmt_duration(time.monotonic() - started)}: "
             + ", ".join(f"{n} {s}" for s, n in status.items()))


def advise_run(folder: str | Path, constraints: Constraints = NO_CONSTRAINTS,
               precision: str | None = None, batch: int | None = None,
               input_layout: str = "nchw",
               output_layout: str = "nchw") -> tuple[Plan, Advice, str | None]:
    """The plan of a run folder (of its rows at `batch`, if given), and a note when its layouts
    are each layer's own best because the conversions cannot be measured here: they must be
    measured on the run's device with the run's versions."""
    return advise_runs(folder, [constraints], precision, batch, input_layout, output_layout)[0]


def advise_runs(folder: str | Path, constraint_sets: list[Constraints],
                precision: str | None = None, batch: int | None = None,
                input_layout: str = "nchw",
                output_layout: str = "nchw") -> list[tuple[Plan, Advice, str | None]]:
    """`advise_run` under each of `constraint_sets`, the folder read once and each conversion
    any of the plans weighs measured once (a plan and what its constraints cost are two
    plans of one run)."""
    df, env = load_run(folder)
    if batch is not None:
        df = df[df["n"] == batch]
    occurrences = env.get("run", {}).get("occurrences")
    advices = [advise(df, c, precision, occurrences) for c in constraint_sets]
    backend, precision = advices[0].backend, advices[0].precision
    key, measured, note = env_key(env), None, None
    unavailable = backends.available(backend)
    changed = [] if unavailable else stale_fields(key, current_env_key(backend))
    if unavailable or changed:
        why = unavailable or f"this machine differs from the run's in {', '.join(changed)}"
        note = f"no network layout plan: conversions cannot be measured here ({why})"
    else:
        keys = set().union(*(needed_conversions(layer_costs(a, input_layout), boundaries(a),
                                                input_layout, output_layout)
                             for a in advices))
        measured = measure_conversions(keys, backend, precision)
    records = df[df["precision"] == precision].to_dict("records")
    entries = [entry_from_row(r) for r in records]
    return [(build_plan(a, key, measured, measurements=entries, input_layout=input_layout,
                        output_layout=output_layout), a, note) for a in advices]

