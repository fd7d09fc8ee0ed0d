"""`winograd-2x2` and `winograd-4x4` on the GPU (`cuda`) and in the emulator (`emu`):
kernels/winograd.cu, non-fused like cuDNN's WINOGRAD_NONFUSED; and `winograd-fused-2x2` and
`winograd-fused-4x4`, the forward form fused into one kernel like cuDNN's WINOGRAD.

The math is the CPU implementation's (`convbench.algos.winograd`), stage for stage, alpha = m + 2
and T tiles over all images: fwd transforms x's windows (Bᵀ d B, from -pad) and the filters
(G g Gᵀ), multiplies per position ξ, M[ξ] = U[ξ]·V[ξ] contracting C, and crops Aᵀ M A; bwd_data
does the same on dy (windows from -(r-1-pad)) with each filter rotated 180° and the GEMM
contracting K (U[ξ] read transposed); bwd_filter is F(3x3, m×m), dy's m×m tiles the "filters",
the GEMM (K×T)·(T×C) summing over batch and tiles, Aᵀ M A giving the 3×3 dw[k][c].

The matrices come from `convbench.algos.transforms` as ``-D`` defines, every tile's in every
configuration, ``WINO_M`` selecting one. One class per tile size serves both backends; every
workspace buffer is allocated in `prepare`. Phases as `convbench.algos.fft_kernels`'s:
``transform <a>``, ``transform <b>``, ``product``, ``inverse <out>``.

The fused variants run fwd and bwd_data (no fused weight gradient, as in cuDNN): the filters are
transformed first, by the non-fused transform, into the only workspace (phase ``transform w``);
then `wino_fused` transforms each block's tiles into shared memory, multiplies them with the
filters and transforms its outputs back from registers, in one launch (phase ``fused``). Their
CPU counterparts are `winograd-2x2` and `-4x4`: fusing is a GPU kernel's choice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from ..core.problem import LAYOUTS, ConvProblem
from ..cuda import kernels
from . import kernel_base, phases
from .kernel_base import ceil_div
from .phases import OPERAND_NAMES, Phased, phase_names
from .transforms import WinogradTransform, c_literal, winograd_matrices
from .winograd import WINOGRAD, Winograd, winograd

_R = 3  # the filter size
TILE_SIZES = (2, 4)
THREADS = 256  #: threads per block of the transform kernels (one thread per tile)
GEMM = {"GEMM_BM": 64, "GEMM_BN": 64, "GEMM_BK": 16, "GEMM_THREADS": 256}
#: The batched GEMM cuts its reduction into slices until the grid has about this many blocks
#: (a few waves on a large GPU), but never into slices of fewer than MIN_SLICE_DEPTH values. The
#: choice depends on the problem alone, so the emulator runs the configuration the GPU runs.
SPLIT_TARGET_BLOCKS = 1024
MIN_SLICE_DEPTH = 256


def _c_initializer(matrix: np.ndarray) -> str:
    """A float matrix as a flat C brace initializer, each literal the shortest decimal that
    reads back as the same float."""
    return "{" + ",".join(c_literal(v) for v in matrix.ravel()) + "}"


def _tables() -> dict[str, str]:
    """``WINO_F<m>X<r>_{AT,G,BT}`` for F(m, 3) and F(3, m) of every tile size, in float."""
    out = {}
    for m in TILE_SIZES:
        for fm, fr in ((m, _R), (_R, m)):
            t = winograd_matrices(fm, fr).astype(np.float32)
            out.update({f"WINO_F{fm}X{fr}_{label}": _c_initializer(a)
                        for label, a in zip(WinogradTransform._fields, t)})
    return out


#: The fused kernel's tiles per tile size: a block computes FUSED_BK output channels ×
#: FUSED_BT tiles over FUSED_BC input channels at a time, and a thread FUSED_MK × FUSED_MT of
#: those with all alpha² positions in registers: 64 accumulators for F(2x2), 72 for F(4x4) (whose
#: 36 positions leave room for one output channel per thread). 256 threads a block, one block per
#: SM asked of the launch bounds: held to 128 registers (two blocks) F(4x4) spills, and F(2x2)
#: fits only at the cap, where ptxas was seen to spill at random under load (kernels/gemm.cu;
#: the gate's register counts are in docs/pages/cuda.md, the compile gate).
FUSED_TILES = {
    2: {"FUSED_BK": 32, "FUSED_BT": 32, "FUSED_BC": 8, "FUSED_MK": 2, "FUSED_MT": 2,
        "FUSED_MIN_BLOCKS": 1},
    4: {"FUSED_BK": 16, "FUSED_BT": 32, "FUSED_BC": 4, "FUSED_MK": 1, "FUSED_MT": 2,
        "FUSED_MIN_BLOCKS": 1},
}

#: The defines winograd.cu is compiled with, per (tile size, layout): the gate covers these.
CONFIGURATIONS = {(m, layout): {"NHWC": int(layout == "nhwc"), "WINO_M": m, "THREADS": THREADS,
                                **GEMM, **FUSED_TILES[m], **_tables()}
                  for m in TILE_SIZES for layout in LAYOUTS}
kernels.declare("winograd", CONFIGURATIONS.values())


def _tile_strides(layout: str, channels: int, tiles: int) -> tuple[int, int]:
    """(channel stride, tile stride) of a buffer of transformed tiles at one position: stored
    [channel][tile] in NCHW, [tile][channel] in NHWC."""
    return (tiles, 1) if layout == "nchw" else (1, channels)


@dataclasses.dataclass(frozen=True)
class _Gemm:
    """wino_gemm for one pass: per position, (rows × cols) = a (rows × depth) · b (depth × cols);
    `a` and `b` name workspace buffers, read through the strides; the depth is cut into slices
    that write their own partial products."""

    a: str
    b: str
    rows: int
    cols: int
    depth: int
    a_row: int
    a_depth: int
    b_depth: int
    b_col: int
    alpha2: int

    @property
    def slice_depth(self) -> int:
        """The reduction's slice: whole GEMM_BK steps, as many slices as SPLIT_TARGET_BLOCKS
        asks for within the limits, none empty."""
        blocks = self.grid_tiles * self.alpha2
        splits = max(1, min(ceil_div(SPLIT_TARGET_BLOCKS, blocks), self.depth // MIN_SLICE_DEPTH,
                            kernel_base.GRID_YZ_MAX // self.alpha2))
        return ceil_div(ceil_div(self.depth, splits), GEMM["GEMM_BK"]) * GEMM["GEMM_BK"]

    @property
    def grid_tiles(self) -> int:
        """Output tiles of one position's product: the blocks per position and slice."""
        return ceil_div(self.rows, GEMM["GEMM_BM"]) * ceil_div(self.cols, GEMM["GEMM_BN"])

    @property
    def splits(self) -> int:
        return ceil_div(self.depth, self.slice_depth)

    @property
    def grid(self) -> tuple[int, int]:
        return self.grid_tiles, self.alpha2 * self.splits

    @property
    def product_size(self) -> int:
        """Elements of the partial products: [slice][position][rows][cols]."""
        return self.splits * self.alpha2 * self.rows * self.cols

    @property
    def args(self) -> tuple[int, ...]:
        return (self.rows, self.cols, self.depth, self.a_row, self.a_depth, self.b_depth,
                self.b_col, self.slice_depth)


@dataclasses.dataclass(frozen=True)
class _Geometry:
    """One pass's geometry: tiles per image, buffer sizes (elements) and the GEMM."""

    tiles_h: int
    tiles_w: int
    buffers: dict[str, int]  #: elements, by the names of `_BUFFERS`
    gemm: _Gemm


#: The workspace buffers of the non-fused kernels, by the name the kernels know them by.
_BUFFERS = {"V": "V (the first input's transformed tiles)", "U": "U (the second input transformed)",
            "M": "M (the products)"}


def _geometry(p: ConvProblem, pass_: str, layout: str, m: int) -> _Geometry:
    alpha2 = (m + _R - 1) ** 2
    out_h, out_w = (p.h, p.w) if pass_ == "bwd_data" else (p.p, p.q)
    tiles_h, tiles_w = ceil_div(out_h, m), ceil_div(out_w, m)
    tiles = p.n * tiles_h * tiles_w
    if pass_ == "bwd_filter":  # (K × T)·(T × C): U holds dy's tiles, V x's
        k_ch, k_tile = _tile_strides(layout, p.k, tiles)
        c_ch, c_tile = _tile_strides(layout, p.c, tiles)
        gemm = _Gemm("U", "V", p.k, p.c, tiles, k_ch, k_tile, c_tile, c_ch, alpha2)
        sizes = (p.c * tiles, p.k * tiles)
    else:
        cin, cout = (p.k, p.c) if pass_ == "bwd_data" else (p.c, p.k)
        # U is [k][c]: strides of the filter matrix's output and input channels.
        f_out, f_in = (1, p.c) if pass_ == "bwd_data" else (p.c, 1)
        i_ch, i_tile = _tile_strides(layout, cin, tiles)
        if layout == "nchw":  # (cout × cin)·(cin × T): products [channel][tile]
            gemm = _Gemm("U", "V", cout, tiles, cin, f_out, f_in, i_ch, i_tile, alpha2)
        else:  # (T × cin)·(cin × cout): products [tile][channel]
            gemm = _Gemm("V", "U", tiles, cout, cin, i_tile, i_ch, f_in, f_out, alpha2)
        sizes = (cin * tiles, p.k * p.c)
    buffers = {"V": alpha2 * sizes[0], "U": alpha2 * sizes[1], "M": gemm.product_size}
    return _Geometry(tiles_h, tiles_w, buffers, gemm)


_Step = Callable[[object, object, object], None]


def _steps(p: ConvProblem, pass_: str, geo: _Geometry, launch: kernels.Launcher,
           buf: dict) -> dict[str, _Step]:
    """The launches of one pass by phase, each a callable (a, b, out) of the pass's operands."""
    th, tw, g = geo.tiles_h, geo.tiles_w, geo.gemm
    tiles = p.n * th * tw

    def transform(name: str, count: int, *sizes: int) -> Callable:
        """Kernel `name`, one thread per element of `count`, as a callable of its two arrays."""
        return launch.kernel(name).bind(ceil_div(count, THREADS), THREADS, sizes)

    gemm = launch.kernel("wino_gemm").bind(g.grid, GEMM["GEMM_THREADS"], g.args)

    def product(a, b, out) -> None:
        gemm(buf[g.a], buf[g.b], buf["M"])

    if pass_ == "bwd_filter":
        first = transform("wgrad_input_transform", p.c * tiles, p.n, p.c, p.h, p.w, th, tw,
                          p.pad)
        second = transform("wgrad_dy_transform", p.k * tiles, p.n, p.k, p.p, p.q, th, tw)
        output = transform("wgrad_output_transform", p.k * p.c, p.k, p.c, g.splits)
    else:
        bwd = pass_ == "bwd_data"
        cin, cout, in_h, in_w, out_h, out_w = ((p.k, p.c, p.p, p.q, p.h, p.w) if bwd else
                                               (p.c, p.k, p.h, p.w, p.p, p.q))
        first = transform("wino_input_transform", cin * tiles, p.n, cin, in_h, in_w, th, tw,
                          _R - 1 - p.pad if bwd else p.pad)
        second = transform("wino_filter_transform", p.k * p.c, p.k, p.c, int(bwd))
        output = transform("wino_output_transform", cout * tiles, p.n, cout, out_h, out_w, th,
                           tw, g.splits)
    steps = (lambda a, b, out: first(a, buf["V"]),
             lambda a, b, out: second(b, buf["U"]),
             product,
             lambda a, b, out: output(buf["M"], out))
    return dict(zip(phase_names(pass_), steps))


class _WinogradKernels(kernel_base.KernelImplementation, Winograd):
    """F(m×m, 3×3) through kernels/winograd.cu; `m` by subclass.

    What Winograd refuses (filters other than 3x3, stride, dilation, groups) is the CPU
    implementation's, so that both refuse the same problems alike; the kernel base comes first
    among the bases, so that its precisions, limits and workspace are the ones that apply."""

    def refuses(self, problem: ConvProblem, pass_: str, layout: str,
                precision: str) -> str | None:
        return Winograd.supports(self, problem, pass_, layout, precision)

    def workspace_buffers(self, problem: ConvProblem, pass_: str, layout: str
                          ) -> dict[str, int]:
        """The transformed tiles of both inputs and the GEMM's (partial) products."""
        buffers = _geometry(problem, pass_, layout, self.m).buffers
        return {_BUFFERS[name]: size for name, size in buffers.items()}

    def phases(self, problem: ConvProblem, pass_: str, layout: str, precision: str) -> list[str]:
        return phase_names(pass_)

    def describe(self, problem, pass_, layout, precision) -> str:
        g = _geometry(problem, pass_, layout, self.m).gemm
        shapes = f"({g.rows}x{g.depth})·({g.depth}x{g.cols})"
        sliced = f", reduction in {g.splits} slices" if g.splits > 1 else ""
        return f"{super().describe(problem, pass_, layout, precision)} {shapes}{sliced}"

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        launch = kernels.launcher(self.backend, "winograd", CONFIGURATIONS[self.m, layout])
        geo = _geometry(problem, pass_, layout, self.m)
        xp = launch.xp
        buf = {name: xp.empty(size, dtype=xp.float32) for name, size in geo.buffers.items()}
        return Phased(_steps(problem, pass_, geo, launch, buf))


# --- fused -------------------------------------------------------------------------------------
def _fused_geometry(p: ConvProblem, pass_: str, m: int) -> dict:
    """wino_fused's launch for fwd or bwd_data: its grid, threads and arguments after the three
    arrays, and the transformed filters' size (elements)."""
    f = FUSED_TILES[m]
    bwd = pass_ == "bwd_data"
    cin, cout, in_h, in_w, out_h, out_w = ((p.k, p.c, p.p, p.q, p.h, p.w) if bwd else
                                           (p.c, p.k, p.h, p.w, p.p, p.q))
    tiles_h, tiles_w = ceil_div(out_h, m), ceil_div(out_w, m)
    tiles = p.n * tiles_h * tiles_w
    # u is [ξ][k][c]: element (output channel, input channel) of the pass at o·u_out + i·u_in.
    u_out, u_in = (1, p.c) if bwd else (p.c, 1)
    threads = (f["FUSED_BK"] // f["FUSED_MK"]) * (f["FUSED_BT"] // f["FUSED_MT"])
    return {"grid": (ceil_div(tiles, f["FUSED_BT"]), ceil_div(cout, f["FUSED_BK"])),
            "threads": threads, "tiles_h": tiles_h, "tiles_w": tiles_w,
            "args": (p.n, cin, in_h, in_w, cout, out_h, out_w, tiles_h, tiles_w,
                     _R - 1 - p.pad if bwd else p.pad, u_out, u_in),
            "filters": (m + _R - 1) ** 2 * p.k * p.c}


class _FusedWinogradKernels(_WinogradKernels):
    """F(m×m, 3×3) forward form in one kernel (`wino_fused`) after the filter transform."""

    def refuses(self, problem: ConvProblem, pass_: str, layout: str,
                precision: str) -> str | None:
        if pass_ == "bwd_filter":
            return (f"{self.algo} fuses the forward form (fwd, bwd_data) only; the weight "
                    f"gradient is winograd-{self.m}x{self.m}'s (non-fused, as in cuDNN)")
        return super().refuses(problem, pass_, layout, precision)

    def check_launch(self, problem: ConvProblem, pass_: str, layout: str) -> None:
        kernel_base.check_grid(_fused_geometry(problem, pass_, self.m)["grid"])

    def workspace_buffers(self, problem: ConvProblem, pass_: str, layout: str
                          ) -> dict[str, int]:
        """The transformed filters: the one buffer `prepare` allocates."""
        return {"the transformed filters": _fused_geometry(problem, pass_, self.m)["filters"]}

    def phases(self, problem: ConvProblem, pass_: str, layout: str, precision: str) -> list[str]:
        return [f"transform {OPERAND_NAMES[pass_][1]}", phases.FUSED]

    def describe(self, problem, pass_, layout, precision) -> str:
        f = FUSED_TILES[self.m]
        m = self.m
        return (f"F({m}x{m}, {_R}x{_R}) fused: input transform, {(m + _R - 1) ** 2} products "
                f"and output transform in one kernel, blocks of {f['FUSED_BK']} channels x "
                f"{f['FUSED_BT']} tiles")

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        launch = kernels.launcher(self.backend, "winograd", CONFIGURATIONS[self.m, layout])
        geometry = _fused_geometry(problem, pass_, self.m)
        u = launch.xp.empty(geometry["filters"], dtype=launch.xp.float32)
        p, bwd = problem, int(pass_ == "bwd_data")
        filters = launch.kernel("wino_filter_transform").bind(
            ceil_div(p.k * p.c, THREADS), THREADS, (p.k, p.c, bwd))
        fused = launch.kernel("wino_fused").bind(geometry["grid"], geometry["threads"],
                                                 geometry["args"])

        def transform(a, w, out) -> None:
            filters(w, u)

        def run(a, w, out) -> None:
            fused(a, u, out)

        names = self.phases(problem, pass_, layout, precision)
        return Phased(dict(zip(names, (transform, run))))


#: The fused kernels per tile m: their twin's arithmetic and tolerance, only the transformed
#: filters as workspace, no weight gradient (`counts.WinogradCount`'s `fused`).
FUSED = {m: winograd(m, WINOGRAD[m].tolerance, "winograd-fused", fused=True) for m in TILE_SIZES}


def _per_tile(base: type, algorithms: dict) -> list[type]:
    """`base` with each tile size m of TILE_SIZES, registered as `algorithms[m]`."""
    name = base.__name__.lstrip("_")
    return [kernel_base.register_kernels(algorithms[m])(
        type(f"{name}{m}x{m}", (base,), {"m": m, "__module__": __name__}))
        for m in TILE_SIZES]


WinogradKernels2x2, WinogradKernels4x4 = _per_tile(_WinogradKernels, WINOGRAD)
FusedWinogradKernels2x2, FusedWinogradKernels4x4 = _per_tile(_FusedWinogradKernels, FUSED)
