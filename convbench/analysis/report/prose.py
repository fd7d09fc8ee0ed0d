"""report.md: the header (what ran where, how it was timed, the device's ceilings) and the prose
around `tables`' and `roof`'s tables, assembled in reading order.

First how the best of ours does against torch and which libraries' results were inexact (a
finding for their users: `inexact_section`), which (algorithm, layout) wins each layer and
pass, then the time tables per pass and
layout, a network's cost, how far from the roof, the operation counts, workspace and peak
memory, accuracy (with the error ratios the algorithms' math predicts, computed from the data),
the phase breakdown, what did not run and why, and the noisy, busy and host-bound times. Every
number comes from the results frame and env.json, so a run folder re-renders any time. A run
folder from before the ceilings renders as before, saying they were not measured.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ...algos.phases import FUSED
from ...core.fmt import (
    fmt_duration,
    fmt_error,
    fmt_mib,
    fmt_ms,
    fmt_ratio,
    md_table,
    tabulate,
)
from ...core.measurement import CONTENDED_SHARE, NOISE_THRESHOLD
from ...core.results import RESULTS_CSV, TIMED
from ...machine import contention
from ...machine.devices import DEVICES
from ...measure import memory, timing
from ...measure.ceilings.record import Ceilings, from_env
from .. import speedup
from ..inexact import INEXACT, sentence
from . import inference
from .cells import (
    BEST,
    BUSY,
    HOST_BOUND,
    NOISY,
    TIED,
    algo_major,
    algo_order,
    flag,
    marks,
    order,
)
from .roof import ROOF_ELEMENT_BYTES, ROOF_MAX_ROWS, ROOF_PRECISION, roof_frame, roof_table
from .tables import (
    baseline_of,
    busy_table,
    choice_totals,
    cost_table,
    error_ratios,
    error_table,
    host_bound_table,
    many_problems,
    not_measured,
    op_table,
    peak_table,
    phase_frame,
    phase_table,
    product_share,
    time_table,
    torch_table,
    verdict_table,
    winner_table,
    workspace_table,
)


def memory_methods(df: pd.DataFrame) -> list[str]:
    """One line per memory method the rows used, saying what it reads."""
    return [f"- `{m}`: {memory.METHODS.get(m, '')}" for m in order(df["memory_method"]) if m]


#: (algo, baseline) pairs whose error ratio the accuracy section states, each expected above 1:
#: F(4x4, 3x3)'s transform matrices have larger coefficients than F(2x2, 3x3)'s, and amplify
#: rounding more.
ERROR_RATIOS = (("winograd-4x4", "winograd-2x2"), ("winograd-fused-4x4", "winograd-fused-2x2"))


def error_ratio_line(df: pd.DataFrame, algo: str, baseline: str) -> str | None:
    """One sentence on how much larger `algo`'s error is than `baseline`'s, from the data, or
    None when no row has both."""
    ratios = error_ratios(df, algo, baseline)
    if ratios.empty:
        return None
    larger = int((ratios > 1).sum())
    return (f"{algo} / {baseline} error ratio: median {fmt_ratio(ratios.median())} "
            f"(min {fmt_ratio(ratios.min())}, max {fmt_ratio(ratios.max())}) over "
            f"{len(ratios)} (layer, pass, layout) cases; {algo}'s error is the larger in "
            f"{larger} of {len(ratios)}.")


def accuracy_section(df: pd.DataFrame) -> list[str]:
    """The accuracy tables, one per precision (rows algo and pass, columns layers), and the
    error ratios of `ERROR_RATIOS` where both algorithms were checked; [] when no row has an
    error."""
    checked = df[df["rel_error"].notna()]
    if checked.empty:
        return []
    out = ["## Accuracy", "",
           ("Relative error ‖out − ref‖/‖ref‖ against the float64 reference, per layer and pass "
            "(the larger of the two layouts), at the precision each table names; a case of ours "
            "above its tolerance is `failed` (see Not measured), a library's is timed and "
            "`inexact` (see Inexact results)."), ""]
    for precision, rows in checked.groupby("precision", sort=False):
        out += [f"### {precision}", "", md_table(error_table(rows)), ""]
    lines = [error_ratio_line(df, algo, baseline) for algo, baseline in ERROR_RATIOS]
    out += [f"- {line}" for line in lines if line]
    return out + ([""] if any(lines) else [])


def layer_table(df: pd.DataFrame) -> str:
    """One line per measurement, for `convbench layer`'s terminal output."""
    interval = [f"{fmt_ms(lo)}–{fmt_ms(hi)}" if pd.notna(lo) else ""
                for lo, hi in zip(df["ci_low_ms"], df["ci_high_ms"])]
    cols = {"median ms": [marks(r) + fmt_ms(r["median_ms"]) if r["status"] in TIMED else ""
                          for r in df.to_dict("records")],
            "95% interval": interval,
            "GFLOP/s": df["gflops"].map(lambda v: "" if pd.isna(v) else f"{v:.4g}"),
            "rel error": df["rel_error"].map(fmt_error),
            "workspace MiB": df["workspace_bytes"].map(fmt_mib),
            "reason / note": df["reason"].where(df["status"] != "ok", df["note"])}
    body = df[["layer", "algo", "pass", "layout", "precision", "status"]].assign(**cols)
    return tabulate(body, headers="keys", tablefmt="github", showindex=False,
                    disable_numparse=True)


def phase_section(df: pd.DataFrame) -> list[str]:
    """The phase breakdown: a table per algorithm, pass and precision, and per algorithm how
    often the transforms or the product dominate."""
    phased = phase_frame(df)
    if phased.empty:
        return []
    out = ["## Phase breakdown", "",
           ("Median ms of each phase and its share of their sum, for the algorithms whose passes "
            "have phases. The phases are timed apart from the whole pass, each repetition "
            "running all of them in order with a timestamp between them (CUDA events on the "
            "GPU, the host clock elsewhere); `pass ms` is the whole pass's median (the time "
            "tables'), which the phases' sum approximates. `dominant`: the transforms (inputs' "
            "and output's together) or the product, whichever takes more; for a fused kernel, "
            "its share."), ""]
    groups = algo_major(phased).groupby(["algo", "pass", "precision"], sort=False)
    for (algo, pass_, precision), rows in groups:
        out += [f"### {algo}, {pass_}, {precision}", "", md_table(phase_table(rows)), ""]
    for algo, rows in phased.groupby("algo", sort=False):
        fused = [p for p in rows["phases"] if FUSED in p]
        if fused and len(fused) == len(rows) and any(len(p) > 1 for p in fused):
            shares = [p[FUSED] / sum(p.values()) for p in fused if sum(p.values()) > 0]
            out.append(f"- {algo}: one fused kernel (input transform, product, output "
                       f"transform) takes {min(shares):.0%}–{max(shares):.0%} of the phases' "
                       f"time in {len(rows)} (layer, pass, layout) cases; the rest is the "
                       "filter transform.")
            continue
        apart = [p for p in rows["phases"] if FUSED not in p]
        product = sum(product_share(p) > 0.5 for p in apart)
        line = (f"- {algo}: the transforms dominate in {len(apart) - product} of {len(rows)} "
                f"(layer, pass, layout) cases, the product in {product}")
        if fused:
            line += (f"; in {len(fused)} the transform and the product alternate block by "
                     f"block, one phase (`{FUSED}`)")
        out.append(line + ".")
    return out + [""]


def run_seconds(env: dict) -> float | None:
    """How long the run took, from env.json's load readings: each start (a resumed one too) to
    the end that follows it, summed over the sittings; None without both."""
    total, began = None, None
    for reading in env.get("load") or []:
        try:
            when = datetime.datetime.fromisoformat(reading["time"])
        except (KeyError, TypeError, ValueError):
            continue
        if reading.get("when", "").endswith("start"):
            began = when
        elif reading.get("when") == "end" and began is not None:
            total = (total or 0.0) + (when - began).total_seconds()
            began = None
    return total


def header(df: pd.DataFrame, env: dict) -> list[str]:
    run = env.get("run", {})
    batches = sorted({int(n) for n in df["n"].dropna()})
    batch = ", ".join(map(str, batches))
    if run.get("backend") == "numpy" and batches == [DEVICES["cpu"].batch]:
        batch += " (the default CPU batch; the study used 256)"
    took = run_seconds(env)
    torch = env.get("torch", {})
    blas = env.get("numpy", {}).get("blas", {})
    title = (f"# convbench: {run.get('net', ', '.join(order(df['net'])))} on "
             f"{env.get('device', 'unknown device')}")
    lines = [title, ""]
    facts = [("batch", batch),
             ("backend", ", ".join(order(df["backend"]))),
             ("precision", ", ".join(order(df["precision"]))),
             ("timing budget", f"{run['budget_s']} s per measurement" if "budget_s" in run
              else None),
             ("threads", _threads(env, torch, blas)),
             ("timing", "competing cases (every algo and layout of a problem, pass and "
                        "precision) timed in shuffled interleaved rounds, until each median is "
                        f"known to within {run.get('target_noise', 0.02):.0%} or the budget "
                        "is spent" + ("; " + timing.WARM_POOLS if timing.WARM_POOLS
                                      in env["statistics"].get("timing", "") else "")
              if env.get("statistics") else None),
             ("machine load", "; ".join(f"{r['when']}: {contention.load_text(r)}"
                                        for r in env.get("load", [])) or None),
             ("versions", f"convbench {env.get('convbench')}, NumPy "
                          f"{env.get('numpy', {}).get('version')}, torch {torch.get('version')}"
              if env else None),
             ("git commit", env.get("git_commit")),
             ("date", env.get("date")),
             ("took", None if took is None else f"{fmt_duration(took)} (env.json's load "
                                                "readings, start to end)"),
             ("command", run.get("command"))]
    lines += [f"- {k}: {v}" for k, v in facts if v]
    lines += ceilings_lines(env)
    counts = df["status"].value_counts()
    lines += ["- measurements: " + ", ".join(f"{counts[s]} {s}" for s in counts.index), ""]
    return lines


#: What the report says where a run's env.json has no ceilings (a run from before them).
NO_CEILINGS = "not measured for this run (a run folder from before the ceilings were measured)"


def _product(c: Ceilings, shape: str) -> str:
    """The product a ceiling's shape names, as its `methods` describes it (`square
    (2048x2048)@(2048x2048)`), or the name alone."""
    m = re.search(rf"(?:products: |; ){re.escape(shape)} ([^;]+)", c.methods.get("gflops", ""))
    return f"{shape} {m[1].strip()}" if m else shape


def _rate(x: float | None, unit: str) -> str:
    return "n/a" if x is None else f"{x:.4g} {unit}"


def ceilings_lines(env: dict | None) -> list[str]:
    """The header's lines on the device's ceilings: the attainable fp32 rate and which library
    on which product gave it, the theoretical peak and how it was reckoned, the bandwidth
    beyond and within cache (and how), the GPU's clock while timed; or why there are none."""
    env = env or {}
    c = from_env(env)
    note = env.get("ceilings_note")
    if c is None:
        why = (f"not measured for this run ({note})" if note else NO_CEILINGS
               if "ceilings" not in env else "not measured for this run")
        return [f"- ceilings: {why}"] if env else []
    backend, _, shape = c.methods.get("attainable", c.gemm_backend).partition(" on ")
    out = [f"- ceilings of {c.model} ({c.device}, {c.threads} threads, {c.provenance()}"
           + (f"; {note}" if note else "") + "):",
           (f"  - attainable fp32: {_rate(c.gflops_attainable, 'GFLOP/s')}, {backend or '?'}"
            + (f" on {_product(c, shape)}" if shape else "")
            + " (the fastest SGEMM of the libraries here)"),
           *([(f"  - measured FMA peak: {_rate(c.gflops_peak_measured, 'GFLOP/s')} "
               f"({c.methods.get('peak_measured', '')})"),
              (f"  - compute roof: {_rate(c.compute_roof[0], 'GFLOP/s')}, {c.compute_roof[1]} "
               "(the larger of the two: every share of the roof below is of it)")]
             if c.gflops_peak_measured else []),
           (f"  - theoretical peak: {_rate(c.gflops_peak_theoretical, 'GFLOP/s')} "
            f"({c.peak_method})"),
           (f"  - bandwidth: {_rate(c.bandwidth_gbs_dram, 'GB/s')} beyond cache, "
            f"{_rate(c.bandwidth_gbs_cache, 'GB/s')} within"
            + (f" ({c.methods['bandwidth']})" if c.methods.get("bandwidth") else ""))]
    if c.clock_mhz is not None:
        out.append(f"  - SM clock while the products ran: {c.clock_mhz:.0f} MHz")
    if c.contended:
        out.append(f"  - contended, so low: {c.methods['contended']}")
    return out


def _threads(env: dict, torch: dict, blas: dict) -> str | None:
    policy = env.get("threads")
    if isinstance(policy, dict):
        return (f"{policy['threads']} for every algorithm ({policy.get('set_by')}; "
                f"{policy.get('available_cores')} cores available)")
    return (f"torch {torch.get('threads')}, NumPy BLAS ({blas.get('name')}) "
            f"{blas.get('threads')}" if torch else None)


def network_section(df: pd.DataFrame, env: dict) -> list[str]:
    """The report of a model's or a problem file's run: its problems weighted by how often the
    network has each (`occurrences` in env.json's run), and the network total per choice."""
    occurrences = env.get("run", {}).get("occurrences")
    if not occurrences or not (df["status"] == "ok").any():
        return []
    source = env["run"].get("model") or env["run"].get("problems") or "the network"
    out = ["## Network cost", "",
           (f"{source}: {sum(occurrences.values())} conv layers, {len(occurrences)} distinct "
            "problems. Each problem's median ms per pass in its fastest verified algorithm and "
            "layout, times how often the network has it; the costliest first. Layouts are each "
            "pass's own best here: the conversions between them are not counted (`convbench "
            "advise` weighs them)."), ""]
    unmeasured = env["run"].get("unmeasured") or {}
    if unmeasured:
        out += ["Not measured (convbench cannot run them): " + "; ".join(
            f"{layer} ({why})" for layer, why in unmeasured.items()) + ".", ""]
    skipped = env["run"].get("skipped") or []
    if skipped:
        shown = "; ".join(skipped[:3]) + ("; ..." if len(skipped) > 3 else "")
        out += [(f"Skipped: {len(skipped)} lines of the file are convolutions convbench "
                 f"cannot hold (env.json lists them all): {shown}."), ""]
    for precision, rows in df.groupby("precision", sort=False):
        out += [f"### {precision}", "", md_table(cost_table(rows, occurrences)), "",
                ("Network total per choice: one algorithm for every problem and pass, each in "
                 "its faster layout; `covers` counts the problem-passes it ran verified."), "",
                md_table(choice_totals(rows, occurrences)), ""]
    return out


def roof_section(df: pd.DataFrame, env: dict | None) -> list[str]:
    """How far from the roof: each verified fp32 row's share of the device's attainable
    ceiling, in direct flops and in its own operations, and whether it is compute- or
    memory-bound by the minimum bytes its pass moves; each (algo, pass, layout)'s row nearest
    its roof where the run has more than `ROOF_MAX_ROWS`. Where env.json has no ceilings,
    says so. [] where no row ran verified."""
    if not (df["status"] == "ok").any():
        return []
    out = ["## How far from the roof", ""]
    ceilings = from_env(env)
    if ceilings is None:
        note = (env or {}).get("ceilings_note")
        return out + [("The device's ceilings were not measured for this run"
                       + (f" ({note})" if note else "") + ": no row's share of them can be "
                       "stated."), ""]
    roof = roof_frame(df, ceilings)
    if roof.empty:
        return out + [(f"No verified {ROOF_PRECISION} row: the ceilings are {ROOF_PRECISION}'s, "
                       "and rows of other precisions are not read against them."), ""]
    compute, which = ceilings.compute_roof
    ridge = (f", the ridge at {compute / ceilings.bandwidth_gbs_dram:.3g} "
             "flop/byte" if ceilings.bandwidth_gbs_dram else "")
    named = (f"the {ROOF_PRECISION} compute roof, {compute:.4g} GFLOP/s ({which})"
             if ceilings.gflops_peak_measured else
             f"the attainable {ROOF_PRECISION} ceiling, {compute:.4g} GFLOP/s")
    out += [(f"Each verified {ROOF_PRECISION} row against {ceilings.model}'s ceilings (in the "
             f"header): its rate as a share of {named}, counted two ways: in direct-convolution "
             "flops over its median (`% of ceiling (direct flops)`: above 100% only where the "
             "algorithm does fewer operations than the direct convolution, FFT and Winograd), "
             "and in the algorithm's own operations (`algo_ops`, the Operation counts; `% of "
             "ceiling (own ops)`: the share of the hardware's rate its own arithmetic used). "
             "`flop/byte`: its own operations over the fewest bytes its pass can move (its two "
             f"inputs and its output once each, {ROOF_ELEMENT_BYTES} bytes an element, plus the "
             "workspace it declares; caches and re-reads move more, so this intensity is an "
             "upper bound). `bound`: the lower roof at that intensity, the "
             + ("compute roof " if ceilings.gflops_peak_measured else "attainable compute ")
             + 
             f"or the DRAM bandwidth ({_rate(ceilings.bandwidth_gbs_dram, 'GB/s')}{ridge}), and "
             "`% of roof` the share of it attained. A library's choice of kernel has no "
             "operation count of its own: its intensity is read in direct flops (`d`). Any "
             f"row faster than the device can go was failed by the runner's guard (see Not "
             f"measured). The picture is `roofline.png`."), ""]
    if len(roof) > ROOF_MAX_ROWS:
        best = roof.loc[roof.groupby(["algo", "pass", "layout"], sort=False)["own_share"]
                        .idxmax()]
        out += [(f"The best of {len(roof)} rows: for each (algo, pass, layout), of its rows "
                 f"the one nearest the ceiling in its own operations ({len(best)} listed)."),
                "", md_table(roof_table(algo_major(best))), ""]
    else:
        out += [md_table(roof_table(roof)), ""]
    bound = roof["bound"].value_counts()
    if len(bound):
        out += ["Bound: " + ", ".join(f"{bound[k]} {k}" for k in bound.index)
                + f" of {len(roof)} rows (against the DRAM roof).", ""]
    return out


def inexact_section(df: pd.DataFrame) -> list[str]:
    """The libraries' results beyond their tolerance, a sentence each: timed and kept (torch's
    pick stays the baseline of every comparison), marked `INEXACT` wherever their time is
    shown, never a winner, and no plan's choice unless `--max-error` admits the error. []
    where there are none."""
    rows = df[df["status"] == "inexact"]
    if rows.empty:
        return []
    return ["## Inexact results", "",
            (f"{len(rows)} libraries' results were beyond their tolerance against the float64 "
             "reference. They are what its users run, so they were timed and kept: marked "
             f"`{INEXACT}` wherever their time is shown, the baseline where they are torch's "
             "pick, never a winner, and no plan's choice unless `convbench advise --max-error` "
             "admits their error."), "",
            *(f"- {sentence(r)}." for r in algo_major(rows).to_dict("records")), ""]


def _one_side(ours: bool) -> str:
    """What a run that measured only one side of ours against torch's says instead."""
    missing = "torch's convolution (torch-cpu, cudnn)" if ours else "our algorithms"
    return (f"This run measured none of {missing}: nothing to set against each other (add it "
            "to `--algos`).")


def layer_verdict(df: pd.DataFrame) -> str:
    """The lines `convbench layer` ends on: per precision, its (layer, pass) verdicts of the
    fastest of ours against torch's (`tables.verdict_table`, the report's "Best of ours against
    torch"), each `not decided` and why where busy or missing rows left no comparison; or why
    there is none. The question a layer's run is asked is answered where it is read last."""
    algos = set(df["algo"])
    ours, torchs = any(map(speedup.is_ours, algos)), any(map(speedup.is_torchs, algos))
    if not (ours or torchs):
        return ""
    if not (ours and torchs):
        return f"Verdict: {_one_side(ours)}"
    out = []
    for precision, rows in df.groupby("precision", sort=False):
        out += [(f"Verdict ({precision}): the fastest of ours against torch's, each in its "
                 "faster layout (own / torch below 1: ours is faster; faster only where the 95% "
                 "interval excludes 1)"), "",
                tabulate(verdict_table(rows).reset_index(), headers="keys",
                         tablefmt="github", showindex=False, disable_numparse=True), ""]
    return "\n".join(out).rstrip()


def torch_section(df: pd.DataFrame) -> list[str]:
    """The first question of a reader: how the best of ours does against torch's own
    convolution, per layer and pass (`speedup.against_torch`), a table per precision, the
    README's shape for a run of few layers. Where the run measured only one side, it says
    so; [] where it measured neither."""
    algos = set(df["algo"])
    ours, torchs = any(map(speedup.is_ours, algos)), any(map(speedup.is_torchs, algos))
    if not ours and not torchs:
        return []
    out = ["## Best of ours against torch", ""]
    if not (ours and torchs):
        return out + [_one_side(ours), ""]
    vs = speedup.against_torch(df)
    out += [("Per layer and pass, the fastest of our own algorithms against torch's fastest "
             "convolution (oneDNN's `torch-cpu` on the CPU, `cudnn` or `cudnn-autotune` on a "
             "GPU), each in its faster layout: the ratio of our median to torch's (below 1: "
             "ours is faster) with its 95% interval, paired by round (they were timed side by "
             "side); the one whose interval excludes 1 is faster, else a tie. A cell is empty "
             "where either has no verified time on a quiet machine (see Which wins and Not "
             "measured)"
             + (f"; torch's time marked `{INEXACT}` is its inexact pick's (see Inexact results)."
                if vs["torch_inexact"].any() else ".")), ""]
    wide = not many_problems(df)
    for precision, rows in vs.groupby("precision", sort=False):
        counts = rows["outcome"].value_counts()
        apart = counts.get("", 0)
        out += [f"### {precision}", "", md_table(torch_table(rows, wide)), "",
                (f"Ours faster in {counts.get('ours', 0)}, torch's in {counts.get('torch', 0)}, "
                 f"a tie in {counts.get('tie', 0)} of {len(rows)} (layer, pass)"
                 + (f"; {apart} not compared." if apart else ".")), ""]
    return out


def speedup_section(df: pd.DataFrame, env: dict, baseline: str | None = None) -> list[str]:
    """For a run of many problems: per algorithm, its share of problems won, tied and lost
    against the baseline and its mean speed-up, overall and per class of problem. [] for a
    run of few problems."""
    if not many_problems(df):
        return []
    baseline = baseline_of(df, env, baseline)
    out = [f"## Speed-up over {baseline}", ""]
    if baseline not in set(df["algo"]):
        return out + [(f"The baseline {baseline} was not measured in this run; re-render with "
                      f"`convbench report RUN --baseline ALGO`, ALGO one of "
                      f"{', '.join(algo_order(df))}."), ""]
    sp = speedup.speedups(df, baseline)
    out += [(f"{df['layer'].nunique()} problems. Per problem and pass, each algorithm in its "
             f"faster layout against {baseline} in its faster layout: speed-up = {baseline}'s "
             "median / the algorithm's. It *wins* a problem where the 95% interval of that "
             "ratio lies above 1, loses where it lies below, and ties otherwise (a tie is not "
             "a win); `not compared`: the algorithm or the baseline has no fair verified time there "
             "(not run, failed, or measured on a busy machine)"
             + _inexact_baseline(df, baseline) + ". "
             "The sorted curves are in the plots (`speedup_*.png`); `convbench report RUN "
             "--baseline ALGO` sets another baseline."), ""]
    for (pass_, precision), g in sp.groupby(["pass", "precision"], sort=False):
        out += [f"### {pass_}, {precision}", "", md_table(speedup.summary(g, ["algo"])), "",
                "Per class of problem (`--class`):", "",
                md_table(speedup.summary(speedup.class_order(g), ["class", "algo"])), ""]
    return out


@dataclass(frozen=True)
class _Run:
    """What report.md's sections read: the results, env.json, the plots (file names, or the
    note saying why there are none), the speed-up's baseline, and the busy and host-bound
    tables several sections mention, and the inference variants' rows."""

    df: pd.DataFrame
    env: dict
    plots: list[str] | str
    baseline: str | None
    busy: pd.DataFrame
    host_bound: pd.DataFrame
    #: the inference variants' rows (`inference`), apart from `df`
    once: pd.DataFrame


#: The prose above each precision's winner table; `{share}` says what the bracketed share is of.
WINNERS_PROSE = (
    "Per layer and pass, across every algorithm and layout: the fastest, its median "
    "ms with the 95% interval of the median (order statistics), its GFLOP/s "
    "(direct-convolution flops over the median{share}), the "
    "runner-up and the ratio of their medians with its 95% interval (bootstrap, "
    "paired by round: they were timed side by side), and the algorithms that did "
    "not run, by status (their reasons are under Not measured). The fastest wins "
    "only where that interval excludes 1; otherwise it is a tie within noise with "
    "the times named. `convbench advise RUN` turns this into a plan: one layout per "
    "layer across its passes, the NCHW<->NHWC conversions weighed, ties broken by "
    "workspace (or `--tie-break`).")


def _peak(run: _Run, precision: str) -> tuple[float | None, str, str]:
    """The rate a winner's share is of at `precision`, its name, and the clause saying so: the
    measured fp32 ceiling, else (a run from before the ceilings) the device's FP32 peak."""
    ceilings = from_env(run.env)
    if ceilings is not None:
        peak = ceilings.compute_roof[0] if precision == "fp32" else None
        roof = (f"fp32 compute roof ({ceilings.compute_roof[1]})"
                if ceilings.gflops_peak_measured else "attainable fp32 ceiling")
        return peak, "ceiling", (
            f"; in brackets the share of the device's {roof}, "
            f"{peak:.4g} GFLOP/s (see How far from the roof)" if peak else
            f"; the device's ceilings are fp32's, not {precision}'s")
    fp32_peak = (run.env.get("gpu") or {}).get("fp32_peak_tflops") if run.env else None
    peak = fp32_peak * 1e3 if fp32_peak and precision == "fp32" else None
    return peak, "peak", (
        f"; in brackets the share of the device's FP32 peak, {peak:.4g} GFLOP/s"
        if peak else "; the device's peak is not known here (its ceilings were "
        "not measured for this run)")


def _winners(run: _Run) -> list[str]:
    out = []
    for precision, rows in run.df.groupby("precision", sort=False):
        peak, peak_name, share = _peak(run, precision)
        winners = winner_table(rows, peak, peak_name)
        if winners.empty:
            continue
        out += [f"## Which wins ({precision})", "",
                (WINNERS_PROSE.format(share=share)
                 + (" Times measured on a busy machine do not compete; where torch's "
                    "convolution was among them, the fastest of the rest is not called a "
                    "winner (its baseline is not known)." if len(run.busy) else "")),
                "", md_table(winners), ""]
    return out


def _inexact_baseline(df: pd.DataFrame, baseline: str) -> str:
    """The clause saying on how many (problem, pass) the baseline's time is `inexact`."""
    n = len(df.loc[(df["algo"] == baseline) & (df["status"] == "inexact"),
                   ["layer", "pass", "precision"]].drop_duplicates())
    return (f"; {baseline}'s time is inexact on {n} (problem, pass), its own all the same: it "
            "is what its users run (see Inexact results)" if n else "")


def _times(run: _Run) -> list[str]:
    host_note = (f", `{HOST_BOUND}` a time the host may have set (see Host-bound measurements)"
                 if len(run.host_bound) else "")
    busy_note = (f", `{BUSY}` a time measured on a busy machine (see Busy machine)"
                 if len(run.busy) else "")
    busy_note += (f", `{INEXACT}` the time of an inexact result, which wins nothing "
                  "(see Inexact results)" if (run.df["status"] == "inexact").any() else "")
    out = ["## Time per layer", "",
           (f"Median ms per pass; `{BEST.strip()}` marks the fastest algorithm of each layer "
            f"where it wins beyond noise, `{TIED.strip()}` the fastest and the times tied with "
            f"it where it does not; `{NOISY}` a noisy measurement{host_note}{busy_note}."), ""]
    for (precision, pass_, layout), rows in run.df.groupby(["precision", "pass", "layout"],
                                                           sort=False):
        out += [f"### {pass_}, {layout}, {precision}", "", md_table(time_table(rows)), ""]
    return out


def _op_counts(run: _Run) -> list[str]:
    return ["## Operation counts", "",
            ("Theoretical GFLOP per pass (`opcount.py`); n/a where the kernel is the library's "
             "choice or the algorithm does not apply."), "", md_table(op_table(run.df)), ""]


def _workspace(run: _Run) -> list[str]:
    if not run.df["workspace_bytes"].notna().any():
        return []
    return ["## Workspace", "", "MiB beyond inputs and output, as measured cases declared.",
            "", md_table(workspace_table(run.df)), ""]


def _peak_memory(run: _Run) -> list[str]:
    if not run.df["peak_bytes"].notna().any():
        return []
    return ["## Peak memory", "",
            ("MiB allocated beyond inputs and output while the prepared pass ran (its held "
             "buffers and every temporary), measured on the untimed verifying call:"),
            *memory_methods(run.df), "", md_table(peak_table(run.df)), ""]


def _not_measured(run: _Run) -> list[str]:
    if run.df["status"].isin(TIMED).all():
        return []
    return ["## Not measured", "", md_table(not_measured(run.df)), ""]


def _noisy(run: _Run) -> list[str]:
    noisy = run.df["noisy"].map(flag).sum()
    if not noisy:
        return []
    return ["## Noisy measurements", "",
            (f"{noisy} of {run.df['status'].isin(TIMED).sum()} measurements have IQR/median > "
             f"{NOISE_THRESHOLD}: marked `{NOISY}` in the time tables, `noisy` in "
             f"{RESULTS_CSV}."), ""]


def _flagged(title: str, table: pd.DataFrame, prose: str) -> list[str]:
    """A section of flagged times: its prose and their table; [] where none is flagged."""
    return [f"## {title}", "", prose, "", md_table(table), ""] if len(table) else []


def _busy(run: _Run) -> list[str]:
    return _flagged("Busy machine", run.busy, (
        f"{len(run.busy)} of {run.df['status'].isin(TIMED).sum()} times were measured while "
        "the machine was busy: on the CPU, other processes kept the pass's threads off the "
        "cores they were ready to run on, or the hypervisor gave the cores to other "
        f"machines (less than {CONTENDED_SHARE:.0%} of their ready time on a core: "
        f"`cpu_share` times 1 - `stolen` in {RESULTS_CSV}), on the GPU its clocks "
        "were held down (`throttled`). They "
        f"are marked `{BUSY}`, compete for no win here and are left out of advice "
        "(`--include-busy` takes them); measure them again on a quiet machine."))


def _host_bound(run: _Run) -> list[str]:
    return _flagged("Host-bound measurements", run.host_bound, (
        f"{len(run.host_bound)} GPU measurements may hold time the GPU spent waiting for "
        "the host (Python, the launches): in more than a tenth of their repetitions "
        "the host took longer to issue the pass than the head start the GPU was given "
        f"(`host_bound` in {RESULTS_CSV}; for rows from before the head start, the host "
        "took half the GPU's time or more). These times are upper bounds of the "
        f"kernels' own. Marked `{HOST_BOUND}` in the time tables."))


def _plots(run: _Run) -> list[str]:
    plots = run.plots
    return ["## Plots", "",
            *([plots] if isinstance(plots, str) else [f"![{Path(p).stem}]({p})" for p in plots])]


#: report.md's sections in reading order, each a function of the run to its lines ([] where it
#: has nothing to say).
SECTIONS: tuple[Callable[[_Run], list[str]], ...] = (
    lambda run: header(run.df, run.env),
    lambda run: torch_section(run.df),
    lambda run: inexact_section(run.df),
    lambda run: speedup_section(run.df, run.env, run.baseline),
    _winners,
    _times,
    lambda run: inference.section(run.once, run.df),
    lambda run: network_section(run.df, run.env),
    lambda run: roof_section(run.df, run.env),
    _op_counts,
    _workspace,
    _peak_memory,
    lambda run: accuracy_section(run.df),
    lambda run: phase_section(run.df),
    _not_measured,
    _noisy,
    _busy,
    _host_bound,
    _plots,
)


def markdown(df: pd.DataFrame, env: dict, plots: list[str] | str = (),
             baseline: str | None = None) -> str:
    """report.md: the header, the best of ours against torch per layer and pass, the
    libraries' inexact results, for many problems the speed-up over a baseline, which wins each
    layer, time tables per pass and layout, op counts, workspace, accuracy, the phase
    breakdown, what was not measured and why, noisy measurements, and the plots (`plots`: file
    names, or the note saying why there are none): `SECTIONS`, in order."""
    df, once = inference.split(df)  # inference variants: a section of their own, nothing else
    run = _Run(df, env, plots, baseline, busy_table(df), host_bound_table(df), once)
    return "\n".join(line for section in SECTIONS for line in section(run)) + "\n"
