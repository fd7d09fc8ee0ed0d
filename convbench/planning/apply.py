"""Apply: make a PyTorch model run a plan.

    summary = apply(model, plan)   # a Plan, or a plan file
    print(summary)                 # what changed, layer by layer

`apply` sets the global cuDNN flags the plan asks for, gives each planned layer its layout
(channels_last weights for NHWC), and replaces each layer that torch alone would not run as
planned by a `convbench.nn.Conv2d` holding the same parameters, each pass dispatched to its
algorithm, where it can prove the swap computes what the layer did (`nn.unprovable`). It
measures nothing and chooses nothing: the plan has chosen.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..algos import registry
from ..algos.registry import TORCH_ALGOS
from ..core.fmt import tabulate
from ..core.problem import AXIS_FIELDS, PASSES, PRECISION_OF_DTYPE
from ..machine import threads  # the environment a CPU plan with NumPy passes wants
from ..measure import verify
from . import numerics
from .plan import LayerPlan, Plan, PlanError, current_env_key, stale_fields


@dataclass(frozen=True)
class Change:
    """What `apply` did to one layer of the plan."""

    layer: str
    # One word per meaning: "replaced" (by convbench.nn.Conv2d); "as is": the module itself,
    # torch runs it, in the plan's layout or, where a swap is not proved or the check refused
    # it, as the model has it (layout ""); "skipped": the plan has nothing that fits it.
    action: str
    layout: str
    passes: dict[str, str]
    reason: str


@dataclass
class Summary:
    """What `apply` changed: per layer, and the global cuDNN flags."""

    changes: list[Change]
    cudnn: dict[str, bool]
    backend: str
    #: what the model's whole step measured of the plan (`Plan.checks`)
    checks: list = field(default_factory=list)
    #: the whole model's errors against float64 (`numerics.whole_model`), where checked
    numerics: list = field(default_factory=list)

    @property
    def replaced(self) -> list[str]:
        return [c.layer for c in self.changes if c.action == "replaced"]

    def __str__(self) -> str:
        rows = [[c.layer, c.action, c.layout, *[c.passes.get(p, "") for p in PASSES], c.reason]
                for c in self.changes]
        table = tabulate(rows, headers=["layer", "action", "layout", *PASSES, "why"],
                         tablefmt="github", disable_numparse=True)
        flags = ", ".join(f"cudnn.{k}={v}" for k, v in self.cudnn.items())
        text = f"{table}\n\nset torch.backends.{flags}"
        if self.backend == "numpy":
            text += " (no effect on the CPU)"
        for check in self.checks:
            text += f"\nmeasured on the whole {check.text()}"
        if not self.checks:
            text += ("\nnot confirmed on the model's whole step: the plan's times are each "
                     "layer's alone (tune with step='train' to confirm)")
        if self.numerics:
            text += "\n\n" + _numerics_text(self.numerics)
        if self.backend != "numpy":
            return text
        ours = any(a not in TORCH_ALGOS and a != "torch default"
                   for c in self.changes for a in c.passes.values())
        unset = threads.unset_settings()
        if ours and unset:
            text += (f"\nNumPy passes share the cores with torch's threads: start Python with "
                     f"{unset} so idle threads sleep")
        return text


def _numerics_text(errors: list) -> str:
    """The whole model's errors (`numerics.table`), and what in them the user must know."""
    lines = [("The whole model against float64 (relative error, and in brackets the largest "
              "difference over the largest magnitude):"), "", numerics.table(errors)]
    for e in numerics.moved_by_layout(errors):
        lines.append(f"- channels_last alone moves the {e.mode}-mode {e.quantity} to "
                     f"{e.max_rel:.2g} of its largest value: torch's own effect of the layout")
    torch_err = {(e.mode, e.quantity): e.max_rel for e in errors if e.run == "torch"}
    layout_err = {(e.mode, e.quantity): e.max_rel for e in errors if e.run == "channels_last"}
    for e in errors:
        worst = max(torch_err[e.mode, e.quantity], layout_err[e.mode, e.quantity], 1e-12)
        if e.run == "plan" and e.max_rel > 10 * worst:
            lines.append(f"- the plan moves the {e.mode}-mode {e.quantity} to {e.max_rel:.2g} "
                         f"of its largest value, {e.max_rel / worst:.3g}x torch's own")
    return "\n".join(lines)


def _torch_runs_it(lp: LayerPlan, arriving: str, benchmark: bool) -> bool:
    """Whether torch alone runs the layer as planned: every pass torch's own, in the mode of
    the global cudnn.benchmark, in the planned layout. torch runs a convolution NHWC when its
    weight or its input is channels_last: a channels_last weight gives NHWC, but an NCHW layer
    fed a channels_last activation would run NHWC as well."""
    for c in lp.passes.values():
        if c is not None and (c.algo not in TORCH_ALGOS
                              or TORCH_ALGOS[c.algo] not in (None, benchmark)):
            return False
    return lp.layout == "nhwc" or arriving == "nchw"


def _why_not(model, lp: LayerPlan):
    """(the module the plan's layer names, None) or (None, why it cannot take the plan)."""
    import torch

    from .. import nn as cbnn

    if not lp.layer:
        return None, "the model itself is the conv; wrap it in a module to plan it"
    try:
        module = model.get_submodule(lp.layer)
    except AttributeError:
        return None, "the model has no such module"
    if cbnn.unprovable(module):  # left as it is: it must only be the plan's convolution
        p = lp.problem
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and tuple(weight.shape) == p.w_shape():
            return module, None
        return None, ("its weight differs from the plan's" if isinstance(module, torch.nn.Conv2d)
                      else f"is a {type(module).__name__}, not an nn.Conv2d")
    try:
        geometry = cbnn.conv_geometry(module)
    except ValueError as exc:
        return None, str(exc)
    p = lp.problem
    # conv_geometry and ConvProblem keep stride, pad and dilation in the same one form.
    if (module.in_channels, module.out_channels, *module.kernel_size, geometry["groups"],
            *(geometry[f] for f in AXIS_FIELDS)) != \
            (p.c, p.k, p.r, p.s, p.groups, *(getattr(p, f) for f in AXIS_FIELDS)):
        return None, "its channels, filter or geometry differ from the plan's"
    return module, None


def apply(model, plan: Plan | str | Path, check=None) -> Summary:
    """Make `model` run `plan` (a Plan or a plan file): set the cuDNN flags, give each planned
    layer its layout (channels_last weights for NHWC), and replace each layer that torch alone
    would not run as planned by a `convbench.nn.Conv2d` holding the same parameters.

    Only what convbench provably reproduces is replaced (`nn.unprovable`): a conv subclass
    with a forward of its own, a hook or a parametrization is left untouched, layout too, and
    the table says why, as a swap would drop what it does. `check`: an example input; each
    replacement is then run once against the module it replaces, on the input that module
    receives from it, and one whose output, input gradient or weight gradient differs by
    more than its algorithm's tolerance (`verify.tolerance`) is refused, the original left as is;
    then the whole model, before and after, and in channels_last alone, is compared with its
    float64 run in train and eval mode (`numerics`), and the table says where the plan or the
    layout alone moves its numbers.

    The plan runs in the precision it was measured in, and `apply` changes no one's numerics:
    a plan measured in strict fp32 where torch runs convolutions in TF32 (its default on a
    GPU), or the reverse, or for parameters of another dtype, is refused (PlanError, one line
    naming the setting to change). A bf16 or fp16 plan for fp32 parameters is for
    `torch.autocast`, which each replaced layer checks when called. `cudnn.benchmark` and the
    `benchmark_limit` the plan was measured with are set; a `cudnn.deterministic = True` of
    the caller is never lowered (a warning says where the plan wanted it off, and its
    nondeterministic cuDNN pins run torch's convolution instead). A pinned cuDNN algorithm
    found with another cuDNN than the one loaded runs torch's convolution, with one warning."""
    import torch

    plan = plan if isinstance(plan, Plan) else Plan.load(plan)
    _check_device(model, plan)
    _check_precision(model, plan)
    original = copy.deepcopy(model) if check is not None else None
    misfits = {lp.layer: why for lp in plan.layers if (why := _why_not(model, lp)[1])}
    _check_fit(model, plan, misfits)
    torch.backends.cudnn.benchmark = plan.cudnn["benchmark"]
    if plan.cudnn.get("benchmark_limit") is not None:
        torch.backends.cudnn.benchmark_limit = plan.cudnn["benchmark_limit"]
    deterministic = plan.cudnn["deterministic"] or torch.backends.cudnn.deterministic
    if deterministic and not plan.cudnn["deterministic"]:
        warnings.warn("torch.backends.cudnn.deterministic stays True as you set it (the plan "
                      "was made without it); its nondeterministic cuDNN pins run torch's "
                      "convolution", stacklevel=2)
    torch.backends.cudnn.deterministic = deterministic
    plan = _usable_pins(plan, deterministic)
    changes, swaps = _changes(model, plan, misfits)
    refused = _checked(model, swaps, check, plan.precision) if check is not None else {}
    changes = _swapped(model, changes, swaps, refused)
    changes += [Change(u.layer, "skipped", "", {}, u.reason) for u in plan.unplanned]
    errors = numerics.whole_model(original, model, check) if check is not None else []
    return Summary(changes, dict(plan.cudnn), plan.backend, list(plan.checks), errors)


def _changes(model, plan: Plan, misfits: dict[str, str]) -> tuple[list[Change], dict]:
    """What `apply` does to each planned layer, in the plan's order, and the replacements it
    would make ({layer: (its LayerPlan, the module, the convbench.nn.Conv2d)}): a misfit is
    skipped, a module convbench cannot prove it reproduces left as is, a layer torch runs as
    planned given its layout (channels_last weights for NHWC) as is, any other replaced. A
    layout arrives from the layer before it, the first from the plan's input layout."""
    from .. import nn as cbnn

    changes, arriving, swaps = [], plan.input_layout, {}
    for lp in plan.layers:
        passes = {p: c.algo if c else "torch default" for p, c in lp.passes.items()}
        if lp.layer in misfits:
            changes.append(Change(lp.layer, "skipped", lp.layout, passes, misfits[lp.layer]))
            continue
        module, _ = _why_not(model, lp)
        unproved = cbnn.unprovable(module)
        if unproved:
            changes.append(Change(lp.layer, "as is", "", passes,
                                  f"{unproved}: convbench cannot prove it reproduces it; torch "
                                  "runs it"))
            continue
        ours = sorted({c.algo for c in lp.passes.values()
                       if c is not None and c.algo not in TORCH_ALGOS})
        for algo in ours:  # an algorithm this build lacks fails here, not mid-training
            registry.get(algo, plan.backend)
        if _torch_runs_it(lp, arriving, plan.cudnn["benchmark"]):
            module.to(memory_format=cbnn.MEMORY_FORMAT[lp.layout])
            changes.append(Change(lp.layer, "as is", lp.layout, passes,
                                  "torch runs every pass as planned"))
        else:
            algos = {p: (c.algo, c.backend) if c else None for p, c in lp.passes.items()}
            pins = {p: c.pin for p, c in lp.passes.items() if c is not None and c.pin}
            swaps[lp.layer] = (lp, module, cbnn.Conv2d.from_conv(
                module, lp.layout, algos, pins, plan.precision))
            why = (f"runs {', '.join(ours)}" if ours else
                   "converts its channels_last input to NCHW" if lp.layout == "nchw" else
                   "sets cudnn.benchmark per pass")
            changes.append(Change(lp.layer, "replaced", lp.layout, passes, why))
        arriving = lp.layout
    return changes, swaps


def _swapped(model, changes: list[Change], swaps: dict,
             refused: dict[str, str]) -> list[Change]:
    """Make the replacements `_checked` did not refuse (the module in its layout, then swapped
    into its parent); `changes` with each refused one left as is, saying why."""
    from .. import nn as cbnn

    changes = list(changes)
    for i, change in enumerate(changes):
        if change.layer in refused:
            changes[i] = Change(change.layer, "as is", "", change.passes,
                                refused[change.layer])
        elif change.layer in swaps:
            lp, module, new = swaps[change.layer]
            module.to(memory_format=cbnn.MEMORY_FORMAT[lp.layout])
            parent, _, child = lp.layer.rpartition(".")
            setattr(model.get_submodule(parent), child, new)
    return changes


def _checked(model, swaps: dict, example_input, precision: str) -> dict[str, str]:
    """{layer: why its replacement is refused}: each replacement against the module it
    replaces, on the input one forward pass of `example_input` gives that module (eval mode,
    no gradients kept), in forward, input gradient and weight gradient, with a seeded random
    output gradient; beyond its algorithm's tolerance it is refused. The original runs in
    its own layout, as the model has it: the check measures the replacement, not a layout."""
    import torch

    inputs = {}

    def keep(module, args) -> None:
        inputs.setdefault(names[module], args[0].detach().clone())

    names = {module: name for name, (_, module, _) in swaps.items()}
    handles = [module.register_forward_pre_hook(keep) for module in names]
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            model(example_input)
    finally:
        for h in handles:
            h.remove()
        for m, training in modes.items():
            m.training = training
    refused = {}
    for name, (lp, module, new) in swaps.items():
        if name not in inputs:
            refused[name] = "the check input never reaches it; torch runs it"
            continue
        results = []
        for m in (module, new):
            x = inputs[name].clone().requires_grad_()
            y = m(x)
            dy = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(0))
            wrt = [x, m.weight] if m.weight.requires_grad else [x]
            results.append([y, *torch.autograd.grad(y, wrt, dy.to(y.device))])
        for pass_, ref, out in zip(PASSES, *results):
            choice = lp.passes.get(pass_)
            algo = choice.algo if choice else "torch default"
            rel, _ = verify.errors(out.detach().cpu().numpy(), ref.detach().cpu().numpy())
            tol = verify.tolerance(algo, precision, lp.problem, pass_)
            if not rel <= tol:
                refused[name] = (f"refused by the check: {pass_} ({algo}) differs from torch's "
                                 f"by {rel:.2g} > tolerance {tol:.2g}; torch runs it")
                break
    return refused


def _check_fit(model, plan: Plan, misfits: dict[str, str]) -> None:
    """A plan tuned for another model is not applied in silence: PlanError where it fits none
    of the model's conv layers, a warning where some planned layers do not fit or some conv
    layers of the model are not in the plan (torch's default runs them)."""
    import torch

    named = {lp.layer for lp in plan.layers} | {u.layer for u in plan.unplanned}
    convs = [name for name, m in model.named_modules()
             if isinstance(m, torch.nn.Conv2d) and name not in named]
    if not misfits and not convs:
        return
    first = next(iter(misfits.items()), None)
    example = f" ({first[0]}: {first[1]})" if first else ""
    if plan.layers and len(misfits) == len(plan.layers):
        raise PlanError(f"the plan fits none of the model's conv layers{example}: it was tuned "
                        "for another model; tune this one")
    parts = []
    if misfits:
        parts.append(f"{len(misfits)} of the plan's {len(plan.layers)} layers do not fit it and "
                     f"are skipped{example}")
    if convs:
        parts.append(f"{len(convs)} of its conv layers are not in the plan and run torch's "
                     f"default ({', '.join(convs[:3])}{', ...' if len(convs) > 3 else ''})")
    warnings.warn(f"the plan was not tuned for this model: {'; '.join(parts)}; tune this "
                  "model for a plan of its own", stacklevel=3)


def _check_precision(model, plan: Plan) -> None:
    """PlanError where the model would run the plan's convolutions in another precision than
    they were measured in (`apply`'s docstring)."""

    dtypes = {str(p.dtype).removeprefix("torch.") for p in model.parameters()
              if p.is_floating_point()}
    if len(dtypes) != 1:
        return  # a model of mixed dtypes: each replaced layer checks its own calls
    dtype = dtypes.pop()
    if plan.precision in ("bf16", "fp16") and dtype == "float32":
        return  # for torch.autocast: checked at each call
    stored = "fp32" if plan.precision == "tf32" else plan.precision  # TF32 stores fp32
    if PRECISION_OF_DTYPE.get(dtype) != stored:
        raise PlanError(f"the plan was measured in {plan.precision}; the model's parameters "
                        f"are {dtype}: tune it in the dtype it trains in")
    if plan.backend != "cuda" or plan.precision not in ("fp32", "tf32"):
        return
    from ..algos.cudnn import conv_runs_tf32

    tf32 = conv_runs_tf32()
    if tf32 and plan.precision == "fp32":
        raise PlanError("the plan was measured in strict fp32 (TF32 off) and torch runs this "
                        "process's convolutions in TF32 (its default): set "
                        "torch.backends.cudnn.allow_tf32 = False to train as measured, or tune "
                        "with TF32 on")
    if not tf32 and plan.precision == "tf32":
        raise PlanError("the plan was measured in TF32 and TF32 is off here "
                        "(torch.backends.cudnn.allow_tf32 = False): turn it on to train as "
                        "measured, or tune in strict fp32")


def _usable_pins(plan: Plan, deterministic: bool) -> Plan:
    """`plan` without the cuDNN pins this process cannot run as they were found: those found
    with another cuDNN than the one loaded (an algorithm's number may mean another kernel, or
    none), and nondeterministic ones where determinism is asked; torch's convolution runs
    their passes, and one warning says which and why."""
    import torch

    loaded = torch.backends.cudnn.version() if plan.backend == "cuda" else None
    dropped: dict[str, list[str]] = {}
    layers = []
    for lp in plan.layers:
        passes = {}
        for p, c in lp.passes.items():
            why = None
            if c is not None and c.pin is not None:
                if c.pin.cudnn is not None and str(loaded) != c.pin.cudnn:
                    why = f"found with cuDNN {c.pin.cudnn}, cuDNN {loaded} loaded"
                elif deterministic and not c.pin.deterministic:
                    why = "nondeterministic, and cudnn.deterministic is set"
            if why:
                dropped.setdefault(why, []).append(f"{lp.layer} {p}")
                c = None
            passes[p] = c
        layers.append(dataclasses.replace(lp, passes=passes))
    for why, where in dropped.items():
        warnings.warn(f"{len(where)} pinned cuDNN passes run torch's convolution ({why}): "
                      f"{', '.join(where[:3])}{', ...' if len(where) > 3 else ''}",
                      stacklevel=3)
    return dataclasses.replace(plan, layers=layers) if dropped else plan


def _check_device(model, plan: Plan) -> None:
    """The plan must be for the device the model is on. A plan made with other versions still
    applies, with a warning that its times may not hold."""
    devices = {p.device.type for p in model.parameters()}
    want = {"numpy": "cpu", "cuda": "cuda"}.get(plan.backend)
    if devices and devices != {want}:
        raise PlanError(f"the plan is for backend {plan.backend} ({want}); the model is on "
                        f"{', '.join(sorted(devices))}")
    changed = stale_fields(plan.env, current_env_key(plan.backend))
    if changed:
        warnings.warn(f"plan made with another {', '.join(changed)}: its times may not hold "
                      "here; tune again to re-measure", stacklevel=3)
