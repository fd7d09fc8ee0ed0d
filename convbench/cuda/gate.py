"""The compile gate: every declared kernel configuration compiled with NVRTC for each arch, no
GPU needed, with ptxas's registers, shared memory and spills as a table; a spill fails it.

The algorithm modules declare their configurations at import (`kernels.declare`): import them
first (`registry.load`) for the whole list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..machine import threads
from . import kernels

#: Architectures the compile gate builds every configuration for.
GATE_ARCHS = ("sm_80", "sm_90")


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one function of one compilation."""

    kernel: str
    registers: int = 0
    smem: int = 0  #: static shared memory, bytes
    stack: int = 0  #: stack frame (local memory), bytes
    spill_stores: int = 0
    spill_loads: int = 0

    @property
    def spill(self) -> int:
        return self.spill_stores + self.spill_loads


_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PTXAS_PROPS = re.compile(r"Function properties for (\S+)")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                          r"(\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"Used (\d+) registers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str) -> list[Resources]:
    """One `Resources` per function in a ``--ptxas-options=-v`` log, in order of appearance
    (entry points, and any device function that was not inlined)."""
    found: dict[str, dict[str, int]] = {}
    entry = props = None
    for line in log.splitlines():
        if m := _PTXAS_ENTRY.search(line):
            entry = found.setdefault(m.group(1), {})
        elif m := _PTXAS_PROPS.search(line):
            props = found.setdefault(m.group(1), {})
        elif (m := _PTXAS_FRAME.search(line)) and props is not None:
            props.update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                         spill_loads=int(m.group(3)))
        elif (m := _PTXAS_USED.search(line)) and entry is not None:
            smem = _PTXAS_SMEM.search(line)
            entry.update(registers=int(m.group(1)), smem=int(smem.group(1)) if smem else 0)
    return [Resources(name, **fields) for name, fields in found.items()]


@dataclass(frozen=True)
class GateRow:
    """One function of one (file, defines, arch) compilation, or the error that stopped it."""

    file: str
    defines: kernels.Defines
    arch: str
    resources: Resources | None
    error: str = ""  #: one line; the full compiler log is in `log`
    log: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.resources is not None and self.resources.spill == 0


def compile_check(path: Path, defines: kernels.Defines, arch: str) -> list[GateRow]:
    """Compile one configuration with NVRTC for `arch` (no GPU needed) and report its kernels."""
    from cupy.cuda import nvrtc

    path = Path(path)

    def failed(error: str, log: str = "") -> list[GateRow]:
        return [GateRow(path.name, defines, arch, None, error, log)]

    try:
        code = kernels.read_source(path)
    except OSError as exc:
        return failed(str(exc))
    options = [f"--gpu-architecture={arch}", "--ptxas-options=-v", *kernels.COMPILE_OPTIONS,
               *kernels.define_options(defines)]
    program = nvrtc.createProgram(code, path.name, [], [])
    try:
        nvrtc.compileProgram(program, options)
        error = ""
    except nvrtc.NVRTCError as exc:
        error = str(exc)
    log = nvrtc.getProgramLog(program).rstrip("\x00")
    nvrtc.destroyProgram(program)
    if error:
        first = next((ln for ln in log.splitlines() if "error" in ln), error)
        return failed(f"compile error: {first.strip()}", log)
    resources = parse_ptxas(log)
    if not resources:
        return failed("ptxas reported no kernels", log)
    return [GateRow(path.name, defines, arch, r) for r in resources]


def _ignore_interrupts() -> None:
    """A gate worker leaves Ctrl-C to the gate, which stops handing out compiles."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def gate(jobs: Iterable[tuple[Path, kernels.Defines]], archs: Iterable[str] = GATE_ARCHS,
         workers: int | None = None) -> list[GateRow]:
    """Every (file, defines) job compiled for every arch; rows in job order.

    The compiles run in `workers` processes (default: the cores this process may use), each
    compile alone in its process, never in threads: NVRTC compiles run concurrently in one
    process gave ptxas results that differ from run to run (a kernel at its register cap
    spilled in some runs only), and a gate must not be flaky. The measurements are in
    docs/pages/cuda.md, the compile gate.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    archs = tuple(archs)
    tasks = [(path, defines, arch) for path, defines in jobs for arch in archs]
    workers = min(len(tasks), workers or threads.available_cores())
    if workers <= 1:
        return [row for task in tasks for row in compile_check(*task)]
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_ignore_interrupts)
    try:
        results = list(pool.map(compile_check, *zip(*tasks)))
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return [row for rows in results for row in rows]


def declared_jobs() -> tuple[list[tuple[Path, kernels.Defines]], list[str]]:
    """(the declared configurations as gate jobs, the kernel files nobody declared)."""
    configurations = kernels.declared()
    jobs = [(kernels.kernel_dir() / f"{name}.cu", d) for name, sets in configurations.items()
            for d in sets]
    undeclared = sorted(p.name for p in kernels.kernel_dir().glob("*.cu")
                        if p.stem not in configurations)
    return jobs, undeclared


def _brief(value: str) -> str:
    """A define's value for the table: a brace initializer (a baked-in matrix) by its size."""
    if value.startswith("{") and value.endswith("}"):
        return f"{{{value.count(',') + 1} values}}"
    return value


def render(rows: list[GateRow]) -> str:
    """The resource table. Its `defines` column shows what varies between a file's
    configurations; what they share is listed once per file below the table."""
    from ..core.fmt import tabulate

    shared: dict[str, set[tuple[str, str]]] = {}
    for r in rows:
        shared[r.file] = shared.get(r.file, set(r.defines)) & set(r.defines)
    table = []
    for r in rows:
        res = r.resources
        numbers = [res.registers, res.smem, res.stack, res.spill] if res else [""] * 4
        shown = " ".join(f"{k}={v}" for k, v in r.defines if (k, v) not in shared[r.file])
        status = r.error or ("ok" if r.ok else "SPILL")
        table.append([r.file, shown, r.arch, res.kernel if res else "-", *numbers, status])
    notes = [f"{file} in every configuration: "
             f"{' '.join(f'{k}={_brief(v)}' for k, v in sorted(common))}"
             for file, common in shared.items() if common]
    return "\n".join([tabulate(table, headers=["file", "defines", "arch", "kernel", "registers",
                                                "static smem B", "stack B", "spill B",
                                                "status"]),
                      *notes])


