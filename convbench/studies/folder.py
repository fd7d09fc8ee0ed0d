"""Every study writes its folder one way (docs/pages/design.md §7): report.md (the markdown it
printed), `<study>.csv` (its main table, one row per measurement), env.json (the machine, and under
"run" how the study was asked for), then the study's own extra files and its plots; plots are
skipped, with the report saying so, where matplotlib is missing.

env.json says the folder's `SCHEMA` (a study folder's own version, apart from a run folder's),
which `read_study` checks as `results.schema_of` checks a run folder's: none is version 0 (a
folder from before versions, read as it is), a newer one is refused in one line."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import pandas as pd

from ..core import results
from ..core.fmt import pyplot

#: The version of what a study folder holds: env.json's layout and `<study>.csv`'s columns.
#: A change to either bumps it.
SCHEMA = 1

#: A file beside the three every folder has: its name -> what writes it there (given the path).
Writers = Mapping[str, Callable[[Path], None]]


def write_study(folder: str | Path, study: str, text: str, frame: pd.DataFrame, env: dict,
                extra: Writers | None = None, plots: Writers | None = None) -> list[str]:
    """report.md, `<study>.csv`, env.json, each `extra` file and (with matplotlib) each plot
    in `folder`; the names written, in that order."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / results.REPORT_MD).write_text(text if text.endswith("\n") else text + "\n")
    (folder / f"{study}.csv").write_text(results.to_csv(frame))
    (folder / results.ENV_JSON).write_text(json.dumps({"schema": SCHEMA, **env}, indent=1)
                                           + "\n")
    names = [results.REPORT_MD, f"{study}.csv", results.ENV_JSON]
    drawn = (plots or {}) if pyplot() is not None else {}
    for name, write in {**(extra or {}), **drawn}.items():
        write(folder / name)
        names.append(name)
    return names


def read_study(folder: str | Path, study: str) -> tuple[pd.DataFrame, dict]:
    """A study folder's main table (`<study>.csv`) and env.json, its schema checked
    (`results.schema_of` against this `SCHEMA`); ValueError in one line where the folder holds
    no such study or a newer convbench wrote it."""
    folder = Path(folder)
    csv_path, env_path = folder / f"{study}.csv", folder / results.ENV_JSON
    if not csv_path.is_file() or not env_path.is_file():
        raise ValueError(f"{folder} is not a {study} folder: it has no {csv_path.name} or "
                         f"{results.ENV_JSON}")
    env = json.loads(env_path.read_text())
    if not isinstance(env, dict):
        raise ValueError(f"{env_path} is not a convbench env.json")
    results.schema_of(env, env_path, SCHEMA)
    return pd.read_csv(csv_path), env
