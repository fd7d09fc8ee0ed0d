"""A device's ceilings as a record: what the CPU's and the GPU's measurements share and what a
run folder stores (env.json's `ceilings`).

The record says how each figure was obtained (`methods`) beside the figure, because a ceiling
read without its method is a number nobody can check (docs/pages/design.md §5). It carries a
schema (`SCHEMA`): a cached or stored record of another is refused and measured again, as every
loader refuses what it cannot read (§6). The measurements are `ceilings.cpu` and
`ceilings.gpu`; `ceilings` caches them; `roofline` reads a row against a record.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace

import numpy as np

#: The record's schema: a cached or stored `Ceilings` of another schema is refused (measured
#: again by `measure`).
SCHEMA = 1
#: Timed repetitions per figure, after one warm-up call.
REPS = 3


@dataclass(frozen=True)
class Product:
    """A (batched) fp32 product `batch x (m x k) @ (k x n)` a ceiling is measured on."""

    name: str
    batch: int
    m: int
    k: int
    n: int

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.k * self.n

    def scaled(self, scale: float) -> Product:
        """The same product with m, k, n times `scale` (tests measure small ones)."""
        return replace(self, **{d: max(1, round(getattr(self, d) * scale)) for d in "mkn"})

    def describe(self) -> str:
        batch = f"{self.batch} x " if self.batch > 1 else ""
        return f"{batch}({self.m}x{self.k})@({self.k}x{self.n})"


#: A square product (~0.1-0.3 s on a few cores) and two of our algorithms' products at the CPU's
#: default batch 8 (AlexNet conv3-like: K = 256, C·R·S = 2304, N·P·Q = 1352): an im2col GEMM
#: and the 36 batched products of Winograd F(4x4, 3x3).
CPU_PRODUCTS = (Product("square", 1, 2048, 2048, 2048), Product("im2col", 1, 256, 2304, 1352),
                Product("winograd", 36, 256, 384, 1352))
#: The same on a GPU: a square large enough to fill it, the products at batch 128.
GPU_PRODUCTS = (Product("square", 1, 8192, 8192, 8192), Product("im2col", 1, 256, 2304, 21632),
                Product("winograd", 36, 256, 384, 21632))


@dataclass(frozen=True)
class Ceilings:
    """A device's ceilings (how each is measured: `ceilings.cpu`, `ceilings.gpu`); rates in
    GFLOP/s, bandwidths in GB/s (1e9 bytes), `methods` saying how each figure was obtained.
    env.json stores `to_dict()`."""

    device: str
    model: str
    threads: int
    gflops_attainable: float
    gemm_backend: str
    gflops_by_backend: dict[str, dict[str, float]]
    gflops_peak_theoretical: float | None
    peak_method: str
    bandwidth_gbs_dram: float | None
    bandwidth_gbs_cache: float | None
    bandwidth_by_kernel: dict[str, dict[str, float]]
    clock_mhz: float | None
    openblas_coretype: str | None
    openblas_faster_coretype: str | None
    methods: dict[str, str]
    measured_at: str
    versions: dict[str, str | None]
    #: The compiled FMA loop's rate on the CPU (`ceilings.fma`); None on a GPU, where the peak
    #: is computed from the clock that ran, and in records from before it.
    gflops_peak_measured: float | None = None
    schema: int = SCHEMA
    #: Where the caller got the record: `measured` now, or from this machine's `cache` (first
    #: measured at `measured_at`); None where unknown (a record from before this field, which
    #: readers of schema 1 take as absent). Not part of the figures: left out of comparisons.
    source: str | None = field(default=None, compare=False)

    @property
    def compute_roof(self) -> tuple[float, str]:
        """The compute roof a row is read against, and what it is: the larger of the best
        library SGEMM (`gflops_attainable`) and the measured FMA peak. A kernel may beat a
        library's SGEMM (it need not pack or load as a general product does), never the FMA
        units at the clock that ran."""
        if self.gflops_peak_measured and self.gflops_peak_measured > self.gflops_attainable:
            return self.gflops_peak_measured, "the measured FMA peak"
        return self.gflops_attainable, f"the best library SGEMM ({self.gemm_backend})"

    @property
    def contended(self) -> bool:
        """Whether other work took the cores while some figure was timed (`methods` names
        which): those figures are low, and `measure` does not cache them."""
        return "contended" in self.methods

    def to_dict(self) -> dict:
        return asdict(self)

    def provenance(self) -> str:
        """When the figures were measured, and whether they come from the cache: a cached
        figure is as old as its date, and a stale or contended one is seen for what it is."""
        if self.source == "cache":
            return (f"measured {self.measured_at}, taken from this machine's cache "
                    "(`convbench machine --refresh` measures again)")
        if self.source == "measured":
            return f"measured {self.measured_at}, for this run"
        return f"measured {self.measured_at}"

    @classmethod
    def from_dict(cls, d: Mapping) -> Ceilings:
        """The record back; ValueError for another schema or a record missing a field."""
        if d.get("schema") != SCHEMA:
            raise ValueError(f"ceilings of schema {d.get('schema')!r}; this is schema {SCHEMA}")
        missing = [f.name for f in fields(cls) if f.name not in d and f.default is MISSING]
        if missing:
            raise ValueError(f"ceilings record lacks {', '.join(missing)}")
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    def __str__(self) -> str:
        def rate(x):
            return "n/a" if x is None else f"{x:.4g}"

        lines = [f"{self.device} ({self.model}), {self.threads} threads, {self.provenance()}",
                 (f"  attainable fp32: {rate(self.gflops_attainable)} GFLOP/s "
                  f"({self.gemm_backend})"),
                 *(f"    {b}: " + ", ".join(f"{s} {rate(g)}" for s, g in by.items())
                   for b, by in self.gflops_by_backend.items()),
                 *([(f"  measured FMA peak: {rate(self.gflops_peak_measured)} GFLOP/s "
                     f"({self.methods.get('peak_measured', '')})")]
                   if self.gflops_peak_measured else []),
                 (f"  theoretical peak: {rate(self.gflops_peak_theoretical)} GFLOP/s "
                  f"({self.peak_method})"),
                 f"  compute roof: {rate(self.compute_roof[0])} GFLOP/s ({self.compute_roof[1]})",
                 (f"  bandwidth: {rate(self.bandwidth_gbs_dram)} GB/s beyond cache, "
                  f"{rate(self.bandwidth_gbs_cache)} GB/s within"),
                 *(f"    {level}: " + ", ".join(f"{k} {rate(v)}" for k, v in by.items())
                   for level, by in self.bandwidth_by_kernel.items())]
        if self.clock_mhz is not None:
            lines.append(f"  SM clock while timed: {self.clock_mhz:.0f} MHz")
        if self.openblas_coretype:
            faster = (f"; {self.openblas_faster_coretype} may be faster "
                      f"(probe_openblas_coretype)" if self.openblas_faster_coretype else "")
            lines.append(f"  OpenBLAS core type: {self.openblas_coretype}{faster}")
        if self.contended:
            lines.append(f"  contended, so low: {self.methods['contended']}")
        return "\n".join(lines)


def from_env(env: Mapping | None) -> Ceilings | None:
    """The ceilings a run's env.json carries (`env["ceilings"]`, `runs.environment`), or None:
    not measured there (a run folder from before them, a device without them) or a record of
    another schema."""
    record = (env or {}).get("ceilings")
    if not isinstance(record, Mapping):
        return None
    try:
        return Ceilings.from_dict(record)
    except (ValueError, TypeError):
        return None


def now() -> str:
    """When a record was measured: UTC, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def library_versions() -> dict[str, str | None]:
    """The versions every device's ceiling depends on: NumPy's and torch's (None: no torch)."""
    out: dict[str, str | None] = {"numpy": np.__version__}
    try:
        import torch

        out["torch"] = torch.__version__
    except ImportError:
        out["torch"] = None
    return out
