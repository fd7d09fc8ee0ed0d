"""`convbench memprofile`: what one training step holds in memory, layer by layer, and the
largest batch that fits a memory budget under torch's defaults and under the advisor's plans.

Feature maps dominate training memory and sit idle between the forward pass that makes them and
the backward pass that reads them (Kim et al. 2019); activations grow with the batch while the
weights do not (Torres et al.); and a convolution's workspace decides whether the fastest
algorithm fits beside them (SuperNeurons). This profiles the step `convbench train-step` times —
`trainstep.build_model`'s AlexNet-shaped model, cross-entropy, backward, SGD with momentum — in
its steady state (the second step: SGD's momentum buffers, made by the first, are held
throughout), as a timeline of events, one per leaf module's forward and backward, split into

- weights: the parameters;
- input: the batch of images and labels;
- activations: the tensors autograd saved for backward (`saved_tensors_hooks`), while alive
  (`StorageWeakRef`: a tensor saved twice, or a view, counts once; freed ones not at all);
- gradients: the parameters' gradients, a layer's own counted from its backward event (its dw
  exists then, though autograd accumulates it into `.grad` just after);
- optimizer: SGD's momentum buffers (made by the first step);
- other: the layer outputs and gradients seen at the hooks, alive and not saved;
- workspace: the convolution workspaces of the passes a plan runs through convbench, as their
  algorithms declare them at this batch (`opcount.workspace_bytes`), in one of two ways:
  `held` — how convbench runs a plan today: `functional.run` memoizes each prepared pass with
  its buffers, so after the first step every planned pass's workspace is held throughout —
  or `per-pass` — allocated for the pass and freed after it, as cuDNN's are and as SuperNeurons
  manages them: only the pass running at a conv layer's event counts. Torch's own convolution
  counts 0: torch does not expose its workspace (the measured columns include it);

and, beside the model, what the allocators saw at the same points (`memory.trace`: torch's CPU
allocator and tracemalloc on the host, torch's caching allocator and CuPy's pool on a GPU),
read from before the first step (so what it leaves held is seen), plus the weights and the
batch, which existed before.

The categories are tensors' storage sizes, so the same hooks on the `meta` device give them for
any batch without computing or allocating anything: the largest batch under a budget is a
doubling-then-bisection search on that model's peak (`largest_batch`), for any assignment of
algorithms to the conv layers' passes (`Algos`; `plan_algos` reads one from an advisor plan).
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from . import layers, memory, opcount, registry, report, trainstep
from .apply import apply
from .devices import backend_of
from .plan import TORCH_ALGOS, Plan

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


def train_step(model, opt, x, target, on_loss: Callable[[object], None] = lambda loss: None):
    """One step as `convbench train-step` times it: zero the gradients (freeing them),
    forward, cross-entropy, backward, SGD update."""
    opt.zero_grad(set_to_none=True)
    loss = trainstep.loss(model(x), target)
    on_loss(loss)
    with warnings.catch_warnings():
        # conv1's input needs no gradient, so its full backward hook fires on its outputs.
        warnings.filterwarnings("ignore", "Full backward hook is firing")
        loss.backward()
    opt.step()


def _model_and_batch(net: str, batch: int, device: str):
    """The model and a batch on `device`; on `meta` made there directly, so no weights are
    initialized and no image is drawn."""
    import torch

    torch.manual_seed(0)
    if device != "meta":
        return trainstep.build_model(net).to(device), *trainstep.example_batch(net, batch,
                                                                               device)
    with torch.device("meta"):
        model = trainstep.build_model(net)
    return (model, torch.empty(batch, *trainstep.input_shape(net), device="meta"),
            torch.empty(batch, dtype=torch.long, device="meta"))


def conv_passes(net: str) -> list[tuple[str, str]]:
    """The conv passes a training step of `net`'s model runs: all three of every layer but the
    first, whose input (the images) needs no gradient, so no bwd_data."""
    convs = [layer.name for layer in layers.net_layers(net)]
    return [(name, p) for i, name in enumerate(convs)
            for p in ("fwd", "bwd_data", "bwd_filter") if i or p != "bwd_data"]


def profile_step(net: str, batch: int, device: str, workspace: Workspace | None = None,
                 plan: Plan | None = None, measure: bool = False,
                 held: bool = True) -> list[Event]:
    """The timeline of one steady-state training step of `net`'s model at `batch` on `device`
    (`cpu`, `cuda`, or `meta`: sizes only). `plan` is applied to the model first
    (`apply`; not on `meta`); `workspace` gives each conv pass's workspace (default:
    none known), `held` whether they are held throughout or per pass (`WORKSPACE_MODES`). With
    `measure`, the allocators are read at every event too."""
    import torch

    held_bytes = (sum(workspace(*lp, batch) for lp in conv_passes(net))
                  if held and workspace else 0)
    workspace = workspace or (lambda layer, pass_, n: 0)
    model, x, target = _model_and_batch(net, batch, device)
    if plan is not None:
        apply(model, plan)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)  # as trainstep's
    params = list(model.parameters())
    fixed = {_storage(t)[0] for t in (*params, x, target)}
    weights = sum(_storage(p)[1] for p in params)
    batch_bytes = sum(_storage(t)[1] for t in (x, target))
    convs = {name for name, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)}
    saved, seen, grad_ready = _Live(), _Live(), set()
    events: list[Event] = []
    trace = memory.trace(backend_of(device)) if measure else None
    state = 0

    def sample(phase: str, layer: str, passes: list[str] = ()) -> None:
        if trace is not None:
            trace.mark()
        grads = sum(p.numel() * p.element_size() for p in params
                    if p.grad is not None or id(p) in grad_ready)
        ws = held_bytes if held else max((workspace(layer, p, batch) for p in passes), default=0)
        events.append(Event(phase, layer, weights, batch_bytes, saved.bytes(exclude=fixed),
                             grads, state, seen.bytes(exclude=fixed | saved.keys()), ws))

    def forward_hook(name):
        def hook(module, args, output):
            seen.add(output)
            sample("fwd", name, ["fwd"] if name in convs else [])
        return hook

    def backward_hook(name):
        def hook(module, grad_input, grad_output):
            for g in (*grad_input, *grad_output):
                seen.add(g)
            grad_ready.update(id(p) for p in module.parameters(recurse=False))
            passes = ["bwd_filter"] + (["bwd_data"] if grad_input[0] is not None else [])
            sample("bwd", name, passes if name in convs else [])
        return hook

    def on_loss(loss) -> None:
        seen.add(loss)
        sample("loss", "cross-entropy")

    with trace if trace is not None else contextlib.nullcontext():
        train_step(model, opt, x, target)  # makes SGD's momentum buffers, and whatever is kept
        opt.zero_grad(set_to_none=True)
        state = sum(_storage(v)[1] for s in opt.state.values() for v in s.values()
                    if torch.is_tensor(v))
        if trace is not None:
            trace.mark()  # the steady state the step starts from
        handles = []
        for module in model.modules():  # a full backward hook forbids in-place ops on its
            if getattr(module, "inplace", False):  # module's output: ReLU(inplace) keeps a
                module.inplace = False  # copy here, so a user model's peak is over, not under
        for name, module in model.named_modules():
            if name and not any(module.children()):
                handles.append(module.register_forward_hook(forward_hook(name)))
                handles.append(module.register_full_backward_hook(backward_hook(name)))
        try:
            with torch.autograd.graph.saved_tensors_hooks(_saver(saved), lambda t: t):
                train_step(model, opt, x, target, on_loss)
                sample("step", "sgd")
        finally:
            for h in handles:
                h.remove()
    if trace is None:
        return events
    base = weights + batch_bytes  # allocated before the trace began
    return [Event(**{**asdict(e), "allocated": base + p.allocated, "peak": base + p.peak})
            for e, p in zip(events, trace.points[1:])]


def _saver(saved: _Live):
    def pack(t):
        saved.add(t)
        return t

    return pack


def peak(events: list[Event]) -> Event:
    """The event with the largest modelled total."""
    return max(events, key=lambda e: e.total)


# --- configurations -------------------------------------------------------------------------
def plan_algos(plan: Plan) -> Algos:
    """The passes an advisor plan runs through convbench (torch's own are left out)."""
    return {(lp.layer, pass_): (choice.algo, choice.backend, lp.layout)
            for lp in plan.layers for pass_, choice in lp.passes.items()
            if choice is not None and choice.algo not in TORCH_ALGOS}


def configurations(net: str, plans: Mapping[str, Plan | None],
                   workspace_budget: int) -> dict[str, tuple[Algos, str]]:
    """name -> (the passes it runs through convbench, a note saying which algorithms) for
    `defaults` (no plan) and the advisor's plans (`budgeted`: under `workspace_budget`)."""
    out = {}
    for name, plan in plans.items():
        if plan is None:
            out[name] = ({}, "torch's own convolution (its workspace not modelled)")
            continue
        algos, runs = plan_algos(plan), conv_passes(net)
        counts = Counter(algos[lp][0] if lp in algos else "torch" for lp in runs)
        note = ", ".join(f"{a} {n}" for a, n in counts.most_common())
        if name == "budgeted":
            note += f" (workspace <= {memory.format_size(workspace_budget)})"
        out[name] = (algos, note)
    return out


def declared_workspace(net: str, algos: Algos, precision: str = "fp32") -> Workspace:
    """Each pass's workspace at any batch, as its chosen implementation declares it (0 for
    torch's convolution or an implementation that does not say)."""
    problems = {layer.name: layer.problem for layer in layers.net_layers(net)}

    def at(layer: str, pass_: str, n: int) -> int:
        choice = algos.get((layer, pass_))
        if choice is None:
            return 0
        algo, backend, layout = choice
        impl = registry.get(algo, backend)
        return opcount.workspace_bytes(impl, problems[layer].with_batch(n), pass_, layout,
                                       precision) or 0

    return at


def modelled_peak(net: str, algos: Algos, held: bool = True) -> Callable[[int], Event]:
    """batch -> the peak event of the step modelled on `meta`, workspaces as declared, held or
    per pass (none without `algos`: torch's own convolutions)."""
    ws = declared_workspace(net, algos) if algos else None
    return lambda n: peak(profile_step(net, n, "meta", workspace=ws, held=held))


def largest_batch(peak_at: Callable[[int], Event], budget: int,
                  start: int = 1) -> tuple[int, Event | None]:
    """The largest batch whose peak total fits `budget` (peaks grow with the batch), and its
    peak event; (0, None) if not even one image fits. Doubles from `start`, then bisects."""
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


# --- output ---------------------------------------------------------------------------------
def timeline_rows(events: list[Event]) -> list[dict]:
    """The events as rows of bytes, with their total."""
    return [{"step": i, **asdict(e), "total": e.total} for i, e in enumerate(events)]


def timeline_table(events: list[Event]) -> str:
    """The timeline in MiB, the modelled peak marked `*`."""
    from .tables import tabulate

    top = events.index(peak(events))
    measured = events[0].allocated is not None
    heads = ["#", "phase", "layer", *CATEGORIES, "total"]
    heads += ["allocated (measured)", "peak (measured)"] if measured else []
    body = []
    for i, e in enumerate(events):
        row = [i, e.phase, e.layer, *[_mib(getattr(e, c)) for c in CATEGORIES],
               _mib(e.total) + (" *" if i == top else "")]
        body.append(row + ([_mib(e.allocated), _mib(e.peak)] if measured else []))
    return tabulate(body, headers=heads, tablefmt="github", disable_numparse=True,
                    colalign=("right", "left", "left") + ("right",) * (len(heads) - 3))


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f}"


@dataclass(frozen=True)
class Fit:
    """The largest batch a configuration fits in a budget, with its peak event there, for each
    way of allocating workspaces (`WORKSPACE_MODES`)."""

    config: str
    note: str
    found: dict[str, tuple[int, Event | None]]


def fits(net: str, configs: Mapping[str, tuple[Algos, str]], budget: int,
         start: int = 1) -> list[Fit]:
    """Per configuration (name -> (algos, note)), the largest batch within `budget`."""
    return [Fit(name, note, {mode: largest_batch(modelled_peak(net, algos, mode == "held"),
                                                 budget, start)
                             for mode in WORKSPACE_MODES})
            for name, (algos, note) in configs.items()]


def fit_rows(found: list[Fit]) -> list[dict]:
    """One row per configuration and workspace mode."""
    return [{"configuration": f.config, "workspace": mode, "largest_batch": batch,
             "peak_bytes": e.total if e else None,
             "peak_at": f"{e.phase} {e.layer}" if e else "",
             "workspace_bytes": e.workspace if e else None, "algorithms": f.note}
            for f in found for mode, (batch, e) in f.found.items()]


def fit_table(found: list[Fit]) -> str:
    from .tables import tabulate

    body = [[f.config, *[_fit_cell(*f.found[mode]) for mode in WORKSPACE_MODES], f.note]
            for f in found]
    heads = ["configuration", *[f"largest batch, workspaces {mode} (peak MiB at; workspace)"
                                for mode in WORKSPACE_MODES], "algorithms"]
    return tabulate(body, headers=heads, tablefmt="github", disable_numparse=True)


def _fit_cell(batch: int, e: Event | None) -> str:
    if e is None:
        return "0 (not even one image)"
    return f"{batch} ({_mib(e.total)} at {e.phase} {e.layer}; {_mib(e.workspace)})"


def markdown(net: str, batch: int, device: str, config: str, events: list[Event],
             found: list[Fit], budget: int) -> str:
    """The printed profile: the timeline, how it was read, and the largest batches."""
    top = peak(events)
    lines = [f"# memprofile: {net}, batch {batch}, {device}, {config}", "",
             ("One steady-state training step (forward, cross-entropy, backward, SGD with "
              "momentum) of trainstep's model, MiB at each leaf module's forward and backward. "
              "Categories are storage sizes from hooks: activations are the tensors autograd "
              "saved, while alive; workspace is the declared workspaces of the passes a plan "
              "runs through convbench, all held (functional.run keeps every prepared pass; 0 "
              "for torch's own convolution, which does not say). Measured: the allocators at "
              f"the same points ({memory.trace(backend_of(device)).method}), counted from "
              "before the first step, plus the weights and the batch."), "",
             timeline_table(events), "",
             f"Modelled peak: {_mib(top.total)} MiB at {top.phase} {top.layer}"
             + (f"; measured peak: {_mib(max(e.peak for e in events))} MiB"
                if events[0].peak is not None else "") + ".", "",
             f"## Largest batch in {memory.format_size(budget)}", "",
             ("The model on the `meta` device (exact storage sizes at any batch), the chosen "
              "algorithms' declared workspaces added — held throughout, as convbench runs a "
              "plan (`functional.run` keeps every prepared pass), or per pass, as an allocator "
              "that frees them would; doubling then bisection on the batch."),
             "", fit_table(found)]
    return "\n".join(lines) + "\n"


def write(folder: Path, text: str, events: list[Event], found: list[Fit], title: str) -> list[str]:
    """memprofile.md, timeline.csv, largest_batch.csv and timeline.png in `folder`."""
    import pandas as pd

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "memprofile.md").write_text(text)
    pd.DataFrame(timeline_rows(events)).to_csv(folder / "timeline.csv", index=False)
    pd.DataFrame(fit_rows(found)).to_csv(folder / "largest_batch.csv", index=False)
    note = plot(events, folder / "timeline.png", title)
    names = ["memprofile.md", "timeline.csv", "largest_batch.csv"]
    return names + ([] if note else ["timeline.png"])


def plot(events: list[Event], path: Path, title: str) -> str | None:
    """Stacked bars of the categories per event, the measured allocated bytes and peaks as
    lines; None, or a note when matplotlib is missing."""
    plt = report.pyplot()
    if plt is None:
        return report.NO_MATPLOTLIB
    fig, ax = plt.subplots(figsize=(max(8, 0.35 * len(events) + 2), 4.5), layout="constrained")
    xs, bottom = range(len(events)), [0.0] * len(events)
    for c in CATEGORIES:
        heights = [getattr(e, c) / 2**20 for e in events]
        ax.bar(xs, heights, 0.8, bottom=bottom, label=c)
        bottom = [b + h for b, h in zip(bottom, heights)]
    if events[0].allocated is not None:
        ax.plot(xs, [e.allocated / 2**20 for e in events], "k-", label="allocated (measured)")
        ax.plot(xs, [e.peak / 2**20 for e in events], "k:", label="peak (measured)")
    ax.set_xticks(list(xs), [f"{e.phase} {e.layer}" for e in events], rotation=90,
                  fontsize="small")
    ax.set_ylabel("MiB")
    ax.set_title(title)
    report.save_figure(fig, path)
    return None
