"""`convbench memplan`'s output: its folder (report.md, memplan.csv, memplan.png), from what
`memplan.plan` measured.

Apart from the measuring so the report re-renders from the results without a probe, and the
measuring half carries no markdown or matplotlib. A row per strategy and probed batch goes to the
CSV; the report states how each figure was obtained (the budget, the allocators read, the
gradient check's tolerance) beside the table, and says where a figure is a lower bound
(offloading's images/s: torch's `save_on_cpu` overlaps nothing).
"""

from __future__ import annotations

from pathlib import Path

from ..core.fmt import NO_MATPLOTLIB, fmt_mib, pyplot, save_figure, tabulate
from ..machine.devices import backend_of
from ..measure import memory
from .folder import write_study
from .memplan import CHECK_BATCH, GRADIENT_TOLERANCE, WORKSPACE, Probe, StrategyResult
from .workspace import REFERENCE_BATCH


def rows(found: list[StrategyResult]) -> list[dict]:
    """One row per strategy and probed batch: peak bytes and images/s."""
    out = []
    for r in found:
        if r.search is None:
            out.append({"strategy": r.strategy, "status": "unsupported", "reason": r.reason})
            continue
        for batch in sorted({*r.search.probes, *r.timed}):
            p = r.timed.get(batch) or r.search.probes[batch]
            out.append({"strategy": r.strategy, "status": "ok" if not p.oom else "oom",
                        "reason": "", "batch": batch, "peak_bytes": None if p.oom else p.peak,
                        "images_per_s": p.images_per_s, "largest": batch == r.search.batch,
                        "search_probe": batch in r.search.probes,
                        "gradient_error": r.gradient_error,
                        "gradient_tolerance": r.tolerance,
                        "times_ms": " ".join(f"{t:.6g}" for t in p.times_ms),
                        "note": p.note})
    return out


def _rate(p: Probe | None) -> str:
    return "" if p is None or p.images_per_s is None else f"{p.images_per_s:.3g}"


def _ran(found: list[StrategyResult]) -> list[StrategyResult]:
    """The strategies that ran here (the others are unsupported on this device)."""
    return [r for r in found if r.search is not None]


def table(found: list[StrategyResult], common: int | None) -> str:
    """A row per strategy: its largest batch, its peak and speed there and at the common batch
    (columns left out where no strategy ran: there is no common batch), its gradient error."""
    at_common = common is not None
    body = []
    for r in found:
        if r.search is None:
            body.append([r.strategy, "unsupported", "", "", *(["", ""] if at_common else []),
                         "", r.reason])
            continue
        at = r.timed.get(common)
        body.append([r.strategy, r.search.batch, fmt_mib(r.search.peak, 0), _rate(r.largest),
                     *([fmt_mib(at.peak if at else None, 0), _rate(at)] if at_common else []),
                     f"{r.gradient_error:.1e} (<= {r.tolerance:.0e})",
                     f"{len(r.search.probes)} search probes"])
    return tabulate(body, headers=["strategy", "largest batch", "peak MiB", "images/s",
                                   *([f"peak MiB at {common}", f"images/s at {common}"]
                                     if at_common else []),
                                   "gradient error", "note"],
                    tablefmt="github", disable_numparse=True)


def markdown(net: str, device: str, budget: int, found: list[StrategyResult],
             common: int | None, env: dict) -> str:
    ran = _ran(found)
    facts = [
        (f"budget: {memory.format_size(budget)} for the whole training step (weights, "
         "gradients, SGD momentum, the batch, what is kept for backward, temporaries)"),
        (f"peaks read from the allocators ({memory.trace(backend_of(device)).method}) in a "
         "fresh process per probe, from before the model exists"),
        f"images/s: the median of timed steps at that batch; common batch {common}",
        (f"gradient error: against the plain step's at batch {CHECK_BATCH}, and its tolerance: "
         f"{GRADIENT_TOLERANCE:g} where the same arithmetic is repeated or copied, the loosest "
         "of the chosen algorithms' verification tolerances under a plan"),
    ] if ran else [
        (f"budget: {memory.format_size(budget)} for the whole training step"),
        ("no strategy asked for runs on this device: nothing was measured (why: the table's "
         "note)"),
    ]
    if any("offload" in r.strategy.split("+") for r in ran):
        facts.append("offload: torch's `save_on_cpu` copies each saved tensor to the host and "
                     "back blocking, overlapping none of it with computation (vDNN overlaps "
                     "them on a side stream): its images/s is a lower bound for offloading")
    lines = [f"# memplan: {net} on {env.get('device', device)}", "",
             *[f"- {f}" for f in facts], "", table(found, common), "",
             *_workspace_notes(found)]
    if ran:
        lines.append(f"![images/s against batch size]({PLOT})")
    return "\n".join(lines).rstrip("\n") + "\n"


def _workspace_notes(found: list[StrategyResult]) -> list[str]:
    """What the `workspace` strategies chose at their largest batch and at the smallest."""
    out = []
    for r in found:
        if r.search is None or WORKSPACE not in r.strategy.split("+"):
            continue
        if not out:
            out = ["## Workspace choice", "",
                   (f"The conv passes were measured at batch {REFERENCE_BATCH}, every algorithm "
                    "and layout; at each batch the plan takes the fastest whose workspaces fit "
                    "together in what the step without it left of the budget."), ""]
        for batch in (min(r.timed), r.search.batch):
            out.append(f"- {r.strategy} at batch {batch}: {r.timed[batch].note}")
        out.append("")
    return out


#: The plot's file name in the study's folder.
PLOT = "memplan.png"


def plot(found: list[StrategyResult], path: Path, title: str) -> str | None:
    """Images/s against batch size per strategy, each line ending at its largest batch."""
    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    for r in _ran(found):
        points = [(b, p.images_per_s) for b, p in sorted(r.timed.items()) if p.images_per_s]
        if points:
            ax.plot(*zip(*points), marker="o", label=f"{r.strategy} (≤ {r.search.batch})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("images/s")
    ax.set_title(title)
    save_figure(fig, path)
    return None


def write(folder: Path, text: str, found: list[StrategyResult], env: dict,
          title: str) -> list[str]:
    """The study's folder (`folder.write_study`): report.md, memplan.csv, env.json and, where a
    strategy ran, memplan.png."""
    import pandas as pd

    plots = {PLOT: lambda path: plot(found, path, title)} if _ran(found) else {}
    return write_study(folder, "memplan", text, pd.DataFrame(rows(found)), env, plots=plots)
