"""Runs: a sweep of cases measured into a run folder (`run`: its cases from a `RunSpec`, its
folder, resuming it), the layers a spec names (`source`), a sweep sharded over torchrun's ranks
(`shard`), and the first GPU check (`gpucheck`). The package's face hands on `run`'s names."""

from .run import (
    FINDINGS,
    MY_RUNS,
    REMEASURE,
    Outcome,
    Run,
    cases,
    default_folder,
    environment,
    open_folder,
    resume,
    same_machine,
)

__all__ = ["FINDINGS", "MY_RUNS", "REMEASURE", "Outcome", "Run", "cases", "default_folder",
           "environment", "open_folder", "resume", "same_machine"]
