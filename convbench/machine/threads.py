"""One thread policy for every algorithm: how many threads, and idle ones sleep, not spin (after
a short spin that bridges one call to the next).

**How many.** A run uses `count()` threads in every library it times: NumPy's BLAS and OpenMP
(through threadpoolctl), torch's intra-op pool, and the FFT's own workers. `use(n)` sets it
(`--threads N`); the default is the cores this process may run on (`os.sched_getaffinity`), not
the machine's count, so a process pinned to one core does not start two threads that wait on
each other. Algorithms read `count()` when they run, never a count frozen at import.

**Idle threads sleep, but not at once.** OpenBLAS's pool (the NumPy algorithms) and torch's
OpenMP pool (`torch-cpu`) share the cores, and by default each spins after its work (OpenBLAS's
for up to 2^28 cycles), starving the other's next call. Sleeping at once (`PASSIVE` alone sets
GNU OpenMP's spin count to 0) costs a wake-up per parallel region, and our algorithms make
several torch calls per pass microseconds apart: so idle torch threads first spin for
`GOMP_SPINCOUNT` = 10000 iterations (a fraction of a millisecond), then sleep. (torch's CPU
wheels use GNU OpenMP; Intel's ignores the variable.) The measurements behind both:
docs/pages/measurement.md, one thread policy.

All these variables are read when the libraries load, so they are set before NumPy or torch
is imported, and never overridden. This module imports nothing heavy at import time:
`convbench.cli` calls `sleep_idle_threads()` first thing; `use` loads the libraries it sets.
"""

from __future__ import annotations

import os
import threading

CPU_THREAD_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_THREAD_TIMEOUT": "4",
                  "GOMP_SPINCOUNT": "10000"}

_count: int | None = None
_explicit = False


def sleep_idle_threads() -> dict[str, str]:
    """Set `CPU_THREAD_ENV` where the environment does not say otherwise; returns what is set."""
    for key, value in CPU_THREAD_ENV.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in CPU_THREAD_ENV}


def unset_settings() -> str:
    """The `CPU_THREAD_ENV` settings this process was started without, as the `K=V ...` to
    start Python with ("" where all are set): they are read when the thread pools start, so a
    hint to a user names what to put before the command, not what to set in it."""
    return " ".join(f"{k}={v}" for k, v in CPU_THREAD_ENV.items() if k not in os.environ)


def available_cores() -> int:
    """The cores this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


def check(n: int | None) -> int | None:
    """`n` as a thread count a run may ask for: ValueError above `available_cores()`. Threads
    beyond the cores wait for each other, and the contention measure would then flag their
    rows as if other processes had taken the cores."""
    cores = available_cores()
    if n is not None and n > cores:
        raise ValueError(f"--threads {n}: this process may run on {cores} cores; more threads "
                         "than cores wait on each other and their times would read as "
                         f"contended: give at most {cores}")
    return n


def count() -> int:
    """The threads an algorithm may use: what `use` set, else the cores this process may use."""
    return _count or available_cores()


def use(n: int | None = None) -> dict:
    """Apply the policy: `n` threads (None: `available_cores()`) for NumPy's BLAS and OpenMP,
    torch and the FFT's workers, in this process, from now on. Returns the record env.json
    keeps (`policy()`). ValueError for a count below 1."""
    global _count, _explicit
    if n is not None and n < 1:
        raise ValueError(f"--threads {n}: a run needs at least 1 thread")
    _count, _explicit = n or available_cores(), n is not None
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=_count)  # every BLAS and OpenMP pool loaded so far
    except ImportError:  # threadpoolctl is a dependency; without it only torch is set
        pass
    try:
        import torch

        torch.set_num_threads(_count)
    except ImportError:
        pass
    return policy()


def reapply() -> None:
    """The count set again in every pool (threadpoolctl's and torch's): for a library that
    resets a shared pool when it starts its own (Numba's OpenMP layer, `algos.jit`)."""
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=count())
    except ImportError:
        pass
    import sys

    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(count())


def numpy_blas_pool() -> dict:
    """NumPy's BLAS pool as threadpoolctl reports it (internal_api, version, architecture: the
    core type OpenBLAS chose, num_threads, ...): the pool loaded from NumPy's own libraries,
    else the first; {} without threadpoolctl or a BLAS."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return {}
    pools = sorted((p for p in threadpool_info() if p.get("user_api") == "blas"),
                   key=lambda p: "numpy" not in p.get("filepath", ""))
    return pools[0] if pools else {}


def policy() -> dict:
    """What the policy is now: the count, the cores available, and what each library runs."""
    out: dict = {"threads": count(), "available_cores": available_cores(),
                 "set_by": "--threads" if _explicit else "default (the cores available)",
                 **{k: os.environ.get(k) for k in CPU_THREAD_ENV}}
    try:
        from threadpoolctl import threadpool_info

        out["pools"] = {f"{p.get('internal_api')} ({p.get('user_api')})": p.get("num_threads")
                        for p in threadpool_info()}
    except ImportError:
        pass
    try:
        import torch

        out["torch"] = torch.get_num_threads()
    except ImportError:
        pass
    return out


_pool = None
_pool_size = 0
_pool_lock = threading.Lock()


def _executor(n: int):
    """The `n` threads that compiled kernels' shares run on besides the caller's."""
    from concurrent.futures import ThreadPoolExecutor

    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size != n:
            if _pool is not None:
                _pool.shutdown(wait=True)
            _pool, _pool_size = ThreadPoolExecutor(n, thread_name_prefix="convbench-share"), n
        return _pool


def shares(tasks: int, n: int | None = None) -> list[tuple[int, int]]:
    """Tasks 0..tasks-1 split evenly into at most `n` (default `count()`) ranges (t0, t1)."""
    n = max(1, min(n or count(), tasks))
    per = -(-tasks // n)
    return [(i * per, min((i + 1) * per, tasks)) for i in range(n) if i * per < tasks]


def run_shares(call, jobs: list[tuple]) -> None:
    """call(*job) for every job at once, each on its own thread, the calling thread taking the
    first itself: a third runnable thread on two cores would wait for one (and read as
    contention in the timing's scheduler share). `call` must release the GIL (a ctypes call, a
    Numba `nogil` function)."""
    futures = ([_executor(len(jobs) - 1).submit(call, *job) for job in jobs[1:]]
               if len(jobs) > 1 else [])
    try:
        if jobs:
            call(*jobs[0])
    finally:
        for f in futures:
            f.result()
