"""What every subcommand shares: one-line usage errors, argument types, output, progress."""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import sys
import time
from pathlib import Path

from .. import memory, results
from ..problem import FIELD_MAX, check_choice

EXIT_FAULT = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
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
        raise UsageError(prefix + str(exc).splitlines()[0]) from None


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


def step_options(p, net_help: str | None = None, net_default: str | None = "alexnet") -> None:
    """--net and --device of the commands that run a training step (train-step, memprofile,
    memplan): trainstep's nets, on the CPU or a GPU."""
    from .. import trainstep

    p.add_argument("--net", default=net_default, choices=trainstep.NETS, help=net_help)
    p.add_argument("--device", choices=("cpu", "cuda"),
                   help="default cuda where a GPU is, else cpu")


# --- output ---------------------------------------------------------------------------------
def emit(df, fmt: str, table_text: str) -> None:
    """The results as the table given, or as CSV or JSON rows."""
    print({"table": lambda: table_text, "csv": lambda: results.to_csv(df).rstrip("\n"),
           "json": lambda: results.to_json(df)}[fmt]())


def exit_code(outcome, folder: Path | None) -> int:
    """0; or after a GPU fault one line naming the case, and 1; or after Ctrl-C a line saying
    what was kept and how to finish, and 130."""
    where = f"; finish with --resume --out {folder}" if folder else ""
    if outcome.fault:
        print(f"convbench: error: {outcome.fault}; the GPU is unusable in this process, the "
              f"rows measured so far are kept{where.replace('finish', 'continue after it')}",
              file=sys.stderr)
        return EXIT_FAULT
    if not outcome.interrupted:
        return 0
    print(f"convbench: interrupted; the rows measured so far are kept{where}", file=sys.stderr)
    return EXIT_INTERRUPTED


class Progress:
    """A one-line progress bar on a terminal (stderr), silent when stderr is piped."""

    def __init__(self, total: int, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() and total > 0
        self.total, self.done, self.start = total, 0, time.monotonic()

    def __call__(self, row: dict) -> None:
        self.done += 1
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        line = (f"[{self.done}/{self.total}] {row['layer']} {row['pass']} {row['layout']} "
                f"{row['algo']}: {row['status']}  elapsed {_duration(elapsed)}, "
                f"eta {_duration(eta)}")
        width = shutil.get_terminal_size().columns - 1
        self.stream.write("\r" + line[:width].ljust(width))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.done:
            self.stream.write("\n")
            self.stream.flush()


def _duration(s: float) -> str:
    return f"{int(s // 60)}m{int(s % 60):02d}s"
