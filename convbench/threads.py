"""Idle threads must sleep, not spin, when NumPy's BLAS and torch share the CPU cores.

The NumPy algorithms run on OpenBLAS's threads and `torch-cpu` on torch's OpenMP threads, on
the same cores; by default each pool's threads spin after their work (OpenBLAS's for up to 2^28
cycles), starving the other pool's next call. On 2 cores an AlexNet training step with a plan
took 390 ms instead of 245 ms this way, while torch alone lost 2% (231 vs 226 ms), and in a sweep
`torch-cpu` timed right after a NumPy algorithm measured 2-3x slow. Both variables are read when
the libraries load, so they are set before NumPy or torch is imported, and never overridden.

This module imports nothing heavy: `convbench.cli` calls `sleep_idle_threads()` first thing.
"""

from __future__ import annotations

import os

CPU_THREAD_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_THREAD_TIMEOUT": "4"}


def sleep_idle_threads() -> dict[str, str]:
    """Set `CPU_THREAD_ENV` where the environment does not say otherwise; returns what is set."""
    for key, value in CPU_THREAD_ENV.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in CPU_THREAD_ENV}
