"""`direct` on the GPU (`cuda`) and in the emulator (`emu`): the kernels of kernels/direct.cu.

One class serves both backends and is registered for each; the backend only changes what
`kernels.launcher` hands back (CuPy launches on a GPU, or the host emulator on NumPy arrays),
so the emulated tests in CI check exactly the launch code that runs on the GPU.

The tile sizes are chosen here, once: they go to the source as ``-D`` defines (declared to the
compile gate below) and the grids and shared-memory sizes are derived from them here. How the
kernels tile the work is described in kernels/direct.cu.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .. import emu, kernels
from ..problem import LAYOUTS, ConvProblem
from ..registry import register

TILES = {"THREADS": 256, "TILE_H": 8, "TILE_W": 8, "TILE_O": 32,
         "BF_TILE_K": 64, "BF_TILE_CRS": 64, "BF_CHUNK": 16}
#: The defines direct.cu is compiled with, per layout: the compile gate covers exactly these.
CONFIGURATIONS = {layout: {"NHWC": int(layout == "nhwc"), **TILES} for layout in LAYOUTS}
kernels.declare("direct", CONFIGURATIONS.values())

THREADS = TILES["THREADS"]
#: Input channels the forward and backward-data kernels stage per step, at most.
MAX_CHUNK = 16
#: bwd_filter splits its N·P·Q reduction until the grid has about this many blocks (a few waves
#: on a large GPU), but never into slices of fewer than MIN_SPLIT_PIXELS output pixels. The split
#: depends on the problem alone, so the emulator runs the configuration the GPU runs.
SPLIT_TARGET_BLOCKS = 1024
MIN_SPLIT_PIXELS = 256
_GRID_YZ_MAX = 65535


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class _GatherPlan:
    """direct_fwd / direct_bwd_data: grid, dynamic shared memory and patch extents."""

    grid: tuple[int, int, int]
    smem: int
    patch_h: int
    patch_w: int
    chunk: int


@dataclass(frozen=True)
class _FilterPlan:
    """direct_bwd_filter (+ direct_sum_splits when the reduction is split)."""

    grid: tuple[int, int, int]
    splits: int
    dw_size: int

    @property
    def partial_elements(self) -> int:
        """The split reduction's partial sums, one dw per slice, which direct_sum_splits adds
        into dw; none unsplit (the kernel writes dw itself)."""
        return self.splits * self.dw_size if self.splits > 1 else 0


def _gather_plan(p: ConvProblem, pass_: str) -> _GatherPlan:
    """Raises ValueError(reason) when the problem does not fit the kernel."""
    bwd = pass_ == "bwd_data"
    in_g, out_g = (p.k // p.groups, p.cg) if bwd else (p.cg, p.k // p.groups)
    out_h, out_w = (p.h, p.w) if bwd else (p.p, p.q)

    def extent(tile: int, taps: int) -> int:  # input rows (columns) a tile's taps touch
        if bwd:
            return (tile - 1 + (taps - 1) * p.dilation) // p.stride + 1
        return (tile - 1) * p.stride + (taps - 1) * p.dilation + 1

    patch_h, patch_w = extent(TILES["TILE_H"], p.r), extent(TILES["TILE_W"], p.s)

    def smem(chunk: int) -> int:  # must match the layout of `smem` in direct_gather
        return 4 * (_ceil(chunk * patch_h * patch_w, 4) * 4 + chunk * p.r * p.s * TILES["TILE_O"])

    chunk = next((c for c in range(min(in_g, MAX_CHUNK), 0, -1)
                  if smem(c) <= kernels.DEFAULT_DYNAMIC_SHARED), 0)
    if not chunk:
        raise ValueError(f"one channel's input patch and filter slice need {smem(1):,} bytes of "
                       f"shared memory, over {kernels.DEFAULT_DYNAMIC_SHARED:,}")
    grid = (_ceil(out_h, TILES["TILE_H"]) * _ceil(out_w, TILES["TILE_W"]),
            p.groups * _ceil(out_g, TILES["TILE_O"]), p.n)
    _check_grid(grid)
    return _GatherPlan(grid, smem(chunk), patch_h, patch_w, chunk)


def _filter_plan(p: ConvProblem) -> _FilterPlan:
    kg, crs = p.k // p.groups, p.cg * p.r * p.s
    tiles = (_ceil(crs, TILES["BF_TILE_CRS"]), p.groups * _ceil(kg, TILES["BF_TILE_K"]))
    splits = max(1, min(_ceil(SPLIT_TARGET_BLOCKS, math.prod(tiles)),
                        p.n * p.p * p.q // MIN_SPLIT_PIXELS, _GRID_YZ_MAX))
    grid = (*tiles, splits)
    _check_grid(grid)
    return _FilterPlan(grid, splits, p.k * crs)


def _check_grid(grid: tuple[int, int, int]) -> None:
    """Raises ValueError(reason) past CUDA's grid limits."""
    if max(grid[1:]) > _GRID_YZ_MAX:
        raise ValueError(f"grid {grid} exceeds the CUDA limit of {_GRID_YZ_MAX} in y or z")


def _plan(problem: ConvProblem, pass_: str) -> _GatherPlan | _FilterPlan:
    return _filter_plan(problem) if pass_ == "bwd_filter" else _gather_plan(problem, pass_)


class DirectKernels:
    """`direct` through kernels/direct.cu; `backend` is set by `register` (cuda or emu)."""

    precisions = ("fp32",)

    def available(self) -> str | None:
        return kernels.available(self.backend)

    def supports(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        largest = max(math.prod(s) for s in problem.operand_shapes(pass_, layout))
        if largest >= 2**31:
            return "a tensor has 2^31 or more elements; the kernels index with 32-bit ints"
        try:
            _plan(problem, pass_)
        except ValueError as exc:
            return str(exc)
        return emu.too_big(problem.flops // 2) if self.backend == "emu" else None

    def workspace_bytes(self, problem: ConvProblem, pass_: str, layout: str,
                        precision: str) -> int:
        """The float32 partial sums of a split bwd_filter: fwd and bwd_data stage their tiles
        in shared memory and allocate nothing."""
        plan = _plan(problem, pass_)
        return 4 * plan.partial_elements if isinstance(plan, _FilterPlan) else 0

    def describe(self, problem, pass_, layout, precision) -> str:
        plan = _plan(problem, pass_)
        if isinstance(plan, _FilterPlan):
            return f"N·P·Q reduction in {plan.splits} slice(s)"
        return f"{plan.chunk}-channel steps, {plan.smem:,} B shared memory"

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        launch = kernels.launcher(self.backend, "direct", CONFIGURATIONS[layout])
        p, plan = problem, _plan(problem, pass_)
        dims = (p.n, p.c, p.h, p.w, p.k, p.r, p.s, p.p, p.q, p.stride, p.pad, p.dilation,
                p.groups)
        if isinstance(plan, _GatherPlan):
            kernel = launch.kernel(f"direct_{pass_}")
            args = (*dims, plan.patch_h, plan.patch_w, plan.chunk)
            return lambda a, b, out: kernel(plan.grid, THREADS, (a, b, out, *args),
                                            shared_mem=plan.smem)
        reduce = launch.kernel("direct_bwd_filter")
        if plan.splits == 1:
            return lambda a, b, out: reduce(plan.grid, THREADS, (a, b, out, *dims, 1))
        add = launch.kernel("direct_sum_splits")
        part = launch.xp.empty(plan.partial_elements, dtype=launch.xp.float32)

        def run(a, b, out):
            reduce(plan.grid, THREADS, (a, b, part, *dims, plan.splits))
            add(_ceil(plan.dw_size, THREADS), THREADS, (part, out, plan.dw_size, plan.splits))

        return run


for _backend in ("cuda", "emu"):
    register("direct", _backend)(DirectKernels)
