"""`gemm` on the GPU (`cuda`) and in the emulator (`emu`): explicit im2col/col2im
(kernels/im2col.cu) and our own tiled SGEMM (kernels/gemm.cu); `gemm-cublas` on `cuda`: the same
lowering with cuBLAS for the product, so that results separate the quality of our GEMM kernel
from the cost of the lowering.

Each pass is one lowering kernel and one product, in the layout's own arrangement (the column
matrix `col` is described in kernels/im2col.cu), with no transpose anywhere:

=========== =========================================== =====================================
pass        nchw: per image n and group g               nhwc: per group g
=========== =========================================== =====================================
fwd         im2col; y[n] = W · col[n]        (sgemm_nn) im2col; y = col · Wᵀ      (sgemm_nt)
bwd_data    col[n] = Wᵀ · dy[n] (sgemm_tn); col2im      col = dy · W (sgemm_nn); col2im
bwd_filter  im2col; dw = Σ_n dy[n] · col[n]ᵀ (sgemm_nt) im2col; dw = dyᵀ · col (sgemm_tn)
=========== =========================================== =====================================

The products are row-major with leading dimensions, so each lands directly in NKPQ / NPQK / KCRS
/ KRSC and reads its operands as stored: nchw's images are the batch index of one launch
(blockIdx.z), and bwd_filter's sums over images and output pixels run inside the kernel, split
across blocks into partial results when dw alone has too few tiles to fill the GPU (`Product`
is that description, `sgemm_geometry` sizes its launch, `sgemm_runner` launches it,
`cublas_runner` hands the same description to cuBLAS).

cuBLAS sums only over a product's k, so for it nchw's bwd_filter is laid out as one product a
group, k = N·P·Q, as nhwc's already is (`conv_product(..., one_product=True)`): dw = dy · colᵀ
(sgemm_nt) with col the column matrix of every image at once, [G][C/g·R·S][N·P·Q]
(`im2col_images`), and dy copied to [K][N·P·Q] (`swap_nk`; with one image it is that already).
cuBLAS then picks its own split of the reduction, and the copy is timed and counted as
workspace: it is what this baseline has to do, where our kernel reads dy as it is.

Tile sizes are chosen here, once: they are the -D defines of gemm.cu (declared to the compile
gate below); launch grids, shared memory and splits are derived from them here, from the problem
alone, so the emulator runs the configuration the GPU runs. The column matrix (and the partial
results of a split reduction, or cuBLAS's copy of dy) are allocated in `prepare`, outside the
timed call; `workspace_bytes` reports them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..core.fmt import first_line
from ..core.problem import LAYOUTS, ConvProblem
from ..cuda import kernels
from . import kernel_base
from .counts import GemmCount
from .gemm import GEMM
from .kernel_base import ceil_div
from .registry import register
from .traits import Algorithm

#: The SGEMM tile configurations (-D defines of gemm.cu). `large`: a 128×128 tile of C per block
#: of 256 threads, 8×8 per thread; `small`, for products too small to fill the GPU with large
#: tiles: 64×64 per block of 128 threads, 8×4 per thread. Both step K by BK = 8. MIN_BLOCKS is
#: the blocks per SM the launch bounds ask for (gemm.cu says why 1 for the large tile).
TILES = {"large": {"BM": 128, "BN": 128, "BK": 8, "TM": 8, "TN": 8, "MIN_BLOCKS": 1},
         "small": {"BM": 64, "BN": 64, "BK": 8, "TM": 8, "TN": 4, "MIN_BLOCKS": 4}}
kernels.declare("gemm", TILES.values())

LOWERING_THREADS = 256
#: The defines im2col.cu is compiled with, per layout.
LOWERING = {layout: {"NHWC": int(layout == "nhwc"), "THREADS": LOWERING_THREADS}
            for layout in LAYOUTS}
kernels.declare("im2col", LOWERING.values())

#: Large tiles are used when they still give this many blocks (two per SM of a 132-SM H100/H200,
#: splits of a reduction included); below that, small tiles give more parallelism.
LARGE_TILE_MIN_BLOCKS = 264
#: A split reduction aims at about this many blocks (a few waves on a large GPU), but never at
#: slices of fewer than MIN_SPLIT_TILES K-tiles (256 products per output element).
SPLIT_TARGET_BLOCKS = 1024
MIN_SPLIT_TILES = 32
#: Shared-memory row padding of the staged tiles, floats (kPad in gemm.cu).
SMEM_PAD = 4


def threads(tiles: str) -> int:
    """Threads per block of an SGEMM tile configuration."""
    t = TILES[tiles]
    return (t["BM"] // t["TM"]) * (t["BN"] // t["TN"])


def smem_bytes(tiles: str) -> int:
    """Dynamic shared memory of one SGEMM block: two copies of both staged tiles, as gemm.cu
    lays them out ([2][BK][BM + pad] then [2][BK][BN + pad] floats)."""
    t = TILES[tiles]
    return 4 * 2 * t["BK"] * (t["BM"] + SMEM_PAD + t["BN"] + SMEM_PAD)


# --- the product --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Product:
    """C = op(A) · op(B) as gemm.cu computes it: row-major operands with leading dimensions;
    op(A) is m×k, stored k×m when `trans_a`; op(B) is k×n, stored n×k when `trans_b`.

    Batched over `groups` (offsets *_group apart) and over `images` (offsets *_image apart):
    separate products per image, or, when `reduce`, one product per group summed over images.
    """

    trans_a: bool
    trans_b: bool
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    groups: int = 1
    images: int = 1
    reduce: bool = False
    a_group: int = 0
    a_image: int = 0
    b_group: int = 0
    b_image: int = 0
    c_group: int = 0
    c_image: int = 0  #: unused when `reduce`

    @property
    def entry(self) -> str:
        """The gemm.cu entry point: sgemm_<a><b>, n = as is, t = transposed."""
        return f"sgemm_{'nt'[self.trans_a]}{'nt'[self.trans_b]}"

    @property
    def c_extent(self) -> int:
        """Elements from C's start to one past the last a reduction writes (its partial-result
        size when split)."""
        return (self.groups - 1) * self.c_group + (self.m - 1) * self.ldc + self.n


@dataclass(frozen=True)
class SgemmGeometry:
    """How gemm.cu runs a `Product`: tile configuration, grid, and the split of a reduction."""

    product: Product
    tiles: str
    grid: tuple[int, int, int]
    tiles_per_split: int  #: K-tiles (over images × K) a block reduces
    splits: int  #: partial results a reduction is split into (1: none)

    @property
    def smem(self) -> int:
        return smem_bytes(self.tiles)

    @property
    def partial_elements(self) -> int:
        """Size of the partial-result buffer (0 unless the reduction is split)."""
        return self.splits * self.product.c_extent if self.splits > 1 else 0


def sgemm_geometry(product: Product, tiles: str | None = None) -> SgemmGeometry:
    """Tile configuration (by `LARGE_TILE_MIN_BLOCKS` unless given), grid and splits of a
    product. Raises ValueError(reason) past CUDA's grid limits, or for a split reduction into a
    C that is not contiguous."""
    p = product

    def geometry(name: str) -> SgemmGeometry:
        t = TILES[name]
        xy = (ceil_div(p.m, t["BM"]), ceil_div(p.n, t["BN"]))
        k_tiles = ceil_div(p.k, t["BK"])
        if not p.reduce:
            return SgemmGeometry(p, name, (*xy, p.groups * p.images), k_tiles, 1)
        total = p.images * k_tiles
        splits = max(1, min(ceil_div(SPLIT_TARGET_BLOCKS, xy[0] * xy[1] * p.groups),
                            total // MIN_SPLIT_TILES, kernel_base.GRID_YZ_MAX // p.groups))
        per_split = ceil_div(total, splits)
        splits = ceil_div(total, per_split)  # no empty slice
        return SgemmGeometry(p, name, (*xy, p.groups * splits), per_split, splits)

    if tiles is None:
        large = geometry("large")
        tiles = "large" if math.prod(large.grid) >= LARGE_TILE_MIN_BLOCKS else "small"
    chosen = geometry(tiles)
    kernel_base.check_grid(chosen.grid)
    if chosen.splits > 1 and (p.ldc != p.n or (p.groups > 1 and p.c_group != p.m * p.ldc)):
        raise ValueError("a split reduction sums whole partial results: C must be contiguous")
    return chosen


def sgemm_runner(backend: str, geo: SgemmGeometry) -> Callable:
    """``run(a, b, c)``: the product through gemm.cu on `backend`, launched as `geo` says
    (arrays: C-contiguous, float32, holding the operands at the product's offsets). A split
    reduction's partial results are allocated here, once."""
    launch = kernels.launcher(backend, "gemm", TILES[geo.tiles])
    p, block = geo.product, threads(geo.tiles)
    c_split = p.c_extent if geo.splits > 1 else 0 if p.reduce else p.c_image
    multiply = launch.kernel(p.entry).bind(
        geo.grid, block, (p.m, p.n, p.k, p.lda, p.ldb, p.ldc, p.groups, p.images,
                          geo.tiles_per_split, p.a_group, p.a_image, p.b_group, p.b_image,
                          p.c_group, c_split), geo.smem)
    return kernel_base.split_sum(launch, multiply, "gemm_sum_splits", p.c_extent, geo.splits, block)


def cublas_available() -> str | None:
    """None if CuPy can load cuBLAS here, else why not."""
    try:
        from cupy_backends.cuda.libs import cublas  # noqa: F401  (loads libcublas)
    except ImportError as exc:
        return f"CuPy cannot load cuBLAS: {first_line(exc)}"
    return None


@contextlib.contextmanager
def _fp32_cublas(handle: int):
    """cuBLAS in FP32: CUBLAS_DEFAULT_MATH never computes an sgemm with fewer mantissa bits than
    FP32 (no TF32, whatever CuPy's CUPY_TF32 says: that only selects compute types in CuPy's own
    matmul); host pointer mode for alpha and beta; the current CuPy stream. Mode restored after."""
    import cupy
    from cupy_backends.cuda.libs import cublas

    math_mode, pointer_mode = cublas.getMathMode(handle), cublas.getPointerMode(handle)
    cublas.setMathMode(handle, cublas.CUBLAS_DEFAULT_MATH)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    try:
        yield
    finally:
        cublas.setMathMode(handle, math_mode)
        cublas.setPointerMode(handle, pointer_mode)


@dataclass(frozen=True)
class CublasCall:
    """One cublasSgemmStridedBatched of a product: the element offsets of A, B and C, the batch
    and its (A, B, C) strides."""

    a: int
    b: int
    c: int
    batch: int
    strides: tuple[int, int, int]


def cublas_calls(product: Product) -> list[CublasCall]:
    """The cuBLAS calls of a product, in order: one strided-batched call per group, the images
    its batch. cuBLAS sums only over k, so a product summed over images is refused (ValueError):
    it is laid out as one, k = N·P·Q (`conv_product(..., one_product=True)`), and cuBLAS splits
    that reduction as it sees fit."""
    p = product
    if p.reduce and p.images > 1:
        raise ValueError("cuBLAS sums over k only: lay a sum over images out as one product "
                         "(conv_product(..., one_product=True))")
    return [CublasCall(g * p.a_group, g * p.b_group, g * p.c_group, p.images,
                       (p.a_image, p.b_image, p.c_image)) for g in range(p.groups)]


def cublas_runner(product: Product) -> Callable:
    """``run(a, b, c)``: the product by cuBLAS (CuPy arrays), as `cublas_calls` plans it. cuBLAS
    is column-major, so the row-major C = op(A)·op(B) is computed as Cᵀ = op(B)ᵀ·op(A)ᵀ: B goes
    first, and an operand stored as is (row-major) is exactly the transpose cuBLAS reads."""
    import cupy
    from cupy_backends.cuda.libs import cublas

    p, calls = product, cublas_calls(product)
    handle = cupy.cuda.device.get_cublas_handle()
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    op = {False: cublas.CUBLAS_OP_N, True: cublas.CUBLAS_OP_T}

    def run(a, b, c):
        with _fp32_cublas(handle):
            for call in calls:
                cublas.sgemmStridedBatched(
                    handle, op[p.trans_b], op[p.trans_a], p.n, p.m, p.k, one.ctypes.data,
                    b.data.ptr + 4 * call.b, p.ldb, call.strides[1],
                    a.data.ptr + 4 * call.a, p.lda, call.strides[0], zero.ctypes.data,
                    c.data.ptr + 4 * call.c, p.ldc, call.strides[2], call.batch)

    return run


# --- the convolution ----------------------------------------------------------------------------
def conv_product(problem: ConvProblem, pass_: str, layout: str, one_product: bool = False
                 ) -> tuple[Product, str, str]:
    """The product of a pass and which operands it multiplies: (product, A, B), with A and B
    among "w", "dy", "col"; C is the pass's output, or col in bwd_data (see the module's table).
    `one_product`: nchw's bwd_filter as one product a group over k = N·P·Q, reading
    `im2col_images`' col and dy as [K][N·P·Q] (`images_in_k`), for cuBLAS, which cannot sum
    over images itself; every other product is the same either way.
    """
    p = problem
    kg, crs, pq = p.k // p.groups, p.cg * p.r * p.s, p.p * p.q
    w_group = kg * crs
    if one_product and images_in_k(pass_, layout):  # col: [G][C/g·R·S][N·P·Q]
        npq = p.n * pq
        return (Product(False, True, kg, crs, npq, npq, npq, crs, p.groups, reduce=True,
                        a_group=kg * npq, b_group=crs * npq, c_group=w_group), "dy", "col")
    if layout == "nhwc":  # col: [G][N·P·Q][R·S·C/g]
        npq = p.n * pq
        col_group = npq * crs
        return {
            "fwd": (Product(False, True, npq, kg, crs, crs, crs, p.k, p.groups,
                            a_group=col_group, b_group=w_group, c_group=kg), "col", "w"),
            "bwd_data": (Product(False, False, npq, crs, kg, p.k, crs, crs, p.groups,
                                 a_group=kg, b_group=w_group, c_group=col_group), "dy", "w"),
            "bwd_filter": (Product(True, False, kg, crs, npq, p.k, crs, crs, p.groups,
                                   reduce=True, a_group=kg, b_group=col_group, c_group=w_group),
                           "dy", "col"),
        }[pass_]
    # nchw, col: [N][G][C/g·R·S][P·Q]; y and dy: [N][G][K/g][P·Q]
    col_image, col_group = p.c * p.r * p.s * pq, crs * pq
    y_image, y_group = p.k * pq, kg * pq
    return {
        "fwd": (Product(False, False, kg, pq, crs, crs, pq, pq, p.groups, p.n,
                        a_group=w_group, b_group=col_group, b_image=col_image,
                        c_group=y_group, c_image=y_image), "w", "col"),
        "bwd_data": (Product(True, False, crs, pq, kg, crs, pq, pq, p.groups, p.n,
                             a_group=w_group, b_group=y_group, b_image=y_image,
                             c_group=col_group, c_image=col_image), "w", "dy"),
        "bwd_filter": (Product(False, True, kg, crs, pq, pq, pq, crs, p.groups, p.n,
                               reduce=True, a_group=y_group, a_image=y_image,
                               b_group=col_group, b_image=col_image, c_group=w_group),
                       "dy", "col"),
    }[pass_]


def images_in_k(pass_: str, layout: str) -> bool:
    """Whether `conv_product(..., one_product=True)` lays the pass out otherwise than our SGEMM
    reads it: nchw's bwd_filter, whose sum over images becomes part of k."""
    return pass_ == "bwd_filter" and layout == "nchw"


def dy_copy_elements(problem: ConvProblem, pass_: str, layout: str) -> int:
    """Elements of dy copied to [K][N·P·Q] for the one product of `images_in_k`: all of dy, or 0
    where the pass is not laid out so or there is one image (dy is [K][P·Q] as it is)."""
    p = problem
    return p.n * p.k * p.p * p.q if images_in_k(pass_, layout) and p.n > 1 else 0


def dy_copier(lowering: kernels.Launcher, problem: ConvProblem, pass_: str, layout: str
              ) -> Callable | None:
    """``arrange(dy)``: dy as the product of `images_in_k` reads it, [K][N·P·Q], copied by
    im2col.cu's swap_nk into a buffer allocated here, once; None where dy is that already."""
    size = dy_copy_elements(problem, pass_, layout)
    if not size:
        return None
    p = problem
    copy = lowering.xp.empty(size, dtype=lowering.xp.float32)
    swap = lowering.kernel("swap_nk").bind(ceil_div(size, LOWERING_THREADS), LOWERING_THREADS,
                                           (p.n, p.k, p.p * p.q))

    def arrange(dy):
        swap(dy, copy)
        return copy

    return arrange


def col_elements(problem: ConvProblem) -> int:
    """Elements of the column matrix: every output pixel × every filter tap × every channel."""
    p = problem
    return p.n * p.c * p.r * p.s * p.p * p.q


def _sgemm_geometry(problem: ConvProblem, pass_: str, layout: str) -> SgemmGeometry:
    """How gemm.cu runs a pass's product."""
    return sgemm_geometry(conv_product(problem, pass_, layout)[0])


@kernel_base.register_kernels(GEMM)
class GemmKernels(kernel_base.KernelImplementation):
    """`gemm` through kernels/im2col.cu and kernels/gemm.cu."""

    asymmetric_pad = True  # im2col takes the padding before and the output size
    #: Whether the products are laid out `conv_product(..., one_product=True)`: for a GEMM that
    #: cannot sum over images (cuBLAS); our SGEMM sums them inside the kernel.
    one_product = False

    def check_launch(self, problem: ConvProblem, pass_: str, layout: str) -> None:
        _sgemm_geometry(problem, pass_, layout)

    def workspace_buffers(self, problem: ConvProblem, pass_: str, layout: str
                          ) -> dict[str, int]:
        """The column matrix, and the partial results of a split bwd_filter reduction."""
        return {"the im2col workspace": col_elements(problem),
                "the split reduction's partial results":
                    _sgemm_geometry(problem, pass_, layout).partial_elements}

    def describe(self, problem: ConvProblem, pass_: str, layout: str, precision: str) -> str:
        geo = _sgemm_geometry(problem, pass_, layout)
        t = TILES[geo.tiles]
        note = f"our SGEMM, {t['BM']}×{t['BN']} tiles"
        return note + (f", reduction in {geo.splits} slices" if geo.splits > 1 else "")

    def _multiplier(self, product: Product) -> Callable:
        return sgemm_runner(self.backend, sgemm_geometry(product))

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        product, a_name, b_name = conv_product(problem, pass_, layout, self.one_product)
        multiply = self._multiplier(product)
        lowering = kernels.launcher(self.backend, "im2col", LOWERING[layout])
        col = lowering.xp.empty(col_elements(problem), dtype=lowering.xp.float32)
        p = problem
        dims = (p.n, p.c, p.h, p.w, p.r, p.s, p.p, p.q, *kernel_base.axis_args(p), p.groups)
        if pass_ == "bwd_data":
            col2im = lowering.kernel("col2im").bind(
                ceil_div(p.n * p.c * p.h * p.w, LOWERING_THREADS), LOWERING_THREADS, dims)

            def run(dy, w, dx):
                operands = {"dy": dy, "w": w}
                multiply(operands[a_name], operands[b_name], col)
                col2im(col, dx)

            return run
        regrouped = self.one_product and images_in_k(pass_, layout)
        im2col = lowering.kernel("im2col_images" if regrouped else "im2col").bind(
            ceil_div(col.size, LOWERING_THREADS), LOWERING_THREADS, dims)
        second = "w" if pass_ == "fwd" else "dy"
        arrange = dy_copier(lowering, problem, pass_, layout) if regrouped else None

        def run(x, b, out):
            im2col(x, col)
            operands = {"col": col, second: arrange(b) if arrange else b}
            multiply(operands[a_name], operands[b_name], out)

        return run


#: Our lowering around cuBLAS's product: the library's kernel, exact, the direct flops.
GEMM_CUBLAS = Algorithm("gemm-cublas", family="gemm", origin="library", tolerance="exact",
                        reduction="none", counts=GemmCount(), deterministic=True)


@register(GEMM_CUBLAS, "cuda")
class GemmCublas(GemmKernels):
    """`gemm-cublas`: the lowering kernels of `gemm`, the product by cuBLAS in FP32, nchw's
    bwd_filter as one product a group over k = N·P·Q (`one_product`)."""

    one_product = True

    def available(self) -> str | None:
        return super().available() or cublas_available()

    def check_launch(self, problem: ConvProblem, pass_: str, layout: str) -> None:
        """cuBLAS takes any grid and splits its own reductions: nothing to check."""

    def workspace_buffers(self, problem: ConvProblem, pass_: str, layout: str
                          ) -> dict[str, int]:
        """The column matrix, and in nchw's bwd_filter dy copied to [K][N·P·Q] (cuBLAS's own
        workspace is not counted)."""
        return {"the im2col workspace": col_elements(problem),
                "dy copied to [K][N·P·Q]": dy_copy_elements(problem, pass_, layout)}

    def describe(self, problem: ConvProblem, pass_: str, layout: str, precision: str) -> str:
        product = conv_product(problem, pass_, layout, one_product=True)[0]
        calls = cublas_calls(product)
        note = (f"cuBLAS sgemm (CUBLAS_DEFAULT_MATH: FP32, no TF32), {len(calls)} strided-"
                f"batched call(s) of up to {calls[0].batch}")
        if not images_in_k(pass_, layout):
            return note
        copied = (", dy copied to [K][N·P·Q] by swap_nk"
                  if dy_copy_elements(problem, pass_, layout) else "")
        return (f"{note}, each one product of k = N·P·Q = {product.k} (cuBLAS splits the sum "
                f"over images itself) from im2col_images{copied}")

    def _multiplier(self, product: Product) -> Callable:
        return cublas_runner(product)
