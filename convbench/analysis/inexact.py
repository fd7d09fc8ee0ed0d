"""An `inexact` row as the analysis shows it: its mark and its sentence.

A library's result beyond its tolerance is timed and kept (`verify.verdict`): it is what torch
runs, so it stays the baseline (regret, speed-ups, torch's side of every comparison) while no
winner or plan choice is taken from it. Wherever its time is shown it carries `INEXACT`, and
the report and the advice say its error in a sentence (`sentence`), a finding for its users.
"""

from __future__ import annotations

from ..algos import registry

#: Prefix of an `inexact` row's time.
INEXACT = "†"


def whose(algo: str) -> str:
    """Who computes with `algo`, for a sentence: torch's default or its `cudnn.benchmark` pick
    (origin `torch`, `torch_benchmark` in its traits), else the algorithm by name."""
    a = registry.algorithm(algo)
    if a.origin != "torch":
        return f"`{algo}`"
    return f"torch's {'cudnn.benchmark pick' if a.torch_benchmark else 'default'} (`{algo}`)"


def sentence(r) -> str:
    """An `inexact` row (a record) in a sentence: who computes which pass with what relative
    error, against what tolerance."""
    return (f"{whose(r['algo'])} computes {r['layer']} {r['pass']} ({r['layout']}, "
            f"{r['precision']}) with {100 * r['rel_error']:.2g}% relative error; its tolerance "
            f"is {100 * r['tolerance']:.2g}%")
