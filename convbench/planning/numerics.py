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
    """(output, input gradient, weight gradients: a list of tensors) of one forward and
    backward of `model` on a copy of `x`, from `seed`'s random state (dropout draws the same
    masks); each on the CPU in the dtype it was computed in. The weight gradients stay apart:
    joined into one float64 vector they would cost a copy of every parameter per run, so the
    errors read them tensor by tensor (`_errors`)."""
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
    return ([out.detach().cpu()], [grads[0].detach().cpu()],
            [g.detach().cpu() for g in grads[1:] if g is not None])


def _norms(tensors) -> tuple[float, float]:
    """(‖t‖, max |t|) of `tensors` (an iterable: one tensor at a time in memory) taken as one
    vector, in float64."""
    import torch

    sq = top = 0.0
    for t in tensors:
        if t.numel():
            t = t.double()
            sq += float(torch.linalg.vector_norm(t)) ** 2
            top = max(top, float(torch.linalg.vector_norm(t, float("inf"))))
    return float(np.sqrt(sq)), top


def _errors(a: list, ref: list, ref_norms: tuple[float, float]) -> tuple[float, float]:
    """(‖a − ref‖ / ‖ref‖, max |a − ref| / max |ref|) over the tensors of `a` and `ref` taken
    as one vector, each difference formed in float64; `ref_norms` is `_norms(ref)`."""
    diff, diff_top = _norms(ai.double() - ri.double() for ai, ri in zip(a, ref, strict=True))
    norm, top = ref_norms
    return (diff / norm if norm else diff), (diff_top / top if top else 0.0)


def whole_model(original, applied, x) -> list[Error]:
    """The errors of `torch`, `channels_last` and `plan` (the model `applied`) against the
    float64 original, in train and eval mode (see the module docstring). Neither model is
    changed (each run is on a deep copy, made afresh per mode: a train run moves batch norm's
    running statistics), nor torch's random state (a training run after it draws the dropout
    masks it would have drawn)."""
    import torch

    def runs():
        yield "float64", copy.deepcopy(original).double(), x.double()
        yield "torch", copy.deepcopy(original), x
        yield ("channels_last", copy.deepcopy(original).to(memory_format=torch.channels_last),
               x.contiguous(memory_format=torch.channels_last))
        yield "plan", copy.deepcopy(applied), x

    out = []
    devices = [x.device] if x.is_cuda else []
    for mode in MODES:
        with torch.random.fork_rng(devices=devices):  # the caller's random state untouched
            got = {name: _run(m, xi, mode == "train") for name, m, xi in runs()}
        for i, quantity in enumerate(QUANTITIES):
            ref = got["float64"][i]
            ref_norms = _norms(ref)
            for name in RUNS[1:]:
                rel, max_rel = _errors(got[name][i], ref, ref_norms)
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
