"""What one training step of a `Workload` holds in memory, layer by layer: the model of memory
`memprofile` shows and `memplan` bounds its search with.

The step (`Training.step`) is profiled in its steady state, the second step (SGD's momentum
buffers, made by the first, are held throughout), as a timeline of events, one per leaf
module's forward and backward, split into: weights; input (images and labels); activations
(the tensors autograd saved for backward, `saved_tensors_hooks`, while alive: a tensor saved
twice, or a view, counts once, by `StorageWeakRef`); gradients (a layer's own from its backward
event, when its dw exists, just before autograd accumulates it into `.grad`); optimizer (the
momentum buffers); other (outputs and gradients seen at the hooks, alive and not saved); and
workspace, the convolution workspaces of the passes a plan runs through convbench as their
algorithms declare them (`opcount.workspace_bytes`), either `held` throughout — how convbench
runs a plan today, `functional.run` memoizing each prepared pass with its buffers — or
`per-pass`, as cuDNN's and SuperNeurons' are. Torch's own convolution counts 0 (it does not
expose its workspace; the measured columns include it). Beside the model, what the allocators
saw at the same points (`memory.trace`: torch's and tracemalloc on the host, torch's and CuPy's
pool on a GPU), read from before the first step, plus the weights and batch made before it.

The categories are storage sizes, so the same hooks on the `meta` device give them for any batch
without computing anything: the largest batch under a budget is a doubling-then-bisection search
on that model's peak (`largest_modelled_batch`), for any assignment of algorithms to the conv
passes (`Algos`; `plan_algos` reads one from an advisor plan).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from functools import partial

from ..algos import registry
from ..algos.registry import TORCH_ALGOS
from ..machine.devices import backend_of
from ..measure import memory, opcount
from ..planning.plan import Plan
from .workload import Workload

#: (layer, pass) -> (algo, backend, layout) of the conv passes a configuration runs through
#: convbench; a pass left out runs in torch's own convolution.
Algos = Mapping[tuple[str, str], tuple[str, str, str]]
#: (layer, pass, batch) -> workspace bytes of that pass.
Workspace = Callable[[str, str, int], int]
CATEGORIES = ("weights", "input", "activations", "gradients", "optimizer", "other",
              "workspace")
#: How workspaces are allocated: held from a pass's first call on, or for the pass only.
WORKSPACE_MODES = ("held", "per-pass")
#: Largest batch the search tries.
MAX_BATCH = 1 << 20


@dataclass(frozen=True)
class Event:
    """The memory of one point of the step: the model's categories (bytes) and, when measured,
    the allocators' bytes allocated at the point and their peak since the previous one."""

    phase: str  # fwd, loss, bwd, step
    layer: str
    weights: int
    input: int
    activations: int
    gradients: int
    optimizer: int
    other: int
    workspace: int
    allocated: int | None = None
    peak: int | None = None

    @property
    def total(self) -> int:
        return sum(getattr(self, c) for c in CATEGORIES)


def _storage(t):
    """(identity, bytes, weak reference) of a tensor's storage."""
    from torch.multiprocessing.reductions import StorageWeakRef

    s = t.untyped_storage()
    return s._cdata, s.nbytes(), StorageWeakRef(s)


class _Live:
    """Storages by identity, counted while alive. A dead entry whose identity is reused by a new
    storage is replaced."""

    def __init__(self):
        self.refs: dict[int, tuple[int, object]] = {}

    def add(self, t) -> None:
        if t is None:
            return
        key, nbytes, ref = _storage(t)
        if key not in self.refs or self.refs[key][1].expired():
            self.refs[key] = (nbytes, ref)

    def bytes(self, exclude: set[int] = frozenset()) -> int:
        return sum(n for k, (n, ref) in self.refs.items() if k not in exclude and not ref.expired())

    def keys(self) -> set[int]:
        return {k for k, (_, ref) in self.refs.items() if not ref.expired()}


def profile_step(load: Workload, batch: int, device: str, workspace: Workspace | None = None,
                 plan: Plan | None = None, measure: bool = False,
                 held: bool = True) -> list[Event]:
    """The timeline of one steady-state training step of `load` at `batch` on `device`
    (`cpu`, `cuda`, or `meta`: sizes only). `plan` is applied to the model first
    (`apply`; not on `meta`); `workspace` gives each conv pass's workspace (default:
    none known), `held` whether they are held throughout or per pass (`WORKSPACE_MODES`). With
    `measure`, the allocators are read at every event too."""
    profile = _StepProfile(load, batch, device, workspace, plan, measure, held)
    with profile.trace if profile.trace is not None else contextlib.nullcontext():
        profile.first_step()
        profile.hooked_step()
    return profile.timeline()


class _StepProfile:
    """One profiled step: what its hooks read (the run, its parameters, the storages counted
    apart) and what they record (`sample`: an `Event` per hook), as methods rather than
    closures over the locals of `profile_step`."""

    def __init__(self, load: Workload, batch: int, device: str, workspace: Workspace | None,
                 plan: Plan | None, measure: bool, held: bool):
        import torch

        self.batch, self.held = batch, held
        self.held_bytes = (sum(workspace(*lp, batch) for lp in load.conv_passes())
                           if held and workspace else 0)
        self.workspace = workspace or (lambda layer, pass_, n: 0)
        self.run = run = load.prepare(batch, device, plan)
        self.params = list(run.model.parameters())
        self.fixed = {_storage(t)[0] for t in (*self.params, run.x, run.target)}
        self.weights = sum(_storage(p)[1] for p in self.params)
        self.batch_bytes = sum(_storage(t)[1] for t in (run.x, run.target))
        self.convs = {name for name, m in run.model.named_modules()
                      if isinstance(m, torch.nn.Conv2d)}
        self.saved, self.seen, self.grad_ready = _Live(), _Live(), set()
        self.events: list[Event] = []
        self.trace = memory.trace(backend_of(device)) if measure else None
        self.state = 0  # the optimizer's buffers, once the first step made them

    def sample(self, phase: str, layer: str, passes: list[str] = ()) -> None:
        if self.trace is not None:
            self.trace.mark()
        grads = sum(p.numel() * p.element_size() for p in self.params
                    if p.grad is not None or id(p) in self.grad_ready)
        ws = (self.held_bytes if self.held else
              max((self.workspace(layer, p, self.batch) for p in passes), default=0))
        fixed = self.fixed
        self.events.append(Event(phase, layer, self.weights, self.batch_bytes,
                                 self.saved.bytes(exclude=fixed), grads, self.state,
                                 self.seen.bytes(exclude=fixed | self.saved.keys()), ws))

    def on_forward(self, name: str, module, args, output) -> None:
        self.seen.add(output)
        self.sample("fwd", name, ["fwd"] if name in self.convs else [])

    def on_backward(self, name: str, module, grad_input, grad_output) -> None:
        for g in (*grad_input, *grad_output):
            self.seen.add(g)
        self.grad_ready.update(id(p) for p in module.parameters(recurse=False))
        passes = ["bwd_filter"] + (["bwd_data"] if grad_input[0] is not None else [])
        self.sample("bwd", name, passes if name in self.convs else [])

    def on_loss(self, loss) -> None:
        self.seen.add(loss)
        self.sample("loss", "cross-entropy")

    def first_step(self) -> None:
        """The step before the profiled one: it makes SGD's momentum buffers, and whatever is
        kept; the steady state the profiled step starts from."""
        import torch

        run = self.run
        run.step()
        run.opt.zero_grad(set_to_none=True)
        self.state = sum(_storage(v)[1] for s in run.opt.state.values() for v in s.values()
                         if torch.is_tensor(v))
        if self.trace is not None:
            self.trace.mark()

    def hooked_step(self) -> None:
        """The profiled step, an event at every leaf module's forward and backward, the loss
        and the optimizer's step."""
        import torch

        model, handles = self.run.model, []
        for module in model.modules():  # a full backward hook forbids in-place ops on its
            if getattr(module, "inplace", False):  # module's output: ReLU(inplace) keeps a
                module.inplace = False  # copy here, so a user model's peak is over, not under
        for name, module in model.named_modules():
            if name and not any(module.children()):
                handles.append(module.register_forward_hook(partial(self.on_forward, name)))
                handles.append(module.register_full_backward_hook(
                    partial(self.on_backward, name)))
        try:
            # the loss's and backward's saved tensors count too
            with torch.autograd.graph.saved_tensors_hooks(_saver(self.saved), lambda t: t):
                self.run.step(on_loss=self.on_loss)
                self.sample("step", "sgd")
        finally:
            for h in handles:
                h.remove()

    def timeline(self) -> list[Event]:
        """The events, with what the allocators saw at each where they were read."""
        if self.trace is None:
            return self.events
        base = self.weights + self.batch_bytes  # allocated before the trace began
        return [Event(**{**asdict(e), "allocated": base + p.allocated, "peak": base + p.peak})
                for e, p in zip(self.events, self.trace.points[1:])]


def _saver(saved: _Live):
    def pack(t):
        saved.add(t)
        return t

    return pack


def peak(events: list[Event]) -> Event:
    """The event with the largest modelled total."""
    return max(events, key=lambda e: e.total)


def plan_algos(plan: Plan) -> Algos:
    """The passes an advisor plan runs through convbench (torch's own are left out)."""
    return {(lp.layer, pass_): (choice.algo, choice.backend, lp.layout)
            for lp in plan.layers for pass_, choice in lp.passes.items()
            if choice is not None and choice.algo not in TORCH_ALGOS}


def declared_workspace(load: Workload, algos: Algos, precision: str = "fp32") -> Workspace:
    """Each pass's workspace at any batch, as its chosen implementation declares it (0 for
    torch's convolution or an implementation that does not say)."""
    problems = {layer.name: layer.problem for layer in load.conv_layers}

    def at(layer: str, pass_: str, n: int) -> int:
        choice = algos.get((layer, pass_))
        if choice is None:
            return 0
        algo, backend, layout = choice
        impl = registry.get(algo, backend)
        return opcount.workspace_bytes(impl, problems[layer].with_batch(n), pass_, layout,
                                       precision) or 0

    return at


def modelled_peak(load: Workload, algos: Algos, held: bool = True) -> Callable[[int], Event]:
    """batch -> the peak event of the step modelled on `meta`, workspaces as declared, held or
    per pass (none without `algos`: torch's own convolutions)."""
    ws = declared_workspace(load, algos) if algos else None
    return lambda n: peak(profile_step(load, n, "meta", workspace=ws, held=held))


def largest_modelled_batch(peak_at: Callable[[int], Event], budget: int,
                           start: int = 1) -> tuple[int, Event | None]:
    """The largest batch whose modelled peak total fits `budget` (peaks grow with the batch),
    and its peak event; (0, None) if not even one image fits. Doubles from `start`, then
    bisects: the model costs nothing to ask, so no bound on the growth is needed."""
    lo, lo_event = 0, None
    hi = max(1, start)
    while hi <= MAX_BATCH:
        e = peak_at(hi)
        if e.total > budget:
            break
        lo, lo_event, hi = hi, e, hi * 2
    else:
        return lo, lo_event
    while hi - lo > 1:
        mid = (lo + hi) // 2
        e = peak_at(mid)
        if e.total > budget:
            hi = mid
        else:
            lo, lo_event = mid, e
    return lo, lo_event
