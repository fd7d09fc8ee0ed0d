"""Every study writes its folder one way (docs/pages/design.md §7): report.md (the markdown it
printed), `<study>.csv` (its main table, one row per measurement), env.json (the machine, and under
"run" how the study was asked for), then the study's own extra files and its plots; plots are
skipped, with the report saying so, where matplotlib is missing."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import pandas as pd

from ..core import results
from ..core.fmt import pyplot

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
    (folder / results.ENV_JSON).write_text(json.dumps(env, indent=1) + "\n")
    names = [results.REPORT_MD, f"{study}.csv", results.ENV_JSON]
    drawn = (plots or {}) if pyplot() is not None else {}
    for name, write in {**(extra or {}), **drawn}.items():
        write(folder / name)
        names.append(name)
    return names
