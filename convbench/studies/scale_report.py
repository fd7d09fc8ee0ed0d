"""`convbench scale`'s output: its folder (report.md, scale.csv, speedup.png, timeline.png), from
the `ScaleResult` that `scale.run` measured.

Apart from the measuring so the ranks carry no markdown or matplotlib and the report re-renders
from the records. The report states how each figure was obtained (the launcher, the threads per
rank, what compute, exchange, serial and hidden mean, what the speedup is over) beside the
tables; a noisy time carries `~`, as the run report marks it.
"""

from __future__ import annotations

import os

from ..core.fmt import fmt_mib, pyplot, save_figure, tabulate
from ..machine.threads import CPU_THREAD_ENV
from .ddp import POWERSGD_START
from .folder import write_study
from .scale import HOOKS, ScaleResult, gradient_bytes, on_meta
from .workload import Workload


def _pick(rows: list[dict], **want) -> dict | None:
    return next((r for r in rows if all(r[k] == v for k, v in want.items())), None)


def _num(v, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def _ms(row: dict | None) -> str:
    if row is None:
        return ""
    return ("~" if row["noisy"] else "") + f"{row['median_ms']:.4g}"


def bytes_table(load: Workload) -> str:
    """Gradient bytes per step of the model and, for a catalog net, of its counterpart with or
    without FC layers."""
    loads = [load] if load.user else [load, load.counterpart()]
    body = []
    for each in loads:
        split = gradient_bytes(on_meta(each))
        total = sum(split.values())
        body.append([each.name, f"{total / 4:,.0f}", fmt_mib(total, 1),
                     f"{split['conv'] / total:.1%}", f"{split['fc'] / total:.1%}"])
    return tabulate(body, headers=["net", "parameters", "gradient MiB/step", "conv share",
                                   "fc6-fc8 share"], tablefmt="github", disable_numparse=True)


def scaling_table(rows: list[dict]) -> str:
    """Per world size and batch, with the exact all-reduce: the step, its parts, the speedup."""
    body = []
    for r in (r for r in rows if r["kind"] == "step" and r["hook"] == "allreduce"):
        at = {"world_size": r["world_size"], "batch": r["batch"]}
        body.append([r["world_size"], r["batch"], r["rank_batch"], _ms(r), _num(r["iqr_ms"], ".3g"),
                     f"{r['images_per_s']:.3g}", _num(r["speedup"], ".2f"),
                     _num(r["efficiency"], ".0%"),
                     _ms(_pick(rows, **at, hook="none", kind="compute")),
                     _ms(_pick(rows, **at, hook="allreduce", kind="exchange")),
                     _ms(_pick(rows, **at, hook="allreduce", kind="serial")),
                     _num(r["hidden_share"], ".0%"), _num(r["one_process_error"], ".1e")])
    return tabulate(body, headers=["world", "batch", "per rank", "step ms", "IQR ms", "images/s",
                                   "speedup", "efficiency", "compute ms", "exchange ms",
                                   "serial ms", "hidden", "vs one process"],
                    tablefmt="github", disable_numparse=True)


def hooks_table(rows: list[dict]) -> str:
    """Per world size above 1, batch and hook: what was sent, what it cost, what it changed."""
    body = []
    for r in (r for r in rows if r["kind"] == "step" and r["world_size"] > 1):
        at = {"world_size": r["world_size"], "batch": r["batch"], "hook": r["hook"]}
        body.append([r["world_size"], r["batch"], r["hook"],
                     fmt_mib(r["exchanged_bytes"], 1),
                     _ms(_pick(rows, **at, kind="exchange")), _ms(r),
                     _num(r["speedup"], ".2f"), _num(r["hidden_share"], ".0%"),
                     _num(r["gradient_error"], ".1e")])
    return tabulate(body, headers=["world", "batch", "hook", "MiB sent/step", "exchange ms",
                                   "step ms", "speedup", "hidden", "gradient error"],
                    tablefmt="github", disable_numparse=True)


def markdown(result: ScaleResult, env: dict) -> str:
    """The report: how it was measured, the gradient bytes, the scaling and the hooks."""
    job, info = result.job, result.run_info()
    threads = ("one compute thread per rank, idle threads sleeping "
               f"({', '.join(f'{k}={os.environ.get(k, v)}' for k, v in CPU_THREAD_ENV.items())})"
               if job.device == "cpu" else "one GPU per rank, fp32 (TF32 off)")
    facts = [
        (f"{info['nodes']} node(s), ranks launched by {info['launcher']}; backend "
         f"{result.interconnect['backend']}; {threads}"),
        (f"training step of {job.load.name}: forward, cross-entropy, backward, SGD (momentum "
         "0.9) under DistributedDataParallel (default 25 MiB buckets); batch = the global "
         "batch, split evenly over the ranks"),
        (f"{job.steps} timed steps after {job.warmup} warm-up steps (PowerSGD: rank "
         f"{job.powersgd_rank}, compressing from iteration {POWERSGD_START}); a step's time is "
         "the slowest rank's, ranks meeting at a barrier before each; `~`: IQR/median > 0.1"),
        ("compute: the step under no_sync() (no exchange); exchange: the hook's exchange alone, "
         "each bucket waited for in turn; serial: the step with that wait, nothing overlapped; "
         "hidden = (compute + exchange − step) / exchange, clamped to [0, 1]"),
        ("speedup: images/s over one rank's at the same batch per rank (efficiency = speedup / "
         "ranks)" if job.per_rank else "speedup: the one-rank step time over this one at the "
         "same global batch (efficiency = speedup / ranks)"),
        ("gradient error: ‖g − g_exact‖/‖g_exact‖ of one step's averaged gradient against the "
         "exact all-reduce's, same weights and data, at the hook's first compressed step; vs "
         "one process: the exact all-reduce's gradient against one process's gradient of the "
         "whole global batch"),
    ]
    lines = [f"# scale: {job.load.name} on {env.get('device', job.device)}", "",
             *[f"- {f}" for f in facts], "", "## Gradient exchanged per step", "",
             bytes_table(job.load), "", "## Scaling with the exact all-reduce", "",
             scaling_table(result.rows), ""]
    if any(r["world_size"] > 1 for r in result.rows):
        lines += ["## Sending less: communication hooks", "", hooks_table(result.rows), ""]
    lines += ["![speedup against batch size](speedup.png)", "",
              "![one step: compute and exchange](timeline.png)"]
    return "\n".join(lines) + "\n"


def plot_speedup(rows: list[dict], path, title: str, per_rank: bool = False) -> None:
    """Speedup against the batch (global, or per rank), a line per world size (colour) and
    hook (style)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    styles = dict(zip(HOOKS, ("o-", "s--", "^-.", "D:")))
    worlds = sorted({r["world_size"] for r in rows if r["world_size"] > 1})
    colours = {w: f"C{i}" for i, w in enumerate(worlds)}
    for world in worlds:
        for hook in HOOKS:
            points = [(r["rank_batch" if per_rank else "batch"], r["speedup"]) for r in rows
                      if r["kind"] == "step" and r["world_size"] == world and r["hook"] == hook
                      and r["speedup"] is not None]
            if points:
                ax.plot(*zip(*sorted(points)), styles[hook], color=colours[world],
                        label=f"{world} ranks, {hook}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch per rank" if per_rank else "global batch")
    ax.set_ylabel("speedup over one rank")
    ax.set_title(title)
    save_figure(fig, path)


def plot_timeline(timelines: dict[tuple[int, int], dict], path, title: str) -> None:
    """Rank 0's step per world size above 1 (or 1 alone) and batch: forward, backward and the
    optimizer on one lane, each bucket's exchange (ready to done) on the other."""
    plt = pyplot()
    shown = {k: v for k, v in timelines.items() if k[0] > 1} or timelines
    fig, axes = plt.subplots(len(shown), 1, figsize=(9, 1.6 * len(shown) + 0.8), squeeze=False,
                             layout="constrained")
    for ax, ((world, batch), t) in zip(axes[:, 0], sorted(shown.items())):
        last_ready = max((a for a, _ in t["buckets"]), default=t["backward"])
        parts = [("forward", 0.0, t["forward"], "C0"),
                 ("backward", t["forward"], last_ready, "C1"),
                 ("optimizer", t["backward"], t["end"], "C2")]
        for label, a, b, colour in parts:
            ax.barh(1, b - a, left=a, color=colour, label=label)
        for i, (a, b) in enumerate(t["buckets"]):
            ax.barh(0, b - a, left=a, color="C3", alpha=0.6, edgecolor="black",
                    label="exchange (per bucket)" if i == 0 else None)
        ax.set_yticks([0, 1], ["exchange", "compute"])
        ax.set_title(f"{world} ranks, batch {batch}", fontsize="small", loc="left")
    axes[-1, 0].set_xlabel("ms from the start of the step")
    fig.suptitle(title)
    save_figure(fig, path)


def write(folder, text: str, result: ScaleResult, env: dict, title: str) -> list[str]:
    """The study's folder (`folder.write_study`): report.md, scale.csv, env.json and the plots."""
    import pandas as pd

    df = pd.DataFrame(result.rows).astype({"exchanged_bytes": "Int64"})  # None: not a float
    return write_study(folder, "scale", text, df, env, plots={
        "speedup.png": lambda path: plot_speedup(result.rows, path, title,
                                                 result.job.per_rank),
        "timeline.png": lambda path: plot_timeline(result.timelines(), path, title)})
