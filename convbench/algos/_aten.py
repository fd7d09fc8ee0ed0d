"""One pass as one aten call: shared by `torch-cpu` (oneDNN) and `cudnn` (cuDNN).

PyTorch picks the library from where the tensors live; the call, and how a layout becomes a
memory format (an NHWC array viewed with NCHW indexing is a `channels_last` tensor), is the same.
torch allocates the result itself, so a prepared pass is two phases (`convbench.algos.phases`): the
call, and the copy of its result into the harness's output, which the pass's time leaves out.
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.problem import ConvProblem
from .phases import CONVOLUTION, OUTPUT_COPY, Phased
from .reference import BFLOAT16

#: The phases of a pass run through torch.
PHASES = [CONVOLUTION, OUTPUT_COPY]


def torch_view(a, layout: str):
    """A torch NCHW-indexed view, without a copy, of an array (NumPy, CuPy or torch) stored in
    `layout`. A NumPy bfloat16 array (ml_dtypes', which DLPack does not carry) is shared as its
    16-bit words, viewed as torch's bfloat16."""
    import numpy as np
    import torch

    if isinstance(a, np.ndarray) and BFLOAT16 is not None and a.dtype == BFLOAT16:
        t = torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    else:
        t = torch.from_dlpack(a)
    return t if layout == "nchw" else t.permute(0, 3, 1, 2)


class Views:
    """torch views of the arrays of the last call, made once per set of arrays: the harness
    repeats a call on the same arrays, so a timed call spends no host time on DLPack. `clear`
    drops them (and so the arrays, for the memory trace)."""

    def __init__(self, layout: str):
        self.layout = layout
        self.clear()

    def __call__(self, a, b, out) -> tuple:
        if len(self._arrays) != 3 or any(x is not y for x, y in zip(self._arrays, (a, b, out))):
            self._arrays = (a, b, out)
            self._views = tuple(torch_view(v, self.layout) for v in self._arrays)
        return self._views

    def clear(self) -> None:
        self._arrays: tuple = ()
        self._views: tuple = ()


def aten_phased(problem: ConvProblem, pass_: str, views: Views,
                run: Callable[[Callable[[], None]], None] = lambda work: work()) -> Phased:
    """The pass as `PHASES`: torch's call, holding its result, then the copy of that result
    into `out`. `run(work)` runs each step's torch work (cuDNN's on its own thread, in its
    settings); the result lives from one step to the next, as it did inside one call."""
    import torch

    op, held = aten_pass(problem, pass_), []

    def convolution(a, b, out) -> None:
        ta, tb, tout = views(a, b, out)

        def work() -> None:
            with torch.no_grad():
                held[:] = [op(ta, tb, tout)]

        run(work)

    def copy(a, b, out) -> None:
        tout = views(a, b, out)[2]

        def work() -> None:
            with torch.no_grad():
                tout.copy_(held.pop())

        run(work)

    return Phased(dict(zip(PHASES, (convolution, copy))), on_forget=views.clear)


def aten_pass(problem: ConvProblem, pass_: str):
    """The pass as one aten call on NCHW-indexed tensors: f(a, b, out) -> result.

    `convolution_backward` computes only the gradient its mask asks for; of the tensor it is
    not asked about (x for dx, w for dw) it uses only shape and memory format, which `out`
    has, so no placeholder is allocated per call.
    """
    import torch

    kw = {name: list(v) if isinstance(v, tuple) else v
          for name, v in problem.torch_args().items()}
    kw.update(transposed=False, output_padding=[0, 0])
    conv, backward = torch.ops.aten.convolution, torch.ops.aten.convolution_backward
    if pass_ == "fwd":
        return lambda x, w, y: conv(x, w, None, **kw)
    if pass_ == "bwd_data":
        return lambda dy, w, dx: backward(dy, dx, w, None, output_mask=[True, False, False],
                                          **kw)[0]
    return lambda x, dy, dw: backward(dy, x, dw, None, output_mask=[False, True, False], **kw)[1]
