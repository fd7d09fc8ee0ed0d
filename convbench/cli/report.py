"""`convbench report RUN` and `convbench compare RUN_A RUN_B`: a run folder re-rendered, and
two run folders' medians side by side."""

from __future__ import annotations

from .. import report, results
from .common import FORMATS, emit, usage_errors


def _load(folder: str):
    with usage_errors():
        return results.load_run(folder)


def cmd_report(args) -> int:
    df, env = _load(args.run)
    emit(df, args.format, report.write(args.run, df, env))
    return 0


def cmd_compare(args) -> int:
    (a, _), (b, _) = _load(args.run_a), _load(args.run_b)
    cmp = report.compare(a, b)
    emit(cmp, args.format, report.compare_table(cmp))
    return 0


def add_parsers(sub) -> None:
    for name, func, runs, text in (("report", cmd_report, ["run"], "re-render a run folder"),
                                   ("compare", cmd_compare, ["run_a", "run_b"],
                                    "ratio of medians per row between two run folders")):
        p = sub.add_parser(name, help=text)
        for r in runs:
            p.add_argument(r, metavar=r.upper())
        p.add_argument("--format", choices=FORMATS, default="table")
        p.set_defaults(func=func)
