"""Each CPU algorithm's phases before and after a change: a baseline commit's algorithm modules
against the working tree's, timed side by side in one process.

    python -m convbench.tools.phases_bench --baseline HEAD~1 --layers alexnet:conv3 --batch 8
    make phases PHASES_ARGS="--baseline main --algos fft,winograd-4x4 --passes fwd"

The baseline's `convbench/algos/` is read from git (`git archive`: any commit, branch or tag)
and loaded as a second package, its classes in a registry of their own; both sides share the
working tree's core, so a baseline needing core code the tree no longer has fails with one
line. Each case (layer x algo x pass x layout) is prepared on both sides, checked against the
float64 reference, then timed phase by phase in shuffled rounds (`timing.rounds_cpu`), so drift
falls on both alike; a pass without phases is one phase, `pass`. Printed per case and side:
each phase's median ms, the pass's total (phases timed apart, like an explicit pad, left out)
and after/before with its interval; `--csv` keeps the table. A benchmark for people changing an
algorithm, not a unit test: CI runs it on a tiny problem only to keep it working.
"""

from __future__ import annotations

import argparse
import importlib
import io
import pkgutil
import subprocess
import sys
import tarfile
import tempfile
import types
from contextlib import contextmanager
from pathlib import Path

from ..core.fmt import first_line
from ..machine import threads

#: The package name the baseline's algorithm modules are loaded under.
BASELINE_PACKAGE = "convbench._baseline_algos"
#: The phase of a side whose pass exposes no phases: the whole call.
WHOLE = "pass"


class BenchError(ValueError):
    """A problem with what was asked (a bad commit, a baseline that does not load)."""


def baseline_tree(rev: str, dest: Path, repo: Path) -> Path:
    """Write commit `rev`'s `convbench/algos/` under `dest`; returns that folder."""
    try:
        blob = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev,
                               "convbench/algos"], check=True, capture_output=True).stdout
    except FileNotFoundError as e:
        raise BenchError("git is not installed: the baseline is read from git") from e
    except subprocess.CalledProcessError as e:
        err = e.stderr.decode(errors="replace").strip().splitlines()
        raise BenchError(f"--baseline {rev}: {err[-1] if err else 'git archive failed'}") from e
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(dest, filter="data")
    return dest / "convbench" / "algos"


@contextmanager
def _collecting(into: dict):
    """`registry.register` files classes into `into` instead of the registry, wrapped as
    `register` wraps them (`registry.wrap`). A baseline
    registers an algorithm by its traits (`traits.Algorithm`), or from before those by its
    name; its traits are this tree's, read by name."""
    from ..algos import registry

    real = registry.register

    def register(declared, backend: str):
        algo = getattr(declared, "name", declared)

        def deco(cls):
            into[(algo, backend)] = registry.wrap(cls, algo, backend)
            return cls
        return deco

    registry.register = register
    try:
        yield
    finally:
        registry.register = real


#: Where the modules a baseline's algorithms import stood before the package's layers became
#: folders: a baseline from before that move imports them by these names.
_BEFORE_FOLDERS = {
    "problem": "core.problem", "fmt": "core.fmt", "stats": "core.stats",
    "measurement": "core.measurement", "threads": "machine.threads", "registry": "algos.registry",
    "padding": "algos.padding", "phases": "algos.phases", "transforms": "algos.transforms",
    "reference": "algos.reference", "kernels": "cuda.kernels", "emu": "cuda.emu",
}
#: The baseline's own copies of these are not loaded: its algorithms register with, and are
#: timed by, this tree's contract (a second registry or phase contract would not be seen).
_SHARED = ("registry", "phases", "padding")


@contextmanager
def _aliases(names: dict[str, str]):
    """`sys.modules` answers each key (a dotted name) with the module of its value while the
    baseline loads, and forgets them after."""
    added = [k for k in names if k not in sys.modules]
    for key in added:
        sys.modules[key] = importlib.import_module(names[key])
    try:
        yield
    finally:
        for key in added:
            del sys.modules[key]


def load_baseline(folder: Path) -> dict:
    """Import every module of a baseline's algos folder as `BASELINE_PACKAGE`; returns its
    implementations by (algo, backend). A baseline from before the layers became folders finds
    the modules it imports under their old names."""
    if BASELINE_PACKAGE in sys.modules:
        raise BenchError("a baseline is already loaded in this process")
    pkg = types.ModuleType(BASELINE_PACKAGE)
    pkg.__path__ = [str(folder)]
    pkg.__package__ = BASELINE_PACKAGE
    sys.modules[BASELINE_PACKAGE] = pkg
    aliases = {f"convbench.{old}": f"convbench.{new}" for old, new in _BEFORE_FOLDERS.items()}
    aliases |= {f"{BASELINE_PACKAGE}.{name}": f"convbench.algos.{name}" for name in _SHARED}
    impls: dict = {}
    with _aliases(aliases), _collecting(impls):
        for mod in sorted(pkgutil.iter_modules([str(folder)]), key=lambda m: m.name):
            try:
                importlib.import_module(f"{BASELINE_PACKAGE}.{mod.name}")
            except Exception as e:  # any failure is the baseline's, said in one line
                raise BenchError(f"the baseline's algos/{mod.name}.py does not load against "
                                 f"this tree: {type(e).__name__}: {e}") from e
    return impls


def _side(side, impl, problem, pass_, layout, precision, a, b, out):
    """Prepare one side, run it once and check it; returns its timing.Contender."""
    from ..algos import phases
    from ..algos.reference import nan_output, reference
    from ..measure import timing
    from ..measure.verify import check

    run = impl.prepare(problem, pass_, layout, precision)
    run(a, b, out)
    checked = check(out, reference(problem, pass_, layout, a, b), impl.algo, precision,
                    problem, pass_)
    if not checked.ok:
        raise BenchError(f"{impl.algo} {pass_} {layout} ({side}) fails its check: "
                         f"{checked.reason}")
    steps = getattr(run, "phase_fns", None) or {WHOLE: lambda: run(a, b, out)}
    out[...] = nan_output(problem, pass_, layout, out.dtype)
    return timing.Contender(dict(steps), frozenset(phases.APART))


def bench(cases, before: dict, budget_s: float, precision: str = "fp32"):
    """Time each case's two sides in rounds; a DataFrame, one row per case, side and phase."""
    import numpy as np
    import pandas as pd

    from ..algos import registry
    from ..algos.reference import DTYPES, random_operands
    from ..core import stats
    from ..measure import timing

    rows = []
    for layer, problem, algo, pass_, layout in cases:
        after = registry.get(algo, "numpy")
        if after.supports(problem, pass_, layout, precision) is not None:
            continue
        key = dict(layer=layer, algo=algo, pass_=pass_, layout=layout)
        a, b = random_operands(problem, pass_, layout, DTYPES[precision])
        out = np.empty(problem.operand_shapes(pass_, layout)[2], DTYPES[precision])
        sides = {"after": _side("after", after, problem, pass_, layout, precision, a, b, out)}
        old = before.get((algo, "numpy"))
        if old is not None and old.supports(problem, pass_, layout, precision) is None:
            sides = {"before": _side("before", old, problem, pass_, layout, precision, a, b, out), **sides}
        timed = dict(zip(sides, timing.rounds_cpu(list(sides.values()), budget_s, probe=None)))
        totals = {side: t.total.times_ms for side, t in timed.items()}
        for side, t in timed.items():
            for phase, m in t.steps.items():
                rows.append({**key, "side": side, "phase": phase, "ms": m.median})
            ratio = (stats.ratio(totals["after"], totals["before"], paired=True).text()
                     if side == "after" and "before" in totals else "")
            rows.append({**key, "side": side, "phase": "total", "ms": t.total.median,
                         "after/before": ratio, "reps": len(t.total.times_ms)})
    return pd.DataFrame(rows)


def table(df) -> str:
    """Markdown, one table per algo and pass (their phases as columns, in order), one line per
    case and side."""
    import pandas as pd

    from ..core.fmt import tabulate

    if df.empty:
        return "(no case ran)"
    keys = ["layer", "algo", "pass_", "layout", "side"]
    out = []
    for (algo, pass_), group in df.groupby(["algo", "pass_"], sort=False):
        phases = list(dict.fromkeys(p for p in group["phase"] if p != "total")) + ["total"]
        wide = group.pivot_table(index=keys, columns="phase", values="ms", sort=False)
        wide = wide[phases].round(2)
        extra = group[group["phase"] == "total"].set_index(keys)[["reps", "after/before"]]
        wide = pd.concat([wide, extra], axis=1).reset_index().drop(columns=["algo", "pass_"])
        wide = wide.astype(object).where(wide.notna(), None)
        text = tabulate(wide, headers="keys", tablefmt="pipe", showindex=False, missingval="")
        out.append(f"{algo} {pass_}\n\n{text}")
    return "\n\n".join(out)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m convbench.tools.phases_bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default="HEAD",
                    help="commit whose convbench/algos/ is 'before' (default HEAD: the "
                    "working tree's uncommitted change)")
    ap.add_argument("--layers", nargs="+", default=["alexnet:conv2", "alexnet:conv3"],
                    help="layers (alexnet:conv3) or problem specs (n=1,c=3,h=9,w=9,k=4,r=3,"
                    "s=3,pad=1), space-separated")
    ap.add_argument("--batch", type=int, default=None,
                    help="batch size (default: a spec's own n, 8 for a catalog layer)")
    ap.add_argument("--algos", default="gemm,fft,winograd",
                    help="numpy algos, comma-separated ('winograd' means every tile)")
    ap.add_argument("--passes", default="fwd,bwd_data,bwd_filter")
    ap.add_argument("--layouts", default="nchw,nhwc")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--budget", type=float, default=1.0,
                    help="seconds per side and case (rounds stop earlier at 2%% noise)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--csv", type=Path, help="also write the long table (case, side, phase)")
    return ap


def main(argv=None) -> int:
    threads.sleep_idle_threads()  # before NumPy or torch load
    args = _parser().parse_args(argv)
    from ..algos import registry
    from ..catalogs import layers
    from ..core.problem import LAYOUTS, PASSES, check_choice

    try:
        threads.use(args.threads)
        passes, layouts = args.passes.split(","), args.layouts.split(",")
        for p in passes:
            check_choice("pass", p, PASSES)
        for lay in layouts:
            check_choice("layout", lay, LAYOUTS)
        algos = registry.expand_algos(args.algos, "numpy")
        problems = []
        for spec in args.layers:
            p = layers.resolve(spec).problem
            batch = args.batch or (None if "=" in spec else 8)
            problems.append((spec, p.with_batch(batch) if batch else p))
        cases = [(spec, p, algo, pass_, layout) for spec, p in problems for algo in algos
                 for pass_ in passes for layout in layouts]
        repo = Path(__file__).resolve().parents[2]
        with tempfile.TemporaryDirectory(prefix="convbench-baseline-") as tmp:
            try:
                before = load_baseline(baseline_tree(args.baseline, Path(tmp), repo))
                df = bench(cases, before, args.budget, args.precision)
            finally:
                for name in [m for m in sys.modules if m.split(".")[:2] ==
                             BASELINE_PACKAGE.split(".")]:
                    del sys.modules[name]
    except ValueError as e:
        print(f"phases_bench: {first_line(e)}", file=sys.stderr)
        return 2
    batches = ", ".join(sorted({str(p.n) for _, p in problems}))
    print(f"before: {args.baseline}'s convbench/algos; after: the working tree; batch "
          f"{batches}, {args.precision}, {threads.count()} threads; median ms\n")
    print(table(df))
    if args.csv:
        df.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
