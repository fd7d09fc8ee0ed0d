"""convbench: which convolution algorithm and layout is fastest for this layer on this GPU.

Functional API (NumPy arrays for the `numpy` and `emu` backends, CuPy for `cuda`)::

    convbench.conv2d(x, w, stride, padding, *, algo="gemm", backend="numpy", layout="nchw")
    convbench.conv2d_backward_data(dy, w, input_shape, ..., algo=..., backend=..., layout=...)
    convbench.conv2d_backward_filter(x, dy, weight_shape, ..., algo=..., backend=..., layout=...)

The names load on first use, so that importing a submodule (the CLI does) does not load NumPy
before `convbench.machine.threads` has set how idle threads wait.
"""

import importlib

__version__ = "0.1.0"

_LAZY = {
    "conv2d": "functional", "conv2d_backward_data": "functional",
    "conv2d_backward_filter": "functional", "run": "functional", "UnsupportedError": "functional",
    "ConvProblem": "core.problem", "parse_spec": "core.problem", "PASSES": "core.problem",
    "LAYOUTS": "core.problem", "PRECISIONS": "core.problem",
}

__all__ = [
    "LAYOUTS",
    "PASSES",
    "PRECISIONS",
    "ConvProblem",
    "UnsupportedError",
    "__version__",
    "conv2d",
    "conv2d_backward_data",
    "conv2d_backward_filter",
    "parse_spec",
    "run",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'convbench' has no attribute {name!r}")
