"""How a time reads in the report's tables and plots: the marks a time carries and the orders
every table shares.

A time that may be wrong is never shown bare: it carries its mark (`~` noisy, `!` host-bound,
`#` busy machine), so a reader does not take it for a result, and so does the time of a result
that was not right (`†`: `inexact`, a library's result beyond its tolerance); the fastest of a
column is marked `*` where it wins beyond noise and `=` where it ties (`ranking`'s rule: the
interval of its ratio to the runner-up excludes 1), as PyTorch's `Compare` marks the best.
Algorithms come in the registry's order and everything else as measured, so every table and
plot reads alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from ...algos import registry
from ...core.measurement import is_host_bound
from .. import ranking
from ..inexact import INEXACT

#: Suffix of a column's fastest time where it wins beyond noise, and of every time tied with
#: the fastest where it does not.
BEST, TIED = " *", " ="
#: Prefix of a noisy measurement's time (IQR/median above the threshold).
NOISY = "~"
#: Prefix of a GPU time the host may have set (`measurement.is_host_bound`).
HOST_BOUND = "!"
#: Prefix of a time measured on a busy machine (contended cores, throttled GPU clocks).
BUSY = "#"


def order(values, reference: Sequence[str] = ()) -> list[str]:
    """Distinct values: those in `reference` in its order, then the rest as first seen."""
    seen = list(dict.fromkeys(values))
    return [v for v in reference if v in seen] + [v for v in seen if v not in reference]


def algo_order(df: pd.DataFrame) -> list[str]:
    return order(df["algo"], registry.names())


def layer_order(df: pd.DataFrame) -> list[str]:
    return order(df["layer"])


def flag(v) -> bool:
    """A boolean cell that may be missing (None/NaN) as a plain bool."""
    return bool(pd.notna(v) and v)


def host_bound(r) -> bool:
    """Whether a row's GPU may have waited for its host: its own flag, or for rows from before
    it, the host took a sizeable share of the device's time to issue the pass."""
    if pd.notna(r.get("host_bound")):
        return bool(r["host_bound"])
    return is_host_bound(None if pd.isna(r["host_ms"]) else r["host_ms"], r["median_ms"])


def marks(r) -> str:
    """The prefix marks of a row's time: inexact, noisy, host-bound, busy machine."""
    return ((INEXACT if r.get("status") == "inexact" else "")
            + (NOISY if flag(r["noisy"]) else "") + (HOST_BOUND if host_bound(r) else "")
            + (BUSY if ranking.busy(r) else ""))


def algo_major(df: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by algorithm (in `registry.names` order), otherwise as they were."""
    rank = {a: i for i, a in enumerate(algo_order(df))}
    return df.sort_values("algo", key=lambda col: col.map(rank), kind="stable")
