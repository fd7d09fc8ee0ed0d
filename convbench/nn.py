"""`convbench.nn.Conv2d`: an `nn.Conv2d` whose three passes run the algorithms a plan chose.

PyTorch picks one convolution implementation for all passes of a layer, and it computes the
data gradient of a layer whose input needs none unless told otherwise (the study found Torch
needed a user option for it). This module runs forward, bwd_data and bwd_filter each through the
implementation chosen for it, in the layout chosen for the layer, inside one
`torch.autograd.Function`, and skips a gradient autograd does not ask for
(`ctx.needs_input_grad`), so the first layer's data gradient is never computed.

A pass chosen as `torch-cpu`, `cudnn` or `cudnn-autotune` runs through torch's own convolution
(cuDNN with `benchmark` off or on for that pass); any other algorithm runs through
`convbench.functional.run` on arrays that share the tensors' memory: `.numpy()` on the CPU,
CuPy through DLPack on a GPU, stored in the layer's layout (channels_last tensors seen as NHWC
arrays). The bias is added in torch. The module keeps `nn.Conv2d`'s parameters and state_dict
keys, so checkpoints and optimizers carry over.

torch caches cuDNN's plan per thread, keyed without the benchmark flag: on one thread, whichever
mode ran a shape first would decide the other's plan (a `cudnn` pass would run autotune's pick,
or the reverse). So a pass chosen as `cudnn` or `cudnn-autotune` in the mode other than the
global `cudnn.benchmark` runs on that mode's own worker thread (`_in_mode`), on the caller's
device and stream and in its grad mode, as `algos.cudnn` times them; a pass in the global
flag's mode, torch's default (None) and `torch-cpu` run where they are called.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn.utils import parametrize

from . import functional
from .algos import cudnn_pinned, registry
from .algos.registry import TORCH_ALGOS
from .core.problem import (
    LAYOUTS,
    PASSES,
    PRECISION_OF_DTYPE,
    PRECISIONS,
    ConvProblem,
    Pair,
    axis_pair,
    check_choice,
)

#: The memory format that stores a tensor in each layout.
MEMORY_FORMAT = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}


def conv_geometry(conv: nn.Conv2d) -> dict[str, Pair]:
    """stride, pad, dilation and groups of a conv module as a `ConvProblem` takes them (one int
    where torch's two axes agree, else the (h, w) pair); ValueError with the reason for a module
    no `ConvProblem` describes."""
    if conv.padding_mode != "zeros":
        raise ValueError(f"padding_mode {conv.padding_mode!r}: convbench pads with zeros only")
    dilation = tuple(conv.dilation)
    padding = explicit_padding(conv.padding, dilation, conv.kernel_size)
    return {"stride": axis_pair("stride", conv.stride), "pad": axis_pair("pad", padding),
            "dilation": axis_pair("dilation", dilation), "groups": conv.groups}


def explicit_padding(padding, dilation, kernel_size):
    """torch's `padding` of a convolution (numbers, or the strings `valid` and `same`) as
    numbers `axis_pair` takes: `same` pads an odd total one more after than before, as
    torch and TensorFlow's SAME do."""
    if padding == "valid":
        return 0
    if padding == "same":
        dilation = (dilation,) * 2 if isinstance(dilation, int) else dilation
        totals = [d * (k - 1) for d, k in zip(dilation, kernel_size)]
        return tuple((t // 2, t - t // 2) if t % 2 else t // 2 for t in totals)
    return padding


def unprovable(module: nn.Module) -> str | None:
    """Why `apply` may not swap `module` for a `Conv2d` (None: it may). Only what convbench
    reproduces exactly is replaced: a module running `nn.Conv2d`'s own forward, with no hooks
    of its own and no parametrization. A subclass's own forward (TF-SAME padding, weight
    standardisation, a scaled output) or a hook or parametrization changing the weight is
    code a swap would silently drop."""
    name = type(module).__name__
    if not isinstance(module, nn.Conv2d):
        return f"{name} is not an nn.Conv2d"
    if type(module) not in (nn.Conv2d, Conv2d):
        for method in ("forward", "_conv_forward"):
            if getattr(type(module), method) is not getattr(nn.Conv2d, method):
                return f"{name} has its own {method}"
    if parametrize.is_parametrized(module):
        return f"{name} is parametrized"
    hooks = [kind for kind in ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks",
                               "_backward_hooks") if getattr(module, kind, None)]
    if hooks:
        return f"{name} has {_hook_words(hooks)}"
    return None


def _hook_words(hooks: list[str]) -> str:
    """`_forward_pre_hooks` -> `forward pre-hooks`, joined."""
    return " and ".join(h.strip("_").replace("_pre_", " pre-").replace("_", " ")
                        for h in hooks)


def torch_geometry(problem: ConvProblem) -> tuple[list[int], list[int], list[int]]:
    """stride, padding and dilation of `problem` as torch's convolutions take them: [height,
    width] each; for a problem padded unequally, those of its `symmetric_part()`, which runs
    after the explicit pad."""
    args = problem.torch_args()
    return tuple(list(args[f]) for f in ("stride", "padding", "dilation"))


def problem_of(conv: nn.Conv2d, x_shape) -> ConvProblem:
    """The `ConvProblem` of `conv` applied to an NCHW-indexed input of `x_shape`."""
    if len(x_shape) != 4:
        raise ValueError(f"input of {len(x_shape)} dimensions: convbench runs batched (4-D) "
                         "input only")
    n, c, h, w = x_shape
    r, s = conv.kernel_size
    return ConvProblem(n=n, c=c, h=h, w=w, k=conv.out_channels, r=r, s=s, **conv_geometry(conv))


@contextlib.contextmanager
def _cudnn_benchmark(value: bool | None):
    """`torch.backends.cudnn.benchmark = value` for the block (None: unchanged)."""
    if value is None:
        yield
        return
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = value
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = saved


#: One worker thread per cuDNN mode (benchmark False, True): each keeps its own plan cache.
_MODE_WORKERS: dict[bool, ThreadPoolExecutor] = {}


def _in_mode(benchmark: bool | None, t: torch.Tensor, work):
    """`work()` with `cudnn.benchmark = benchmark`; a mode other than the global flag's on its
    own thread (see the module docstring), on `t`'s device and current stream, in the caller's
    grad mode. The global flag's mode runs where it is called: the thread's torch layers run in
    that mode there, forward on the caller's thread and backward on autograd's, so its plan
    cache already holds that mode's plans, and the hand-off (tens of microseconds a pass, paid
    on every pass of a replaced layer in a training step) is saved."""
    if benchmark is None or benchmark == torch.backends.cudnn.benchmark:
        return work()
    worker = _MODE_WORKERS.get(benchmark)
    if worker is None:
        worker = _MODE_WORKERS.setdefault(benchmark, ThreadPoolExecutor(
            1, thread_name_prefix=f"convbench-cudnn-benchmark-{benchmark}"))
    grad = torch.is_grad_enabled()
    stream = torch.cuda.current_stream(t.device) if t.is_cuda else None

    def run():
        with contextlib.ExitStack() as stack:
            if stream is not None:
                stack.enter_context(torch.cuda.device(t.device))
                stack.enter_context(torch.cuda.stream(stream))
            stack.enter_context(torch.set_grad_enabled(grad))
            stack.enter_context(_cudnn_benchmark(benchmark))
            return work()

    return worker.submit(run).result()


def _external_stream(cupy, stream: torch.cuda.Stream):
    """CuPy's handle on torch's stream: through the CUDA stream protocol (`Stream.from_external`,
    CuPy 14, which deprecates `ExternalStream`) where both sides have it, else `ExternalStream`."""
    if hasattr(cupy.cuda.Stream, "from_external") and hasattr(stream, "__cuda_stream__"):
        return cupy.cuda.Stream.from_external(stream)
    return cupy.cuda.ExternalStream(stream.cuda_stream, stream.device.index)


@contextlib.contextmanager
def _on_torch_stream(t: torch.Tensor):
    """CuPy work on the device and stream torch uses for `t`, so it is ordered with torch's."""
    if not t.is_cuda:
        yield
        return
    import cupy

    current = torch.cuda.current_stream(t.device)
    stream = _external_stream(cupy, current) if current.cuda_stream else cupy.cuda.Stream.null
    with cupy.cuda.Device(t.device.index), stream:
        yield


def _array(t: torch.Tensor, layout: str):
    """The array sharing `t`'s memory, indexed in `layout` (`t` is stored in it already)."""
    t = t.detach()
    if layout == "nhwc":
        t = t.permute(0, 2, 3, 1)
    if t.is_cuda:
        import cupy

        return cupy.from_dlpack(t)
    return t.numpy()


class Dispatch:
    """How one layer runs its passes: the layout, per pass `(algo, backend)` or None (torch's
    default), the cuDNN algorithms pinned (`pins`; a `cudnn-find-*` choice without one is
    pinned by its name, under its precision's default math), and the precision the plan was
    measured in (None: not checked)."""

    def __init__(self, geometry: dict[str, Pair], layout: str,
                 algos: dict[str, tuple[str, str] | None],
                 pins: dict | None = None, precision: str | None = None):
        check_choice("layout", layout, LAYOUTS)
        for pass_ in algos:
            check_choice("pass", pass_, PASSES)
        if precision is not None:
            check_choice("precision", precision, PRECISIONS)
        self.geometry, self.layout, self.precision = geometry, layout, precision
        self.algos = {p: algos.get(p) for p in PASSES}
        self.pins = dict(pins or {})
        #: (x shape, w shape) -> its problem: made (and validated) once, not every call
        self._problems: dict[tuple, ConvProblem] = {}
        self._pinned: dict[tuple, cudnn_pinned.PinnedPass] = {}
        self._runs_dtype: dict[tuple, bool] = {}
        self._pin_of: dict[tuple, tuple[cudnn_pinned.Pin | None, str]] = {}
        self._warned: set[str] = set()
        self.id = next(_IDS)
        _DISPATCHES[self.id] = self

    def __getstate__(self) -> dict:
        """What a copy (deepcopy, pickle) carries: the plan's choices, not prepared passes."""
        return {"geometry": self.geometry, "layout": self.layout, "algos": self.algos,
                "pins": self.pins, "precision": self.precision}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def describe(self, pass_: str) -> str:
        choice = self.algos[pass_]
        return "torch default" if choice is None else choice[0]

    def warn_once(self, key: str, text: str) -> None:
        """One warning per layer and cause: a fallback repeats every step, its warning once."""
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(text, stacklevel=4)

    def setting_differs(self, x: torch.Tensor) -> str | None:
        """Why this call runs in another precision than the plan was measured in (TF32 on or
        off, an autocast dtype, the tensors' dtype), or None where it does not (or the layer
        has no plan's precision)."""
        if self.precision is None:
            return None
        now = live_precision(x.device.type, x.dtype)
        if now == self.precision:
            return None
        return f"the plan was measured in {self.precision}, this call runs in {now}"

    def fall_back(self, pass_: str, why: str) -> None:
        """Torch's own convolution runs `pass_` from now on, and says why once."""
        self.warn_once(pass_, f"convbench: {pass_} of a {self.layout} layer runs torch's "
                              f"convolution instead of {self.describe(pass_)}: {why}")
        self.algos[pass_] = None
        self.pins.pop(pass_, None)
        self._pin_of.clear()

    def _torch_mode(self, pass_: str) -> tuple[bool, bool | None]:
        """(runs in torch, the cudnn.benchmark it runs with)."""
        choice = self.algos[pass_]
        if choice is None:
            return True, None
        return choice[0] in TORCH_ALGOS, TORCH_ALGOS.get(choice[0])

    def to_layout(self, t: torch.Tensor) -> torch.Tensor:
        return t.contiguous(memory_format=MEMORY_FORMAT[self.layout])

    def problem_from_shapes(self, x_shape, w_shape) -> ConvProblem:
        key = (tuple(x_shape), tuple(w_shape))
        problem = self._problems.get(key)
        if problem is None:
            n, c, h, w = x_shape
            k, _, r, s = w_shape
            problem = self._problems[key] = ConvProblem(n=n, c=c, h=h, w=w, k=k, r=r, s=s,
                                                        **self.geometry)
        return problem

    def _pin(self, pass_: str, a: torch.Tensor) -> tuple[cudnn_pinned.Pin | None, str]:
        """(the cuDNN algorithm pinned for `pass_`, or None where its choice is not cuDNN's;
        the precision it runs in), for operands like `a`: asked once per pass, device and
        dtype, as it is on every call's path."""
        key = (pass_, a.device.type, a.dtype)
        if key not in self._pin_of:
            precision = self.precision or live_precision(a.device.type, a.dtype)
            pin = self.pins.get(pass_)
            if pin is None and self.algos[pass_] is not None:
                pin = cudnn_pinned.Pin.of(self.algos[pass_][0], pass_, precision)
            self._pin_of[key] = (pin, precision)
        return self._pin_of[key]

    def _ours(self, pass_: str, problem: ConvProblem, a: torch.Tensor, b: torch.Tensor,
              out_shape) -> torch.Tensor | None:
        """The pass by its algorithm into a new tensor in the layer's layout, or None where
        the algorithm refused it (`fall_back` said why; torch's convolution runs it). A pinned
        cuDNN pass runs prepared (`cudnn_pinned.PinnedPass`); ours through the prepared pass
        called directly (`functional.prepared`; the shapes are the problem's by construction,
        so `functional.run`'s checks are not paid every call)."""
        algo, backend = self.algos[pass_]
        pin, precision = self._pin(pass_, a)
        if pin is None and not self._runs(algo, backend, a.dtype):
            self.fall_back(pass_, f"{algo} does not run {a.dtype}")
            return None
        out = torch.empty(out_shape, dtype=a.dtype, device=a.device,
                          memory_format=MEMORY_FORMAT[self.layout])
        if pin is not None:
            try:
                self._pinned_pass(pass_, problem, precision, pin, out)(a, b, out)
            except cudnn_pinned.Refused as exc:
                self.fall_back(pass_, str(exc))
                return None
            return out
        with _on_torch_stream(out):
            xa, xb = _array(a, self.layout), _array(b, self.layout)
            functional.prepared_call(problem, pass_, xa, xb, _array(out, self.layout),
                                     algo=algo, backend=backend, layout=self.layout)
        return out

    def _pinned_pass(self, pass_: str, problem: ConvProblem, precision: str,
                     pin: cudnn_pinned.Pin, out: torch.Tensor) -> cudnn_pinned.PinnedPass:
        device = cudnn_pinned.device_index(out)
        key = (problem, pass_, precision, device)
        runner = self._pinned.get(key)
        if runner is None:
            runner = self._pinned[key] = cudnn_pinned.PinnedPass(
                problem, pass_, self.layout, precision, pin, device)
        return runner

    def _runs(self, algo: str, backend: str, dtype: torch.dtype) -> bool:
        """Whether our `algo` computes in `dtype` (a bf16 autocast reaches a layer planned
        for fp32 passes only if the plan's precision was not checked)."""
        key = (algo, backend, dtype)
        if key not in self._runs_dtype:
            precision = PRECISION_OF_DTYPE.get(str(dtype).removeprefix("torch."))
            impl = registry.get(algo, backend)
            self._runs_dtype[key] = precision in getattr(impl, "precisions", (precision,))
        return self._runs_dtype[key]

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """y from x and w, both already in the layer's layout."""
        in_torch, benchmark = self._torch_mode("fwd")
        problem = self.problem_from_shapes(x.shape, w.shape)
        if not in_torch:
            y = self._ours("fwd", problem, x, w, problem.y_shape())
            if y is not None:
                return y
            benchmark = None
        explicit = problem.symmetric_part()[1]
        if any(explicit):  # torch pads both sides of an axis alike
            x = torch.nn.functional.pad(x, explicit)
        return _in_mode(benchmark, x, lambda: torch.nn.functional.conv2d(
            x, w, None, *torch_geometry(problem), self.geometry["groups"]))

    def backward(self, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, need_dx: bool,
                 need_dw: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """dx and dw, each only if needed; the torch-run ones of one cuDNN mode in one call,
        as torch's own backward does (a pass whose algorithm refused it among them)."""
        dy = self.to_layout(dy)
        problem = self.problem_from_shapes(x.shape, w.shape)
        grads: dict[str, torch.Tensor | None] = {"bwd_data": None, "bwd_filter": None}
        needed = [p for p, need in (("bwd_data", need_dx), ("bwd_filter", need_dw)) if need]
        by_mode: dict[bool | None, list[str]] = {}
        for pass_ in needed:
            in_torch, benchmark = self._torch_mode(pass_)
            if not in_torch:
                grads[pass_] = (self._ours(pass_, problem, dy, w, problem.x_shape())
                                if pass_ == "bwd_data" else
                                self._ours(pass_, problem, x, dy, problem.w_shape()))
                if grads[pass_] is not None:
                    continue
                benchmark = None
            by_mode.setdefault(benchmark, []).append(pass_)
        explicit = problem.symmetric_part()[1]
        padded = torch.nn.functional.pad(x, explicit) if by_mode and any(explicit) else x
        for benchmark, passes in by_mode.items():
            dx, dw, _ = _in_mode(benchmark, dy, lambda passes=passes: (
                torch.ops.aten.convolution_backward(
                    dy, padded, w, None, *torch_geometry(problem), False, [0, 0],
                    self.geometry["groups"],
                    ["bwd_data" in passes, "bwd_filter" in passes, False])))
            if dx is not None and any(explicit):  # the padded x's gradient, cropped back
                dx = torch.nn.functional.pad(dx, [-e for e in explicit])
            grads.update({p: {"bwd_data": dx, "bwd_filter": dw}[p] for p in passes})
        return grads["bwd_data"], grads["bwd_filter"]


def live_precision(device_type: str, dtype: torch.dtype) -> str:
    """The precision torch would run a convolution of `dtype` tensors on `device_type` in, here
    and now: an active autocast's dtype, else `dtype`, fp32 as tf32 where torch's cuDNN
    convolutions run TF32 (its default on a GPU)."""
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
    precision = PRECISION_OF_DTYPE.get(str(dtype).removeprefix("torch."), str(dtype))
    if precision == "fp32" and device_type == "cuda":
        from .algos.cudnn import conv_runs_tf32

        if conv_runs_tf32():
            return "tf32"
    return precision


@contextlib.contextmanager
def precision_setting(precision: str, device_type: str):
    """The block runs convolutions in `precision` (`live_precision`'s inverse) for fp32 inputs:
    TF32 on for tf32 and off for fp32 on a GPU, `torch.autocast` for bf16 and fp16; the TF32
    flags are restored after."""
    check_choice("precision", precision, PRECISIONS)
    with contextlib.ExitStack() as stack:
        if device_type == "cuda" and precision in ("fp32", "tf32"):
            from .algos.cudnn import conv_runs_tf32, set_tf32

            was = conv_runs_tf32()
            set_tf32(precision == "tf32")
            stack.callback(set_tf32, was)
        stack.enter_context(autocast_for(precision, device_type))
        yield


def autocast_for(precision: str, device_type: str):
    """The context convolutions run in at `precision` from fp32 tensors: `torch.autocast` to
    bf16 or fp16, else none (fp32 and tf32 are the tensors' own dtype)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return contextlib.nullcontext() if dtype is None else torch.autocast(device_type,
                                                                         dtype=dtype)


#: Every live layer's Dispatch by id: the operators below take the id, as an operator's
#: arguments are tensors and plain values.
_DISPATCHES: weakref.WeakValueDictionary[int, Dispatch] = weakref.WeakValueDictionary()
_IDS = itertools.count()


def _empty_in(layout: str, like: torch.Tensor, shape) -> torch.Tensor:
    return torch.empty(shape, dtype=like.dtype, device=like.device,
                       memory_format=MEMORY_FORMAT[layout])


class _PlannedConv(torch.autograd.Function):
    """The eager path of `planned_conv`: the same Dispatch calls in a plain autograd Function,
    as the custom operator's Python wrappers (its autograd Function, the dispatcher's
    redispatch, argument defaults) cost about 0.17 ms of CPU time a layer's step, and eager
    training needs none of what they give (docs/pages/advisor.md)."""

    @staticmethod
    def forward(ctx, x, weight, layer: int):
        ctx.save_for_backward(x, weight)
        ctx.layer = layer
        return _DISPATCHES[layer].forward(x, weight)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dx, dw = _DISPATCHES[ctx.layer].backward(x, weight, dy, *ctx.needs_input_grad[:2])
        return dx, dw, None


@torch.library.custom_op("convbench::planned_conv", mutates_args=())
def planned_conv(x: torch.Tensor, weight: torch.Tensor, layer: int) -> torch.Tensor:
    """y = conv(x, weight) as layer `layer`'s Dispatch runs it; x and weight in its layout.
    An operator of its own, so torch.compile keeps it whole (opaque) and autograd calls
    `planned_conv_backward`."""
    return _DISPATCHES[layer].forward(x, weight)


@planned_conv.register_fake
def _planned_conv_fake(x, weight, layer):
    d = _DISPATCHES[layer]
    return _empty_in(d.layout, x, d.problem_from_shapes(x.shape, weight.shape).y_shape())


@torch.library.custom_op("convbench::planned_conv_backward", mutates_args=())
def planned_conv_backward(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, layer: int,
                          need_dx: bool, need_dw: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) of `planned_conv`; a gradient not needed is an empty tensor, not computed."""
    dx, dw = _DISPATCHES[layer].backward(x, weight, dy, need_dx, need_dw)
    return (x.new_empty(0) if dx is None else dx, weight.new_empty(0) if dw is None else dw)


@planned_conv_backward.register_fake
def _planned_conv_backward_fake(x, weight, dy, layer, need_dx, need_dw):
    layout = _DISPATCHES[layer].layout
    return (_empty_in(layout, x, x.shape) if need_dx else x.new_empty(0),
            _empty_in(layout, weight, weight.shape) if need_dw else weight.new_empty(0))


def _setup_context(ctx, inputs, output) -> None:
    x, weight, layer = inputs
    ctx.save_for_backward(x, weight)
    ctx.layer = layer


def _backward(ctx, dy):
    x, weight = ctx.saved_tensors
    need_dx, need_dw = ctx.needs_input_grad[:2]
    dx, dw = planned_conv_backward(x, weight, dy, ctx.layer, need_dx, need_dw)
    return (dx if need_dx else None), (dw if need_dw else None), None


planned_conv.register_autograd(_backward, setup_context=_setup_context)


class Conv2d(nn.Conv2d):
    """`nn.Conv2d` with a layout and an algorithm per pass: `algos` maps `fwd`, `bwd_data` and
    `bwd_filter` to `(algo, backend)`, or None (or leaves them out) for torch's default."""

    def __init__(self, *args, layout: str = "nchw",
                 algos: dict[str, tuple[str, str] | None] | None = None,
                 pins: dict | None = None, precision: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.dispatch = Dispatch(conv_geometry(self), layout, algos or {}, pins, precision)

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, layout: str,
                  algos: dict[str, tuple[str, str] | None], pins: dict | None = None,
                  precision: str | None = None) -> Conv2d:
        """A dispatching copy of `conv` holding the very same parameter objects, so an
        optimizer built on the original keeps training it."""
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                  padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                  bias=conv.bias is not None, padding_mode=conv.padding_mode, device="meta",
                  layout=layout, algos=algos, pins=pins, precision=precision)
        new.weight, new.bias = conv.weight, conv.bias
        new.train(conv.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The planned passes; under `torch.autocast` in its dtype, as torch's own convolution
        runs there (input, weight and bias cast, the cast's gradient autograd's). A call in
        another precision than the plan's runs torch's convolution, with one warning: the
        plan's times and tolerances do not hold there."""
        differs = self.dispatch.setting_differs(x)
        if differs:
            self.dispatch.warn_once("setting", f"convbench: a planned layer runs torch's "
                                    f"convolution: {differs}; tune in this setting")
            return self._conv_forward(x, self.weight, self.bias)
        weight, bias = self.weight, self.bias
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
            x, weight = x.to(dtype), weight.to(dtype)
            bias = None if bias is None else bias.to(dtype)
        d = self.dispatch
        # torch.compile sees one opaque operator; eager runs the same passes without its wrappers
        run = planned_conv if torch.compiler.is_compiling() else _PlannedConv.apply
        y = run(d.to_layout(x), d.to_layout(weight), d.id)
        return y if bias is None else y + bias.view(1, -1, 1, 1)

    def extra_repr(self) -> str:
        passes = ", ".join(f"{p}={self.dispatch.describe(p)}" for p in PASSES)
        return f"{super().extra_repr()}, layout={self.dispatch.layout}, {passes}"
