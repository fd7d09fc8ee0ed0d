"""Devices as users name them (`cpu`, `cuda`, `emu`): the backend each runs, and the defaults a
sweep uses there.

A device is where a sweep runs; a backend (`backends.BACKENDS`) is where an implementation runs.
They differ in one place: `cpu` runs the `numpy` backend. The defaults are the batch and the
timing budget per measurement a sweep takes when not told otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.problem import check_choice
from . import backends


@dataclass(frozen=True)
class Device:
    """A device: its backend, and the defaults `convbench bench` uses there."""

    name: str
    backend: str
    batch: int | None  # None: the catalog's own batch (the study's 256 for alexnet)
    budget_s: float  # seconds of timed repetitions per measurement


DEVICES = {
    # Batch 8: small enough that the AlexNet sweep (5 layers, every algo, 3 passes, 2 layouts)
    # ends in minutes on 2 cores (what a committed run took: docs/pages/commands.md); 0.5 s
    # per measurement, each also getting at least `timing.MIN_REPS` repetitions.
    "cpu": Device("cpu", "numpy", 8, 0.5),
    "cuda": Device("cuda", "cuda", None, 0.1),  # do_bench's 100 ms of repetitions
    "emu": Device("emu", "emu", 1, 0.05),  # emulated kernels are slow: tiny problems only
}


def default_device() -> str:
    """`cuda` where a GPU and CuPy are here, else `cpu`."""
    return "cuda" if backends.available("cuda") is None else "cpu"


def here() -> list[str]:
    """The devices this machine can run."""
    return [name for name, d in DEVICES.items() if backends.available(d.backend) is None]


def resolve(name: str | None) -> Device:
    """The device `name` (None: the default here); ValueError naming why it cannot run here
    and which can."""
    device = DEVICES[check_choice("device", name or default_device(), tuple(DEVICES))]
    reason = backends.available(device.backend)
    if reason:
        raise ValueError(f"{device.name}: {reason}; valid here: {', '.join(here())}")
    return device


def backend_of(torch_device: str) -> str:
    """The backend that runs on a torch device (`cpu`, `cuda`, `cuda:1`; `meta` counts as the
    host)."""
    return "cuda" if torch_device.startswith("cuda") else "numpy"


def of_backend(backend: str) -> Device:
    """The device that runs `backend`."""
    return next(d for d in DEVICES.values() if d.backend == backend)
