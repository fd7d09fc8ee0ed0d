"""What every subcommand shares: one-line usage errors, argument types, output, progress."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import sys
import time
from pathlib import Path

from ..core import results
from ..core.fmt import first_line, fmt_duration
from ..core.problem import FIELD_MAX, PRECISIONS, check_choice
from ..machine import devices
from ..measure import memory

EXIT_FAULT = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
#: What a shell reports for a process its pipe's reader left (128 + SIGPIPE).
EXIT_PIPE = 141
FORMATS = ("table", "csv", "json")


class UsageError(Exception):
    """Bad input: reported as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump), exit code 2."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


@contextlib.contextmanager
def usage_errors(prefix: str = ""):
    """A library's ValueError (its message is for the user) as a UsageError, its first line
    after `prefix`."""
    try:
        yield
    except ValueError as exc:
        raise UsageError(prefix + first_line(exc)) from None


def resolve_device(name: str | None) -> devices.Device:
    """The device of `--device` (None: `devices.default_device()`, the one default of every
    command), or a UsageError naming why it cannot run here."""
    with usage_errors("--device "):
        return devices.resolve(name)


# --- argument types -------------------------------------------------------------------------
def positive(kind):
    """A positive, finite number of `kind` (a count is also at most `FIELD_MAX`, the most a
    problem field holds): `nan`, `inf`, `0` and `-1` are refused where they are parsed."""
    def parse(text: str):
        try:
            v = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive number") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if v <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not positive")
        if kind is int and v > FIELD_MAX:
            raise argparse.ArgumentTypeError(f"{text!r} is larger than {FIELD_MAX}")
        return v

    return parse


def seed(text: str) -> int:
    """A random seed: a whole number from 0 to 2**32 - 1 (what NumPy's generators take)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= v < 2 ** 32:
        raise argparse.ArgumentTypeError(f"{text!r} is not a seed from 0 to {2 ** 32 - 1}")
    return v


def counts(what: str):
    """An argparse type: a comma list of distinct positive counts of `what` (batch sizes, world
    sizes), smallest first, each at most `FIELD_MAX`."""
    def parse(text: str) -> list[int]:
        try:
            out = sorted({int(t) for t in text.split(",") if t.strip()})
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of {what}") from None
        if not out or out[0] <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of positive {what}")
        if out[-1] > FIELD_MAX:
            raise argparse.ArgumentTypeError(f"{out[-1]} is larger than {FIELD_MAX}")
        return out

    return parse


#: `1,2,4,8` -> the distinct positive batch sizes, smallest first.
batches = counts("batch sizes")


def size(text: str) -> int:
    try:
        return memory.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def choices(text: str, kind: str, valid: tuple[str, ...]) -> list[str]:
    """A comma list, each item one of `valid` (`all` for every one); ValueError otherwise."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if items == ["all"]:
        return list(valid)
    if not items:
        raise ValueError(f"no {kind} given; valid: {', '.join(valid)}")
    return [check_choice(kind, t, valid) for t in dict.fromkeys(items)]


# --- options declared once ------------------------------------------------------------------
#: The two meanings `--budget` once had: seconds (layer, bench, sweep, tune, train-step,
#: gpu-check) and bytes (memplan, memprofile). Each has its own name now; `--budget` is still
#: read, unlisted, where it meant one of them.
def time_budget_option(p, help: str, default: float | None = None,
                       old_spelling: bool = True) -> None:
    """--time-budget S (dest `time_budget`): seconds of timing; with `old_spelling`, also the
    unlisted --budget it was called before."""
    p.add_argument("--time-budget", type=positive(float), default=default, metavar="S",
                   help=help)
    if old_spelling:
        p.add_argument("--budget", type=positive(float), dest="time_budget",
                       default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def precision_list(text: str) -> tuple[str, ...]:
    """`--precisions`: a comma list of `PRECISIONS` (`all`: every one), checked where it is
    parsed, so a wrong one is one line and exit 2 before anything runs."""
    try:
        return tuple(choices(text, "precision", PRECISIONS))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def precisions_option(p, help: str, default: tuple[str, ...] | None = None) -> None:
    """--precisions LIST (dest `precisions`, a tuple): the precisions a GPU command measures,
    one spelling for every one of them; also the unlisted --precision it was called before."""
    p.add_argument("--precisions", type=precision_list, default=default, metavar="LIST",
                   help=help)
    p.add_argument("--precision", type=precision_list, dest="precisions",
                   default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def step_budget_option(p, what: str = "each comparison") -> None:
    """--step-budget S (dest `step_budget`): seconds of timed steps per side of `what`, the
    whole-step comparisons that confirm a plan (`planning.confirm`); one spelling and default
    for every command that tunes."""
    from ..planning import confirm

    p.add_argument("--step-budget", type=positive(float), default=confirm.STEP_BUDGET_S,
                   metavar="S", help=f"seconds of timed steps per side of {what} "
                                     "(default %(default)s)")


def memory_budget_option(p, help: str) -> None:
    """--memory-budget SIZE (dest `memory_budget`): bytes, or 512MiB, 2GiB; also the unlisted
    --budget it was called before."""
    p.add_argument("--memory-budget", type=size, metavar="SIZE", help=help)
    p.add_argument("--budget", type=size, dest="memory_budget", default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)


def workspace_budget_option(p, help: str = "most workspace a pass may use: bytes, or "
                            "256MiB, 1GiB, 2GB", default: int | None = None) -> None:
    """--workspace-budget SIZE: the most workspace a planned pass may use."""
    p.add_argument("--workspace-budget", type=size, default=default, metavar="SIZE", help=help)


def device_option(p, help: str = "default cuda where a GPU is, else cpu",
                  choices: tuple[str, ...] = ("cpu", "cuda")) -> None:
    """--device: where the work runs (`devices.DEVICES` names them)."""
    p.add_argument("--device", choices=choices, help=help)


def model_options(p, model_help: str, input_help: str, required: bool = False) -> None:
    """--model MODULE:CALLABLE and --input N,C,H,W: a user's own network and its input."""
    p.add_argument("--model", required=required, metavar="MODULE:CALLABLE", help=model_help)
    p.add_argument("--input", required=required, metavar="N,C,H,W", help=input_help)


def study_output_options(p, study: str, extras: str, csv_says: str = "",
                         always: bool = False) -> None:
    """--out and --format of a training-step study: its folder, written one way
    (`studies.folder`: report.md, `<study>.csv`, env.json, then the study's own `extras`);
    `always`: written to a folder under my-runs/ when --out is not given."""
    p.add_argument("--out", help=f"folder for report.md, {study}.csv"
                   + (f" ({csv_says})" if csv_says else "") + f", env.json, {extras}"
                   + (f" (default my-runs/<date>-<device>-<net>-{study})" if always else ""))
    p.add_argument("--format", choices=FORMATS, default="table")


def step_options(p, net_help: str | None = None, net_default: str | None = "alexnet") -> None:
    """--net and --device of the commands that run a training step (train-step, memprofile,
    memplan): the workload's nets, on the CPU or a GPU."""
    from ..studies.workload import NETS

    p.add_argument("--net", default=net_default, choices=NETS, help=net_help)
    device_option(p)


def tie_options(p) -> None:
    """--tie-break and --include-busy of the commands that choose (advise, tune)."""
    from ..planning.plan import TIE_BREAKS

    p.add_argument("--tie-break", choices=TIE_BREAKS, default="workspace",
                   help="among candidates whose times are a tie within noise with the fastest, "
                        "prefer the least workspace (default), the lowest median (time) or the "
                        "smallest error against float64 (error)")
    p.add_argument("--include-busy", action="store_true",
                   help="also choose among times measured on a busy machine (contended CPU "
                        "cores, throttled GPU clocks), left out by default")


# --- output ---------------------------------------------------------------------------------
def emit(df, fmt: str, table_text: str, json_data=None) -> None:
    """The results as the table given, or as CSV rows, or as JSON: `json_data` where given
    (a study's rows with their raw times), else the rows of `df`."""
    print({"table": lambda: table_text,
           "csv": lambda: results.to_csv(df).rstrip("\n"),
           "json": lambda: (results.to_json(df) if json_data is None
                            else json.dumps(json_data, indent=1))}[fmt]())


def command_line(args) -> str:
    """The command as it was typed (env.json's "run"), for a study's folder."""
    return " ".join(["convbench", *getattr(args, "argv", [])])


def percent(text: str) -> float:
    """An argparse type: a percentage (`2`, `2%`, `0.5`) as a fraction, above 0 and below 100."""
    value = text.strip().removesuffix("%")
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage such as 2 or 0.5%") \
            from None
    if not math.isfinite(v) or not 0 < v < 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage between 0 and 100")
    return v / 100


def summary_line(outcome) -> str:
    """One line for the end of a run, benchdnn-style: what was measured and how it went, with
    the rows whose numbers may be wrong counted (this run's rows, not a resumed run's older)."""
    rows = outcome.rows
    status = {s: sum(r["status"] == s for r in rows) for s in results.STATUSES}
    ok = [r for r in rows if r["status"] in results.TIMED]
    flags = {"noisy": sum(bool(r.get("noisy")) for r in ok),
             "contended": sum(bool(r.get("contended")) for r in ok),
             "throttled": sum(bool(r.get("throttled")) for r in ok),
             "host-bound": sum(bool(r.get("host_bound")) for r in ok)}
    line = (f"convbench: {len(rows)} cases in {fmt_duration(outcome.seconds)}: "
            + ", ".join(f"{n} {s}" for s, n in status.items())
            + "; " + ", ".join(f"{n} {f}" for f, n in flags.items()))
    if outcome.skipped:
        line += f"; {outcome.skipped} not tried (their series ran out of memory)"
    return line


def busy_warning(outcome, folder: Path | None = None) -> str | None:
    """The warning a run ends on when some of its times were taken on a busy machine, with the
    command that measures them again in `folder` (a new run without one)."""
    ok = [r for r in outcome.rows if r["status"] in results.TIMED]
    contended = sum(bool(r.get("contended")) for r in ok)
    throttled = sum(bool(r.get("throttled")) for r in ok)
    if not contended and not throttled:
        return None
    what = " and ".join(
        text for n, text in ((contended, (f"{contended} while other processes or virtual machines "
                                          "held the cores their threads needed (contended)")),
                             (throttled, (f"{throttled} while the GPU's clocks were held down "
                                         "(throttled)"))) if n)
    again = (f"--resume --out {folder} --remeasure busy" if folder is not None
             else "a new run")
    return (f"convbench: warning: of {len(ok)} times, {what}: they may be wrong, advice leaves "
            f"them out; the report lists them; measure them again on a quiet machine ({again})")


def finish(outcome, folder: Path | None, quiet: bool = False) -> int:
    """The lines a measuring command ends on (stderr, after its output): what was not tried,
    where the rows are, the summary, a warning if the machine was busy; then 0, or after a GPU
    fault one line naming the case and 1, or after Ctrl-C a line saying what was kept and how to
    finish, and 130."""
    err = sys.stderr
    if folder is not None:
        print(f"convbench: {len(outcome.frame)} rows in {folder}", file=err)
    print(summary_line(outcome), file=err)
    warning = busy_warning(outcome, folder)
    where = f"; finish with --resume --out {folder}" if folder else ""
    if outcome.fault:
        if warning:
            print(warning, file=err)
        print(f"convbench: error: {outcome.fault}; the GPU is unusable in this process, the "
              f"rows measured so far are kept{where.replace('finish', 'continue after it')}",
              file=err)
        return EXIT_FAULT
    if outcome.interrupted:
        if warning:
            print(warning, file=err)
        print(f"convbench: interrupted; the rows measured so far are kept{where}", file=err)
        return EXIT_INTERRUPTED
    if warning:
        print(warning, file=err)
    return 0


class Progress:
    """Progress on stderr as cases finish: on a terminal one line, redrawn; elsewhere (a pipe,
    a CI log) one line per finished case; nothing when `quiet`."""

    def __init__(self, total: int, stream=None, quiet: bool = False):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.enabled = not quiet and total > 0
        self.total, self.done, self.start = total, 0, time.monotonic()

    def __call__(self, row: dict) -> None:
        self.done += 1
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        status = row["status"]
        if status in results.TIMED and row.get("median_ms") is not None:
            marks = [m for m, on in (("noisy", row.get("noisy")), ("contended",
                     row.get("contended")), ("throttled", row.get("throttled"))) if on]
            status = (f"{row['median_ms']:.4g} ms" + (f" ({', '.join(marks)})" if marks else "")
                      + (f" (inexact: {row['reason']})" if status == "inexact" else ""))
        line = (f"[{self.done}/{self.total}] {row['layer']} {row['pass']} {row['layout']} "
                f"{row['algo']}: {status}  elapsed {fmt_duration(elapsed)}, eta {fmt_duration(eta)}")
        if self.tty:
            width = shutil.get_terminal_size().columns - 1
            self.stream.write("\r" + line[:width].ljust(width))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty and self.done:
            self.stream.write("\n")
            self.stream.flush()
