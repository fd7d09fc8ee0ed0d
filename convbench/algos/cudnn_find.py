"""`cudnn-find-*`: each of cuDNN's convolution algorithms on its own, through cuDNN's find API.

torch picks an algorithm for you (`cudnn`: the heuristic; `cudnn-autotune`: the fastest of a
timed search) and does not say which, nor what the others would cost. Here cuDNN's own
`cudnnFindConvolution{Forward,BackwardData,BackwardFilter}AlgorithmEx` is called, through
ctypes, on the libcudnn that torch loaded (the same build `cudnn` runs), and every algorithm it
offers for a pass becomes a case of its own — `cudnn-find-implicit-gemm`,
`cudnn-find-implicit-precomp-gemm`, `cudnn-find-gemm`, `cudnn-find-direct`, `cudnn-find-fft`,
`cudnn-find-fft-tiling`, `cudnn-find-winograd`, `cudnn-find-winograd-nonfused`, and for the
backward passes cuDNN's unnamed `cudnn-find-algo-0`, `-algo-1`, `-algo-3` — verified and timed
by the harness like any other (`cudnnConvolution*` with that algorithm, into the harness's
output, with the workspace cuDNN asked for), its note holding what the find reported: cuDNN's
own time and rank, its workspace, whether it is deterministic, and its math type. An algorithm
the find rejects for a problem is `unsupported`, with cuDNN's status as the reason.

The find runs once per (problem, pass, layout, precision, device), on scratch operands, with a
workspace of at most `FIND_WORKSPACE` bytes and half the free memory (`find_workspace_bytes`):
cuDNN's explicit GEMM needs about the im2col matrix (1.1-1.2 GB for AlexNet's conv1 and conv2
at batch 256), which a 1 GiB cap shut out. An algorithm that still needs more is not tried;
cuDNN says `CUDNN_STATUS_ALLOC_FAILED` of it, and its row (`unsupported`) says that this is
the find's workspace cap, not the GPU running out of memory (`reason`). A find that fails as a
whole (not a GPU fault) is remembered, and every algorithm of its case is `unsupported` with
its status, once; a libcudnn that cannot be loaded makes every `cudnn-find-*` algorithm
unavailable with one reason (`available`), not a `failed` row per case.

Tolerances: cuDNN's FFT and Winograd algorithms are judged with the FFT's and Winograd
F(4x4, 3x3)'s tolerance columns (their traits, `traits`), not the exact algorithms'. A result
beyond its column is not failed but `inexact` (a library's: `verify.verdict`): timed, kept, its
error said. Math types: fp32 is `CUDNN_FMA_MATH` (no TF32), tf32, fp16 and bf16
allow tensor cores (`CUDNN_TENSOR_OP_MATH`); where the find reports an algorithm under several
math types, the fastest allowed one is run.

Everything that touches the library is in `Binding`, which takes any object with cuDNN's C
functions: the tests load a fake libcudnn built from C on the CPU (argument marshalling, the
enum names, status handling); the first GPU run checks the rest against the real one.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import weakref
from dataclasses import dataclass

from ..core.problem import ConvProblem
from ..machine import faults
from .registry import Implementation, UnsupportedError, register
from .traits import Algorithm

# --- cuDNN's enums (cudnn_cnn.h / cudnn_graph.h, stable from cuDNN 7 to 9) -------------------
#: Algorithm names by pass, in enum order (the index is the enum value).
ALGO_ENUMS = {
    "fwd": ("IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
            "WINOGRAD", "WINOGRAD_NONFUSED"),
    "bwd_data": ("ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"),
    "bwd_filter": ("ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED",
                   "FFT_TILING"),
}
#: The C functions of each pass: (find, run, max-count query).
_FUNCTIONS = {
    "fwd": ("cudnnFindConvolutionForwardAlgorithmEx", "cudnnConvolutionForward",
            "cudnnGetConvolutionForwardAlgorithmMaxCount"),
    "bwd_data": ("cudnnFindConvolutionBackwardDataAlgorithmEx", "cudnnConvolutionBackwardData",
                 "cudnnGetConvolutionBackwardDataAlgorithmMaxCount"),
    "bwd_filter": ("cudnnFindConvolutionBackwardFilterAlgorithmEx",
                   "cudnnConvolutionBackwardFilter",
                   "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount"),
}
#: The workspace an algorithm needs, per pass (no find: what a pinned pass asks).
_WORKSPACE_SIZE = {"fwd": "cudnnGetConvolutionForwardWorkspaceSize",
                   "bwd_data": "cudnnGetConvolutionBackwardDataWorkspaceSize",
                   "bwd_filter": "cudnnGetConvolutionBackwardFilterWorkspaceSize"}
MATH_TYPES = ("DEFAULT_MATH", "TENSOR_OP_MATH", "TENSOR_OP_MATH_ALLOW_CONVERSION", "FMA_MATH")
DATA_TYPES = {"fp32": 0, "tf32": 0, "fp16": 2, "bf16": 9}  # CUDNN_DATA_FLOAT, HALF, BFLOAT16
_COMPUTE_FLOAT = 0
_TENSOR_NCHW, _TENSOR_NHWC = 0, 1
_CROSS_CORRELATION = 1
_NON_DETERMINISTIC, _DETERMINISTIC = 0, 1
#: The math types each precision may run (fp32: no tensor cores, so no TF32).
ALLOWED_MATH = {"fp32": ("FMA_MATH",),
                "tf32": ("TENSOR_OP_MATH", "DEFAULT_MATH", "FMA_MATH"),
                "fp16": ("TENSOR_OP_MATH", "DEFAULT_MATH", "FMA_MATH"),
                "bf16": ("TENSOR_OP_MATH", "DEFAULT_MATH", "FMA_MATH")}
#: The largest workspace the find may use (and at most half the free memory): algorithms
#: needing more are not tried.
FIND_WORKSPACE = 8 << 30
ALLOC_FAILED = "CUDNN_STATUS_ALLOC_FAILED"


def find_workspace_bytes(free: int) -> int:
    """The find's workspace, with `free` bytes of device memory free."""
    return min(FIND_WORKSPACE, free // 2)


def reason(perf: Perf, workspace_bytes: int) -> str:
    """The `unsupported` reason of an algorithm the find did not run."""
    if perf.status == ALLOC_FAILED:
        return (f"cuDNN's find: {ALLOC_FAILED}: it needs more workspace than the "
                f"{workspace_bytes / 2**30:.3g} GiB the find was given (FIND_WORKSPACE, at "
                "most half the free memory), not the GPU out of memory")
    return f"cuDNN's find: {perf.status}"


def algo_name(enum_name: str) -> str:
    """`IMPLICIT_PRECOMP_GEMM` -> `cudnn-find-implicit-precomp-gemm`."""
    return "cudnn-find-" + enum_name.lower().replace("_", "-")


#: Every convbench algorithm name this module registers, in a stable order.
ALGO_NAMES = tuple(dict.fromkeys(algo_name(n) for names in ALGO_ENUMS.values() for n in names))
#: The family of each of cuDNN's algorithms, as its enum names it (ALGO_0 and the like: cuDNN
#: does not say).
FAMILIES = {"IMPLICIT_GEMM": "gemm", "IMPLICIT_PRECOMP_GEMM": "gemm", "GEMM": "gemm",
            "DIRECT": "direct", "FFT": "fft", "FFT_TILING": "fft", "WINOGRAD": "winograd",
            "WINOGRAD_NONFUSED": "winograd"}
#: Per family, (tolerance column, reduction): FFT's and Winograd's columns (cuDNN does not say
#: its tiles: F(4x4, 3x3)'s alpha 6, which also holds F(2x2, 5x5)), no reduction where the
#: kernel does the direct flops, else any (a transform we do not count may run). Winograd on a
#: 5x5 filter gets no looser column of its own: its error there is cuDNN's unstated choice of
#: tile, and a column widened to the error one GPU measured would call that error right and let
#: advice pick it silently. Beyond alpha 6 the row is `inexact` instead: timed, its error
#: stated, no plan's choice unless the user's `--max-error` admits it.
JUDGED = {"gemm": ("exact", "none"), "direct": ("exact", "none"), "fft": ("fft", "any"),
          "winograd": ("winograd-alpha6", "any"), "undisclosed": ("exact", "any")}
#: The algorithms cuDNN's find reports nondeterministic: the backward passes' BWD_DATA_ALGO_0,
#: BWD_FILTER_ALGO_0 and _3 accumulate with atomics.
NONDETERMINISTIC = ("ALGO_0", "ALGO_3")


def traits(enum_name: str) -> Algorithm:
    """The traits of cuDNN's algorithm `enum_name`, run one by one: a library's kernel of its
    family, with nothing of ours to count, deterministic unless cuDNN says otherwise."""
    family = FAMILIES.get(enum_name, "undisclosed")
    tolerance, reduction = JUDGED[family]
    return Algorithm(algo_name(enum_name), family=family, origin="library", tolerance=tolerance,
                     reduction=reduction, counts=None,
                     deterministic=enum_name not in NONDETERMINISTIC)


class CudnnError(RuntimeError):
    """A cuDNN call that did not return CUDNN_STATUS_SUCCESS; the message names the call and the
    status as cuDNN spells it (`CUDNN_STATUS_EXECUTION_FAILED`, which the runner knows as a
    fault of the GPU; `..._ALLOC_FAILED`, an out-of-memory)."""


class _Perf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t: the three share one layout."""

    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int),
                ("mathType", ctypes.c_int), ("reserved", ctypes.c_int * 3)]


@dataclass(frozen=True)
class Perf:
    """One entry of a find: an algorithm (its enum name), cuDNN's status for it, its time (ms,
    cuDNN's own measurement), its workspace, determinism and math type."""

    algo: str
    status: str
    time_ms: float
    workspace: int
    deterministic: bool
    math: str
    enum: int
    math_enum: int

    @property
    def ok(self) -> bool:
        return self.status == "CUDNN_STATUS_SUCCESS"


_P, _I, _SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
_SIGNATURES = {
    "cudnnGetErrorString": ([_I], ctypes.c_char_p),
    "cudnnGetVersion": ([], _SZ),
    "cudnnCreate": ([ctypes.POINTER(_P)], _I),
    "cudnnDestroy": ([_P], _I),
    "cudnnSetStream": ([_P, _P], _I),
    "cudnnCreateTensorDescriptor": ([ctypes.POINTER(_P)], _I),
    "cudnnDestroyTensorDescriptor": ([_P], _I),
    "cudnnSetTensor4dDescriptorEx": ([_P, _I] + [_I] * 8, _I),
    "cudnnCreateFilterDescriptor": ([ctypes.POINTER(_P)], _I),
    "cudnnDestroyFilterDescriptor": ([_P], _I),
    "cudnnSetFilter4dDescriptor": ([_P, _I, _I, _I, _I, _I, _I], _I),
    "cudnnCreateConvolutionDescriptor": ([ctypes.POINTER(_P)], _I),
    "cudnnDestroyConvolutionDescriptor": ([_P], _I),
    "cudnnSetConvolution2dDescriptor": ([_P] + [_I] * 8, _I),
    "cudnnSetConvolutionGroupCount": ([_P, _I], _I),
    "cudnnSetConvolutionMathType": ([_P, _I], _I),
    **{f[2]: ([_P, ctypes.POINTER(_I)], _I) for f in _FUNCTIONS.values()},
    # (handle, inDesc, in, inDesc, in, convDesc, outDesc, out, requested, *returned, perf*,
    #  ws, size): the inputs in `Descriptors.inputs` order
    **{f[0]: ([_P, _P, _P, _P, _P, _P, _P, _P, _I, ctypes.POINTER(_I), ctypes.POINTER(_Perf),
               _P, _SZ], _I) for f in _FUNCTIONS.values()},
    # (handle, inDesc, inDesc, convDesc, outDesc, algo, *size): the inputs in `inputs` order
    **{f: ([_P, _P, _P, _P, _P, _I, ctypes.POINTER(_SZ)], _I) for f in _WORKSPACE_SIZE.values()},
    # (handle, alpha*, inDesc, in, inDesc, in, convDesc, algo, ws, size, beta*, outDesc, out)
    **{f[1]: ([_P, _P, _P, _P, _P, _P, _P, _I, _P, _SZ, _P, _P, _P], _I)
       for f in _FUNCTIONS.values()},
}


class Binding:
    """cuDNN's legacy convolution API on a loaded library (`ctypes.CDLL`): the signatures set
    once, every status checked."""

    def __init__(self, lib):
        self.lib = lib
        for name, (args, res) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res

    @classmethod
    def load(cls, path: str) -> Binding:
        return cls(ctypes.CDLL(path))

    def status_name(self, status: int) -> str:
        text = self.lib.cudnnGetErrorString(status)
        return text.decode() if text else f"cuDNN status {status}"

    def call(self, name: str, *args) -> None:
        status = getattr(self.lib, name)(*args)
        if status != 0:
            raise CudnnError(f"{name}: {self.status_name(status)}")

    def version(self) -> int:
        return int(self.lib.cudnnGetVersion())

    def _create(self, kind: str) -> int:
        handle = _P()
        self.call(f"cudnnCreate{kind}", ctypes.byref(handle))
        return handle.value

    def handle(self) -> int:
        return self._create("")


class Descriptors:
    """The tensor, filter and convolution descriptors of one pass in one layout and precision,
    destroyed by `close` (or on leaving a `with` block). `a`, `b`, `out` follow the pass's
    operand order (`ConvProblem.operand_shapes`): the filter is `w` in fwd and bwd_data (the
    second operand) and `dw` in bwd_filter (the output)."""

    def __init__(self, cudnn: Binding, problem: ConvProblem, pass_: str, layout: str,
                 precision: str, math: str = "FMA_MATH"):
        self.cudnn, self.pass_ = cudnn, pass_
        p, dtype = problem, DATA_TYPES[precision]
        self._made: list[tuple[str, int]] = []
        try:
            x = self._tensor(dtype, layout, p.n, p.c, p.h, p.w)
            y = self._tensor(dtype, layout, p.n, p.k, p.p, p.q)
            w = self._make("Filter")
            cudnn.call("cudnnSetFilter4dDescriptor", w, dtype,
                       _TENSOR_NCHW if layout == "nchw" else _TENSOR_NHWC, p.k, p.cg, p.r, p.s)
            self.conv = self._make("Convolution")
            cudnn.call("cudnnSetConvolution2dDescriptor", self.conv, p.pad_h, p.pad_w,
                       p.stride_h, p.stride_w, p.dil_h, p.dil_w, _CROSS_CORRELATION,
                       _COMPUTE_FLOAT)
            cudnn.call("cudnnSetConvolutionGroupCount", self.conv, p.groups)
            self.set_math(math)
        except BaseException:
            self.close()
            raise
        self.a, self.b, self.out = {"fwd": (x, w, y), "bwd_data": (y, w, x),
                                    "bwd_filter": (x, y, w)}[pass_]

    def inputs(self, a: int, b: int) -> tuple[int, int, int, int]:
        """(descriptor, pointer) of the two inputs in the order cuDNN's functions take them:
        the pass's order, but the filter first for bwd_data (`cudnnConvolutionBackwardData(
        handle, alpha, wDesc, w, dyDesc, dy, ...)`)."""
        if self.pass_ == "bwd_data":
            return self.b, b, self.a, a
        return self.a, a, self.b, b

    def set_math(self, math: str) -> None:
        self.cudnn.call("cudnnSetConvolutionMathType", self.conv, MATH_TYPES.index(math))

    def _make(self, kind: str) -> int:
        desc = self.cudnn._create(f"{kind}Descriptor")
        self._made.append((kind, desc))
        return desc

    def _tensor(self, dtype: int, layout: str, n: int, c: int, h: int, w: int) -> int:
        desc = self._make("Tensor")
        strides = ((c * h * w, h * w, w, 1) if layout == "nchw" else (h * w * c, 1, w * c, c))
        self.cudnn.call("cudnnSetTensor4dDescriptorEx", desc, dtype, n, c, h, w, *strides)
        return desc

    def close(self) -> None:
        while self._made:
            kind, desc = self._made.pop()
            getattr(self.cudnn.lib, f"cudnnDestroy{kind}Descriptor")(desc)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def find(cudnn: Binding, handle: int, desc: Descriptors, a: int, b: int, out: int,
         workspace: int, workspace_bytes: int) -> list[Perf]:
    """cuDNN's find for `desc`'s pass on device pointers `a`, `b`, `out` (written with scratch
    results) and a workspace: every algorithm it tried, fastest first, as cuDNN orders them."""
    find_fn, _, count_fn = _FUNCTIONS[desc.pass_]
    most = _I()
    cudnn.call(count_fn, handle, ctypes.byref(most))
    perf, got = (_Perf * max(1, most.value))(), _I()
    cudnn.call(find_fn, handle, *desc.inputs(a, b), desc.conv, desc.out, out, len(perf),
               ctypes.byref(got), perf, workspace, workspace_bytes)
    names = ALGO_ENUMS[desc.pass_]
    return [Perf(names[e.algo] if 0 <= e.algo < len(names) else f"ALGO_{e.algo}",
                 cudnn.status_name(e.status), float(e.time), int(e.memory),
                 e.determinism == _DETERMINISTIC,
                 MATH_TYPES[e.mathType] if 0 <= e.mathType < len(MATH_TYPES) else str(e.mathType),
                 e.algo, e.mathType)
            for e in perf[:got.value]]


def run(cudnn: Binding, handle: int, desc: Descriptors, algo: int, a: int, b: int, out: int,
        workspace: int, workspace_bytes: int) -> None:
    """`out = conv(a, b)` with algorithm `algo` (alpha 1, beta 0: `out` is overwritten)."""
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    cudnn.call(_FUNCTIONS[desc.pass_][1], handle, ctypes.byref(alpha), *desc.inputs(a, b),
               desc.conv, algo, workspace, workspace_bytes, ctypes.byref(beta), desc.out, out)


def workspace_size(cudnn: Binding, handle: int, desc: Descriptors, algo: int) -> int:
    """The workspace (bytes) algorithm `algo` needs for `desc`'s pass, as cuDNN says without a
    find; CudnnError (NOT_SUPPORTED, BAD_PARAM) where it cannot run this pass."""
    size = _SZ()
    da, _, db, _ = desc.inputs(0, 0)
    cudnn.call(_WORKSPACE_SIZE[desc.pass_], handle, da, db, desc.conv, desc.out, algo,
               ctypes.byref(size))
    return int(size.value)


def enum_of(algo: str, pass_: str) -> str | None:
    """`cudnn-find-fft-tiling` -> `FFT_TILING` where `pass_` has that algorithm, else None."""
    return next((e for e in ALGO_ENUMS[pass_] if algo_name(e) == algo), None)


def choose(perfs: list[Perf], enum_name: str, precision: str) -> Perf | None:
    """The entry to run for algorithm `enum_name`: the fastest successful one under a math type
    the precision allows; else the first entry for it (its status is why it cannot run); None
    when the find did not report it."""
    mine = [p for p in perfs if p.algo == enum_name]
    good = [p for p in mine if p.ok and p.math in ALLOWED_MATH[precision]]
    if good:
        return min(good, key=lambda p: p.time_ms)
    return next((p for p in mine if not p.ok), mine[0] if mine else None)


def note(perfs: list[Perf], chosen: Perf, precision: str) -> str:
    """The row's note: what cuDNN's find said of this algorithm, and its rank among those that
    ran (under the precision's math types)."""
    ran = sorted({p.algo: p for p in sorted(perfs, key=lambda p: -p.time_ms)
                  if p.ok and p.math in ALLOWED_MATH[precision]}.values(),
                 key=lambda p: p.time_ms)
    rank = next(i for i, p in enumerate(ran, 1) if p.algo == chosen.algo)
    return (f"cuDNN find: {chosen.time_ms:.4g} ms (rank {rank} of {len(ran)}), workspace "
            f"{chosen.workspace} B, {'deterministic' if chosen.deterministic else 'nondeterministic'},"
            f" {chosen.math}")


_NOTE = re.compile(r"cuDNN find: (?P<ms>[-0-9.e+]+) ms \(rank \d+ of \d+\), workspace "
                   r"(?P<ws>\d+) B, (?P<det>deterministic|nondeterministic), (?P<math>\w+)$")


def found(text: str) -> dict | None:
    """What a row's `note` (written by `note`) says the find reported: {"search_ms",
    "workspace_bytes", "deterministic", "math"}; None for any other text. A plan's pin reads
    it, so the math type the algorithm was timed under is the one training runs."""
    m = _NOTE.match(text or "")
    if m is None:
        return None
    return {"search_ms": float(m["ms"]), "workspace_bytes": int(m["ws"]),
            "deterministic": m["det"] == "deterministic", "math": m["math"]}


# --- the library torch loaded ----------------------------------------------------------------
def library_path() -> str | None:
    """The libcudnn this process has loaded (torch loads it with its first cuDNN call), from
    /proc/self/maps; `CONVBENCH_CUDNN_LIBRARY` names another."""
    override = os.environ.get("CONVBENCH_CUDNN_LIBRARY")
    if override:
        return override
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if os.path.basename(path).startswith("libcudnn.so"):
                    return path
    except OSError:
        pass
    return None


@functools.lru_cache(maxsize=1)
def _binding() -> Binding | str:
    """The binding of the libcudnn torch uses (loading it through torch first), or why there
    is none: asked once per process."""
    import torch

    torch.backends.cudnn.version()  # loads libcudnn
    path = library_path()
    if path is None:
        return "torch has not loaded a libcudnn this process can see"
    try:
        return Binding.load(path)
    except (OSError, AttributeError) as exc:  # not loadable; a symbol the library lacks
        return f"cannot bind {path}: {type(exc).__name__}: {str(exc).splitlines()[0]}"


def binding() -> Binding:
    """The binding of the libcudnn torch uses; RuntimeError with the reason where none."""
    found = _binding()
    if isinstance(found, str):
        raise RuntimeError(found)
    return found


def unavailable() -> str | None:
    """Why cuDNN's find cannot be reached here (the one reason every case gets), or None."""
    found = _binding()
    return found if isinstance(found, str) else None


# --- the implementations ---------------------------------------------------------------------
class _Finds:
    """The finds made, per (problem, pass, layout, precision, device): every `cudnn-find-*`
    algorithm of a case reads the same one."""

    def __init__(self):
        self._handles: dict[int, int] = {}
        self._perfs: dict[tuple, list[Perf]] = {}
        self._failed: dict[tuple, str] = {}
        #: the workspace each find was given (bytes)
        self.sizes: dict[tuple, int] = {}

    def handle(self, cudnn: Binding, device: int) -> int:
        if device not in self._handles:
            self._handles[device] = cudnn.handle()
        return self._handles[device]

    def perfs(self, problem, pass_, layout, precision) -> list[Perf]:
        import cupy

        device = cupy.cuda.Device().id
        key = (problem, pass_, layout, precision, device)
        if key in self._failed:
            raise UnsupportedError(self._failed[key])
        if key not in self._perfs:
            cudnn = binding()
            handle = self.handle(cudnn, device)
            dtype = {"fp32": "float32", "tf32": "float32", "fp16": "float16",
                     "bf16": "bfloat16"}[precision]
            a, b = (cupy.random.standard_normal(s, dtype=cupy.float32).astype(dtype)
                    for s in problem.operand_shapes(pass_, layout)[:2])
            out = cupy.empty(problem.operand_shapes(pass_, layout)[2], dtype=dtype)
            free = cupy.cuda.Device().mem_info[0]
            size = self.sizes[key] = find_workspace_bytes(free)
            ws = cupy.empty(size, dtype=cupy.uint8)
            stream = cupy.cuda.get_current_stream()
            cudnn.call("cudnnSetStream", handle, stream.ptr)
            math = "FMA_MATH" if precision == "fp32" else "TENSOR_OP_MATH"
            try:
                with Descriptors(cudnn, problem, pass_, layout, precision, math) as desc:
                    self._perfs[key] = find(cudnn, handle, desc, a.data.ptr, b.data.ptr,
                                            out.data.ptr, ws.data.ptr, size)
            except CudnnError as exc:
                if _sticky(exc):
                    raise faults.DeviceUnusable(f"cuDNN's find: {exc}; then "
                                                f"{faults.device_usable()}") from exc
                self._failed[key] = f"cuDNN's find failed: {exc}"
                raise UnsupportedError(self._failed[key]) from exc
            stream.synchronize()
        return self._perfs[key]


def _sticky(exc: CudnnError) -> bool:
    """Whether a failed find left the GPU unusable: by its words where they say
    (`faults.is_sticky_fault`, the runner's own test), else by the device itself (an
    INTERNAL_ERROR is also cuDNN's answer to a configuration it cannot run)."""
    return faults.is_sticky_fault(exc) or faults.device_usable() is not None


_FINDS = _Finds()


class _CudnnFind(Implementation):
    """One cuDNN algorithm (`enum`, by name) run as the find reported it."""

    precisions = ("fp32", "tf32", "fp16", "bf16")
    enum: str

    def available(self) -> str | None:
        from .cudnn import CuDNN

        return CuDNN.available(self) or unavailable()

    def supports(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        if self.enum not in ALGO_ENUMS[pass_]:
            return f"cuDNN has no {self.enum} algorithm for {pass_}"
        return None

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        """The find (once per case, shared by every algorithm), then this algorithm's pass;
        `UnsupportedError` (the row's `unsupported`) where the find rejected it."""
        import cupy

        perfs = _FINDS.perfs(problem, pass_, layout, precision)
        chosen = choose(perfs, self.enum, precision)
        if chosen is None:
            raise UnsupportedError(f"cuDNN's find did not report {self.enum} for this problem")
        if not chosen.ok:
            raise UnsupportedError(reason(chosen, _FINDS.sizes.get(
                (problem, pass_, layout, precision, cupy.cuda.Device().id), 0)))
        cudnn = binding()
        handle = _FINDS.handle(cudnn, cupy.cuda.Device().id)
        desc = Descriptors(cudnn, problem, pass_, layout, precision, chosen.math)
        ws = cupy.empty(max(1, chosen.workspace), dtype=cupy.uint8)
        size = chosen.workspace

        def call(a, b, out) -> None:
            cudnn.call("cudnnSetStream", handle, cupy.cuda.get_current_stream().ptr)
            run(cudnn, handle, desc, chosen.enum, a.data.ptr, b.data.ptr, out.data.ptr,
                ws.data.ptr, size)

        weakref.finalize(call, desc.close)
        return call

    def describe(self, problem, pass_, layout, precision) -> str:
        perfs = _FINDS.perfs(problem, pass_, layout, precision)
        return note(perfs, choose(perfs, self.enum, precision), precision)


for _enum in dict.fromkeys(n for names in ALGO_ENUMS.values() for n in names):
    register(traits(_enum), "cuda")(type(f"CudnnFind_{_enum}", (_CudnnFind,),
                                            {"enum": _enum}))
