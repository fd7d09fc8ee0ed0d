"""convbench: which convolution algorithm and layout is fastest for this layer on this GPU.

Functional API (NumPy arrays for the `numpy` and `emu` backends, CuPy for `cuda`)::

    convbench.conv2d(x, w, stride, padding, *, algo="gemm", backend="numpy", layout="nchw")
    convbench.conv2d_backward_data(dy, w, input_shape, ..., algo=..., backend=..., layout=...)
    convbench.conv2d_backward_filter(x, dy, weight_shape, ..., algo=..., backend=..., layout=...)
"""

from .functional import (UnsupportedError, conv2d, conv2d_backward_data,
                         conv2d_backward_filter, run)
from .problem import LAYOUTS, PASSES, PRECISIONS, ConvProblem, parse_spec

__version__ = "0.1.0"

__all__ = ["ConvProblem", "parse_spec", "PASSES", "LAYOUTS", "PRECISIONS", "conv2d",
           "conv2d_backward_data", "conv2d_backward_filter", "run", "UnsupportedError",
           "__version__"]
