"""A plan's cuDNN algorithm run directly in training code: a pinned pass.

`cudnn-find-*` (`cudnn_find`) measures each of cuDNN's algorithms by running cuDNN's find; a plan
that chose one must not find again at the first training step, hold a workspace of its own or
hop threads. A pinned pass is what training runs instead: cuDNN's descriptors made once per
(problem, pass, layout, precision, pin), the workspace the algorithm needs asked of cuDNN once
(`cudnnGetConvolution*WorkspaceSize`, no find), and each call one `cudnnConvolution*` with the
plan's algorithm and math type, on a handle of the calling thread and device set to torch's
current stream, into tensors torch allocated, the workspace taken from torch's caching
allocator for the call (`workspace`): freed to it after the call, so every pinned pass of a
step shares the same cached blocks and torch can use them between passes.

Where cuDNN refuses the pin (the algorithm does not support the problem in this precision, the
workspace cannot be had), `Refused` says why in one line and the caller runs torch's own
convolution instead; a GPU fault (`faults.is_sticky_fault`) is raised as it is, as nothing can
run after it.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

from ..core.problem import ConvProblem
from ..machine import faults
from . import cudnn_find as cf

#: The math type a pin runs where its plan did not say (plans from before pins recorded it):
#: strict fp32 is FMA only; the other precisions allow tensor cores, as the find ran them.
DEFAULT_MATH = {"fp32": "FMA_MATH", "tf32": "TENSOR_OP_MATH", "fp16": "TENSOR_OP_MATH",
                "bf16": "TENSOR_OP_MATH"}


class Refused(RuntimeError):
    """cuDNN will not run this pin here; the message is the one line a warning shows."""


@dataclass(frozen=True)
class Pin:
    """One of cuDNN's legacy algorithms for one pass, as a plan records it: the enum name
    (`FFT_TILING`), the math type it was timed under, the workspace and the time cuDNN's find
    reported, and the cuDNN version (`cudnnGetVersion`, as text) it was found with."""

    algo: str
    math: str
    workspace_bytes: int | None = None
    search_ms: float | None = None
    cudnn: str | None = None

    @classmethod
    def of(cls, algo: str, pass_: str, precision: str, note: str = "",
           cudnn: str | None = None) -> Pin | None:
        """The pin of convbench algorithm `algo` (`cudnn-find-fft`) for `pass_`, from its
        row's note (`cudnn_find.found`), or None where `algo` is not one of cuDNN's."""
        enum = cf.enum_of(algo, pass_)
        if enum is None:
            return None
        seen = cf.found(note) or {}
        return cls(enum, seen.get("math", DEFAULT_MATH[precision]), seen.get("workspace_bytes"),
                   seen.get("search_ms"), cudnn)

    @property
    def deterministic(self) -> bool:
        return self.algo not in cf.NONDETERMINISTIC


def workspace(nbytes: int, device):
    """`nbytes` of scratch from torch's caching allocator on `device` (tests spy on this)."""
    import torch

    return torch.empty(nbytes, dtype=torch.uint8, device=device)


class _Handles(threading.local):
    """One cuDNN handle per thread and device: cuDNN's handles are not to be shared between
    threads, and autograd runs the backward passes on a thread of its own."""

    def __init__(self):
        self.by_device: dict[tuple[int, int], int] = {}

    def get(self, cudnn: cf.Binding, device: int) -> int:
        key = (id(cudnn), device)
        if key not in self.by_device:
            if device < 0:
                self.by_device[key] = cudnn.handle()
            else:  # cudnnCreate binds the handle to the current device
                import torch

                with torch.cuda.device(device):
                    self.by_device[key] = cudnn.handle()
        return self.by_device[key]


_HANDLES = _Handles()


def device_index(t) -> int:
    """The CUDA device of tensor `t`; -1 on the CPU, where only a fake libcudnn runs."""
    return t.device.index if t.is_cuda else -1


def _stream(t) -> int:
    """torch's current stream on `t`'s device (0, the default stream, on the CPU)."""
    import torch

    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


class PinnedPass:
    """`pin` for one pass of `problem` in `layout` and `precision`, ready to run: descriptors
    made, workspace size asked. Call it with torch tensors `(a, b, out)` in the pass's operand
    order, stored in `layout`; `out` is overwritten."""

    def __init__(self, problem: ConvProblem, pass_: str, layout: str, precision: str, pin: Pin,
                 device: int, cudnn: cf.Binding | None = None):
        self.cudnn = cudnn or cf.binding()
        self.pass_, self.pin = pass_, pin
        self.enum = cf.ALGO_ENUMS[pass_].index(pin.algo)
        try:
            self.desc = cf.Descriptors(self.cudnn, problem, pass_, layout, precision, pin.math)
        except cf.CudnnError as exc:
            raise Refused(f"cuDNN refuses the descriptors: {exc}") from None
        try:
            self.bytes = cf.workspace_size(self.cudnn, _HANDLES.get(self.cudnn, device),
                                           self.desc, self.enum)
        except cf.CudnnError as exc:
            self.desc.close()
            raise Refused(f"cuDNN refuses {pin.algo} for this pass: {exc}") from None
        weakref.finalize(self, self.desc.close)  # the descriptors go with the prepared pass

    def __call__(self, a, b, out) -> None:
        import torch

        handle = _HANDLES.get(self.cudnn, device_index(out))
        self.cudnn.call("cudnnSetStream", handle, _stream(out))
        try:
            scratch = workspace(self.bytes, out.device) if self.bytes else None
        except torch.OutOfMemoryError:
            raise Refused(f"no workspace of {self.bytes} B for {self.pin.algo}: torch's "
                          "allocator is out of memory") from None
        try:
            cf.run(self.cudnn, handle, self.desc, self.enum, a.data_ptr(), b.data_ptr(),
                   out.data_ptr(), 0 if scratch is None else scratch.data_ptr(), self.bytes)
        except cf.CudnnError as exc:
            if faults.is_sticky_fault(exc):
                raise
            raise Refused(f"cuDNN refused {self.pin.algo} at run time: {exc}") from None
