"""Operands and the float64 reference every implementation is checked against.

Operands are seeded standard-normal data, never zeros (zeros hide unwritten outputs and wrong
indexing). They are drawn in NCHW and transposed to the layout asked for, so both layouts of one
seed hold the same numbers and share one reference. The reference is PyTorch's convolution in
float64 — an implementation independent of all of ours.
"""

from __future__ import annotations

import numpy as np

from ..core.problem import LAYOUTS, PASSES, ConvProblem, check_choice


def _bfloat16():
    """NumPy's bfloat16 (ml_dtypes', which CuPy's is too), or None where it is not installed."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


BFLOAT16 = _bfloat16()
#: Array types the harness makes operands in, per precision (tf32 computes on fp32 storage;
#: bf16 needs ml_dtypes, a dependency: without it bf16 has no array type and does not run).
DTYPES = {"fp64": np.float64, "fp32": np.float32, "tf32": np.float32, "fp16": np.float16,
          **({"bf16": BFLOAT16} if BFLOAT16 is not None else {})}

#: NCHW -> layout axis order, for activations and filters alike (KCRS -> KRSC), and back.
_TO_LAYOUT = {"nchw": (0, 1, 2, 3), "nhwc": (0, 2, 3, 1)}
_FROM_LAYOUT = {"nchw": (0, 1, 2, 3), "nhwc": (0, 3, 1, 2)}


def _transposed(a, layout: str, order: dict):
    check_choice("layout", layout, LAYOUTS)
    if layout == "nchw":
        return a
    return _array_module(a).ascontiguousarray(a.transpose(order[layout]))


def to_layout(a, layout: str):
    """An NCHW (or KCRS) array as a contiguous array in `layout` (works for NumPy and CuPy)."""
    return _transposed(a, layout, _TO_LAYOUT)


def from_layout(a, layout: str):
    """An array in `layout` as a contiguous NCHW (or KCRS) array."""
    return _transposed(a, layout, _FROM_LAYOUT)


def array_module(backend: str):
    """NumPy for `numpy` and `emu`, CuPy for `cuda`: where the operands of a backend live."""
    if backend == "cuda":
        import cupy

        return cupy
    return np


def _array_module(a):
    mod = type(a).__module__.split(".")[0]
    if mod == "cupy":
        import cupy

        return cupy
    return np


def random_operands(problem: ConvProblem, pass_: str, layout: str = "nchw",
                    dtype=np.float32, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The two inputs of `pass_`, standard normal, in `layout` and `dtype`, on the host."""
    a_shape, b_shape, _ = problem.operand_shapes(pass_, "nchw")
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(a_shape).astype(dtype)
    b = rng.standard_normal(b_shape).astype(dtype)
    return to_layout(a, layout), to_layout(b, layout)


def nan_output(problem: ConvProblem, pass_: str, layout: str, dtype=np.float32, xp=np):
    """The output buffer of a pass filled with NaN, so an unwritten element fails the check."""
    shape = problem.operand_shapes(pass_, layout)[2]
    return xp.full(shape, xp.nan, dtype=dtype)


def reference(problem: ConvProblem, pass_: str, layout: str, a, b) -> np.ndarray:
    """The pass computed in float64 by PyTorch on the CPU, returned in `layout`.

    `a` and `b` may be NumPy or CuPy arrays of any float dtype, in `layout`.
    """
    return _float64_pass(problem, pass_, layout, a, b)


def magnitudes(problem: ConvProblem, pass_: str, layout: str, a, b) -> np.ndarray:
    """The pass on the operands' absolute values, in float64: each element the sum of its
    terms' magnitudes, which bounds its rounding error (`verify.magnitude_floor`)."""
    return _float64_pass(problem, pass_, layout, abs(_to_host(a)), abs(_to_host(b)))


def _float64_pass(problem: ConvProblem, pass_: str, layout: str, a, b) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    check_choice("pass", pass_, PASSES)
    ta, tb = (torch.from_numpy(np.asarray(_to_host(from_layout(v, layout)), dtype=np.float64))
              for v in (a, b))
    # torch pads both sides alike: a padding that differs before and after is x padded (or
    # cropped) explicitly, and dx cropped back (zeros where no output reads x).
    sym, explicit = problem.symmetric_part()
    kw = problem.torch_args()
    if pass_ == "fwd":
        out = F.conv2d(F.pad(ta, explicit), tb, **kw)
    elif pass_ == "bwd_data":
        out = torch.nn.grad.conv2d_input(sym.x_shape("nchw"), tb, ta, **kw)
        out = F.pad(out, tuple(-v for v in explicit))
    else:
        out = torch.nn.grad.conv2d_weight(F.pad(ta, explicit), problem.w_shape("nchw"), tb, **kw)
    return to_layout(out.numpy(), layout)


def _to_host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a
