"""Is the machine giving a measurement the cores it needs? Readings that say so.

A CPU time is only what it claims when the pass's threads ran whenever they were ready to. On a
shared machine another process takes cores, and a pass whose threads wait on each other (BLAS
threads at a barrier) can slow 10x while its own spread stays small: nothing in the times
alone says so. Linux says so: `/proc/self/task/*/schedstat` holds, per thread, the time spent on
a core and the time spent runnable but waiting for one (the run-queue delay). Per repetition,
the share

    on-core time / (on-core time + run-queue time), summed over the process's threads

is 0.97-1.0 on a quiet machine whatever the thread count, and falls to about 0.5 for a 2-thread
pass on 2 cores beside two busy processes: the share of its cores the pass actually got.
`measurement.CONTENDED_SHARE` is the line below which a row is flagged `contended`. Beside it,
each repetition keeps the process's CPU time and involuntary context switches (`getrusage`).

On a virtual machine the hypervisor can give this machine's cores to other machines (steal).
A thread it stops counts neither as on a core nor as waiting for one, so the share does not
drop; only the machine's tick counters (/proc/stat) say so: per repetition, `sample` reads the
ticks this machine's cores had work and the ticks of that stolen, and `stolen` gives the share
stolen over a measurement's repetitions (measured here, a 2-thread GEMM beside a busy
neighbour machine: 16% stolen in a window and 0.83 of its wall time on its cores, its share
1.00). A measurement's share of its cores is then share × (1 - stolen).

`machine_load` reads the machine as a whole, for env.json at the start and end of a run: the
load average and every other process that kept a core busy over a short window, by name.
"""

from __future__ import annotations

import datetime
import os
import resource
import time
from dataclasses import dataclass

_TASKS = "/proc/self/task"
#: A process busier than this share of one core over `machine_load`'s window is listed.
BUSY_PROCESS = 0.1


#: Fewer busy ticks than this (at 100 a second, 0.2 core-seconds) over a measurement's
#: repetitions say too little about the hypervisor's share to read one: a tick or two stolen
#: in a handful would read as a large share.
MIN_BUSY_TICKS = 20


@dataclass(frozen=True)
class Sample:
    """The process at one moment: per thread (id -> (ns on a core, ns waiting for one)) where
    the kernel reports it, its CPU time and its involuntary context switches; and the machine's
    (busy, stolen) ticks so far (`machine_ticks`), None where not read."""

    threads: dict[int, tuple[int, int]]
    cpu_s: float
    involuntary: int
    ticks: tuple[int, int] | None = None


def _schedstat() -> dict[int, tuple[int, int]]:
    out = {}
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/schedstat") as f:
                on, waiting, _ = f.read().split()
        except (OSError, ValueError):  # the thread ended, or no schedstat in this kernel
            continue
        out[int(tid)] = (int(on), int(waiting))
    return out


def sample() -> Sample:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return Sample(_schedstat(), usage.ru_utime + usage.ru_stime, usage.ru_nivcsw,
                  machine_ticks())


def available() -> bool:
    """Whether this kernel reports per-thread run-queue time (schedstat)."""
    return bool(_schedstat())


def share(before: Sample, after: Sample) -> float | None:
    """The share of the time the process's threads were ready to run that they spent on a core
    between the two samples; None where the kernel does not say, or no thread was ready. A
    thread that started in between counts from zero; one that ended is not counted."""
    on = waiting = 0
    for tid, (on_b, wait_b) in after.threads.items():
        on_a, wait_a = before.threads.get(tid, (0, 0))
        on, waiting = on + on_b - on_a, waiting + wait_b - wait_a
    if on + waiting <= 0:
        return None
    return on / (on + waiting)


def ticks_between(before: Sample, after: Sample) -> tuple[int, int]:
    """(busy, stolen) machine ticks between two samples; (0, 0) where either was not read."""
    if before.ticks is None or after.ticks is None:
        return 0, 0
    return after.ticks[0] - before.ticks[0], after.ticks[1] - before.ticks[1]


def stolen(busy: int, steal: int) -> float | None:
    """The share of the ticks this machine's cores had work that the hypervisor gave to other
    machines; None below `MIN_BUSY_TICKS` busy ticks (too few to say)."""
    return steal / busy if busy >= MIN_BUSY_TICKS else None


def cpu_ms(before: Sample, after: Sample) -> float:
    """The process's CPU time between the samples, in ms (every thread, user and system)."""
    return (after.cpu_s - before.cpu_s) * 1e3


# --- the machine ---------------------------------------------------------------------------------
def _process_ticks() -> dict[int, tuple[str, int]]:
    """pid -> (name, user + system clock ticks) of every process this one can read."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:
            continue
        name = text[text.find("(") + 1:text.rfind(")")]
        fields = text[text.rfind(")") + 2:].split()
        out[int(entry)] = (name, int(fields[11]) + int(fields[12]))  # utime, stime
    return out


def _stat_fields() -> list[int] | None:
    """The machine's CPU tick counters so far (/proc/stat's first line: user, nice, system,
    idle, iowait, irq, softirq, steal, guest, guest_nice); None where not readable."""
    try:
        with open("/proc/stat") as f:
            return [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def _cpu_ticks() -> tuple[int, int] | None:
    """(all, stolen) CPU ticks of the machine so far (/proc/stat): steal is time the hypervisor
    gave this virtual machine's cores to others, which no process here can see."""
    fields = _stat_fields()
    if fields is None:
        return None
    return sum(fields), fields[7] if len(fields) > 7 else 0


def machine_ticks() -> tuple[int, int] | None:
    """(busy, stolen) ticks of the machine so far: busy counts the ticks its cores had work —
    user, nice, system, irq, softirq and steal (guest time is inside user), not idle or iowait:
    a core with nothing to run loses nothing to the hypervisor."""
    fields = _stat_fields()
    if fields is None or len(fields) < 8:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return user + nice + system + irq + softirq + steal, steal


def machine_load(window_s: float = 0.25, own_pids: set[int] | None = None) -> dict:
    """The machine's load now: the load average, the cores this process may use, the other
    processes that kept at least `BUSY_PROCESS` of a core busy over `window_s` (by name, with
    their share of one core), their sum as `busy_cores`, and the share of the window a
    hypervisor stole from this machine's cores (`steal`). `own_pids` (default this process)
    are not others."""
    own = own_pids or {os.getpid()}
    tick = os.sysconf("SC_CLK_TCK")
    ticks = _cpu_ticks()
    try:
        first = _process_ticks()
        time.sleep(window_s)
        second = _process_ticks()
    except OSError:  # no /proc: only the load average
        first = second = {}
    after = _cpu_ticks()
    steal = None
    if ticks and after and after[0] > ticks[0]:
        steal = round((after[1] - ticks[1]) / (after[0] - ticks[0]), 3)
    busy = []
    for pid, (name, ticks) in second.items():
        if pid in own or pid not in first:
            continue
        cores = (ticks - first[pid][1]) / tick / window_s
        if cores >= BUSY_PROCESS:
            busy.append({"pid": pid, "name": name, "cores": round(cores, 2)})
    busy.sort(key=lambda p: -p["cores"])
    try:
        load = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        load = None
    return {"time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "loadavg": load, "cores": os.cpu_count(), "steal": steal,
            "busy_cores": round(sum(p["cores"] for p in busy), 2), "busy_processes": busy}


def load_text(load: dict) -> str:
    """A machine-load reading in one line: `load 2.1, 2 other processes busy (1.9 cores): yes, yes`."""
    others = load.get("busy_processes") or []
    text = f"load average {load['loadavg'][0]}" if load.get("loadavg") else "load unknown"
    if load.get("steal"):
        text += f", {load['steal']:.0%} of the cores' time stolen by the hypervisor"
    if not others:
        return text + ", no other busy process"
    names = ", ".join(f"{p['name']} ({p['cores']:.2g})" for p in others[:4])
    more = f" and {len(others) - 4} more" if len(others) > 4 else ""
    cores = load["busy_cores"]
    return (f"{text}, {len(others)} other busy process{'es' if len(others) > 1 else ''} "
            f"({cores:.2g} core{'s' if cores > 1 else ''} busy): {names}{more}")
