"""`torch-cpu`: PyTorch's own CPU convolution (oneDNN where it applies), the CPU baseline.

NHWC runs through `channels_last` tensors, which is how PyTorch asks oneDNN for that layout;
the NumPy inputs are shared with torch without a copy. torch allocates its own result, which is
copied into the caller's output buffer: one pass over the output, inside the timed call.
"""

from __future__ import annotations

from ..problem import ConvProblem
from ..registry import Implementation, register
from ._aten import aten_pass, torch_view


@register("torch-cpu", "numpy")
class TorchCPU(Implementation):
    precisions = ("fp64", "fp32")

    def supports(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        return None

    def describe(self, problem, pass_, layout, precision) -> str:
        import torch

        return f"torch {torch.__version__}, {torch.get_num_threads()} threads"

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        import torch

        op = aten_pass(problem, pass_)

        def run(a, b, out):
            ta, tb, tout = (torch_view(v, layout) for v in (a, b, out))
            with torch.no_grad():
                tout.copy_(op(ta, tb, tout))

        return run
