"""`convbench report RUN` and `convbench compare RUN_A RUN_B`: a run folder's report, and two
run folders' medians side by side (what differs between their machines first; runs of other
problems or batches refused unless --force; --fail-above PCT exits 1 on a regression).

Reading never writes: `report RUN` prints the report (or, `--format csv|json`, the rows) and
leaves RUN as it was, so reading a committed run folder leaves the checkout clean; the report
and its plots are written only where `--out DIR` asks (`--out RUN` re-renders RUN in place).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..analysis import compare, report
from ..core import results
from .common import EXIT_FAULT, FORMATS, UsageError, emit, percent, usage_errors


def _load(folder: str):
    with usage_errors():
        return results.load_run(folder)


def cmd_report(args) -> int:
    df, env = _load(args.run)
    if args.baseline and args.baseline not in set(df["algo"]):
        raise UsageError(f"--baseline {args.baseline} was not measured in {args.run}; "
                         f"measured: {', '.join(dict.fromkeys(df['algo']))}")
    if args.out is None:  # the markdown only where it is what is printed
        emit(df, args.format,
             report.text(df, env, args.baseline) if args.format == "table" else "")
        return 0
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # --out names a file, or a folder this process cannot make
        raise UsageError(f"--out {out}: cannot write a report there "
                         f"({exc.strerror or exc})") from None
    emit(df, args.format, report.write(out, df, env, args.baseline))
    print(f"convbench: {report.REPORT_MD} and its plots written to {out}", file=sys.stderr)
    return 0


def cmd_compare(args) -> int:
    (a, env_a), (b, env_b) = _load(args.run_a), _load(args.run_b)
    differences = compare.environment_differences(env_a, env_b, a, b)
    lines = compare.header(env_a, env_b, differences)
    if not args.force:
        try:
            compare.check_comparable(a, b)
        except ValueError as exc:
            for line in lines:
                print(line, file=sys.stderr)
            raise UsageError(str(exc)) from None
    cmp = compare.compare(a, b)
    if args.format == "table":
        emit(cmp, args.format, "\n".join([*lines, "", compare.compare_table(cmp), "",
                                          compare.answers_text(a, b)]).rstrip())
    else:  # the data stays parseable: the environment goes to stderr
        for line in lines:
            print(line, file=sys.stderr)
        emit(cmp, args.format, "")
    if args.fail_above is None:
        return 0
    slower = compare.regressions(cmp, args.fail_above)
    if slower.empty:
        return 0
    named = [f"{r['layer']} {r['pass']} {r['layout']} {r['algo']} (+{r['ratio'] - 1:.0%})"
             for r in slower.to_dict("records")]
    print(f"convbench: {len(slower)} rows of B slower than A beyond noise by more than "
          f"{args.fail_above * 100:g}%: {', '.join(named[:5])}"
          + (f" and {len(named) - 5} more" if len(named) > 5 else ""), file=sys.stderr)
    return EXIT_FAULT


def add_parsers(sub) -> None:
    p = sub.add_parser("report", help="a run folder's report, printed (--out DIR: written "
                       "there with its plots)")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--format", choices=FORMATS, default="table")
    p.add_argument("--out", metavar="DIR",
                   help="write report.md and its plots into DIR (RUN itself re-renders it); "
                        "without it nothing is written")
    p.add_argument("--baseline", metavar="ALGO",
                   help="for a run of many problems: the algorithm the sorted speed-ups are "
                        "over (default cudnn-autotune on a GPU run, torch-cpu on a CPU run)")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("compare", help="ratio of medians per row between two run folders, "
                       "with what differs between their machines")
    p.add_argument("run_a", metavar="RUN_A")
    p.add_argument("run_b", metavar="RUN_B")
    p.add_argument("--force", action="store_true",
                   help="compare runs of different problems or batches (the rows they share)")
    p.add_argument("--fail-above", type=percent, metavar="PCT",
                   help="exit 1 when a row of B is slower than A beyond noise by more than PCT%%")
    p.add_argument("--format", choices=FORMATS, default="table")
    p.set_defaults(func=cmd_compare)
