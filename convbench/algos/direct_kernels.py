"""`direct` on the GPU (`cuda`) and in the emulator (`emu`): the kernels of kernels/direct.cu.

The tile sizes are chosen here, once: they go to the source as ``-D`` defines (declared to the
compile gate below) and the grids and shared-memory sizes are derived from them here. How the
kernels tile the work is described in kernels/direct.cu.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.problem import LAYOUTS, ConvProblem
from ..cuda import kernels
from . import kernel_base
from .depthwise import is_depthwise
from .direct import DIRECT
from .kernel_base import ceil_div

#: FILT_PAD: floats between the staged filter rows of TILE_O channels (direct.cu says why).
TILES = {"THREADS": 256, "TILE_H": 8, "TILE_W": 8, "TILE_O": 32, "FILT_PAD": 4,
         "BF_TILE_K": 64, "BF_TILE_CRS": 64, "BF_CHUNK": 16}
#: The defines direct.cu is compiled with, per layout: the compile gate covers exactly these.
CONFIGURATIONS = {layout: {"NHWC": int(layout == "nhwc"), **TILES} for layout in LAYOUTS}
kernels.declare("direct", CONFIGURATIONS.values())

#: kernels/depthwise.cu, which `direct` runs where groups = C > 1: per layout, the channels a
#: block owns (its threads run along channels in nhwc, along pixels in nchw) and its pixels.
DEPTHWISE_TILES = {"nchw": {"DW_TILE_C": 8, "DW_PIX": 128},
                   "nhwc": {"DW_TILE_C": 32, "DW_PIX": 32}}
DEPTHWISE_CONFIGURATIONS = {layout: {"NHWC": int(layout == "nhwc"), "THREADS": TILES["THREADS"],
                                     **DEPTHWISE_TILES[layout]} for layout in LAYOUTS}
kernels.declare("depthwise", DEPTHWISE_CONFIGURATIONS.values())

THREADS = TILES["THREADS"]
#: Input channels the forward and backward-data kernels stage per step, at most.
MAX_CHUNK = 16
#: bwd_filter splits its N·P·Q reduction until the grid has about this many blocks (a few waves
#: on a large GPU), but never into slices of fewer than MIN_SPLIT_PIXELS output pixels. The split
#: depends on the problem alone, so the emulator runs the configuration the GPU runs.
SPLIT_TARGET_BLOCKS = 1024
MIN_SPLIT_PIXELS = 256


@dataclass(frozen=True)
class _GatherGeometry:
    """direct_fwd / direct_bwd_data: grid, dynamic shared memory and patch extents."""

    grid: tuple[int, int, int]
    smem: int
    patch_h: int
    patch_w: int
    chunk: int


@dataclass(frozen=True)
class _FilterGeometry:
    """direct_bwd_filter (+ direct_sum_splits when the reduction is split)."""

    grid: tuple[int, int, int]
    splits: int
    dw_size: int

    @property
    def partial_elements(self) -> int:
        """The split reduction's partial sums, one dw per slice, which direct_sum_splits adds
        into dw; none unsplit (the kernel writes dw itself)."""
        return self.splits * self.dw_size if self.splits > 1 else 0


def _gather_geometry(p: ConvProblem, pass_: str) -> _GatherGeometry:
    """Raises ValueError(reason) when the problem does not fit the kernel."""
    bwd = pass_ == "bwd_data"
    in_g, out_g = (p.k // p.groups, p.cg) if bwd else (p.cg, p.k // p.groups)
    out_h, out_w = (p.h, p.w) if bwd else (p.p, p.q)

    def extent(tile: int, taps: int, stride: int, dil: int) -> int:
        """Input rows (columns) a tile's taps touch along one axis."""
        if bwd:
            return (tile - 1 + (taps - 1) * dil) // stride + 1
        return (tile - 1) * stride + (taps - 1) * dil + 1

    patch_h = extent(TILES["TILE_H"], p.r, p.stride_h, p.dil_h)
    patch_w = extent(TILES["TILE_W"], p.s, p.stride_w, p.dil_w)

    def smem(chunk: int) -> int:  # must match the layout of `smem` in direct_gather
        patch = ceil_div(chunk * patch_h * patch_w, 4) * 4
        return 4 * (patch + chunk * p.r * p.s * (TILES["TILE_O"] + TILES["FILT_PAD"]))

    chunk = next((c for c in range(min(in_g, MAX_CHUNK), 0, -1)
                  if smem(c) <= kernels.DEFAULT_DYNAMIC_SHARED), 0)
    if not chunk:
        raise ValueError(f"one channel's input patch and filter slice need {smem(1):,} bytes of "
                         f"shared memory, over {kernels.DEFAULT_DYNAMIC_SHARED:,}")
    grid = (ceil_div(out_h, TILES["TILE_H"]) * ceil_div(out_w, TILES["TILE_W"]),
            p.groups * ceil_div(out_g, TILES["TILE_O"]), p.n)
    kernel_base.check_grid(grid)
    return _GatherGeometry(grid, smem(chunk), patch_h, patch_w, chunk)


def _filter_geometry(p: ConvProblem) -> _FilterGeometry:
    kg, crs = p.k // p.groups, p.cg * p.r * p.s
    tiles = (ceil_div(crs, TILES["BF_TILE_CRS"]), p.groups * ceil_div(kg, TILES["BF_TILE_K"]))
    splits = max(1, min(ceil_div(SPLIT_TARGET_BLOCKS, math.prod(tiles)),
                        p.n * p.p * p.q // MIN_SPLIT_PIXELS, kernel_base.GRID_YZ_MAX))
    grid = (*tiles, splits)
    kernel_base.check_grid(grid)
    return _FilterGeometry(grid, splits, p.k * crs)


@dataclass(frozen=True)
class _DepthwiseGeometry:
    """kernels/depthwise.cu: grid, dynamic shared memory (fwd, bwd_data: the tile's filters)
    and, for bwd_filter, the slices of its N·P·Q reduction."""

    grid: tuple[int, int, int]
    smem: int
    splits: int
    dw_size: int

    @property
    def partial_elements(self) -> int:
        return self.splits * self.dw_size if self.splits > 1 else 0


def _depthwise_geometry(p: ConvProblem, pass_: str, layout: str) -> _DepthwiseGeometry:
    tile = DEPTHWISE_TILES[layout]
    taps, mult = p.r * p.s, p.k // p.c
    if pass_ == "bwd_filter":
        tiles = ceil_div(p.k, tile["DW_TILE_C"]) * taps
        splits = max(1, min(ceil_div(SPLIT_TARGET_BLOCKS, tiles),
                            p.n * p.p * p.q // MIN_SPLIT_PIXELS, kernel_base.GRID_YZ_MAX))
        grid = (ceil_div(p.k, tile["DW_TILE_C"]), taps, splits)
        kernel_base.check_grid(grid)
        return _DepthwiseGeometry(grid, 0, splits, p.k * taps)
    bwd = pass_ == "bwd_data"
    pixels, channels = (p.h * p.w, p.c) if bwd else (p.p * p.q, p.k)
    smem = 4 * tile["DW_TILE_C"] * taps * (mult if bwd else 1)
    if smem > kernels.DEFAULT_DYNAMIC_SHARED:
        raise ValueError(f"a tile's filters need {smem:,} bytes of shared memory, over "
                         f"{kernels.DEFAULT_DYNAMIC_SHARED:,}")
    grid = (ceil_div(pixels, tile["DW_PIX"]), ceil_div(channels, tile["DW_TILE_C"]), p.n)
    kernel_base.check_grid(grid)
    return _DepthwiseGeometry(grid, smem, 1, p.k * taps)


def _geometry(problem: ConvProblem, pass_: str, layout: str = "nchw"
              ) -> _GatherGeometry | _FilterGeometry | _DepthwiseGeometry:
    """The launch geometry of a pass; raises ValueError(reason) where it does not fit. A
    depthwise layer runs kernels/depthwise.cu."""
    if is_depthwise(problem):
        return _depthwise_geometry(problem, pass_, layout)
    if pass_ == "bwd_filter":
        return _filter_geometry(problem)
    return _gather_geometry(problem, pass_)


@kernel_base.register_kernels(DIRECT)
class DirectKernels(kernel_base.KernelImplementation):
    """`direct` through kernels/direct.cu."""

    asymmetric_pad = True  # the kernels take the padding before and the output size

    def check_launch(self, problem: ConvProblem, pass_: str, layout: str) -> None:
        _geometry(problem, pass_, layout)

    def workspace_buffers(self, problem: ConvProblem, pass_: str, layout: str
                          ) -> dict[str, int]:
        """The partial sums of a split bwd_filter: fwd and bwd_data stage their tiles in shared
        memory and allocate nothing."""
        geo = _geometry(problem, pass_, layout)
        if isinstance(geo, (_FilterGeometry, _DepthwiseGeometry)) and geo.partial_elements:
            return {"the split reduction's partial sums": geo.partial_elements}
        return {}

    def describe(self, problem, pass_, layout, precision) -> str:
        geo = _geometry(problem, pass_, layout)
        if isinstance(geo, _DepthwiseGeometry):
            what = (f"N·P·Q reduction in {geo.splits} slice(s)" if pass_ == "bwd_filter"
                    else f"filters of {DEPTHWISE_TILES[layout]['DW_TILE_C']} channels in "
                         f"{geo.smem:,} B shared memory")
            return f"depthwise kernel (depthwise.cu): {what}"
        if isinstance(geo, _FilterGeometry):
            return f"N·P·Q reduction in {geo.splits} slice(s)"
        return f"{geo.chunk}-channel steps, {geo.smem:,} B shared memory"

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        p, geo = problem, _geometry(problem, pass_, layout)
        if isinstance(geo, _DepthwiseGeometry):
            launch = kernels.launcher(self.backend, "depthwise",
                                      DEPTHWISE_CONFIGURATIONS[layout])
            dims = (p.n, p.c, p.h, p.w, p.k, p.r, p.s, p.p, p.q, *kernel_base.axis_args(p))
            if pass_ != "bwd_filter":
                return launch.kernel(f"depthwise_{pass_}").bind(geo.grid, THREADS, dims,
                                                               geo.smem)
            reduce = launch.kernel("depthwise_bwd_filter").bind(geo.grid, THREADS,
                                                                (*dims, geo.splits))
            return kernel_base.split_sum(launch, reduce, "depthwise_sum_splits", geo.dw_size,
                                         geo.splits, THREADS)
        launch = kernels.launcher(self.backend, "direct", CONFIGURATIONS[layout])
        dims = (p.n, p.c, p.h, p.w, p.k, p.r, p.s, p.p, p.q, *kernel_base.axis_args(p), p.groups)
        if isinstance(geo, _GatherGeometry):
            return launch.kernel(f"direct_{pass_}").bind(
                geo.grid, THREADS, (*dims, geo.patch_h, geo.patch_w, geo.chunk), geo.smem)
        reduce = launch.kernel("direct_bwd_filter").bind(geo.grid, THREADS,
                                                         (*dims, geo.splits))
        return kernel_base.split_sum(launch, reduce, "direct_sum_splits", geo.dw_size, geo.splits,
                                 THREADS)
