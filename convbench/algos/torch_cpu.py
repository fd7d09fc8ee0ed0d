"""`torch-cpu`: PyTorch's own CPU convolution (oneDNN where it applies), the CPU baseline.

NHWC runs through `channels_last` tensors, which is how PyTorch asks oneDNN for that layout;
the NumPy inputs are shared with torch without a copy. torch allocates its own result, which is
copied into the caller's output buffer: one pass over the output, inside the timed call.
"""

from __future__ import annotations

import numpy as np

from ..problem import ConvProblem
from ..registry import register


def _view(a: np.ndarray, layout: str):
    """A torch NCHW-indexed view of a NumPy array stored in `layout` (no copy)."""
    import torch

    t = torch.from_numpy(a)
    return t if layout == "nchw" else t.permute(0, 3, 1, 2)


@register("torch-cpu", "numpy")
class TorchCPU:
    precisions = ("fp64", "fp32")

    def supports(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        return None

    def describe(self, problem, pass_, layout, precision) -> str:
        import torch

        return f"torch {torch.__version__}, {torch.get_num_threads()} threads"

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        import torch

        kw = dict(stride=[problem.stride] * 2, padding=[problem.pad] * 2,
                  dilation=[problem.dilation] * 2, transposed=False, output_padding=[0, 0],
                  groups=problem.groups)
        mask = {"fwd": None, "bwd_data": [True, False, False],
                "bwd_filter": [False, True, False]}[pass_]
        x_shape, w_shape = problem.x_shape("nchw"), problem.w_shape("nchw")
        fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format

        def run(a, b, out):
            ta, tb, tout = _view(a, layout), _view(b, layout), _view(out, layout)
            with torch.no_grad():
                if pass_ == "fwd":
                    res = torch.ops.aten.convolution(ta, tb, None, **kw)
                elif pass_ == "bwd_data":
                    # dy, w -> dx: the input tensor only lends its shape and memory format.
                    x = torch.empty(x_shape, dtype=tb.dtype).to(memory_format=fmt)
                    res = torch.ops.aten.convolution_backward(
                        ta, x, tb, None, output_mask=mask, **kw)[0]
                else:
                    w = torch.empty(w_shape, dtype=ta.dtype).to(memory_format=fmt)
                    res = torch.ops.aten.convolution_backward(
                        tb, ta, w, None, output_mask=mask, **kw)[1]
                tout.copy_(res)

        return run
