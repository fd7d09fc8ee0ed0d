"""`fft` and `fft-tiled` on the GPU (`cuda`) and in the emulator (`emu`): cuFFT around the
kernels of kernels/fft.cu.

The math is `convbench.algos.fft`'s, on the same ``Th × Tw`` grid (``T = fast(max(H + pad, P,
R))`` per axis), except that no operand is stored reversed: x sits at (pad, pad), its padding
the grid's zero border, w and y (or dy) at the origin, and the passes differ only in which
factor is conjugated (the spectrum of the reversed tensor), so one spectrum serves every pass:

- fwd         Ŷ[f][n][k]  = Σ_c X̂[f][n][c] · conj(Ŵ[f][k][c])    y = x ⋆ w, a correlation
- bwd_data    dX̂[f][n][c] = Σ_k dŶ[f][n][k] · Ŵ[f][k][c]         dx = dy * w, a convolution
- bwd_filter  dŴ[f][k][c] = Σ_n conj(dŶ[f][n][k]) · X̂[f][n][c]   dw = x ⋆ dy, a correlation

`fft-tiled` is cuDNN's FFT_TILING: overlap-save on TILE × TILE grids, so the filter spectra are
TILE² rather than image-sized; the tiles are more items to the product, (n, tile, channel), and
nothing may wrap around a tile (`_bwd_data_starts`). `fft` is the one-tile case of the same
kernels.

Our kernels pack a tensor (NCHW or NHWC, read natively) onto the grids (`fft_pack`), multiply
the spectra in the item-major order cuFFT writes (`fft_product`), and crop and scale the inverse
(`fft_crop`); between them run cuFFT's batched R2C and C2R on `cuda` (planned in `prepare`), and
numpy.fft's on `emu`, which has no cuFFT. Each call transforms its inputs afresh, as cuDNN's FFT
does. Phases: ``transform <a>``, ``transform <b>``, ``product``, ``inverse <out>``.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..core.fmt import first_line
from ..core.problem import LAYOUTS, ConvProblem
from ..cuda import kernels
from . import kernel_base, registry
from .counts import FFTCount
from .fft import FFT, fft_refusal
from .kernel_base import ceil_div
from .phases import OPERAND_NAMES, Phased, phase_names
from .traits import Algorithm

#: PROD_MIN_BLOCKS: the product kernel's blocks per SM in its launch bounds (fft.cu says why 1).
TILES = {"COPY_TILE": 32, "COPY_THREADS": 256,
         "PROD_TF": 8, "PROD_TM": 32, "PROD_TN": 32, "PROD_TL": 8, "PROD_MM": 4, "PROD_MN": 8,
         "PROD_MIN_BLOCKS": 1}
#: The defines fft.cu is compiled with, per layout: the compile gate covers exactly these.
CONFIGURATIONS = {layout: {"NHWC": int(layout == "nhwc"), **TILES} for layout in LAYOUTS}
kernels.declare("fft", CONFIGURATIONS.values())

COPY_TILE, COPY_THREADS = TILES["COPY_TILE"], TILES["COPY_THREADS"]
PROD_THREADS = (TILES["PROD_TF"] * (TILES["PROD_TM"] // TILES["PROD_MM"])
                * (TILES["PROD_TN"] // TILES["PROD_MN"]))
#: `fft-tiled`'s transform size per axis, as cuDNN's FFT_TILING (32×32 tiles).
TILE = 32

#: Each tensor as A×B×H×W on the grid: its (outer, inner) channel-like dimensions and its
#: spatial extents, as names of `ConvProblem` fields.
_TENSORS = {"x": ("n", "c", ("h", "w")), "w": ("k", "c", ("r", "s")), "y": ("n", "k", ("p", "q"))}


def _x_at_pad(pad: int, r: int, tiled: bool) -> tuple[int, int, int]:
    """fwd's and bwd_filter's starts, tiled or not: x at pad, the rest at the origin."""
    return (pad, 0, 0)


def _bwd_data_starts(pad: int, r: int, tiled: bool) -> tuple[int, int, int]:
    """bwd_data's starts. Untiled, dx sits at pad and the taps reaching before dy's first row
    wrap around the grid's edge into the zero gap beyond dy. A tile has no such gap (its window
    of dy is full of the neighbours' rows), so nothing may wrap: dy's window starts r − 1 − pad
    rows before the tile's first dx row, and that row is read r − 1 cells in."""
    return (r - 1 - pad, 0, r - 1) if tiled else (0, 0, pad)


@dataclass(frozen=True)
class _Recipe:
    """One pass: its tensors (first input, second input, output) as x/w/y, where they start on an
    axis, and the product out[m][n] = Σ_l lhs[m][l] · rhs[l][n]
    per frequency."""

    tensors: tuple[str, str, str]
    #: (pad, filter extent, tiled) -> the grid cell where each tensor's first row (of a tile)
    #: sits; x at pad makes its zero padding the grid's zero border
    starts: Callable[[int, int, bool], tuple[int, int, int]]
    #: the image tensor the tiles partition (each of its rows in exactly one tile)
    partitioned: str
    mnl: tuple[str, str, str]  #: the problem dimensions that m, n and l run over
    lhs_is_first: bool  #: the first input is the left factor (else the second is)
    conj: tuple[bool, bool]  #: conjugate (lhs, rhs)


_RECIPES = {
    "fwd": _Recipe(("x", "w", "y"), _x_at_pad, "y", ("n", "k", "c"), True,
                   (False, True)),
    "bwd_data": _Recipe(("y", "w", "x"), _bwd_data_starts, "x",
                        ("n", "c", "k"), True, (False, False)),
    "bwd_filter": _Recipe(("x", "y", "w"), _x_at_pad, "y", ("k", "c", "n"),
                          False, (True, False)),
}


def _fast_len(n: int) -> int:
    """Smallest 2^a·3^b·5^c·7^d >= n: the sizes cuFFT transforms with its fastest radices."""
    def smooth(m: int) -> bool:
        for p in (2, 3, 5, 7):
            while m % p == 0:
                m //= p
        return m == 1

    return next(m for m in itertools.count(n) if smooth(m))


@dataclass(frozen=True)
class _Axis:
    """One spatial axis: the grid size, and the image tensors' tiles, `step` rows apart."""

    size: int
    step: int
    tiles: int
    starts: tuple[int, int, int]


def _axis(recipe: _Recipe, n: int, r: int, pad: int, tile: int | None) -> _Axis:
    """Untiled, the grid holds the whole padded image: ``fast(max(n + pad, m, r))`` cells (see
    the module docstring). Tiled, a grid of `tile` cells computes ``tile − r + 1`` rows of the
    partitioned tensor; an axis whose untiled grid fits in a tile, or whose filter is over half
    a tile (the tiles would mostly overlap), stays untiled."""
    m = n + 2 * pad - r + 1
    size = _fast_len(max(n + pad, m, r))
    if tile is None or size <= tile or 2 * r > tile:
        return _Axis(size, size, 1, recipe.starts(pad, r, False))
    step = tile - r + 1
    partitioned = n if recipe.partitioned == "x" else m
    return _Axis(tile, step, ceil_div(partitioned, step), recipe.starts(pad, r, True))


@dataclass(frozen=True)
class _Place:
    """One tensor on the grids, per axis (y, x): tile t's grid cell g holds tensor index
    t·step + g − start, for g < extent (`Placement` in kernels/fft.cu). A×B×H×W as in the kernels;
    the filter is never tiled."""

    a: int
    b: int
    h: int
    w: int
    start: tuple[int, int]
    step: tuple[int, int]
    tiles: tuple[int, int]
    extent: tuple[int, int]

    @property
    def items(self) -> int:
        return self.a * self.tiles[0] * self.tiles[1] * self.b


@dataclass(frozen=True)
class _Geometry:
    """Grid, placements and launch geometry of one (problem, pass, tiling); the layout only
    changes which compiled kernels run."""

    th: int
    tw: int
    tiles: tuple[int, int]
    places: tuple[_Place, _Place, _Place]  #: first input, second input, output
    product: tuple[int, ...]  #: fft_product's arguments after the three buffers
    lhs_is_first: bool

    @property
    def tf(self) -> int:
        return self.tw // 2 + 1

    @property
    def freqs(self) -> int:
        return self.th * self.tf

    @property
    def grid_elements(self) -> int:
        """The one real grid buffer, shared by the phases: the largest tensor's grids."""
        return max(p.items for p in self.places) * self.th * self.tw

    def copy_launch(self, place: _Place, to_grid: bool) -> tuple[tuple[int, int, int], tuple]:
        """(grid, scalar arguments) of fft_pack (to_grid) or fft_crop (less its scale)."""
        rows, cols, z = ((self.th, self.tw, place.items // place.b) if to_grid
                         else (place.h, place.w, place.a))
        grid = (rows * ceil_div(cols, COPY_TILE), ceil_div(place.b, COPY_TILE), z)
        args = (place.b, place.h, place.w, self.th, self.tw, *place.start, *place.step,
                *place.tiles)
        return grid, args + place.extent if to_grid else args

    @property
    def product_grid(self) -> tuple[int, int, int]:
        m, n = self.product[1], self.product[2]
        return (ceil_div(self.freqs, TILES["PROD_TF"]), ceil_div(n, TILES["PROD_TN"]),
                ceil_div(m, TILES["PROD_TM"]))

    def launch_grids(self) -> list[tuple[int, int, int]]:
        return [self.product_grid, *(self.copy_launch(p, i < 2)[0]
                                     for i, p in enumerate(self.places))]

    def spectrum_elements(self) -> list[int]:
        return [p.items * self.freqs for p in self.places]

    def workspace_bytes(self) -> int:
        return 4 * self.grid_elements + 8 * sum(self.spectrum_elements())

    def emulated_work(self) -> int:
        """Multiply-adds (and element moves) the emulator runs: 4 real per complex MAC of the
        product, one per grid element packed or cropped."""
        f, m, n, l = self.product[:4]
        return 4 * f * m * n * l + sum(p.items for p in self.places) * self.th * self.tw


@functools.lru_cache(maxsize=4096)  # pure, frozen: asked per layout, backend and check
def _geometry(problem: ConvProblem, pass_: str, tile: int | None) -> _Geometry:
    p, recipe = problem, _RECIPES[pass_]
    axes = (_axis(recipe, p.h, p.r, p.pad_h, tile), _axis(recipe, p.w, p.s, p.pad_w, tile))
    tiles = (axes[0].tiles, axes[1].tiles)
    # An image tensor's tiles are more images to the product: its items are (n, tile, channel).
    sizes = {"n": p.n * tiles[0] * tiles[1], "c": p.c, "k": p.k}

    def place(i: int, tensor: str) -> _Place:
        outer, inner, spatial = _TENSORS[tensor]
        image = tensor != "w"
        step = tuple(ax.step if image else ax.size for ax in axes)
        return _Place(getattr(p, outer), getattr(p, inner), *(getattr(p, d) for d in spatial),
                      start=tuple(ax.starts[i] for ax in axes), step=step,
                      tiles=tiles if image else (1, 1),
                      extent=step if tensor == recipe.partitioned else (axes[0].size,
                                                                         axes[1].size))

    places = tuple(place(i, t) for i, t in enumerate(recipe.tensors))
    first, second, out = recipe.tensors
    lhs, rhs = (first, second) if recipe.lhs_is_first else (second, first)
    m, n, l = recipe.mnl

    def stride(tensor: str, dim: str) -> int:
        outer, inner = _TENSORS[tensor][:2]
        return sizes[inner] if dim == outer else 1

    th, tw = axes[0].size, axes[1].size
    product = (th * (tw // 2 + 1), sizes[m], sizes[n], sizes[l], stride(lhs, m), stride(lhs, l),
               stride(rhs, l), stride(rhs, n), stride(out, m), stride(out, n),
               *map(int, recipe.conj))
    return _Geometry(th, tw, tiles, places, product, recipe.lhs_is_first)


# --- the transforms -------------------------------------------------------------------------------
@functools.lru_cache(maxsize=32)
def _cufft_plan(device: int, fft_type: str, items: int, th: int, tw: int):
    """A cuFFT plan for `items` contiguous 2-D transforms of th×tw, R2C or C2R, cached per shape
    (plans hold their work area on the GPU, so only the recent ones are kept). Made directly
    rather than by `get_fft_plan`, which refuses arrays that are also F-contiguous (1×1×n)."""
    from cupy.cuda import cufft

    real, cplx = (th, tw), (th, tw // 2 + 1)
    inner, outer = (real, cplx) if fft_type == "R2C" else (cplx, real)
    return cufft.PlanNd(real, inner, 1, math.prod(inner), outer, 1, math.prod(outer),
                        getattr(cufft, f"CUFFT_{fft_type}"), items, "C", 2, outer[1])


registry.register_device_cache(_cufft_plan.cache_clear)


class _CuFFT:
    """Batched 2-D R2C and C2R through cuFFT: unnormalized both ways."""

    name = "cuFFT"

    @staticmethod
    def forward(grid, spectrum) -> Callable[[], None]:
        import cupy
        from cupy.cuda import cufft

        plan = _cufft_plan(cupy.cuda.Device().id, "R2C", *grid.shape)
        return lambda: plan.fft(grid, spectrum, cufft.CUFFT_FORWARD)

    @staticmethod
    def inverse(spectrum, grid) -> Callable[[], None]:
        import cupy
        from cupy.cuda import cufft

        plan = _cufft_plan(cupy.cuda.Device().id, "C2R", *grid.shape)
        return lambda: plan.fft(spectrum, grid, cufft.CUFFT_INVERSE)


class _NumpyFFT:
    """The same transforms from numpy.fft, for the emulator (which has no cuFFT)."""

    name = "numpy.fft (the emulator has no cuFFT)"

    @staticmethod
    def forward(grid, spectrum) -> Callable[[], None]:
        return lambda: np.fft.rfft2(grid, out=spectrum)

    @staticmethod
    def inverse(spectrum, grid) -> Callable[[], None]:
        # irfft2 ignores `out` (NumPy 2.4), hence the copy; norm="forward": unscaled inverse.
        return lambda: np.copyto(grid, np.fft.irfft2(spectrum, s=grid.shape[1:], norm="forward"))


_TRANSFORMS = {"cuda": _CuFFT, "emu": _NumpyFFT}


# --- the implementation ---------------------------------------------------------------------------
@kernel_base.register_kernels(FFT)
class FFTKernels(kernel_base.KernelImplementation):
    """`fft` through cuFFT and kernels/fft.cu."""

    tile: int | None = None  #: transform size per axis of `fft-tiled`; None: one whole grid

    def available(self) -> str | None:
        reason = super().available()
        if reason is None and self.backend == "cuda":
            try:
                from cupy.cuda import cufft  # noqa: F401  (CuPy loads libcufft on first use)
            except ImportError as exc:
                return f"CuPy cannot load cuFFT: {first_line(exc)}"
        return reason

    def refuses(self, problem: ConvProblem, pass_: str, layout: str,
                precision: str) -> str | None:
        return fft_refusal(self.algo, problem)

    def check_launch(self, problem: ConvProblem, pass_: str, layout: str) -> None:
        kernel_base.check_grid(*_geometry(problem, pass_, self.tile).launch_grids())

    def workspace_buffers(self, problem: ConvProblem, pass_: str, layout: str
                          ) -> dict[str, int]:
        """The one real grid the phases share, and the three spectra (complex elements)."""
        geo = _geometry(problem, pass_, self.tile)
        spectra = zip(OPERAND_NAMES[pass_], geo.spectrum_elements())
        return {"the transform grid": geo.grid_elements,
                **{f"the spectrum of {name}": size for name, size in spectra}}

    def emulated_work(self, problem: ConvProblem, pass_: str, layout: str) -> int:
        return _geometry(problem, pass_, self.tile).emulated_work()

    def describe(self, problem, pass_, layout, precision) -> str:
        geo = _geometry(problem, pass_, self.tile)
        tiles = f", {geo.tiles[0]}x{geo.tiles[1]} tiles" if self.tile else ""
        return f"{_TRANSFORMS[self.backend].name}, transform {geo.th}x{geo.tw}{tiles}"

    def transform_grid(self, problem: ConvProblem, pass_: str) -> tuple[int, int, int]:
        """(transform height, width, tiles per image) as the kernels run this pass: cuFFT's
        fast sizes, cut into overlap-save tiles where `fft-tiled` tiles an axis."""
        geo = _geometry(problem, pass_, self.tile)
        return geo.th, geo.tw, geo.tiles[0] * geo.tiles[1]

    def workspace_bytes(self, problem, pass_, layout, precision) -> int:
        """The workspace buffers, the spectra complex64; cuFFT's own plan work areas are not
        counted."""
        return _geometry(problem, pass_, self.tile).workspace_bytes()

    def phases(self, problem, pass_, layout, precision) -> list[str]:
        return phase_names(pass_)

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        geo = _geometry(problem, pass_, self.tile)
        launch = kernels.launcher(self.backend, "fft", CONFIGURATIONS[layout])
        xp, fft = launch.xp, _TRANSFORMS[self.backend]
        flat_grid = xp.empty(geo.grid_elements, dtype=xp.float32)
        grids = [flat_grid[:p.items * geo.th * geo.tw].reshape(p.items, geo.th, geo.tw)
                 for p in geo.places]
        spectra = [xp.empty((p.items, geo.th, geo.tf), dtype=xp.complex64)
                   for p in geo.places]
        scale = 1.0 / (geo.th * geo.tw)

        def transform(i: int) -> Callable:
            blocks, args = geo.copy_launch(geo.places[i], to_grid=True)
            pack = launch.kernel("fft_pack").bind(blocks, COPY_THREADS, args)
            execute = fft.forward(grids[i], spectra[i])

            def run(tensor) -> None:
                pack(tensor, grids[i])
                execute()

            return run

        def inverse() -> Callable:
            blocks, args = geo.copy_launch(geo.places[2], to_grid=False)
            crop = launch.kernel("fft_crop").bind(blocks, COPY_THREADS, (*args, scale))
            execute = fft.inverse(spectra[2], grids[2])

            def run(tensor) -> None:
                execute()
                crop(grids[2], tensor)

            return run

        lhs, rhs = spectra[:2] if geo.lhs_is_first else spectra[1::-1]
        product = launch.kernel("fft_product").bind(geo.product_grid, PROD_THREADS, geo.product)
        first, second, out = transform(0), transform(1), inverse()
        names = phase_names(pass_)
        return Phased({
            names[0]: lambda a, b, y: first(a),
            names[1]: lambda a, b, y: second(b),
            names[2]: lambda a, b, y: product(lhs, rhs, spectra[2]),
            names[3]: lambda a, b, y: out(y),
        })


#: FFT over overlapping tiles of a fixed transform size, counted on those tiles.
FFT_TILED = Algorithm("fft-tiled", family="fft", origin="ours", tolerance="fft",
                      reduction="counted", counts=FFTCount(),
                      deterministic=True)


@kernel_base.register_kernels(FFT_TILED)
class FFTTiledKernels(FFTKernels):
    """`fft-tiled`: the same kernels over TILE × TILE transforms of overlapping tiles."""

    tile = TILE
