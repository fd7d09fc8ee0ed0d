"""`convbench memprofile`: what one training step holds in memory, layer by layer, and the
largest batch that fits a memory budget under torch's defaults and under the advisor's plans.

Feature maps dominate training memory and sit idle between the forward pass that makes them and
the backward pass that reads them (Kim et al. 2019); activations grow with the batch while the
weights do not (Torres et al.); and a convolution's workspace decides whether the fastest
algorithm fits beside them (SuperNeurons). This profiles the workload's step (`footprint`: the
timeline's categories, and the model of them on `meta`) as measured, and searches the largest
batch per configuration — torch's defaults and the advisor's plans — on the model
(`footprint.largest_modelled_batch`), with each plan's workspaces held or per pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core.fmt import NO_MATPLOTLIB, fmt_mib, pyplot, save_figure
from ..machine.devices import backend_of
from ..measure import memory
from ..planning.plan import Plan
from .folder import write_study
from .footprint import (
    CATEGORIES,
    WORKSPACE_MODES,
    Algos,
    Event,
    largest_modelled_batch,
    modelled_peak,
    peak,
    plan_algos,
)
from .workload import Workload


def configurations(load: Workload, plans: Mapping[str, Plan | None],
                   workspace_budget: int) -> dict[str, tuple[Algos, str]]:
    """name -> (the passes it runs through convbench, a note saying which algorithms) for
    `defaults` (no plan) and the advisor's plans (`budgeted`: under `workspace_budget`)."""
    out = {}
    for name, plan in plans.items():
        if plan is None:
            out[name] = ({}, "torch's own convolution (its workspace not modelled)")
            continue
        algos, runs = plan_algos(plan), load.conv_passes()
        counts = Counter(algos[lp][0] if lp in algos else "torch" for lp in runs)
        note = ", ".join(f"{a} {n}" for a, n in counts.most_common())
        if name == "budgeted":
            note += f" (workspace <= {memory.format_size(workspace_budget)})"
        out[name] = (algos, note)
    return out


# --- output ---------------------------------------------------------------------------------
def timeline_rows(events: list[Event]) -> list[dict]:
    """The events as rows of bytes, with their total."""
    return [{"step": i, **asdict(e), "total": e.total} for i, e in enumerate(events)]


def timeline_table(events: list[Event]) -> str:
    """The timeline in MiB, the modelled peak marked `*`."""
    from ..core.fmt import tabulate

    top = events.index(peak(events))
    measured = events[0].allocated is not None
    heads = ["#", "phase", "layer", *CATEGORIES, "total"]
    heads += ["allocated (measured)", "peak (measured)"] if measured else []
    body = []
    for i, e in enumerate(events):
        row = [i, e.phase, e.layer, *[fmt_mib(getattr(e, c), 1) for c in CATEGORIES],
               fmt_mib(e.total, 1) + (" *" if i == top else "")]
        body.append(row + ([fmt_mib(e.allocated, 1), fmt_mib(e.peak, 1)] if measured else []))
    return tabulate(body, headers=heads, tablefmt="github", disable_numparse=True,
                    colalign=("right", "left", "left") + ("right",) * (len(heads) - 3))


@dataclass(frozen=True)
class Fit:
    """The largest batch a configuration fits in a budget, with its peak event there, for each
    way of allocating workspaces (`WORKSPACE_MODES`)."""

    config: str
    note: str
    found: dict[str, tuple[int, Event | None]]


def fits(load: Workload, configs: Mapping[str, tuple[Algos, str]], budget: int,
         start: int = 1) -> list[Fit]:
    """Per configuration (name -> (algos, note)), the largest batch within `budget`."""
    return [Fit(name, note, {mode: largest_modelled_batch(
                                 modelled_peak(load, algos, mode == "held"), budget, start)
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
    from ..core.fmt import tabulate

    body = [[f.config, *[_fit_cell(*f.found[mode]) for mode in WORKSPACE_MODES], f.note]
            for f in found]
    heads = ["configuration", *[f"largest batch, workspaces {mode} (peak MiB at; workspace)"
                                for mode in WORKSPACE_MODES], "algorithms"]
    return tabulate(body, headers=heads, tablefmt="github", disable_numparse=True)


def _fit_cell(batch: int, e: Event | None) -> str:
    if e is None:
        return "0 (not even one image)"
    return f"{batch} ({fmt_mib(e.total, 1)} at {e.phase} {e.layer}; {fmt_mib(e.workspace, 1)})"


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
             f"Modelled peak: {fmt_mib(top.total, 1)} MiB at {top.phase} {top.layer}"
             + (f"; measured peak: {fmt_mib(max(e.peak for e in events), 1)} MiB"
                if events[0].peak is not None else "") + ".", "",
             f"## Largest batch in {memory.format_size(budget)}", "",
             ("The model on the `meta` device (exact storage sizes at any batch), the chosen "
              "algorithms' declared workspaces added — held throughout, as convbench runs a "
              "plan (`functional.run` keeps every prepared pass), or per pass, as an allocator "
              "that frees them would; doubling then bisection on the batch."),
             "", fit_table(found)]
    return "\n".join(lines) + "\n"


def write(folder: Path, text: str, events: list[Event], found: list[Fit], env: dict,
          title: str) -> list[str]:
    """The study's folder (`folder.write_study`): report.md, memprofile.csv (the timeline),
    env.json, largest_batch.csv and timeline.png."""
    import pandas as pd

    return write_study(
        folder, "memprofile", text, pd.DataFrame(timeline_rows(events)), env,
        extra={"largest_batch.csv": lambda path: pd.DataFrame(fit_rows(found)).to_csv(
            path, index=False)},
        plots={"timeline.png": lambda path: plot(events, path, title)})


def plot(events: list[Event], path: Path, title: str) -> str | None:
    """Stacked bars of the categories per event, the measured allocated bytes and peaks as
    lines; None, or a note when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
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
    save_figure(fig, path)
    return None
