"""The harness: a sweep of cases -> one verified, timed results row each.

A sweep is data (layers × algos × passes × layouts × precisions, like Triton's `perf_report`),
each case one `Case`, each result one row of `results.COLUMNS`. For every case the
implementation is first run on seeded random operands into a NaN-filled output and checked
against the float64 reference; only a pass that checks out is timed, and a library's beyond
its tolerance (`inexact`: `verify.verdict`), which is what its users run. Whatever happens to
one case — unsupported, a wrong answer, an exception, out of memory — becomes that case's row and
the sweep goes on.

Cases compete when they share (problem, pass, precision): every algorithm and layout of it.
Such a group is prepared and verified case by case, then its verified cases are timed together
in shuffled rounds (`timing.time_rounds`), so drift falls on all of them alike and their times
pair up by round; each row carries its rounds' id (`round_group`) and why its rounds stopped.
On the host with more than one thread each timed repetition follows an untimed call of its
own (`warm_pools`), so no contender pays for waking its thread pool.
Where holding every prepared case at once would crowd the memory (on the GPU, or the host, with
less than `HEADROOM` of it free), the group is timed in parts; under a `MemoryLimit` every case is
timed alone (each must fit the limit by itself, as a batch sweep asks). A case out of memory
beside held ones (a part's prepared cases, or its fellow contenders while timed) is measured
again alone once they are given back: only a case that does not fit by itself is `oom`, its
reason saying what it needed and what was free (`_room`).

The reference is computed once per (problem, pass, precision): operands are drawn in NCHW and
transposed, so both layouts and every algorithm share the same numbers and the same reference.

The verifying run is also the memory run: a `memory.trace` reads the allocators around
`prepare` and that one call, and is over before timing starts, so a row's `peak_bytes` never
costs its time anything. A `MemoryLimit` turns a footprint beyond it into `oom`: on the host
the predicted footprint is checked before anything is allocated, the measured one before timing.

A pass with phases (`convbench.algos.phases`: FFT's and Winograd's transforms, product and
inverse) is timed in the rounds as its sequence of phases, a timestamp between each: the row's
time is, repetition by repetition, the sum of its phases, and `phases_ms` each phase's time in
its median repetition (`rows.median_repetition`), beside the same competitors: the phase
table adds up to the pass. (Timed apart after the rounds, with warm caches and no competitor
between repetitions, the phases' medians disagreed with the pass: docs/pages/measurement.md.)
A phase the pass would not run in training code is timed but left out of its time
(`phases.APART`: the copy of a library's own result into the harness's output, an explicit pad
or crop), and the note says what it took.

Each row is built by `rows`, which also fails a timed row faster than the device's ceilings
allow (`rows.plausibility`; docs/pages/design.md §5).

`on_row` sees each row the moment its group is done: `runs` streams it into a run folder
(`results.RunFolder`), so an interrupted run keeps everything it measured (a group cut short by
Ctrl-C is not written: a resumed run measures it whole).
"""

from __future__ import annotations

import contextlib
import itertools
import secrets
import time
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from ..algos import reference, registry
from ..algos.phases import APART, OUTPUT_COPY
from ..algos.reference import DTYPES, array_module
from ..algos.registry import UnsupportedError
from ..catalogs.layers import Layer
from ..core.fmt import first_line
from ..machine import threads
from ..machine.faults import is_sticky_fault
from . import memory, opcount, timing, verify
from .case import Case, Ready
from .ceilings import Ceilings
from .memory import MemoryLimit
from .rows import guarded_row, row, timed_row
from .timing import Contender

#: Below this share of the device's memory free, a group's prepared cases are timed before more
#: are prepared (the rest of the group is timed as another part).
HEADROOM = 0.25


def sweep(layers: Iterable[Layer], algos: Iterable[str], backend: str, passes: Iterable[str],
          layouts: Iterable[str], precisions: Iterable[str]) -> list[Case]:
    """Every case of the product, ordered so each (problem, pass, precision) is contiguous:
    its reference is computed once."""
    return [Case(layer.net, layer.name, layer.problem, algo, backend, pass_, layout, precision)
            for layer in layers for precision in precisions for pass_ in passes
            for layout in layouts for algo in algos]


class Operands:
    """Seeded operands and their float64 reference for the current (problem, pass, precision),
    handed out as fresh copies in the layout and array module asked for, so an implementation
    that scribbles on its inputs cannot spoil the next one's.

    Each layout is made once per (problem, pass, precision), not once per case: the transposes
    (and on the GPU the copies to the device) are done when a layout is first asked for, and
    every case gets a copy made where the operands live (on the GPU, device to device). With
    `on_device` the reference is kept on the GPU too, so a GPU case is verified there
    (`verify.errors` on CuPy arrays) instead of copying its output back to be checked on the
    host; off (the default under a memory limit) the GPU holds nothing between cases.
    `floor` is the current problem's `verify.magnitude_floor` (from the pass on the operands'
    absolute values), so an output whose random terms cancel is not a false `failed`."""

    def __init__(self, seed: int = 0, on_device: bool = False):
        self.seed, self.on_device = seed, on_device
        self._key = None
        self._nchw = None
        self._layouts: dict = {}
        self.floor = 0.0

    def get(self, case: Case, xp):
        """(a, b) in `case.layout` on the backend's device, and the reference in that layout
        (on the device with `on_device` on the GPU, else on the host)."""
        key = (case.problem, case.pass_, case.precision)
        if key != self._key:
            self._key = self._nchw = None  # drop the old arrays before making new ones
            self._layouts = {}
            a, b = reference.random_operands(case.problem, case.pass_, "nchw",
                                             DTYPES[case.precision], self.seed)
            self._nchw = a, b, reference.reference(case.problem, case.pass_, "nchw", a, b)
            self.floor = verify.magnitude_floor(
                reference.magnitudes(case.problem, case.pass_, "nchw", a, b),
                case.problem, case.pass_)
            self._key = key
        held = (case.layout, xp.__name__)
        if held not in self._layouts:
            a, b, ref = (reference.to_layout(v, case.layout) for v in self._nchw)
            if xp is not np and self.on_device:
                a, b, ref = xp.asarray(a), xp.asarray(b), xp.asarray(ref)
            self._layouts[held] = a, b, ref
        a, b, ref = self._layouts[held]
        return xp.array(a), xp.array(b), ref


#: Host seconds per stage of the cases measured in this process, for a GPU check's summary:
#: drawing operands and the float64 reference (`operands`), giving the GPU's memory back
#: (`release`), preparing and running the pass once (`prepare`: compiles, plans, cuDNN's
#: search), checking its output (`verify`), timing (`time`) and describing (`describe`).
STAGES = ("operands", "release", "prepare", "verify", "time", "describe")
_STAGE_S = dict.fromkeys(STAGES, 0.0)


@contextlib.contextmanager
def _stage(name: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        _STAGE_S[name] += time.perf_counter() - start


def stage_seconds(reset: bool = False) -> dict[str, float]:
    """Seconds spent in each of `STAGES` since the last reset; `reset` starts them again."""
    out = dict(_STAGE_S)
    if reset:
        _STAGE_S.update(dict.fromkeys(STAGES, 0.0))
    return out


class NotMeasured(Exception):
    """Why a case has no time: its status (`unsupported`, `failed`, `oom`) and one-line reason."""

    def __init__(self, status: str, reason: str, check: verify.Check | None = None,
                 fatal: bool = False):
        super().__init__(reason)
        self.status, self.reason, self.check, self.fatal = status, reason, check, fatal


#: How the CUDA libraries word a failed allocation in errors of their own types (cuFFT's
#: CUFFT_ALLOC_FAILED, cuBLAS's and cuDNN's *_STATUS_ALLOC_FAILED, the runtime's out of memory).
_OOM_WORDS = ("ALLOC_FAILED", "cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY",
              "DefaultCPUAllocator: can't allocate memory")  # torch's host allocator


def _is_oom(exc: BaseException) -> bool:
    """MemoryError (CuPy's OutOfMemoryError is one), torch.cuda.OutOfMemoryError (by name, so
    neither library has to be imported to ask), or a library's own allocation failure."""
    return (isinstance(exc, MemoryError)
            or any(cls.__name__ == "OutOfMemoryError" for cls in type(exc).__mro__)
            or any(word in str(exc) for word in _OOM_WORDS))


class DeviceFault(Exception):
    """A case faulted the GPU (`is_sticky_fault`): its row, `failed`, is recorded, and no later
    case can run in this process. A resumed run continues after it."""

    def __init__(self, row: dict):
        super().__init__(f"{row['layer']} {row['algo']} {row['pass']} {row['layout']} faulted "
                         f"the GPU ({row['reason']})")
        self.row = row
        #: rows of the same group finished before the fault (`measure_group` fills it in)
        self.done: list[dict] = []


def _not_measured(exc: Exception, room: str | None = None) -> NotMeasured:
    """`exc` as a case's status and reason; `room` (`_room`) is added to a failed allocation's
    (a `MemoryLimit`'s refusal says its own sizes)."""
    if isinstance(exc, NotMeasured):
        return exc
    lines = str(exc).strip().splitlines()
    if isinstance(exc, UnsupportedError):  # known only once prepared (cuDNN's find)
        return NotMeasured("unsupported", lines[0] if lines else type(exc).__name__)
    reason = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    if _is_oom(exc):  # the next case starts by giving the pools' blocks back
        fits = room is None or isinstance(exc, memory.OverLimit)
        return NotMeasured("oom", reason if fits else f"{reason} ({room})")
    return NotMeasured("failed", reason, fatal=is_sticky_fault(exc))


def _phase_fns(impl, fn, args: tuple) -> dict[str, Callable[[], None]] | None:
    """The prepared callable's phase functions in the order `impl.phases` names them, when the
    implementation has phases and the callable carries them; ValueError if the two disagree
    (a breach of the phase contract, which would mislabel the breakdown)."""
    names = impl.phases(*args)
    if names is None:
        return None
    fns = getattr(fn, "phase_fns", {})
    if sorted(names) != sorted(fns):
        raise ValueError(f"phases() names {names} but the prepared pass has {list(fns)}")
    return {name: fns[name] for name in names}


def prepare(case: Case, operands: Operands, impl=None,
            limit: MemoryLimit | None = None, collect: bool = True) -> Ready:
    """Prepare `case`, run it once into a NaN-filled output, reading its memory, and check it
    against the reference; raise NotMeasured unless it is supported, within `limit` and
    correct. `impl` replaces the registry's implementation (tests inject fakes this way);
    `collect`: collect garbage before it (`memory.release_device_memory`)."""
    impl = impl if impl is not None else registry.get(case.algo, case.backend)
    args = (case.problem, case.pass_, case.layout, case.precision)
    _check_supported(impl, case, args)
    xp = array_module(case.backend)
    footprint, total = _operands_fit(case)
    room = None
    try:
        # An empty GPU for every case, before its operands: the last case's cached blocks (in
        # either pool, an out-of-memory's included) and plans are given back.
        with _stage("release"):
            memory.release_device_memory(case.backend, collect)
        workspace = opcount.workspace_bytes(impl, *args)
        predicted = footprint + (workspace or 0)
        room = _room(predicted, workspace is not None, memory.free_bytes(case.backend), total,
                     limit)
        _check_predicted(case.backend, predicted, total, limit)
        a, b, ref, out = _operands(case, operands, xp)
        fn, trace = _first_call(impl, args, (a, b, out), case.backend, xp)
        # A library that returns its own result (`OUTPUT_COPY`) allocates one output more
        # than our kernels, which write into `out`: counted like ours, not as workspace.
        own_result = OUTPUT_COPY in (impl.phases(*args) or ())
        peak = memory.pass_peak(trace.points, out.nbytes if own_result else 0)
        if limit is not None:
            limit.check(case.backend, footprint + peak, "measured footprint (operands and peak)")
        phase_fns = _phase_fns(impl, fn, args)
    except Exception as exc:
        raise _not_measured(exc, room) from exc
    chk = _verify(impl, case, args, out, ref, operands.floor)
    return Ready(impl, lambda: fn(a, b, out), chk, workspace, peak, trace.method, phase_fns)


def _check_supported(impl, case: Case, args: tuple) -> None:
    """NotMeasured (`unsupported`) where `impl` cannot run `case`, or NumPy and CuPy have no
    array type of its precision."""
    reason = registry.impl_available(impl) or registry.supports(impl, *args)
    if reason:
        raise NotMeasured("unsupported", reason)
    if case.precision not in DTYPES:
        raise NotMeasured("unsupported", f"no {case.precision} array type in NumPy or CuPy")


def _operands_fit(case: Case) -> tuple[int, int]:
    """(operand bytes, the device's bytes); NotMeasured (`oom`) where the operands alone exceed
    the device, before anything is sized or allocated for them."""
    footprint = memory.operand_bytes(case.problem, case.pass_, DTYPES[case.precision])
    total = memory.total_bytes(case.backend)
    if footprint > total:
        raise NotMeasured("oom", f"its operands need {memory.format_size(footprint)}, more than "
                          f"the {memory.format_size(total)} this device has")
    return footprint, total


def _check_predicted(backend: str, predicted: int, total: int,
                     limit: MemoryLimit | None) -> None:
    """OverLimit where the predicted footprint exceeds the device or `limit`: refused before a
    byte of it is allocated (on the host an allocation the kernel grants but cannot back is
    touched into the out-of-memory killer, which no `except` sees)."""
    if predicted > total:
        raise memory.OverLimit(
            f"its operands and workspace need {memory.format_size(predicted)}, more than "
            f"the {memory.format_size(total)} this device has")
    if limit is not None:
        limit.check(backend, predicted, "predicted footprint (operands and workspace)")


def _operands(case: Case, operands: Operands, xp) -> tuple:
    """(a, b, the float64 reference, a NaN-filled output) of `case`; a failure is NotMeasured
    saying it is not the algorithm's."""
    with _stage("operands"):
        try:
            a, b, ref = operands.get(case, xp)
            out = reference.nan_output(case.problem, case.pass_, case.layout,
                                       DTYPES[case.precision], xp)
        except Exception as exc:  # not the algorithm's failure: say whose it is
            nm = _not_measured(exc)
            raise NotMeasured(nm.status, f"the operands or the float64 reference: "
                              f"{nm.reason}", fatal=nm.fatal) from exc
    return a, b, ref, out


def _first_call(impl, args: tuple, operands: tuple, backend: str, xp):
    """(the prepared pass, the memory trace of its preparing and first call): compiled first
    (a JIT's compile is not the pass's memory), then prepared and called once."""
    with _stage("prepare"):
        impl.compile(*args)
    with _stage("prepare"), memory.trace(backend) as trace:
        fn = impl.prepare(*args)
        trace.mark()
        fn(*operands)
        if backend == "cuda":  # a fault in the pass surfaces here, as this case's failure
            xp.cuda.Device().synchronize()
    return fn, trace


def _verify(impl, case: Case, args: tuple, out, ref, floor) -> verify.Check:
    """The check of the first call's output, by the algorithm's tolerance or, for a library,
    by the algorithm it picked (cuDNN's FFT, Winograd: `_judged_as`); NotMeasured (`failed`)
    where it fails and its `verify.verdict` is not `inexact` (a library's result beyond its
    tolerance is timed all the same: its row says the error, `rows.timed_row`)."""
    p = case.problem
    with _stage("verify"):
        chk = verify.check(out, ref, case.algo, case.precision, p, case.pass_, floor)
        if not chk.ok:
            judged = _judged_as(impl, args)
            if judged:
                chk = verify.check(out, ref, judged, case.precision, p, case.pass_, floor)
    if verify.verdict(chk, case.algo) == "failed":
        raise NotMeasured("failed", chk.reason, chk)
    return chk


def _asked(question, args: tuple, otherwise):
    """`question(*args)`, an implementation's account of a case it ran; `otherwise(exc)` where
    it cannot give one, which does not undo the measurement. A GPU fault (`is_sticky_fault`)
    is raised: swallowed, it would be blamed on the next case."""
    try:
        return question(*args)
    except Exception as exc:
        if is_sticky_fault(exc):
            raise
        return otherwise(exc)


def _judged_as(impl, args: tuple) -> str | None:
    """`impl.judged_as` (the algo whose tolerance judges the pass it ran), None where it cannot
    say."""
    return _asked(impl.judged_as, args, lambda exc: None)


def _room(needed: int, known: bool, free: int, total: int, limit: MemoryLimit | None) -> str:
    """Why an allocation failed, for an `oom` row: what the case needs against what it had (the
    device's free memory when it started, and the limit)."""
    needs = (f"it needs {memory.format_size(needed)} with its workspace" if known else
             f"its operands need {memory.format_size(needed)}, its workspace is unknown")
    within = f", within the memory limit {memory.format_size(limit.nbytes)}" if limit else ""
    return (f"{needs}; {memory.format_size(free)} of the device's {memory.format_size(total)} "
            f"was free{within}")


def _describe(impl, args: tuple) -> str:
    """The implementation's note for the row; a note that cannot be made (cuDNN's profiled
    call failing, say) is said in the note."""
    return _asked(impl.describe, args,
                  lambda exc: f"(no description: {type(exc).__name__}: {first_line(exc)})")


def _kernels(impl, args: tuple) -> list[str] | None:
    """`impl.kernels` (the GPU kernels a library's pass launched), None where it cannot say."""
    return _asked(impl.kernels, args, lambda exc: None)


def _note(case: Case, ready: Ready) -> tuple[str, list[str] | None]:
    """`_describe` of a timed case and the kernels it ran (`_kernels`), their seconds counted
    as the `describe` stage."""
    args = (case.problem, case.pass_, case.layout, case.precision)
    with _stage("describe"):
        return _describe(ready.impl, args), _kernels(ready.impl, args)


def competing(cases: Iterable[Case]) -> Iterator[list[Case]]:
    """Consecutive cases of one (problem, pass, precision), which compete, as lists. (It reads
    one case ahead of the group it yields: group a list, not a generator that decides what
    comes next from the rows seen.)"""
    for _, group in itertools.groupby(cases, key=lambda c: (c.problem, c.pass_, c.precision)):
        yield list(group)


#: This process's prefix of `round_group` ids: rows timed in the same rounds share an id.
_PROCESS = secrets.token_hex(3)
_GROUPS = itertools.count(1)


class _Blame(Exception):
    """An exception raised by the call of contender `index` while a group was timed."""

    def __init__(self, index: int):
        super().__init__(index)
        self.index = index


def _guarded(index: int, fn: Callable[[], None]) -> Callable[[], None]:
    def call() -> None:
        try:
            fn()
        except Exception as exc:
            raise _Blame(index) from exc

    return call


def _contender(index: int, ready: Ready) -> Contender:
    """What the rounds time of a prepared case: its phases where it has them (those in
    `APART` left out of its time), else the whole call."""
    if ready.phase_fns:
        return Contender({n: _guarded(index, f) for n, f in ready.phase_fns.items()},
                         frozenset(APART) & set(ready.phase_fns))
    return Contender.call(_guarded(index, ready.call))


def warm_pools(backend: str) -> bool:
    """Whether each timed repetition follows an untimed call of its own (`timing.WARM_POOLS`):
    on the host with more than one thread, where a pool's sleeping workers would otherwise
    be woken inside the timed call (one thread has no pool to wake)."""
    return backend == "numpy" and threads.count() > 1


def _crowded(backend: str) -> bool:
    """Whether less than `HEADROOM` of the device's memory is free (the host's: available)."""
    return memory.free_bytes(backend) < HEADROOM * memory.total_bytes(backend)


def _time_part(part: list[tuple[Case, Ready]], budget_s: float, target: float,
               seed: int, ceilings: Ceilings | None = None) -> list[dict]:
    """Rows for prepared, verified cases timed together in rounds (see the module's docstring);
    a case whose call raises while timed gets its row (`failed` or `oom`) and the others are
    timed again without it; a row faster than `ceilings` allow is `failed` (`rows.plausibility`).
    DeviceFault if the GPU faulted, naming the case where it can."""
    if not part:
        return []
    backend, group = part[0][0].backend, f"{_PROCESS}-{next(_GROUPS)}"
    options = {"target": target, "seed": seed,
               **({"head_start": timing.gpu_head_start()} if backend == "cuda" else {}),
               **({"warm": True} if warm_pools(backend) else {})}
    try:
        with _stage("time"):
            timed = timing.time_rounds([_contender(i, ready) for i, (_, ready)
                                        in enumerate(part)], budget_s, backend, **options)
    except _Blame as blame:
        case = part[blame.index][0]
        nm = _not_measured(blame.__cause__)
        r = row(case, nm.status, f"{nm.reason} (while timed)", part[blame.index][1].check)
        if nm.fatal:
            raise DeviceFault(r) from blame.__cause__
        rest = iter(_time_part(part[:blame.index] + part[blame.index + 1:], budget_s, target,
                               seed, ceilings))
        return [r if i == blame.index else next(rest) for i in range(len(part))]
    except Exception as exc:  # outside any one case's call: the timer's, or a GPU fault seen
        nm = _not_measured(exc)  # at a synchronize, which no one call can be blamed for
        why = (f"{nm.reason} (while {len(part)} cases were timed together"
               + (": which one faulted is unknown)" if nm.fatal else ")"))
        rows = [row(c, nm.status, why, ready.check) for c, ready in part]
        if nm.fatal:
            fault = DeviceFault(rows[0])
            fault.done = rows[1:]
            raise fault from exc
        return rows
    return _timed_rows(part, timed, group, ceilings)


def _timed_rows(part: list[tuple[Case, Ready]], timed: list, group: str,
                ceilings: Ceilings | None) -> list[dict]:
    """The rows of a part timed together, each described and guarded (`guarded_row`); a row
    that cannot be made is `failed` and the rest go on, unless the GPU faulted describing it:
    then the rest are rows without a description, and DeviceFault is raised with them."""
    out: list[dict] = []
    faulted: dict | None = None
    for (case, ready), t in zip(part, timed):
        if faulted is not None:  # timed before the fault; no description can be made now
            out.append(guarded_row(timed_row(
                case, ready, t, group, "(no description: the GPU faulted describing "
                f"{faulted['algo']} {faulted['layout']})"), case, ready, ceilings))
            continue
        try:
            out.append(guarded_row(timed_row(case, ready, t, group, *_note(case, ready)),
                                   case, ready, ceilings))
        except Exception as exc:  # noqa: BLE001 - the row's, unless the GPU faulted
            nm = _not_measured(exc)
            if not nm.fatal:  # a bug in making this row: its row says so, the run goes on
                out.append(row(case, "failed", f"{nm.reason} (while its row was made)",
                               ready.check))
                continue
            faulted = row(case, nm.status, f"{nm.reason} (while described)", ready.check)
            out.append(faulted)
    if faulted is not None:
        fault = DeviceFault(faulted)
        fault.done = [r for r in out if r is not faulted]
        raise fault
    return out


def measure_group(group: list[Case], operands: Operands, budget_s: float,
                  impls: dict | None = None, limit: MemoryLimit | None = None,
                  target: float = timing.TARGET_NOISE, seed: int = 0, *,
                  ceilings: Ceilings | None = None) -> list[dict]:
    """Rows for a group of competing cases, in the group's order: each prepared and verified
    (`prepare`), then the verified ones timed together (`_time_part`), each checked against
    `ceilings` where given (`rows.plausibility`). Under `limit`, or where memory runs short,
    prepared cases are timed before the next is prepared. A case out of memory beside held
    ones is measured again alone once they are given back (preparing: the held ones are timed
    first; timed: after its part), so only a case that cannot fit by itself is `oom`. A fault
    of the GPU raises DeviceFault with the rows finished before it (`DeviceFault.done`)."""
    rows: dict[int, dict] = {}
    part: list[tuple[int, Case, Ready]] = []

    def attempt(i: int, case: Case, collect: bool = False) -> NotMeasured | None:
        """Prepare `case` into `part`, or say why not; garbage is collected before the
        group's first case and before a case tried again out of memory."""
        try:
            with limit.enforce(case.backend) if limit else contextlib.nullcontext():
                part.append((i, case, prepare(case, operands, (impls or {}).get(case.algo),
                                              limit, collect or i == 0)))
        except NotMeasured as nm:  # a copy: the raised one's traceback holds the attempt's
            # arrays (a fault's is kept, to chain: nothing runs after it)
            return nm if nm.fatal else NotMeasured(nm.status, nm.reason, nm.check)
        return None

    def time_part() -> None:
        done = _time_part([(c, r) for _, c, r in part], budget_s, target, seed, ceilings)
        beside = len(part) > 1
        timed = [(i, c) for i, c, _ in part]
        part.clear()  # the prepared cases given back before any is measured again alone
        again = [(i, c) for (i, c), r in zip(timed, done) if beside and r["status"] == "oom"]
        rows.update((i, r) for (i, _), r in zip(timed, done))
        for i, case in again:
            rows[i] = measure_group([case], operands, budget_s, impls, limit, target, seed,
                                    ceilings=ceilings)[0]

    try:
        for i, case in enumerate(group):
            nm = attempt(i, case)
            if nm is not None and nm.status == "oom" and part:  # the held cases' memory, maybe
                time_part()
                nm = attempt(i, case, collect=True)
            if nm is not None:
                rows[i] = row(case, nm.status, nm.reason, nm.check)
                if nm.fatal:
                    raise DeviceFault(rows[i]) from nm
                continue
            if limit is not None or _crowded(case.backend):
                time_part()
        time_part()
    except DeviceFault as fault:
        fault.done = [rows[i] for i in sorted(rows) if rows[i] is not fault.row] + fault.done
        raise
    return [rows[i] for i in range(len(group))]


def measure(case: Case, operands: Operands, budget_s: float, impl=None,
            limit: MemoryLimit | None = None, target: float = timing.TARGET_NOISE, *,
            ceilings: Ceilings | None = None) -> dict:
    """One results row for `case` alone: verified, its memory read and timed (and its phases,
    when it has them), or the reason it is not."""
    (r,) = measure_group([case], operands, budget_s, {case.algo: impl} if impl else None, limit,
                         target, ceilings=ceilings)
    return r


def run_groups(groups: Iterable[list[Case]], budget_s: float, impls: dict | None = None,
               on_row: Callable[[dict], None] | None = None, limit: MemoryLimit | None = None,
               target: float = timing.TARGET_NOISE, seed: int = 0, *,
               ceilings: Ceilings | None = None) -> list[dict]:
    """Measure each group of competing cases (`measure_group`) in order; `on_row` sees each row
    as soon as its group is done (to stream it). `impls` maps algo names to implementation
    objects that replace the registry's; `ceilings`, the device's, guard every timed row
    (`rows.plausibility`; None: no guard). `groups` may be a generator that decides what comes
    next from the rows `on_row` has seen (as the batch sweep does)."""
    # The reference on the GPU, beside the operands, unless a memory limit must see the
    # pools hold only the case's own memory.
    operands, rows = Operands(on_device=limit is None), []
    for group in groups:
        try:
            done = measure_group(group, operands, budget_s, impls, limit, target, seed,
                                 ceilings=ceilings)
        except DeviceFault as fault:  # the rows before it are kept, then nothing more can run
            for r in [*fault.done, fault.row]:
                rows.append(r)
                if on_row is not None:
                    on_row(r)
            raise
        for r in done:
            rows.append(r)
            if on_row is not None:
                on_row(r)
    return rows


def run(cases: Iterable[Case], budget_s: float, impls: dict | None = None,
        on_row: Callable[[dict], None] | None = None, limit: MemoryLimit | None = None,
        target: float = timing.TARGET_NOISE, seed: int = 0, *,
        ceilings: Ceilings | None = None) -> list[dict]:
    """`run_groups` of the competing groups of `cases` (`competing`), in their order."""
    return run_groups(competing(cases), budget_s, impls, on_row, limit, target, seed,
                      ceilings=ceilings)
