"""`torch-cpu`: PyTorch's own CPU convolution (oneDNN where it applies), the CPU baseline.

NHWC runs through `channels_last` tensors, which is how PyTorch asks oneDNN for that layout;
the NumPy inputs are shared with torch without a copy. torch allocates its own result, which is
copied into the caller's output buffer: a phase of its own (`_aten`), timed apart and left out
of the pass's time.

bf16 runs where the CPU computes it itself (`host.bf16_flag`: AVX512_BF16, AMX-BF16, Arm's
BF16), oneDNN's bf16 kernels on bfloat16 operands and output; elsewhere it is `unsupported`, as
a library would emulate it through fp32 and the time would be the emulation's.
"""

from __future__ import annotations

from ..core.problem import ConvProblem
from ..machine import host
from ._aten import PHASES, Views, aten_phased
from .reference import DTYPES
from .registry import Implementation, register
from .traits import Algorithm

#: torch's own CPU convolution: its pick of kernel, judged exact, allowed any reduction (a
#: library may run a transform we do not count).
TORCH_CPU = Algorithm("torch-cpu", family="chosen", origin="torch", tolerance="exact",
                      reduction="any", counts=None, deterministic=True)


@register(TORCH_CPU, "numpy")
class TorchCPU(Implementation):
    precisions = ("fp64", "fp32", "bf16")

    def supports(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        if precision != "bf16":
            return None
        if host.bf16_flag() is None:
            return ("bf16 needs a CPU that computes it (avx512_bf16, amx_bf16 or bf16 among "
                    "its flags); this one would emulate it in fp32")
        if "bf16" not in DTYPES:
            return "bf16 needs NumPy's bfloat16: pip install ml-dtypes"
        return None

    def describe(self, problem, pass_, layout, precision) -> str:
        import torch

        unit = f"; bf16 on {host.bf16_flag()}" if precision == "bf16" else ""
        return f"torch {torch.__version__}, {torch.get_num_threads()} threads{unit}"

    def phases(self, problem, pass_, layout, precision) -> list[str]:
        return PHASES

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        return aten_phased(problem, pass_, Views(layout))
