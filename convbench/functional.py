"""The functional API, shaped like `torch.nn.functional.conv2d` and `torch.nn.grad`.

Each call infers the `ConvProblem` from the array shapes in the layout named, checks the
implementation supports it, and runs it into a fresh output. For repeated calls on one shape the
prepared callable is memoized, so plans and compiled kernels are reused: per device and stream
(a prepared pass's workspace is used by one stream at a time), keeping its workspace but not the
arrays of its last call (a phased pass forgets them, `phases.Phased.forget`: a training step's
activations must not stay alive in the memory the next step is measured in). The cache is a
device cache (`registry.register_device_cache`): the runner empties it before each GPU case.
"""

from __future__ import annotations

import functools

import numpy as np

from .algos import registry
from .algos.registry import UnsupportedError
from .core.problem import LAYOUTS, PRECISION_OF_DTYPE, ConvProblem, check_choice


def _as_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {v!r}")
    return int(v)


def _per_axis(name: str, v):
    """stride, padding or dilation as torch takes them: one int for both spatial axes, or an
    (h, w) pair (which `ConvProblem` keeps as one int where the two agree). `padding` may also
    give an axis as (before, after): ((top, bottom), (left, right)), which torch cannot."""
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"{name} must be an int or an (h, w) pair, got {v!r}")
        if name == "padding" and any(isinstance(x, (tuple, list)) for x in v):
            return tuple(_per_axis(name, x) if isinstance(x, (tuple, list)) else
                         _as_int(name, x) for x in v)
        return (_as_int(name, v[0]), _as_int(name, v[1]))
    return _as_int(name, v)


def _nchw(shape, layout: str, what: str) -> tuple[int, int, int, int]:
    if len(shape) != 4:
        raise ValueError(f"{what} must be 4-D ({layout}), got shape {tuple(shape)}")
    return tuple(shape) if layout == "nchw" else (shape[0], shape[3], shape[1], shape[2])


def _precision(*arrays) -> str:
    dtypes = {str(a.dtype) for a in arrays}
    if len(dtypes) != 1:
        raise ValueError(f"operands must share one dtype, got {', '.join(sorted(dtypes))}")
    dtype = dtypes.pop()
    if dtype not in PRECISION_OF_DTYPE:
        raise ValueError(f"dtype {dtype} is not supported; use float32 or float64")
    return PRECISION_OF_DTYPE[dtype]


def _problem_from_shapes(x_nchw, w_kcrs, stride, padding, dilation, groups) -> ConvProblem:
    n, c, h, w = x_nchw
    k, cg, r, s = w_kcrs
    groups = _as_int("groups", groups)
    if groups <= 0 or c % groups or cg * groups != c:
        raise ValueError(f"weight has {cg} input channels per group, input has {c} channels "
                         f"in {groups} group(s)")
    return ConvProblem(n=n, c=c, h=h, w=w, k=k, r=r, s=s, stride=_per_axis("stride", stride),
                       pad=_per_axis("padding", padding),
                       dilation=_per_axis("dilation", dilation),
                       groups=groups)


@functools.lru_cache(maxsize=256)
def _prepared(algo, backend, problem, pass_, layout, precision, place=None):
    """The prepared pass; `place` (the array's device and the current stream, `_place`) only
    keys the cache."""
    impl = registry.get(algo, backend)
    reason = registry.impl_available(impl) or registry.supports(impl, problem, pass_, layout,
                                                                precision)
    if reason:
        raise UnsupportedError(f"{algo} on {backend}: {reason}")
    return impl.prepare(problem, pass_, layout, precision)


def run(problem: ConvProblem, pass_: str, a, b, *, algo: str, backend: str = "numpy",
        layout: str = "nchw", out=None):
    """Run one pass of `problem` on operands already in `layout`; returns the output."""
    check_choice("layout", layout, LAYOUTS)
    precision = _precision(a, b)
    a_shape, b_shape, out_shape = problem.operand_shapes(pass_, layout)
    for name, arr, shape in (("first operand", a, a_shape), ("second operand", b, b_shape)):
        if tuple(arr.shape) != shape:
            raise ValueError(f"{pass_}: {name} has shape {tuple(arr.shape)}, expected {shape}")
    if out is None:
        xp = np if isinstance(a, np.ndarray) else _cupy()
        out = xp.full(out_shape, xp.nan, dtype=a.dtype)
    elif tuple(out.shape) != out_shape:
        raise ValueError(f"{pass_}: out has shape {tuple(out.shape)}, expected {out_shape}")
    prepared_call(problem, pass_, a, b, out, algo=algo, backend=backend, layout=layout,
                  precision=precision)
    return out


#: NumPy dtype -> precision, looked up by the dtype object (its `.name` is a slow property).
_PRECISION_OF = {np.dtype(d): p for d, p in PRECISION_OF_DTYPE.items() if d != "bfloat16"}


def prepared_call(problem: ConvProblem, pass_: str, a, b, out, *, algo: str, backend: str,
                  layout: str, precision: str | None = None) -> None:
    """One pass into `out`, by the prepared pass of (algo, backend, problem, pass, layout,
    precision) (prepared once, then cached), with no check of the operands: for a caller
    whose shapes are the problem's by construction (`nn.Conv2d`, `run` after its checks).
    The pass forgets its operands after (a prepared pass keeps none alive between calls)."""
    precision = precision or _PRECISION_OF.get(a.dtype) or _precision(a, b)
    fn = _prepared(algo, backend, problem, pass_, layout, precision, _place(a))
    try:
        fn(a, b, out)
    finally:
        forget = getattr(fn, "forget", None)
        if forget is not None:
            forget()


registry.register_device_cache(_prepared.cache_clear)


def _place(a) -> tuple[int, int] | None:
    """(device id, current stream) of a CuPy array; None on the host."""
    if isinstance(a, np.ndarray):
        return None
    cupy = _cupy()
    return a.device.id, cupy.cuda.get_current_stream().ptr


def _cupy():
    import cupy

    return cupy


def conv2d(x, w, stride=1, padding=0, dilation=1, groups=1, *, algo: str = "direct",
           backend: str = "numpy", layout: str = "nchw", out=None):
    """y = conv(x, w), like `torch.nn.functional.conv2d` (cross-correlation), in `layout`."""
    check_choice("layout", layout, LAYOUTS)
    p = _problem_from_shapes(_nchw(x.shape, layout, "x"), _nchw(w.shape, layout, "w"),
                             stride, padding, dilation, groups)
    return run(p, "fwd", x, w, algo=algo, backend=backend, layout=layout, out=out)


def conv2d_backward_data(dy, w, input_shape, stride=1, padding=0, dilation=1, groups=1, *,
                         algo: str = "direct", backend: str = "numpy", layout: str = "nchw",
                         out=None):
    """dx from dy and w, like `torch.nn.grad.conv2d_input`; `input_shape` is x's, in `layout`."""
    check_choice("layout", layout, LAYOUTS)
    p = _problem_from_shapes(_nchw(input_shape, layout, "input_shape"),
                             _nchw(w.shape, layout, "w"), stride, padding, dilation, groups)
    return run(p, "bwd_data", dy, w, algo=algo, backend=backend, layout=layout, out=out)


def conv2d_backward_filter(x, dy, weight_shape, stride=1, padding=0, dilation=1, groups=1, *,
                           algo: str = "direct", backend: str = "numpy", layout: str = "nchw",
                           out=None):
    """dw from x and dy, like `torch.nn.grad.conv2d_weight`; `weight_shape` in `layout`."""
    check_choice("layout", layout, LAYOUTS)
    p = _problem_from_shapes(_nchw(x.shape, layout, "x"),
                             _nchw(weight_shape, layout, "weight_shape"), stride, padding,
                             dilation, groups)
    return run(p, "bwd_filter", x, dy, algo=algo, backend=backend, layout=layout, out=out)
