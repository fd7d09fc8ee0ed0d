"""`cudnn` and `cudnn-autotune`: cuDNN through PyTorch on CuPy arrays, the GPU baseline.

The CuPy operands are shared with torch through DLPack, without a copy; nhwc arrays are viewed
with NCHW indexing, which torch reads as channels_last tensors, so cuDNN gets the layout as
stored (the pattern of `torch_cpu`). torch allocates its result, which is copied into the
caller's output: a phase of its own (`_aten`), timed apart and left out of the pass's time.

`cudnn` lets cuDNN's heuristics pick the algorithm (``torch.backends.cudnn.benchmark=False``);
`cudnn-autotune` (``benchmark=True``) times the candidates on the first call of a shape — made in
`prepare` — and keeps the fastest: every engine cuDNN offers, not torch's default of the
heuristic's first ten (`AUTOTUNE_BENCHMARK_LIMIT`, recorded in env.json). torch caches the
chosen plan per thread, keyed without the benchmark flag, so on one thread whichever mode ran a
shape first would silently decide the plan of the other. Each mode therefore runs on its own
worker thread: a hand-off of some tens of microseconds per call (and per phase), paid by both
modes alike, and seen in a GPU row's `host_ms`.

A CuPy told to use per-thread default streams (`CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1`) is
refused (`per_thread_stream_refusal`): its current stream is then `cudaStreamPerThread`, a handle
that names the worker thread's own stream there, not the caller's, so the pass would run
unordered with, and untimed by, the caller's events.

**Tuning cost.** Each mode's worker first runs a tiny convolution's three passes (`_warm`), so
the library's start-up and lazy loading fall on no shape. The first call of a shape in a mode
(made in `prepare`) then pays for the plan, and with `benchmark=True` for the search; its wall
time (`first_call_ms`) goes into the row's note (`first call … ms`), beside the steady state the
row times, so the summary can say after how many calls the search pays for itself
(`summary.tuning_cost`).

Precisions: fp32 runs with TF32 off for cuDNN and cuBLAS, tf32 with it allowed (both set around
each call and restored, so nothing leaks); fp16 and bf16 run in their storage type. What is
allowed is not what runs: `kernels` profiles one call, once per case in a process, and the row
keeps the kernels' names and whether one ran on tensor cores (`kernelnames`); `describe` names
the kernel family from them (`classify_kernels`).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor

from ..core.problem import ConvProblem
from ._aten import PHASES, Views, aten_phased
from .kernelnames import is_helper, short_name
from .registry import Implementation, register
from .traits import Algorithm

_TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}
#: `torch.backends.cudnn.benchmark_limit` of cudnn-autotune: 0 tries every engine (torch's
#: default, 10, tries only the heuristic's first ten, which need not hold the fastest).
AUTOTUNE_BENCHMARK_LIMIT = 0

# --- which kernel ran ------------------------------------------------------------------------

#: (family, pattern), most telling first: a Winograd or FFT pass also launches GEMMs, an explicit
#: GEMM launches im2col then a GEMM, so the first family with a matching kernel names the pass.
#: Patterns follow cuDNN's kernel names: legacy `cudnn::detail::*_convolve_sgemm`, the SASS
#: kernels `<arch>_scudnn_*` (implicit precomputed GEMM), `winograd_nonfused::winograd*4x4`,
#: `fft2d_r2c_*`, xmma `sm80_xmma_fprop_implicit_gemm_*` and CUTLASS `*_s1688fprop_*`; on Hopper,
#: `sm90_xmma_{fprop,dgrad,wgrad}_implicit_gemm_*`, CUTLASS 3's `cutlass3x_sm90_*fprop*` and
#: cuBLAS 12's `nvjet_*` GEMMs. A name no family matches is "unknown", with the kernel named.
_FAMILIES = (
    ("Winograd nonfused", r"winograd_nonfused|winograd(Forward|Backward|Wgrad)(Data|Filter|Output)"),
    ("Winograd", r"winograd"),
    ("FFT", r"fft|flip_filter"),
    ("GEMM (explicit)", r"\bim2col\dd|explicit_convolve"),
    ("direct", r"grouped_direct|depthwise"),
    ("implicit precomputed GEMM", (r"precomputed_convolve|computeOffsets|implicit_gemm_indexed"
                                   r"|\b(maxwell|pascal|volta|turing|ampere)_[a-z0-9]*cudnn")),
    ("implicit GEMM", r"implicit_convolve|implicit_gem|fprop|dgrad|wgrad"),
    ("GEMM", r"gemm|gemv|nvjet"),
)
_TRANSPOSES = r"nchwToNhwc|nhwcToNchw"


#: The `cudnn-find-*` algo whose tolerance judges a pass of each rounding family.
_JUDGED = {"Winograd nonfused": "cudnn-find-winograd-nonfused", "Winograd": "cudnn-find-winograd",
           "FFT": "cudnn-find-fft"}


def judged_family(described: str) -> str | None:
    """The algo whose tolerance judges a pass `classify_kernels` described (None: the exact
    algorithms' own)."""
    return _JUDGED.get(described.split(" (", 1)[0])


def _matches(pattern: str, name: str) -> bool:
    return re.search(pattern, name, re.IGNORECASE) is not None


def classify_kernels(names: list[str]) -> str:
    """The algorithm family of a pass from the CUDA kernels it launched, with the kernel that
    shows it: e.g. "Winograd (kernel: maxwell_scudnn_winograd_128x128_...)"."""
    if not names:
        return "unknown (no CUDA kernel ran)"
    workers = [n for n in names if not is_helper(n)]
    in_any = [n for n in workers if any(_matches(p, n) for _, p in _FAMILIES)]
    family, main = "unknown", (workers or names)[0]
    for fam, pattern in _FAMILIES:
        hits = [n for n in names if _matches(pattern, n)]
        if hits:
            family = fam
            main = next((n for n in hits if n in workers), (in_any or hits)[0])
            break
    extra = "; with NCHW<->NHWC transposes" if any(_matches(_TRANSPOSES, n) for n in names) else ""
    return f"{family} (kernel: {short_name(main)}{extra})"


# --- running a pass --------------------------------------------------------------------------

@contextlib.contextmanager
def _math(precision: str, autotune: bool):
    """cuDNN on, the algorithm choice of the mode, TF32 only for tf32; all restored after.

    torch 2.9 and later set TF32 per operator (`torch.backends.cudnn.conv.fp32_precision`), and
    their legacy `allow_tf32` flags raise once the per-operator ones disagree (a program that used
    the new API): there, only the new API is touched."""
    import torch

    cudnn, matmul, tf32 = torch.backends.cudnn, torch.backends.cuda.matmul, precision == "tf32"
    limit = cudnn.benchmark_limit
    if autotune:
        cudnn.benchmark_limit = AUTOTUNE_BENCHMARK_LIMIT
    try:
        with _tf32(cudnn, matmul, tf32, autotune):
            yield
    finally:
        cudnn.benchmark_limit = limit


def _new_tf32_api(cudnn, matmul) -> bool:
    """Whether this torch sets TF32 per operator (2.9 and later; see `_math`)."""
    return hasattr(cudnn, "conv") and hasattr(matmul, "fp32_precision")


def conv_runs_tf32() -> bool:
    """Whether torch's own fp32 convolutions run in TF32 now (torch's default: yes), read
    through whichever API this torch has: the legacy flag raises once the new one was used."""
    import torch

    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    if not _new_tf32_api(cudnn, matmul):
        return bool(cudnn.allow_tf32)
    value = cudnn.conv.fp32_precision
    for parent in (cudnn, torch.backends):  # "none": the parent's setting holds
        if value != "none":
            break
        value = getattr(parent, "fp32_precision", "none")
    return value == "tf32"


def strict_fp32() -> None:
    """TF32 off for torch's convolutions and products from now on (`set_tf32`)."""
    set_tf32(False)


def set_tf32(on: bool) -> None:
    """TF32 on or off for torch's convolutions and products from now on, both alike, through
    whichever API this torch has (see `_math`)."""
    import torch

    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    if _new_tf32_api(cudnn, matmul):
        cudnn.conv.fp32_precision = matmul.fp32_precision = "tf32" if on else "ieee"
    else:
        cudnn.allow_tf32 = matmul.allow_tf32 = on


@contextlib.contextmanager
def _tf32(cudnn, matmul, tf32: bool, autotune: bool):
    """cuDNN on, the mode's benchmark flag, TF32 as asked, through whichever API this torch has
    (see `_math`)."""
    if _new_tf32_api(cudnn, matmul):
        names = ("enabled", "benchmark", "deterministic")
        saved = ([getattr(cudnn, n) for n in names], cudnn.conv.fp32_precision,
                 matmul.fp32_precision)
        try:
            for name, value in zip(names, (True, autotune, False)):
                setattr(cudnn, name, value)
            cudnn.conv.fp32_precision = matmul.fp32_precision = "tf32" if tf32 else "ieee"
            yield
        finally:
            for name, value in zip(names, saved[0]):
                setattr(cudnn, name, value)
            cudnn.conv.fp32_precision, matmul.fp32_precision = saved[1:]
        return
    saved = matmul.allow_tf32
    matmul.allow_tf32 = tf32
    try:
        with cudnn.flags(enabled=True, benchmark=autotune, deterministic=False, allow_tf32=tf32):
            yield
    finally:
        matmul.allow_tf32 = saved


def _stream(ptr: int, device):
    """torch on the caller's CuPy stream, so the pass is ordered with, and timed by events on,
    the stream the caller uses."""
    import torch

    if ptr == 0:  # CuPy's null stream is the legacy default stream, torch's default
        return torch.cuda.stream(torch.cuda.default_stream(device))
    return torch.cuda.stream(torch.cuda.ExternalStream(ptr, device=device))


#: The environment variable that makes CuPy's default stream per thread.
PER_THREAD_STREAM = "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM"


def per_thread_stream_refusal() -> str | None:
    """Why cuDNN through torch cannot run with this CuPy's streams (see the module docstring),
    or None."""
    if os.environ.get(PER_THREAD_STREAM, "0") not in ("", "0"):
        return (f"{PER_THREAD_STREAM}={os.environ[PER_THREAD_STREAM]}: torch's passes run on a "
                "worker thread, where CuPy's per-thread default stream is another stream than "
                "the caller's; unset it")
    return None


#: The wall time (ms) of the first call of each (algo, problem, pass, layout, precision) in
#: this process: the plan made, and with autotune the search (`CuDNN.prepare`).
_FIRST_CALLS: dict[tuple, float] = {}
FIRST_CALL_NOTE = "first call {:.4g} ms"


def first_call_ms(algo: str, problem, pass_: str, layout: str, precision: str) -> float | None:
    """The first call's wall time of a case in this process (None: not made here yet)."""
    return _FIRST_CALLS.get((algo, problem, pass_, layout, precision))


#: The CUDA kernels one call of each (algo, problem, pass, layout, precision) launched in this
#: process (`CuDNN.kernels`).
_KERNELS: dict[tuple, list[str]] = {}

#: The seconds each worker's warm-up took (`_warm`), by mode: env.json and the docs say it.
WARM_UP_S: dict[bool, float] = {}


def _warm(device, autotune: bool) -> None:
    """A tiny convolution's three passes on the worker thread, in its mode, before any
    shape is timed: the library's start-up and lazy module loading (per thread, some of it)
    are paid here, not by the first case's first call, which the tuning cost reads."""
    import torch

    started = time.perf_counter()
    with _math("fp32", autotune):
        x = torch.randn(1, 4, 8, 8, device=device, requires_grad=True)
        w = torch.randn(4, 4, 3, 3, device=device, requires_grad=True)
        torch.nn.functional.conv2d(x, w, padding=1).sum().backward()
        torch.cuda.synchronize(device)
    WARM_UP_S.setdefault(autotune, time.perf_counter() - started)


def _capability():
    import torch

    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


def _torch_cudnn(name: str, benchmark: bool) -> Algorithm:
    """cuDNN through torch: its heuristic's pick (`benchmark` off) or its search's, judged
    exact (a pass that fails is judged by the family it ran, `judged_as`), allowed any
    reduction (a transform we do not count may run), not deterministic (its pick may be one of
    its algorithms that accumulate with atomics)."""
    return Algorithm(name, family="chosen", origin="torch", tolerance="exact", reduction="any",
                     counts=None, deterministic=False, torch_benchmark=benchmark)


@register(_torch_cudnn("cudnn", False), "cuda")
class CuDNN(Implementation):
    precisions = ("fp32", "tf32", "fp16", "bf16")
    autotune = False

    def __init__(self):
        self._worker = None

    def available(self) -> str | None:
        import torch

        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else "no usable CUDA GPU"
            return f"torch {torch.__version__} cannot run cuDNN here: {build}"
        if not torch.backends.cudnn.is_available():
            return f"torch {torch.__version__} was built without cuDNN"
        return per_thread_stream_refusal()

    def supports(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        if precision == "bf16":
            try:
                import ml_dtypes  # noqa: F401  (CuPy holds bfloat16 through it)
            except ImportError:
                return "bf16 needs CuPy's bfloat16, which needs ml_dtypes: pip install ml-dtypes"
        cc = _capability()
        if precision in ("tf32", "bf16") and cc is not None and cc < (8, 0):
            return f"{precision} needs compute capability 8.0 or newer, this GPU is sm_{cc[0]}{cc[1]}"
        return None

    def phases(self, problem, pass_, layout, precision) -> list[str]:
        return PHASES

    def _start_worker(self, device) -> None:
        """The mode's worker thread, warmed (`_warm`) when it starts."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix=self.algo)
            self._worker.submit(_warm, device, self.autotune).result()

    def compile(self, problem, pass_, layout, precision) -> None:
        """The worker started and warmed here, outside the pass's memory trace: the warm-up's
        allocations are not the pass's."""
        import cupy
        import torch

        self._start_worker(torch.device("cuda", cupy.cuda.Device().id))

    def prepare(self, problem: ConvProblem, pass_: str, layout: str, precision: str):
        import cupy
        import torch

        device = torch.device("cuda", cupy.cuda.Device().id)
        self._start_worker(device)

        def in_mode(work, ptr: int) -> None:
            with _math(precision, self.autotune), _stream(ptr, device):
                work()

        def run_in_mode(work) -> None:
            self._worker.submit(in_mode, work, cupy.cuda.get_current_stream().ptr).result()

        views = Views(layout)
        run = aten_phased(problem, pass_, views, run_in_mode)
        # One call on scratch operands: cuDNN's plan (and for autotune, its search) is made
        # here, not in the first timed call; the first such call of a case is timed (the
        # tuning cost). The scratch operands are dropped with their views before the harness
        # reads the memory the prepared pass holds.
        dtype = getattr(torch, _TORCH_DTYPES[precision])
        scratch = [torch.randn(s, dtype=dtype, device=device)
                   for s in problem.operand_shapes(pass_, layout)]
        torch.cuda.synchronize()
        started = time.perf_counter()
        run(*scratch)
        torch.cuda.synchronize()
        _FIRST_CALLS.setdefault((self.algo, problem, pass_, layout, precision),
                                (time.perf_counter() - started) * 1e3)
        del scratch
        run.forget()  # and the views (`aten_phased`)
        return run

    def kernels(self, problem: ConvProblem, pass_: str, layout: str,
                precision: str) -> list[str]:
        """The CUDA kernels one call launches, profiled after the plan is made: once per case
        in this process (torch keeps the plan it made for a shape and its settings, so a second
        profile names the same kernels), for the row, its note and its judging alike."""
        key = (self.algo, problem, pass_, layout, precision)
        if key not in _KERNELS:
            _KERNELS[key] = self._profiled(problem, pass_, layout, precision)
        return _KERNELS[key]

    def _profiled(self, problem: ConvProblem, pass_: str, layout: str,
                  precision: str) -> list[str]:
        import torch
        from torch.profiler import ProfilerActivity, profile

        run = self.prepare(problem, pass_, layout, precision)
        dtype = getattr(torch, _TORCH_DTYPES[precision])
        operands = [torch.randn(s, dtype=dtype, device="cuda")
                    for s in problem.operand_shapes(pass_, layout)]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run(*operands)
            torch.cuda.synchronize()
        return [e.name for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA]

    def describe(self, problem: ConvProblem, pass_: str, layout: str, precision: str) -> str:
        """The kernel family that ran, from one profiled call after the plan is made."""
        names = self.kernels(problem, pass_, layout, precision)
        first = first_call_ms(self.algo, problem, pass_, layout, precision)
        return classify_kernels(names) + (
            "" if first is None else "; " + FIRST_CALL_NOTE.format(first))

    def judged_as(self, problem: ConvProblem, pass_: str, layout: str,
                  precision: str) -> str | None:
        """cuDNN's FFT and Winograd round more than its GEMMs: a pass that ran one of them
        is judged with the tolerance of cuDNN's own algorithm of that family, as
        `cudnn-find-*` rows are (`judged_family`)."""
        return judged_family(classify_kernels(self.kernels(problem, pass_, layout, precision)))


@register(_torch_cudnn("cudnn-autotune", True), "cuda")
class CuDNNAutotune(CuDNN):
    """cuDNN with ``benchmark=True``: the fastest algorithm of a timed search per shape."""

    autotune = True
