"""One pass as one aten call: shared by `torch-cpu` (oneDNN) and `cudnn` (cuDNN).

PyTorch picks the library from where the tensors live; the call, and how a layout becomes a
memory format (an NHWC array viewed with NCHW indexing is a `channels_last` tensor), is the same.
"""

from __future__ import annotations

from ..problem import ConvProblem


def torch_view(a, layout: str):
    """A torch NCHW-indexed view, without a copy, of an array (NumPy, CuPy or torch) stored in
    `layout`."""
    import torch

    t = torch.from_dlpack(a)
    return t if layout == "nchw" else t.permute(0, 3, 1, 2)


def aten_pass(problem: ConvProblem, pass_: str):
    """The pass as one aten call on NCHW-indexed tensors: f(a, b, out) -> result.

    `convolution_backward` computes only the gradient its mask asks for; of the tensor it is
    not asked about (x for dx, w for dw) it uses only shape and memory format, which `out`
    has, so no placeholder is allocated per call.
    """
    import torch

    kw = {"stride": [problem.stride] * 2, "padding": [problem.pad] * 2,
          "dilation": [problem.dilation] * 2, "transposed": False, "output_padding": [0, 0],
          "groups": problem.groups}
    conv, backward = torch.ops.aten.convolution, torch.ops.aten.convolution_backward
    if pass_ == "fwd":
        return lambda x, w, y: conv(x, w, None, **kw)
    if pass_ == "bwd_data":
        return lambda dy, w, dx: backward(dy, dx, w, None, output_mask=[True, False, False],
                                          **kw)[0]
    return lambda x, dy, dw: backward(dy, x, dw, None, output_mask=[False, True, False], **kw)[1]
