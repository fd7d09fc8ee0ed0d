"""Any model as a list of problems: `MODULE:CALLABLE` built, its conv layers found, deduplicated.

    model = models.load("torchvision.models:resnet18")
    net = models.conv_layers(model, (1, 3, 224, 224))
    net.layers        # one Layer per distinct problem, named by the first module that has it
    net.occurrences   # {layer name: how many conv modules of the model have its problem}

This is the door of `convbench bench --model` and `convbench tune --model`: a user's own network
measured like a catalog. The layers are found the way the advisor finds them (`find_convs`: the
conv2d calls of one forward pass, on the operands the model passes), so whatever `advisor.tune`
plans, `bench` measures. A
problem that several modules share is measured once; its count lets a report weigh it by use.
Optional dependencies stay optional: torchvision is imported only if the spec names it.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections import Counter
from dataclasses import dataclass, field

from ..catalogs.layers import Layer
from ..core.fmt import first_line
from ..core.problem import FIELD_MAX, ConvProblem, axis_pair
from .plan import Unplanned

#: `torch.conv2d`'s arguments, in order.
CONV2D_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


@dataclass(frozen=True)
class Site:
    """A convolution as the model computes it: the module it belongs to, its problem on the
    operands the model really passes, the passes training needs (bwd_data only when its input
    requires grad, bwd_filter when its weight does), and `kept`: why `apply` leaves the module
    to torch (`nn.unprovable`; None where apply can replace it). A kept site is measured all
    the same, so the plan and `bench` say what it costs."""

    name: str
    problem: ConvProblem
    passes: tuple[str, ...]
    kept: str | None = None


def find_convs(model, example_input) -> tuple[list[Site], list[Unplanned]]:
    """The convolutions `model` computes on `example_input`, in call order, and the modules
    whose convolutions no `ConvProblem` describes, with why. Every `torch.conv2d` call of one
    forward pass is caught (a `TorchFunctionMode`), so its problem is the one computed: padding
    a module does in its own forward (TF-SAME) is in its input, not lost as a forward hook on
    the module would lose it. A call belongs to the module whose weight Parameter it
    convolves, else (a weight computed in forward, a parametrization) to the innermost module
    running. Runs the model once in eval mode (batch-norm statistics stay as they are), with
    autograd on so each call shows whether its operands require grad; ValueError, in one line,
    when the forward pass fails on that input. (Over 60 lines: its hooks and its function mode
    share one forward pass's state, the stack of modules running and what was found, and live
    only as long as that pass; the body outside them is 25 lines.)"""
    import torch
    from torch.overrides import TorchFunctionMode

    from .. import nn as cbnn

    modules = dict(model.named_modules())
    names = {id(m): name for name, m in modules.items()}
    owners = {id(m._parameters["weight"]): name for name, m in modules.items()
              if m._parameters.get("weight") is not None}
    kept = {name: cbnn.unprovable(m) for name, m in modules.items()}  # before our hooks
    running: list[str] = []
    sites: dict[str, Site] = {}
    refused: dict[str, str] = {}

    def problem_of(module, x, weight, stride=1, padding=0, dilation=1, groups=1):
        if x.dtype != example_input.dtype:
            raise ValueError(f"input dtype {x.dtype}, the model's input is "
                             f"{example_input.dtype}")
        if isinstance(module, torch.nn.Conv2d):
            cbnn.conv_geometry(module)  # a padding mode convbench cannot run
        if x.dim() != 4:
            raise ValueError(f"input of {x.dim()} dimensions: convbench runs batched (4-D) "
                             "input only")
        (n, c, h, w), (k, _, r, s) = x.shape, weight.shape
        pad = cbnn.explicit_padding(padding, dilation, (r, s))
        return ConvProblem(n=n, c=c, h=h, w=w, k=k, r=r, s=s, stride=axis_pair("stride", stride),
                           pad=axis_pair("pad", pad), dilation=axis_pair("dilation", dilation),
                           groups=groups)

    def convolved(call: dict) -> None:
        x, weight = call["input"], call["weight"]
        caller = running[-1] if running else ""
        name = owners.get(id(weight), caller)
        if name in refused:
            return
        try:
            problem = problem_of(modules[name], x, weight, **{
                f: call[f] for f in ("stride", "padding", "dilation", "groups") if f in call})
            if name in sites and sites[name].problem != problem:
                raise ValueError("called with several input shapes; a plan has one problem "
                                 "per layer")
        except ValueError as exc:
            refused[name] = first_line(exc)
            sites.pop(name, None)
            return
        why = kept[name] if name == caller else (f"its weight is convolved by "
                                                 f"{caller or 'the model'}, not by itself")
        passes = ("fwd", *(("bwd_data",) if x.requires_grad else ()),
                  *(("bwd_filter",) if weight.requires_grad else ()))
        sites.setdefault(name, Site(name, problem, passes, why))

    class Convolutions(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.conv2d:
                convolved({**dict(zip(CONV2D_ARGS, args)), **kwargs})
            return func(*args, **kwargs)

    modes = {m: m.training for m in model.modules()}

    def enter(module, args) -> None:
        running.append(names[id(module)])

    def leave(module, args, output) -> None:
        running.pop()

    handles = [h for m in model.modules()
               for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    try:
        model.eval()
        with torch.enable_grad(), Convolutions():
            model(example_input)
    except Exception as exc:  # the user's forward, whatever it raises
        raise ValueError(f"the model rejects input {','.join(map(str, example_input.shape))}: "
                         f"{type(exc).__name__}: {first_line(exc)}") from exc
    finally:
        for h in handles:
            h.remove()
        for m, training in modes.items():
            m.training = training
    return list(sites.values()), [Unplanned(n, r) for n, r in refused.items()]


@dataclass
class ModelLayers:
    """A model's distinct conv problems as layers of `net` (each layer's `count`: how many conv
    modules have its problem), the conv modules no `ConvProblem` describes (with why), and
    the measured ones `apply` would leave to torch (`kept`: module name -> why)."""

    net: str
    layers: list[Layer]
    unplanned: list[Unplanned] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)

    @property
    def occurrences(self) -> dict[str, int]:
        return {layer.name: layer.count for layer in self.layers}


def parse_input(text: str) -> tuple[int, int, int, int]:
    """`N,C,H,W` -> the example input's shape; ValueError naming what is wrong."""
    parts = [t.strip() for t in text.split(",")]
    try:
        dims = tuple(int(t) for t in parts)
    except ValueError:
        raise ValueError(f"--input {text!r} is not N,C,H,W (four integers)") from None
    if len(dims) != 4:
        raise ValueError(f"--input {text!r} has {len(dims)} dimensions; N,C,H,W has four")
    if min(dims) <= 0 or max(dims) > FIELD_MAX:
        raise ValueError(f"--input {text!r}: each of N,C,H,W must be in 1..{FIELD_MAX}")
    return dims  # type: ignore[return-value]


def load(spec: str):
    """The `nn.Module` that `MODULE:CALLABLE` returns when called without arguments
    (`torchvision.models:resnet18`, `mypkg.nets:Net`); ValueError with one line naming why
    not: no colon, a module that does not import, no such callable, a call that fails, or a
    result that is not an `nn.Module`.

    A module in the current folder imports too (`--model mynet:net` beside `mynet.py`), as
    `python script.py` would find it: the folder is appended to `sys.path`, after the
    installed packages, so a clone's folder there never hides convbench itself (the `convbench`
    command's sys.path starts at its script's folder, and `python -P -m convbench` leaves the
    current folder out)."""
    import torch

    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--model {spec!r} is not MODULE:CALLABLE (e.g. "
                         "torchvision.models:resnet18)")
    try:
        target = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001  (any import error is the user's module's)
        raise ValueError(f"--model {spec!r}: cannot import {module_name}: "
                         f"{type(exc).__name__}: {first_line(exc)}") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ValueError(f"--model {spec!r}: {module_name} has no {attr}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"--model {spec!r}: {attr} is not callable")
    try:
        model = target()
    except Exception as exc:  # noqa: BLE001  (the user's constructor)
        raise ValueError(f"--model {spec!r}: {attr}() failed: {type(exc).__name__}: "
                         f"{first_line(exc)}") from None
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"--model {spec!r}: {attr}() returned a {type(model).__name__}, "
                         "not an nn.Module")
    return model


def net_name(spec: str) -> str:
    """The name a model's rows and run folder carry: its callable's (`resnet18`)."""
    return spec.partition(":")[2].rsplit(".", 1)[-1]


def conv_layers(model, input_shape: tuple[int, ...], net: str = "model",
                device: str = "cpu") -> ModelLayers:
    """The distinct conv problems of `model` run on a seeded input of `input_shape` (on
    `device`), each named by the module path of its first occurrence; ValueError when the
    model rejects the input or has no conv layer convbench can run."""
    import torch

    x = torch.randn(*input_shape, generator=torch.Generator().manual_seed(0)).to(device)
    sites, unplanned = find_convs(model.to(device), x)  # ValueError if the model rejects x
    counts = Counter(site.problem for site in sites)
    first = {}
    for site in sites:
        first.setdefault(site.problem, site.name)
    if not first:
        why = f" ({unplanned[0].layer}: {unplanned[0].reason})" if unplanned else ""
        raise ValueError(f"the model has no conv layer convbench can run{why}")
    layers = [Layer(net, name, problem, counts[problem]) for problem, name in first.items()]
    return ModelLayers(net, layers, unplanned, {s.name: s.kept for s in sites if s.kept})
