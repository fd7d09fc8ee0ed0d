"""The results row and its forms: columns and types, CSV on disk, a run folder read back.

One row is one measurement (docs/pages/design.md §3): the key that identifies it (layer, problem,
algo, backend, pass, layout, precision), its status and reason, the times and what was derived from
them, accuracy, memory and notes: a `Row`, whose columns and types are declared once, here.
Everything that writes or reads rows goes through here: the runner makes `Row`s (`new_row`); `CsvSink` appends them to measurements.csv one at a time, so an interrupted
run keeps every row it measured; `read_rows` and `load_run` read a run back; `frame` types a table
of rows (from the runner or read back as strings) as a DataFrame, which report, advice and sweeps
read; `to_records`/`to_json` are its JSON form, and `entry_from_row` / `row_from_entry` the compact
form a plan stores its measurements in.

A run folder holds measurements.csv, env.json (the machine and how the run was asked for) and
the report rendered from them. env.json says the folder's `SCHEMA`, which every reader checks
(`schema_of`: none is version 0, read as it is; a newer one is refused). `RunFolder.open`
prepares one for a run: it refuses to mix new rows into a finished run unless resuming, refuses
a file written with other columns or a newer schema, and keeps a resumed run's first env.json.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NewType, TypedDict

import pandas as pd

from .fmt import first_line
from .measurement import Measurement
from .problem import AXIS_FIELDS, ConvProblem, axis_pair, pair_text

PROBLEM_FIELDS = tuple(f.name for f in dataclasses.fields(ConvProblem))
#: The version of what a run folder holds: env.json's layout (its `run` a `RunSpec`) and
#: measurements.csv's columns (`Row`). env.json says it (`schema`); every reader checks it
#: (`schema_of`): a folder without one is version 0 (before run specs; its file may lack later
#: columns, which read as empty), a newer one is refused. A change to either bumps it.
SCHEMA = 2

#: A text column: empty, not missing, where it does not apply.
Text = NewType("Text", str)
#: A per-axis column (stride, pad, dilation): an integer where the axes agree, else `HxW` text.
Axis = int | str
#: A flag: True, False, or missing where it does not apply (a row not timed, a file before it).
Flag = bool | None

#: One row of results: every column and its type, in the CSV's order (design §3's columns
#: first, then what the reports and compare use). `rows.row` builds one; the CSV's header,
#: and how `frame` types each column, come from here. Numbers are None where they do not apply.
Row = TypedDict("Row", {
    "layer": str, **{f: Axis if f in AXIS_FIELDS else int for f in PROBLEM_FIELDS},
    "algo": str, "backend": str, "pass": str, "layout": str, "precision": str,
    "status": str, "reason": Text, "median_ms": float, "iqr_ms": float, "reps": int,
    "gflops": float, "rel_error": float, "workspace_bytes": int, "peak_bytes": int,
    "memory_method": Text, "net": str, "min_ms": float, "noisy": Flag, "times_ms": Text,
    "phases_ms": Text, "algo_ops": int, "max_abs_error": float, "tolerance": float,
    "note": Text, "host_ms": float, "ci_low_ms": float, "ci_high_ms": float, "stop": Text,
    "round_group": Text, "cpu_ms": float, "cpu_share": float, "contended": Flag,
    "throttled": Text, "host_bound": Flag, "stolen": float, "tensor_cores": Flag,
    "kernels": Text})

#: A row as measurements.csv holds it, read back (`read_rows`): every column as text, the
#: empty string where the row holds None; `frame` types it as `Row` says.
TextRow = dict[str, str]

_TYPES: dict[str, object] = Row.__annotations__
#: The results table's columns, in order.
COLUMNS = tuple(_TYPES)
#: What identifies a row: a second row with the same key is the same measurement.
KEY = ("layer", *PROBLEM_FIELDS, "algo", "backend", "pass", "layout", "precision")
#: A row's status (docs/pages/design.md §2). `inexact`: a library's result (torch's pick, one of
#: cuDNN's algorithms) beyond its tolerance, timed all the same: it is what users run, so it stays
#: the baseline it is, its error said; ours beyond theirs are `failed` and never timed.
STATUSES = ("ok", "inexact", "unsupported", "failed", "oom")
#: The statuses whose row holds a time: where a baseline may come from. A winner, a choice or a
#: "fastest verified" comes from `ok` rows alone.
TIMED = ("ok", "inexact")
#: The columns of each kind, from `Row`.
INTEGER = tuple(c for c, t in _TYPES.items() if t is int)
NUMERIC = tuple(c for c, t in _TYPES.items() if t in (int, float))
TEXT = tuple(c for c, t in _TYPES.items() if t is Text)
FLAGS = tuple(c for c, t in _TYPES.items() if t == Flag)


def new_row(**cells) -> Row:
    """A row with every column, None where `cells` gives none; ValueError for a cell that is no
    column (a misspelt one would otherwise be dropped by the CSV writer, or refuse it)."""
    unknown = set(cells) - set(COLUMNS)
    if unknown:
        raise ValueError(f"no results column {', '.join(sorted(unknown))}")
    row: Row = dict.fromkeys(COLUMNS)  # type: ignore[assignment]
    row.update(cells)  # type: ignore[typeddict-item]
    return row


RESULTS_CSV = "measurements.csv"
ENV_JSON = "env.json"
#: What people read in a run or study folder, rendered from the other two (`analysis.report`).
REPORT_MD = "report.md"
#: A rank's rows in a sharded run (`convbench.runs.shard`), until they are merged into RESULTS_CSV.
PARTIAL_CSV = ".rank{rank}.csv"

#: Separators of the `phases_ms` cell: phase names hold spaces but neither of these.
_PHASE_SEP, _PHASE_VALUE = ";", "="


# --- cells ----------------------------------------------------------------------------------
def phases_text(phases: dict[str, Measurement]) -> str:
    """Per-phase median ms as one CSV cell, in execution order:
    ``transform x=0.12;transform w=0.05;product=0.4;inverse y=0.1``."""
    return _PHASE_SEP.join(f"{name}{_PHASE_VALUE}{m.median:.6g}" for name, m in phases.items())


def parse_phases(text: str | None) -> dict[str, float]:
    """A `phases_ms` cell back as {phase: median ms}, in order; {} for an empty or missing cell
    (a pass without phases, or not measured)."""
    if not isinstance(text, str) or not text:
        return {}
    pairs = (item.rpartition(_PHASE_VALUE) for item in text.split(_PHASE_SEP))
    return {name: float(ms) for name, _, ms in pairs}


def problem_from_row(row) -> ConvProblem:
    """The problem of a row (a dict, a record or a DataFrame row; numbers or CSV strings)."""
    return ConvProblem(**{f: _axis_cell(f, row[f]) if f in AXIS_FIELDS else int(row[f])
                          for f in PROBLEM_FIELDS})


def _axis_cell(field: str, v):
    """A stride, pad or dilation cell (2, "2", "2.0" or "2x1") in its one form."""
    if isinstance(v, float) or (isinstance(v, str) and "." in v):
        v = int(float(v))
    return axis_pair(field, v)


def row_key(row) -> tuple[str, ...]:
    """A row's key as the CSV spells it (strings), whether the row came from the runner or was
    read back from a file: comparable with `runner.Case.key()`."""
    return tuple(str(row[c]) for c in KEY)


# --- measurements.csv -----------------------------------------------------------------------
def _drop_partial_line(path: Path) -> None:
    """Cut a last line that a crash left half written, so appending starts on a fresh line."""
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def read_rows(path: str | os.PathLike) -> list[TextRow]:
    """The complete rows of a results CSV (a half-written last line is left out)."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path, newline="") as f:
        text = f.read()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    return list(csv.DictReader(text.splitlines()))


class CsvSink:
    """measurements.csv, appended to one row at a time. The file is opened and closed for each
    row, so a row is on disk the moment it is appended, whatever happens next. A file whose
    header is not `COLUMNS` (written by another convbench version) is refused, not appended
    to under the wrong header."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            _drop_partial_line(self.path)
        if not self.path.exists() or self.path.stat().st_size == 0:
            self._write(None)
            return
        with open(self.path, newline="") as f:
            header = next(csv.reader(f), [])
        if header != list(COLUMNS):
            raise ValueError(f"{self.path} has other columns than this convbench writes "
                             "(another version wrote it); start a new run folder")

    def _write(self, r: dict | None) -> None:
        with open(self.path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            if r is None:
                writer.writeheader()
            else:
                writer.writerow(r)

    def append(self, r: Row | TextRow) -> None:
        self._write(r)


# --- a sharded run's partial files -------------------------------------------------------------
def partial_csv(folder: str | Path, rank: int) -> Path:
    """Where rank `rank` of a sharded run appends its rows."""
    return Path(folder) / PARTIAL_CSV.format(rank=rank)


def partial_files(folder: str | Path) -> list[Path]:
    """The partial files in `folder` (every rank's this process can see)."""
    folder = Path(folder)
    return sorted(folder.glob(PARTIAL_CSV.format(rank="*"))) if folder.is_dir() else []


def partial_rows(folder: str | Path) -> list[TextRow]:
    """Every complete row of the partial files in `folder`."""
    return [r for path in partial_files(folder) for r in read_rows(path)]


def drop_partials(folder: str | Path) -> None:
    """Delete the partial files in `folder` (once their rows are in measurements.csv)."""
    for path in partial_files(folder):
        path.unlink(missing_ok=True)


def merge_rows(folder: str | Path, rows: Sequence[Row | TextRow] = (),
               order: Sequence[tuple[str, ...]] = ()) -> None:
    """Fold the partial files of `folder`, and `rows`, into its measurements.csv: one row per
    key (the first seen: the file's, then the partials', then `rows`), the keys of `order`
    first in its order, then the rest as seen; the file replaced whole, then the partials
    deleted. Nothing to fold, nothing done. ValueError for a measurements.csv with other
    columns (`CsvSink`)."""
    folder = Path(folder)
    extra = partial_rows(folder) + list(rows)
    if not extra:
        return
    path = folder / RESULTS_CSV
    CsvSink(path)  # refuses a file with other columns
    merged: dict[tuple[str, ...], dict] = {}
    for r in read_rows(path) + extra:
        merged.setdefault(row_key(r), r)
    rank = {key: i for i, key in enumerate(order)}
    keys = sorted(merged, key=lambda k: rank.get(k, len(rank)))  # stable: the rest as seen
    _rewrite(path, [merged[k] for k in keys])
    drop_partials(folder)


def _rewrite(path: Path, rows: Sequence[Row | TextRow]) -> None:
    """Replace the results CSV at `path` by `rows`, whole, through a temporary file: a reader,
    or a run cut short, sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{RESULTS_CSV}.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def replace_row(path: str | os.PathLike, row: Row) -> None:
    """Put `row` in the place of the row with its key in the results CSV at `path` (appended
    where none has it). A measurement taken again replaces the old one this way, not beside
    it: the file keeps one row per key for every reader, and the old row goes in the same
    atomic step that writes the new one, so an interrupted remeasure loses neither."""
    path = Path(path)
    rows = read_rows(path)
    key = row_key(row)
    at = next((i for i, r in enumerate(rows) if row_key(r) == key), len(rows))
    _rewrite(path, [*rows[:at], row, *rows[at + 1:]])


# --- the DataFrame and JSON forms -----------------------------------------------------------
def frame(rows: Sequence[Row | TextRow]) -> pd.DataFrame:
    """Rows (`Row`s from the runner, or strings from the CSV) as a typed results DataFrame,
    each column as `Row` types it. A column the rows lack (a file from before it existed) is
    empty, as in a row it does not apply to."""
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    for col, kind in _TYPES.items():
        if kind in (int, float):
            df[col] = pd.to_numeric(df[col], errors="coerce")
        elif kind == Axis:
            df[col] = [_cell_form(col, v) for v in df[col]]
        elif kind == Flag:
            df[col] = df[col].map({True: True, False: False, "True": True, "False": False})
        elif kind is Text:
            df[col] = df[col].astype(object).fillna("")
    return df


def _cell_form(field: str, v):
    """A per-axis cell as a table holds it: an int, or `HxW` text where the axes differ;
    a missing one stays missing."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return v
    value = _axis_cell(field, v)
    return pair_text(value) if isinstance(value, tuple) else value


def to_csv(df: pd.DataFrame) -> str:
    return df.to_csv(index=False)


def to_records(df: pd.DataFrame) -> list[dict]:
    """Rows as JSON-ready dicts: NaN and inf as None, the raw times as a list of floats, the
    phases as {phase: median ms} (in order)."""
    def clean(k, v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return int(v) if k in INTEGER and v is not None else v

    records = []
    for r in df.astype(object).to_dict("records"):
        r = {k: clean(k, v) for k, v in r.items()}
        if "times_ms" in r:
            r["times_ms"] = [float(t) for t in (r["times_ms"] or "").split()]
        if "phases_ms" in r:
            r["phases_ms"] = parse_phases(r["phases_ms"]) or None
        records.append(r)
    return records


def to_json(df: pd.DataFrame) -> str:
    return json.dumps(to_records(df), indent=1)


# --- a plan's measurement entries -----------------------------------------------------------
#: The numbers an entry keeps (None where the row has none, or not a finite one).
ENTRY_NUMBERS = ("median_ms", "iqr_ms", "rel_error", "tolerance")
#: The texts an entry keeps ("" where the row has none): the rounds it was timed in (entries
#: with the same id pair up round by round), why the GPU was throttled while it was, and the
#: row's note (for a cuDNN algorithm what its find reported, which a plan's pin records).
ENTRY_TEXTS = ("round_group", "throttled", "note")


def _finite(v) -> float | None:
    """A number cell as a float, or None where it is missing, NaN or infinite (JSON has no
    NaN; an infinite error is a failed row, which its status already says)."""
    if v is None or isinstance(v, str):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def entry_from_row(row: dict) -> dict:
    """A results row (runner or DataFrame record) as a plan's measurement entry: what choosing
    among measurements needs, keyed by problem and pass rather than by layer."""
    times = row.get("times_ms") or ""
    workspace = _finite(row.get("workspace_bytes"))
    return {"problem": problem_from_row(row),
            "pass": row["pass"], "algo": row["algo"], "backend": row["backend"],
            "layout": row["layout"], "status": row["status"], "reason": row.get("reason") or "",
            **{k: _finite(row.get(k)) for k in ENTRY_NUMBERS},
            "workspace_bytes": None if workspace is None else int(workspace),
            "times_ms": [float(t) for t in times.split()] if isinstance(times, str) else
            [float(t) for t in times],
            **{k: row.get(k) if isinstance(row.get(k), str) else "" for k in ENTRY_TEXTS},
            "contended": row.get("contended") in (True, "True")}


def row_from_entry(entry: dict, layer: str, net: str, precision: str) -> dict:
    """A measurement entry as a results row of `layer` (the columns it has; `frame` fills in
    the rest)."""
    out = {"layer": layer, "net": net, "precision": precision,
           **entry["problem"].axis_fields(),
           **{k: v for k, v in entry.items() if k not in ("problem", "times_ms")}}
    out["times_ms"] = " ".join(f"{t:.6g}" for t in entry["times_ms"])
    return out


# --- run folders ----------------------------------------------------------------------------
def resumable_env(folder: str | Path) -> dict:
    """The env.json of a run folder to resume: ValueError, naming what is missing, where there
    is no run to resume (no folder, no env.json, one that cannot be read as JSON). Resuming
    such a folder would start a whole run of default options, or mix them with its rows."""
    folder = Path(folder)
    env_path = folder / ENV_JSON
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise ValueError(f"{folder} {what}: there is no run to resume; start one without "
                         "--resume")
    if not env_path.is_file():
        raise ValueError(f"{folder} has no {ENV_JSON}, so the options of its run are unknown: "
                         "nothing to resume; start another run folder")
    try:
        env = json.loads(env_path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{env_path} cannot be read ({first_line(exc)}): the options of its "
                         "run are unknown; start another run folder") from None
    if not isinstance(env, dict):
        raise ValueError(f"{env_path} is not a convbench env.json; start another run folder")
    return env


def schema_of(env: dict, where: str | Path, newest: int = SCHEMA) -> int:
    """The schema version of a folder's env.json (a run folder's: `SCHEMA`; a study's: its own
    `newest`): 0 where it says none (a folder from before versions, read as it is); ValueError
    in one line, naming `where`, for a version newer than this convbench reads, or one that is
    no version."""
    version = env.get("schema", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise ValueError(f"{where} has schema {version!r}, which is no schema version; "
                         "it was not written by convbench")
    if version > newest:
        raise ValueError(f"{where} has schema {version}, newer than this convbench reads "
                         f"(up to {newest}): upgrade convbench to read it")
    return version


def load_run(folder: str | Path) -> tuple[pd.DataFrame, dict]:
    """A run folder's results and environment; ValueError if it holds no results, or if a
    newer convbench wrote it (`schema_of`). A folder of an older schema is read as it is: the
    columns its file lacks are empty (`frame`), the env.json keys it lacks absent."""
    folder = Path(folder)
    csv_path = folder / RESULTS_CSV
    if not csv_path.is_file():
        raise ValueError(f"{folder} is not a run folder: it has no {RESULTS_CSV}")
    env_path = folder / ENV_JSON
    env = json.loads(env_path.read_text()) if env_path.is_file() else {}
    if not isinstance(env, dict):
        raise ValueError(f"{env_path} is not a convbench env.json")
    schema_of(env, env_path)
    return frame(read_rows(csv_path)), env


class FolderInUse(ValueError):
    """A run folder that already holds results, opened without resuming."""


@dataclass
class RunFolder:
    """A run folder open for appending: the rows it held when opened (`measured`, what a
    resumed run skips), its environment, and where new rows go."""

    path: Path
    env: dict
    measured: list[TextRow]
    sink: CsvSink

    @classmethod
    def open(cls, path: str | Path, env: dict, resume: bool = False) -> RunFolder:
        """Prepare `path` for a run described by `env`: FolderInUse if it holds results and
        `resume` is off; ValueError if its measurements.csv has other columns or its env.json
        a newer schema (`schema_of`). A new run's env.json says this version's `SCHEMA`; a
        resumed run keeps the env.json of its first start (what the run was asked to be). Rows a sharded
        run left in partial files are merged in first, so they count as measured."""
        path = Path(path)
        merge_rows(path)
        measured = read_rows(path / RESULTS_CSV)
        if measured and not resume:
            raise FolderInUse(f"{path} already holds results")
        env_path = path / ENV_JSON
        stored = json.loads(env_path.read_text()) if resume and env_path.exists() else None
        if stored is not None:
            schema_of(stored, env_path)  # before a row is added to a folder it cannot read
        sink = CsvSink(path / RESULTS_CSV)
        if stored is None:  # a new run: this version's rows and env.json
            env = {"schema": SCHEMA, **env}
        else:
            load = env.get("load", [])
            env = stored
            env["load"] = env.get("load", []) + [{**r, "when": f"resumed {r['when']}"}
                                                 for r in load]
        folder = cls(path, env, measured, sink)
        folder.save_env()
        return folder

    def append(self, row: Row) -> None:
        self.sink.append(row)

    def replace(self, row: Row) -> None:
        """Put a case measured again in the place of its old row (`replace_row`)."""
        replace_row(self.sink.path, row)

    def save_env(self) -> None:
        """Write `env` to env.json (whole, through a temporary file: never half written)."""
        tmp = self.path / f".{ENV_JSON}.tmp"
        tmp.write_text(json.dumps(self.env, indent=1) + "\n")
        os.replace(tmp, self.path / ENV_JSON)
