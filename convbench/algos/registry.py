"""Which implementations exist: one per (algo, backend), found by `@register`.

The contract an implementation keeps is `Implementation` (and `TransformGrid` for FFT): an
abstract class rather than a list of names probed with `hasattr`, so that `register` refuses a
class that breaks it at import, and callers use every hook without asking whether it is there.

Modules under `convbench.algos` register themselves on import; `load()` imports them all, so a
new algorithm is one new file, with no list to edit. It registers with its traits
(`traits.Algorithm`: family, origin, tolerance, reduction, count, deterministic), which every
table of the harness, the guard, the reports, the advice and the docs reads (`algorithm`), so none of them is keyed by
algorithm names.
"""

from __future__ import annotations

import abc
import contextlib
import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, Protocol, runtime_checkable

from ..core.problem import LAYOUTS, PASSES, PRECISIONS, ConvProblem, check_choice, pair_text
from ..machine import backends
from . import dilation, padding
from .phases import CONVOLUTION, CROP, EXPLICIT_PAD, Phased
from .traits import Algorithm

#: The shipped algorithms, in the order tables and listings show them (the vocabulary of
#: docs/pages/design.md §2). Only an order: what each is, its traits say where it registers; an
#: algorithm registered under another name (a test's, a plugin's) follows these, in the order it
#: registered (`names`).
ALGOS = ("direct", "gemm", "gemm-cublas", "fft", "fft-tiled", "winograd-2x2", "winograd-4x4",
         "winograd-5x5", "winograd-6x6", "winograd-fused-2x2", "winograd-fused-4x4",
         # Winograd with the filters transformed once (inference, `traits.weights_once`)
         "winograd-2x2-inference", "winograd-4x4-inference", "winograd-5x5-inference",
         "winograd-6x6-inference", "cudnn",
         "cudnn-autotune", "torch-cpu",
         # cuDNN's algorithms one by one, through its find API (`algos.cudnn_find`)
         "cudnn-find-implicit-gemm", "cudnn-find-implicit-precomp-gemm", "cudnn-find-gemm",
         "cudnn-find-direct", "cudnn-find-fft", "cudnn-find-fft-tiling", "cudnn-find-winograd",
         "cudnn-find-winograd-nonfused", "cudnn-find-algo-0", "cudnn-find-algo-1",
         "cudnn-find-algo-3")
#: A pass a plan leaves to torch, as plans and reports name it: torch's own convolution, judged
#: as the exact algorithms are.
TORCH_DEFAULT = "torch default"
#: What `winograd` and `all` mean on the command line.
ALIASES = {"winograd": ("winograd-2x2", "winograd-4x4"),
           "winograd-fused": ("winograd-fused-2x2", "winograd-fused-4x4"),
           "cudnn-find": tuple(a for a in ALGOS if a.startswith("cudnn-find-")),
           "winograd-inference": tuple(a for a in ALGOS if a.endswith("-inference"))}
#: Algos that `all` leaves out, asked for by name (their alias): cuDNN's algorithms one by one
#: are eleven cases more per pass, for the study of cuDNN, not for choosing a plan; Winograd's
#: inference variants are rows reported apart, for inference, not for a training plan.
OPT_IN = ALIASES["cudnn-find"] + ALIASES["winograd-inference"]

class UnsupportedError(ValueError):
    """The implementation cannot run this problem; the message is its one-line reason."""


#: One prepared pass: ``run(a, b, out)`` reads the pass's two inputs and writes every element of
#: the preallocated `out` (NumPy arrays on `numpy` and `emu`, CuPy on `cuda`).
PassFn = Callable[[Any, Any, Any], None]


class Implementation(abc.ABC):
    """One algorithm on one backend, as the harness, the functional API and the advisor use it.

    Subclass it and decorate the class with `register(algo, backend)`, which sets `algo` and
    `backend` on the one instance it keeps. `supports` and `prepare` are required; the other
    hooks have defaults that mean "nothing to add", so callers call them without checking.
    Arrays follow `ConvProblem.operand_shapes(pass_, layout)`.
    """

    #: The precisions it runs (`fp64`, `fp32`, ...): `supports` is asked only about these.
    precisions: ClassVar[tuple[str, ...]]
    #: Whether it runs a padding that differs before and after (`ConvProblem.pad_top`, ...)
    #: itself. If not, `register` files it behind `ExplicitPad`, and every hook sees only
    #: problems padded alike on both sides.
    asymmetric_pad: ClassVar[bool] = False
    #: Whether a dilated problem it refuses runs as its undilated phases (`dilation.split`):
    #: `register` then files it behind `DilationSplit`. For implementations whose tiles take
    #: no dilation (Winograd, FFT); one that runs dilation itself leaves it False.
    split_dilation: ClassVar[bool] = False
    algo: str
    backend: str

    @abc.abstractmethod
    def supports(self, problem: ConvProblem, pass_: str, layout: str,
                 precision: str) -> str | None:
        """None, or a one-line reason why it cannot run this combination. Never raises: the
        runner records the reason as the case's `unsupported` row."""

    @abc.abstractmethod
    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str) -> PassFn:
        """The pass, ready to time: everything that must not be timed (library plans,
        compilation, workspace allocation) happens here, once."""

    def available(self) -> str | None:
        """None when its own needs beyond the backend (a library, a device) are met here, else
        why not; `impl_available` asks the backend first."""
        return None

    def describe(self, problem: ConvProblem, pass_: str, layout: str, precision: str) -> str:
        """A note for the results row (which FFT library, which cuDNN kernel ran); "" for none."""
        return ""

    def kernels(self, problem: ConvProblem, pass_: str, layout: str,
                precision: str) -> list[str] | None:
        """For a library that picks its own kernels: the GPU kernels one call launches, by
        name, so the row says what ran (`kernelnames`: whether on tensor cores), not only what
        was allowed. None: not said (our own algorithms are what they are named)."""
        return None

    def compile(self, problem: ConvProblem, pass_: str, layout: str, precision: str) -> None:
        """Compile what the pass will run (a JIT's machine code), before the runner traces
        `prepare`'s memory: the compiler's one-time memory in a process is not the pass's
        workspace. Nothing by default."""

    def workspace_bytes(self, problem: ConvProblem, pass_: str, layout: str,
                        precision: str) -> int | None:
        """The bytes it allocates beyond inputs and output, or None when it does not say:
        `opcount.workspace_bytes` then falls back to the algorithm's theoretical figure."""
        return None

    def phases(self, problem: ConvProblem, pass_: str, layout: str,
               precision: str) -> list[str] | None:
        """The names of the pass's phases, in order, when the prepared callable carries
        ``phase_fns`` (the contract is `convbench.algos.phases`); None: the pass is one phase."""
        return None

    def judged_as(self, problem: ConvProblem, pass_: str, layout: str,
                  precision: str) -> str | None:
        """For a library that picks its own algorithm: the algo whose tolerance judges the pass
        it ran (asked only of a pass that failed its own); None: its own tolerance."""
        return None


@runtime_checkable
class TransformGrid(Protocol):
    """What an FFT implementation adds: the grid it transforms on, which `opcount` counts. The
    grid is the implementation's choice (FFTW's or cuFFT's fast sizes, fft-tiled's tiles), so the
    count asks it rather than restating it."""

    def transform_grid(self, problem: ConvProblem, pass_: str) -> tuple[int, int, int]:
        """(transform height, width, tiles per image) as this implementation runs `pass_`."""


class ExplicitPad(Implementation):
    """An implementation that pads both sides alike, running a problem padded unequally as
    `ConvProblem.symmetric_part()`: x padded (or cropped) explicitly first, or its dx cropped
    after (`convbench.algos.padding`), a phase of its own timed apart from the pass's time. The
    explicit pad keeps what padding both sides share; where the implementation refuses that
    (Winograd takes one padding for both axes), every side is padded explicitly instead.
    Problems padded alike reach the implementation untouched; its own attributes
    (`transform_grid`, Winograd's `m`) are read through."""

    def __init__(self, inner: Implementation):
        self.inner = inner
        self.precisions = inner.precisions
        # The protocols' methods in the instance itself: Python 3.12's isinstance against a
        # runtime-checkable protocol looks attributes up statically, past `__getattr__`.
        if hasattr(inner, "transform_grid"):
            self.transform_grid = inner.transform_grid

    def __getattr__(self, name: str):
        if name == "inner":  # not set yet (copy, pickle): no recursion through getattr
            raise AttributeError(name)
        return getattr(self.inner, name)

    def route(self, problem: ConvProblem, pass_: str, layout: str, precision: str
              ) -> tuple[ConvProblem, tuple[int, int, int, int], str | None]:
        """(the problem the implementation runs, the explicit pad (left, right, top, bottom)
        of x before it, the implementation's reason if it runs neither form)."""
        sym, explicit = problem.symmetric_part()
        reason = self.inner.supports(sym, pass_, layout, precision)
        if reason and sym is not problem:
            whole, all_sides = problem.symmetric_part(whole=True)
            if whole != sym and self.inner.supports(whole, pass_, layout, precision) is None:
                return whole, all_sides, None
        return sym, explicit, reason

    def supports(self, problem, pass_, layout, precision):
        sym, _, reason = self.route(problem, pass_, layout, precision)
        if reason and sym is not problem:
            return f"{reason} (padding {pair_text(problem.pad)} runs as {pair_text(sym.pad)} " \
                   "after an explicit pad)"
        return reason

    def available(self):
        return self.inner.available()

    def describe(self, problem, pass_, layout, precision):
        sym, (left, right, top, bottom), _ = self.route(problem, pass_, layout, precision)
        note = self.inner.describe(sym, pass_, layout, precision)
        if sym is problem:
            return note
        step = "dx cropped" if pass_ == "bwd_data" else "x padded"
        return (f"{note}{'; ' if note else ''}padding {pair_text(problem.pad)}: {step} "
                f"explicitly by {top}+{bottom}x{left}+{right} (timed apart), then padding "
                f"{pair_text(sym.pad)}")

    def compile(self, problem, pass_, layout, precision):
        sym, _, _ = self.route(problem, pass_, layout, precision)
        self.inner.compile(sym, pass_, layout, precision)

    def judged_as(self, problem, pass_, layout, precision):
        sym, _, _ = self.route(problem, pass_, layout, precision)
        return self.inner.judged_as(sym, pass_, layout, precision)

    def kernels(self, problem, pass_, layout, precision):
        sym, _, _ = self.route(problem, pass_, layout, precision)
        return self.inner.kernels(sym, pass_, layout, precision)

    def workspace_bytes(self, problem, pass_, layout, precision):
        sym, explicit, _ = self.route(problem, pass_, layout, precision)
        inner = self.inner.workspace_bytes(sym, pass_, layout, precision)
        if inner is None:
            return None
        return inner + padding.explicit_bytes(problem, precision, explicit)

    def phases(self, problem, pass_, layout, precision):
        sym, _, _ = self.route(problem, pass_, layout, precision)
        inner = self.inner.phases(sym, pass_, layout, precision)
        if sym is problem:
            return inner
        inner = inner or [CONVOLUTION]
        return inner + [CROP] if pass_ == "bwd_data" else [EXPLICIT_PAD] + inner

    def prepare(self, problem, pass_, layout, precision):
        sym, explicit, _ = self.route(problem, pass_, layout, precision)
        run = self.inner.prepare(sym, pass_, layout, precision)
        if sym is problem:
            return run
        inner = getattr(run, "phase_fns", None)
        if pass_ == "bwd_data":
            crop = padding.CropOutput(problem, layout, explicit)
            steps = {CONVOLUTION: lambda a, b, out: run(a, b, crop.target(out)),
                     CROP: lambda a, b, out: crop(out)}
        else:
            pad = padding.PadInput(problem, layout, explicit)
            steps = {EXPLICIT_PAD: lambda a, b, out: pad(a),
                     CONVOLUTION: lambda a, b, out: run(pad.buffer.get(a), b, out)}
        # forgetting the call forgets the inner pass's too: its own box holds the call's w, y,
        # dy or dw (and torch's views of them) between calls of a memoized pass otherwise
        phased = Phased(steps, on_forget=getattr(run, "forget", None))
        if inner:  # the inner pass's own phases, replaying the call `phased` made
            mine = dict(phased.phase_fns)
            pad_fn, crop_fn = mine.get(EXPLICIT_PAD), mine.get(CROP)
            phased.phase_fns = {**({EXPLICIT_PAD: pad_fn} if pad_fn else {}), **inner,
                                **({CROP: crop_fn} if crop_fn else {})}
        return phased


class DilationSplit(Implementation):
    """An implementation that runs no dilation, running a dilated problem as its undilated
    phases (`dilation.split`: space to batch, the batch times the phases): x (or dy) copied
    into the phases, the undilated problem run, its result copied back out, both copies timed
    as phases of the pass (`dilation.SPLIT`, `dilation.MERGE`). Undilated problems, and those
    with no split (a stride that does not divide the dilation), reach the implementation
    untouched; its own attributes are read through."""

    def __init__(self, inner: Implementation):
        self.inner = inner
        self.precisions = inner.precisions
        if hasattr(inner, "transform_grid"):  # as in ExplicitPad: the protocol's method here
            self.transform_grid = lambda problem, pass_: inner.transform_grid(
                self.undilated(problem)[0], pass_)

    def __getattr__(self, name: str):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @staticmethod
    def undilated(problem: ConvProblem) -> tuple[ConvProblem, dilation.Split | None]:
        """(the problem the implementation runs, the split that leads there, or None)."""
        s = dilation.split(problem)
        return (problem, None) if s is None else (s.problem, s)

    def supports(self, problem, pass_, layout, precision):
        sub, s = self.undilated(problem)
        reason = self.inner.supports(sub, pass_, layout, precision)
        if reason and s is not None:
            return f"{reason} (dilation {pair_text(problem.dilation)} runs as {s.phases} " \
                   "undilated phases)"
        return reason

    def available(self):
        return self.inner.available()

    def describe(self, problem, pass_, layout, precision):
        sub, s = self.undilated(problem)
        note = self.inner.describe(sub, pass_, layout, precision)
        return note if s is None else f"{note}{'; ' if note else ''}{dilation.text(s)}"

    def compile(self, problem, pass_, layout, precision):
        self.inner.compile(self.undilated(problem)[0], pass_, layout, precision)

    def judged_as(self, problem, pass_, layout, precision):
        return self.inner.judged_as(self.undilated(problem)[0], pass_, layout, precision)

    def kernels(self, problem, pass_, layout, precision):
        return self.inner.kernels(self.undilated(problem)[0], pass_, layout, precision)

    def workspace_bytes(self, problem, pass_, layout, precision):
        sub, s = self.undilated(problem)
        inner = self.inner.workspace_bytes(sub, pass_, layout, precision)
        if inner is None or s is None:
            return inner
        return inner + dilation.workspace_bytes(s, precision)

    def phases(self, problem, pass_, layout, precision):
        sub, s = self.undilated(problem)
        inner = self.inner.phases(sub, pass_, layout, precision)
        if s is None:
            return inner
        merge = [] if pass_ == "bwd_filter" else [dilation.MERGE]  # dw is the phases' own
        return [dilation.SPLIT, *(inner or [CONVOLUTION]), *merge]

    def prepare(self, problem, pass_, layout, precision):
        sub, s = self.undilated(problem)
        run = self.inner.prepare(sub, pass_, layout, precision)
        if s is None:
            return run
        ph = dilation.Phases(problem, s, layout)
        box: dict = {}  # the undilated call's operands, from the split to the merge
        if pass_ == "fwd":
            def split(x, w, y):
                box["call"] = (ph.split_x(x), w, ph.y_target(x))

            def merge(x, w, y):
                ph.merge_y(y)
        elif pass_ == "bwd_data":
            def split(dy, w, dx):
                box["call"] = (ph.split_y(dy), w, ph.x_target(dy))

            def merge(dy, w, dx):
                ph.merge_x(dx)
        else:
            def split(x, dy, dw):
                box["call"] = (ph.split_x(x), ph.split_y(dy), dw)

            merge = None
        steps = {dilation.SPLIT: split, CONVOLUTION: lambda a, b, out: run(*box["call"])}
        if merge is not None:
            steps[dilation.MERGE] = merge

        def forget():
            box.clear()
            if hasattr(run, "forget"):
                run.forget()

        phased = Phased(steps, on_forget=forget)
        inner = getattr(run, "phase_fns", None)
        if inner:  # the inner pass's own phases, replaying the call `phased` made
            mine = phased.phase_fns
            phased.phase_fns = {dilation.SPLIT: mine[dilation.SPLIT], **inner,
                                **({dilation.MERGE: mine[dilation.MERGE]}
                                   if dilation.MERGE in mine else {})}
        return phased


def wrap(cls: type, algo: str, backend: str) -> Implementation:
    """The one instance of a registered class, as the registry files it: behind `ExplicitPad`
    where it pads both sides alike, behind `DilationSplit` where it splits dilation."""
    inst = cls()
    inst.algo, inst.backend = algo, backend
    if not cls.asymmetric_pad:
        inst = ExplicitPad(inst)
        inst.algo, inst.backend = algo, backend
    if getattr(cls, "split_dilation", False):  # a baseline's class from before it
        inst = DilationSplit(inst)
        inst.algo, inst.backend = algo, backend
    return inst


_IMPLS: dict[tuple[str, str], Implementation] = {}
_ALGORITHMS: dict[str, Algorithm] = {}
_loaded = False


def declare(algorithm: Algorithm) -> Algorithm:
    """File an algorithm's traits under its name (`register` does, for each implementation; a
    stand-in that is handed to the runner directly, as the tests' are, declares its own). A bare
    name, an alias's name, or a second declaration of the name that differs raises here."""
    _check_traits(algorithm)
    algo = algorithm.name
    if algo in ALIASES:
        raise ValueError(f"algorithm name {algo!r} is a command-line alias of "
                         f"{', '.join(ALIASES[algo])}")
    declared = _ALGORITHMS.setdefault(algo, algorithm)
    if declared != algorithm:
        raise ValueError(f"{algo} is declared with other traits than before: {algorithm} "
                         f"against {declared}")
    return algorithm


def register(algorithm: Algorithm, backend: str) -> Callable[[type], type]:
    """Class decorator: instantiate the class and file it under (algorithm, backend), the
    algorithm declared by its traits (`declare`; every backend of one name passes an equal
    declaration). A bare name, a class that breaks the contract (`Implementation`) or a second
    declaration that differs raises here, at import."""
    _check_traits(algorithm)
    check_choice("backend", backend, backends.BACKENDS)
    algo = algorithm.name

    def deco(cls: type) -> type:
        key = (algo, backend)
        if key in _IMPLS:
            raise RuntimeError(f"{algo} on {backend} registered twice")
        _check_contract(cls, f"{algo} on {backend}")
        declare(algorithm)
        _IMPLS[key] = wrap(cls, algo, backend)
        return cls

    return deco


def _check_traits(algorithm) -> None:
    """Raises TypeError where `algorithm` is not an algorithm's traits (a bare name)."""
    if not isinstance(algorithm, Algorithm):
        raise TypeError(f"{algorithm!r}: an algorithm registers with its traits, "
                        f"registry.register(Algorithm(name, family=..., origin=..., "
                        f"tolerance=..., reduction=..., counts=..., deterministic=...), "
                        f"backend)")


def _check_contract(cls: type, what: str) -> None:
    """Raises TypeError, in one line, where `cls` breaks the contract of `Implementation`."""
    name = getattr(cls, "__qualname__", repr(cls))
    if not (isinstance(cls, type) and issubclass(cls, Implementation)):
        raise TypeError(f"{name} cannot register as {what}: it does not subclass "
                        f"registry.Implementation")
    if cls.__abstractmethods__:
        raise TypeError(f"{name} cannot register as {what}: it does not define "
                        f"{', '.join(sorted(cls.__abstractmethods__))}")
    precisions = getattr(cls, "precisions", None)
    if (not isinstance(precisions, tuple) or not precisions
            or not set(precisions) <= set(PRECISIONS)):
        raise TypeError(f"{name} cannot register as {what}: its precisions must be a non-empty "
                        f"tuple of {', '.join(PRECISIONS)}, not {precisions!r}")


def load() -> None:
    """Import every module of `convbench.algos` once, so each registers itself."""
    global _loaded
    if _loaded:
        return
    from .. import algos

    for mod in sorted(pkgutil.iter_modules(algos.__path__), key=lambda m: m.name):
        importlib.import_module(f"{algos.__name__}.{mod.name}")
    _loaded = True


def names() -> list[str]:
    """Every registered algorithm's name: the shipped ones in `ALGOS` order, then the others in
    the order they registered."""
    load()
    rank = {a: i for i, a in enumerate(ALGOS)}
    return sorted(_ALGORITHMS, key=lambda a: rank.get(a, len(ALGOS)))


def algorithm(name: str) -> Algorithm:
    """The traits `name` registered with; ValueError naming the registered algorithms if none
    did (a row of an algorithm this code does not have is not judged by another's traits)."""
    load()
    found = _ALGORITHMS.get(name)
    if found is None:
        raise ValueError(f"unknown algo {name!r}; valid: {', '.join(names())}")
    return found


def algorithms() -> list[Algorithm]:
    """Every registered algorithm's traits, in `names` order."""
    return [_ALGORITHMS[a] for a in names()]


class _TorchAlgos(Mapping):
    """The algorithms that are torch's own convolution (origin `torch`), each with the
    `cudnn.benchmark` it runs with (None: whatever is set), read from their traits when asked
    (so after `load`)."""

    def __getitem__(self, algo: str) -> bool | None:
        load()
        found = _ALGORITHMS.get(algo)
        if found is None or found.origin != "torch":
            raise KeyError(algo)
        return found.torch_benchmark

    def __iter__(self) -> Iterator[str]:
        return iter([a.name for a in algorithms() if a.origin == "torch"])

    def __len__(self) -> int:
        return sum(1 for _ in self)


#: Algorithms that are torch's own convolution, and the `cudnn.benchmark` each runs with (None:
#: whatever is set). A pass planned for one of them is left to torch when the plan is applied.
TORCH_ALGOS: Mapping[str, bool | None] = _TorchAlgos()


@contextlib.contextmanager
def scratch() -> Iterator[None]:
    """The registry as loaded, restored on leaving: what is registered inside (a test's own
    algorithm) does not outlive it."""
    load()
    impls, algos = dict(_IMPLS), dict(_ALGORITHMS)
    try:
        yield
    finally:
        _IMPLS.clear()
        _IMPLS.update(impls)
        _ALGORITHMS.clear()
        _ALGORITHMS.update(algos)


def get(algo: str, backend: str) -> Implementation:
    """The implementation of `algo` on `backend`; ValueError naming what exists if none."""
    load()
    check_choice("algo", algo, names())
    check_choice("backend", backend, backends.BACKENDS)
    impl = _IMPLS.get((algo, backend))
    if impl is None:
        have = ", ".join(sorted(a for a, b in _IMPLS if b == backend)) or "none"
        raise ValueError(f"algo {algo!r} has no {backend} implementation; {backend} has: {have}")
    return impl


def implementations(backend: str | None = None) -> list[Implementation]:
    """Registered implementations, in `names` order, optionally of one backend."""
    order = {a: i for i, a in enumerate(names())}
    keys = sorted(_IMPLS, key=lambda k: (order[k[0]], backends.BACKENDS.index(k[1])))
    return [_IMPLS[k] for k in keys if backend is None or k[1] == backend]


def algos_for(backend: str) -> list[str]:
    return [impl.algo for impl in implementations(backend)]


def expand_algos(text: str, backend: str) -> list[str]:
    """`direct,winograd` -> ['direct', 'winograd-2x2', 'winograd-4x4']; `all` -> every algo the
    backend has but the `OPT_IN` ones (`cudnn-find` names those). Unknown names raise ValueError
    naming the valid ones."""
    have, known = algos_for(backend), names() + list(ALIASES) + ["all"]
    out: list[str] = []
    for name in (t.strip() for t in text.split(",")):
        if not name:
            continue
        meant = ([a for a in have if a not in OPT_IN] if name == "all"
                 else ALIASES.get(name, (name,)))
        for a in meant:
            check_choice("algo", a, known)
            if a not in have:
                raise ValueError(f"algo {a!r} is not available on {backend}; "
                                 f"valid: {', '.join(have)}")
            if a not in out:
                out.append(a)
    if not out:
        raise ValueError(f"no algo given; valid: {', '.join(have)}")
    return out


def impl_available(impl: Implementation) -> str | None:
    """None if this implementation can run here: its backend, then its own needs."""
    return backends.available(impl.backend) or impl.available()


def supports(impl: Implementation, problem: ConvProblem, pass_: str, layout: str,
             precision: str) -> str | None:
    """None if `impl` runs this combination, else a one-line reason."""
    check_choice("pass", pass_, PASSES)
    check_choice("layout", layout, LAYOUTS)
    check_choice("precision", precision, PRECISIONS)
    if precision not in impl.precisions:
        return f"{impl.algo} on {impl.backend} runs {'/'.join(impl.precisions)}, not {precision}"
    return impl.supports(problem, pass_, layout, precision)


# --- what implementations keep on the GPU -------------------------------------------------------
#: What implementations keep on the GPU from one case to the next (cuFFT plans hold their work
#: areas in CuPy's pool): each a callable that drops its cache. `clear_device_caches` runs them
#: before every case on the GPU and after an out-of-memory, so a case's peak includes its own
#: plans and no earlier case's count against its memory limit.
_DEVICE_CACHES: list = []


def register_device_cache(clear):
    """Add `clear` (a no-argument callable dropping a cache of GPU memory); returns it."""
    _DEVICE_CACHES.append(clear)
    return clear


def clear_device_caches() -> None:
    for clear in _DEVICE_CACHES:
        clear()
