"""The kernel wrappers' base: what every implementation through kernels/*.cu shares — one class
for `cuda` and `emu` (`register_kernels`), the limits every kernel has (32-bit indexing, grid
sizes), and the split-K sum. The sources and launches are `cuda.kernels`'.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from ..core.problem import ConvProblem
from ..cuda import emu
from ..cuda.kernels import Launcher, available
from . import registry
from .phases import OPERAND_NAMES
from .traits import Algorithm

#: The kernels index with 32-bit ints: every tensor and workspace buffer has fewer elements.
INDEX_LIMIT = 2**31
#: CUDA's limit on a grid's y and z (x goes to 2^31 - 1).
GRID_YZ_MAX = 65535


def ceil_div(a: int, b: int) -> int:
    """The blocks (tiles, slices) of `b` that cover `a`."""
    return -(-a // b)


def axis_args(p: ConvProblem) -> tuple[int, int, int, int, int, int]:
    """A problem's per-axis geometry as the kernels take it: stride_h, stride_w, pad_h, pad_w,
    dil_h, dil_w (each axis apart, so a per-axis problem runs as any other). The kernels take
    the padding before (top, left) only: with the output size P, Q given, they read no padding
    after, so a problem padded unequally before and after runs as any other."""
    return p.stride_h, p.stride_w, p.pad_top, p.pad_left, p.dil_h, p.dil_w


def check_grid(*grids: tuple[int, ...]) -> None:
    """Raises ValueError(reason) for the first grid past CUDA's limit in y or z."""
    for grid in grids:
        if max(grid[1:], default=1) > GRID_YZ_MAX:
            raise ValueError(f"grid {grid} exceeds the CUDA limit of {GRID_YZ_MAX} in y or z")


def _over_index_limit(sizes: Mapping[str, int]) -> str | None:
    """The reason if an array of `sizes` (name -> elements) is too large to index, else None."""
    for name, count in sizes.items():
        if count >= INDEX_LIMIT:
            return (f"{name} has {count:,} elements, 2^31 or more: the kernels index with "
                    f"32-bit ints")
    return None


#: The last answers of `KernelImplementation._kernel_reason`, by (class, algo, problem, pass,
#: layout, precision): the `cuda` and `emu` wrappers of an algorithm are one class, and a
#: listing asks both about each case back to back (`convbench list --net convset`: 8498
#: problems, 2 backends). A few are enough; the oldest goes first.
_KERNEL_REASONS: dict = {}
_KERNEL_REASONS_KEPT = 64
_UNSEEN = object()


class KernelImplementation(registry.Implementation):
    """An implementation through kernels/*.cu: one class serves `cuda` and `emu`
    (`register_kernels`), the backend only changing what `launcher` hands back, so the emulated
    tests check exactly the launch code that runs on the GPU.

    `supports` is written once, here, from hooks: what the algorithm itself refuses comes first
    (`refuses`), then the limits every kernel has, each with its reason: 32-bit indexing of the
    operands, the wrapper's launch geometry (`check_launch`), 32-bit indexing of its workspace
    buffers (`workspace_buffers`), and on `emu` the emulator's budget (`emulated_work`).
    """

    precisions = ("fp32",)

    def available(self) -> str | None:
        return available(self.backend)

    def supports(self, problem: ConvProblem, pass_: str, layout: str,
                 precision: str) -> str | None:
        key = (type(self), self.algo, problem, pass_, layout, precision)
        reason = _KERNEL_REASONS.get(key, _UNSEEN)
        if reason is _UNSEEN:
            reason = self._kernel_reason(problem, pass_, layout, precision)
            if len(_KERNEL_REASONS) >= _KERNEL_REASONS_KEPT:
                del _KERNEL_REASONS[next(iter(_KERNEL_REASONS))]
            _KERNEL_REASONS[key] = reason
        if reason or self.backend != "emu":
            return reason
        return emu.too_big(self.emulated_work(problem, pass_, layout))

    def _kernel_reason(self, problem: ConvProblem, pass_: str, layout: str,
                       precision: str) -> str | None:
        """What the algorithm and its kernels' limits refuse, the same on `cuda` and `emu`."""
        operands = zip(OPERAND_NAMES[pass_], problem.operand_shapes(pass_, layout))
        reason = (self.refuses(problem, pass_, layout, precision)
                  or _over_index_limit({name: math.prod(s) for name, s in operands}))
        if reason:
            return reason
        try:
            self.check_launch(problem, pass_, layout)
            return _over_index_limit(self.workspace_buffers(problem, pass_, layout))
        except ValueError as exc:
            return str(exc)

    def refuses(self, problem: ConvProblem, pass_: str, layout: str,
                precision: str) -> str | None:
        """Why the algorithm does not run this problem at any size (FFT's stride > 1,
        Winograd's filters other than 3x3), or None."""
        return None

    def check_launch(self, problem: ConvProblem, pass_: str, layout: str) -> None:
        """Raises ValueError(reason) where the launch geometry does not fit the hardware (a grid
        past `GRID_YZ_MAX`, too much shared memory); nothing to check by default."""

    def workspace_buffers(self, problem: ConvProblem, pass_: str, layout: str
                          ) -> dict[str, int]:
        """Elements of each buffer `prepare` allocates, by the name a reason gives it."""
        return {}

    def workspace_bytes(self, problem: ConvProblem, pass_: str, layout: str,
                        precision: str) -> int:
        """The workspace buffers, float32: declared from the sizes `supports` checks, so the
        two cannot disagree."""
        return 4 * sum(self.workspace_buffers(problem, pass_, layout).values())

    def emulated_work(self, problem: ConvProblem, pass_: str, layout: str) -> int:
        """Multiply-adds the emulator would run, for `emu.too_big`: the direct convolution's."""
        return problem.flops // 2


def split_sum(launch: Launcher, reduce: Callable, sum_kernel: str, size: int, splits: int,
              threads: int) -> Callable:
    """``run(a, b, out)`` of a reduction split over `splits` slices: `reduce(a, b, partials)`
    writes one partial result of `size` elements per slice, then `sum_kernel(partials, out,
    size, splits)` adds them in slice order (deterministic). The partials are allocated here,
    once; with one slice `reduce` writes `out` itself."""
    if splits == 1:
        return reduce
    add = launch.kernel(sum_kernel).bind(ceil_div(size, threads), threads, (size, splits))
    part = launch.xp.empty(splits * size, dtype=launch.xp.float32)

    def run(a, b, out) -> None:
        reduce(a, b, part)
        add(part, out)

    return run


def register_kernels(algorithm: Algorithm) -> Callable[[type], type]:
    """Class decorator: register a kernel wrapper as `algorithm` on both `cuda` and `emu`."""
    def deco(cls: type) -> type:
        for backend in ("cuda", "emu"):
            registry.register(algorithm, backend)(cls)
        return cls

    return deco


