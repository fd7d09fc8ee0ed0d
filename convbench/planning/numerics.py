"""Whole-model numerics: what a plan does to a model's output and gradients, against float64.

Each replaced layer is checked alone against the module it replaces (`apply`'s check); this
checks the whole model, because errors compound through the layers, and because a layout change
alone moves torch's own numbers (another kernel, another summation order): channels_last in
train mode moved ResNet-50-D's input gradient by 3.5% of its largest value against float64, on
a CPU (the whole-model issue's probe). So the model is run four ways on the check input, each
from the same weights and the same random state, in train mode (batch statistics) and in eval
mode (running statistics):

- `float64`: the original in double precision, the reference;
- `torch`: the original as it is (fp32);
- `channels_last`: the original with its weights and input in channels_last, the layout change
  alone;
- `plan`: the model with the plan applied.

For the output, the input's gradient and all weight gradients (one vector), each of the other
three gets its error against the reference: the relative (‖a − ref‖ / ‖ref‖) and the largest
difference over the largest magnitude (`max_rel`). The user then reads whether the plan moves
the numbers more than torch's own layout change does.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

#: The runs, the first being the reference.
RUNS = ("float64", "torch", "channels_last", "plan")
#: What is compared in each mode.
QUANTITIES = ("output", "input gradient", "weight gradients")
MODES = ("train", "eval")


@dataclass(frozen=True)
class Error:
    """One quantity's error against the float64 reference."""

    mode: str
    quantity: str
    run: str
    rel: float
    max_rel: float


def _run(model, x, train: bool, seed: int = 0):
    """(output, input gradient, weight gradients as one vector) of one forward and backward
    of `model` on a copy of `x`, from `seed`'s random state (dropout draws the same masks)."""
    import torch

    model.train(train)
    xi = x.detach().clone().requires_grad_(True)
    torch.manual_seed(seed)
    out = model(xi)
    out = out[0] if isinstance(out, (tuple, list)) else out
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed),
                     dtype=torch.float64).to(out.dtype).to(out.device)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out, [xi, *params], dy, allow_unused=True)
    flat = torch.cat([g.detach().flatten().double().cpu() for g in grads[1:] if g is not None])
    return (out.detach().double().cpu().numpy(), grads[0].detach().double().cpu().numpy(),
            flat.numpy())


def _errors(a: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    diff = a - ref
    norm, top = float(np.linalg.norm(ref)), float(np.max(np.abs(ref))) if ref.size else 0.0
    rel = float(np.linalg.norm(diff)) / norm if norm else float(np.linalg.norm(diff))
    return rel, (float(np.max(np.abs(diff))) / top if top else 0.0)


def whole_model(original, applied, x) -> list[Error]:
    """The errors of `torch`, `channels_last` and `plan` (the model `applied`) against the
    float64 original, in train and eval mode (see the module docstring). Neither model is
    changed (each run is on a deep copy), nor torch's random state (a training run after it
    draws the dropout masks it would have drawn)."""
    import torch

    runs = {"float64": (copy.deepcopy(original).double(), x.double()),
            "torch": (copy.deepcopy(original), x),
            "channels_last": (copy.deepcopy(original).to(memory_format=torch.channels_last),
                              x.contiguous(memory_format=torch.channels_last)),
            "plan": (copy.deepcopy(applied), x)}
    out = []
    devices = [x.device] if x.is_cuda else []
    for mode in MODES:
        with torch.random.fork_rng(devices=devices):  # the caller's random state untouched
            got = {name: _run(copy.deepcopy(m), xi, mode == "train") for name, (m, xi)
                   in runs.items()}
        for i, quantity in enumerate(QUANTITIES):
            for name in RUNS[1:]:
                rel, max_rel = _errors(got[name][i], got["float64"][i])
                out.append(Error(mode, quantity, name, rel, max_rel))
    return out


def table(errors: list[Error]) -> str:
    """The errors as a markdown table: a row per mode and quantity, a column per run."""
    from ..core.fmt import tabulate

    rows = []
    for mode in MODES:
        for quantity in QUANTITIES:
            cells = {e.run: f"{e.rel:.2g} ({e.max_rel:.2g})" for e in errors
                     if e.mode == mode and e.quantity == quantity}
            rows.append([mode, quantity, *(cells.get(r, "") for r in RUNS[1:])])
    return tabulate(rows, headers=["mode", "against float64", *RUNS[1:]], tablefmt="github",
                    disable_numparse=True)


def moved_by_layout(errors: list[Error], factor: float = 10.0) -> list[Error]:
    """The quantities the layout change alone moves `factor` times further from float64 than
    torch's own NCHW run does: where the user must be told, and a plan may keep the layout."""
    base = {(e.mode, e.quantity): e.max_rel for e in errors if e.run == "torch"}
    return [e for e in errors if e.run == "channels_last"
            and e.max_rel > factor * max(base[e.mode, e.quantity], 1e-12)]
