"""`torch-cpu`: PyTorch's own CPU convolution (oneDNN where it applies), the CPU baseline.

NHWC runs through `channels_last` tensors, which is how PyTorch asks oneDNN for that layout;
the NumPy inputs are shared with torch without a copy. torch allocates its own result, which is
copied into the caller's output buffer: a phase of its own (`_aten`), timed apart and left out
of the pass's time.
"""

from __future__ import annotations

from ..core.problem import ConvProblem
from ._aten import PHASES, Views, aten_phased
from .registry import Implementation, register


@register("torch-cpu", "numpy")
class TorchCPU(Implementation):
    precisions = ("fp64", "fp32")

    def supports(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        return None

    def describe(self, problem, pass_, layout, precision) -> str:
        import torch

        return f"torch {torch.__version__}, {torch.get_num_threads()} threads"

    def phases(self, problem, pass_, layout, precision) -> list[str]:
        return PHASES

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        return aten_phased(problem, pass_, Views(layout))
