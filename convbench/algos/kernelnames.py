"""What a GPU kernel's name says: its short form, whether it is a helper, whether it ran on
tensor cores.

A library that picks its own kernel (cuDNN through torch) does not say which math ran: allowing
TF32 or a 16-bit type lets it use tensor cores, it does not make it. The kernel names do say it,
in NVIDIA's conventions (cuDNN, cuBLAS, CUTLASS, xmma), so a row records what ran, not only what
was allowed (`tensor_cores`).

Tensor cores: the MMA instructions (`hmma`, `imma`, `dmma`, Hopper's `gmma`/`wgmma`), CUTLASS's
`tensorop` class, xmma's `tensor16x8x8` tiles, the TF32 and BF16 types (neither has a CUDA-core
path), the instruction shapes of the SASS kernels (`s884cudnn`, `s1688gemm`, `h16816gemm`,
`i8816`), and an xmma kernel whose inputs are 16- or 8-bit (`sm90_xmma_..._f16f16_f16f32_...`).
CUDA cores: FMA kernels (`ffma`, `hfma`, CUTLASS's `simt`), single- and double-precision GEMMs
(`sgemm`, `scudnn`, `dgemm`, `gemv`), xmma on fp32 inputs (`f32f32_f32f32`), and cuDNN's FFT,
Winograd, direct and legacy implicit-GEMM kernels. A name that shows neither (cuBLAS 12's
`nvjet_*`, a new family) is not guessed at: a pass made only of such kernels says nothing.
"""

from __future__ import annotations

import re

#: Kernels that prepare or finish another's work (and torch's own fills and copies): never the
#: one that computes the pass.
HELPERS = (r"computeOffsets|flip_filter|generateWinogradTiles|im2col|nchwToNhwc|nhwcToNchw"
           r"|transpose|scalePackedTensor|splitKreduce|elementwise|fill|copy")
#: A kernel on tensor cores, from its short name (`short_name`).
TENSOR_CORES = (r"[hid]mma|w?gmma|tensorop|tensor\d+x\d+x\d+|tf32|bf16"
                r"|(?<![0-9])[shid](884|1688|16816|8816|16832)(?=[a-z_])"
                r"|xmma\w*?_(f16|e4m3|e5m2|[isu]8)[a-z0-9]*_")
#: A kernel on CUDA cores (FMA units), from its short name, where no tensor-core mark is.
CUDA_CORES = (r"ffma|hfma|simt|sgemm|dgemm|gemv|scudnn|f32f32_f32f32|fft|winograd"
              r"|implicit_convolve|explicit_convolve|precomputed_convolve|_engine|direct"
              r"|depthwise")


def _matches(pattern: str, name: str) -> bool:
    return re.search(pattern, name, re.IGNORECASE) is not None


def _outline(name: str) -> tuple[str, str]:
    """(the name outside template arguments and parameters, its first template argument with
    that argument's own template arguments dropped)."""
    base, first, depth, in_first = [], [], 0, True
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
            in_first = in_first and depth > 0
        elif depth == 0:
            if ch == "(":
                break
            base.append(ch)
        elif depth == 1 and in_first:
            if ch == ",":
                in_first = False
            else:
                first.append(ch)
    return "".join(base).strip(), "".join(first).strip()


def short_name(name: str) -> str:
    """A demangled kernel name without `void`, namespaces, template arguments and parameters;
    for a generic wrapper (CUTLASS's `Kernel<cutlass_tensorop_...>`) its first template
    argument, where the telling name is."""
    clean = re.sub(r"^void\s+", "", name.strip()).replace("(anonymous namespace)::", "")
    base, first = _outline(clean)
    short = base.rsplit("::", 1)[-1]
    if re.fullmatch(r"(device_)?kernel\d*", short, re.IGNORECASE) and first:
        return first
    return short


def is_helper(name: str) -> bool:
    """Whether a kernel only prepares or finishes another's work (`HELPERS`)."""
    return _matches(HELPERS, name)


def on_tensor_cores(name: str) -> bool | None:
    """Whether one kernel ran on tensor cores (True) or CUDA cores (False), read from its short
    name (template arguments, such as a helper's element type, say nothing); None where the
    name shows neither."""
    short = short_name(name)
    if _matches(TENSOR_CORES, short):
        return True
    if _matches(CUDA_CORES, short):
        return False
    return None


def tensor_cores(names: list[str]) -> bool | None:
    """Whether a pass that launched `names` ran a tensor-core kernel: True where any of its
    kernels did; False where every kernel that computes (not a helper) shows CUDA cores; None
    where no kernel computed or one shows neither (a kernel not known cannot be ruled out)."""
    workers = [on_tensor_cores(n) for n in names if not is_helper(n)]
    if any(workers):
        return True
    if workers and all(w is False for w in workers):
        return False
    return None


def kernels_text(names: list[str]) -> str:
    """The kernels a pass launched as one CSV cell: each short name once, in launch order."""
    return "; ".join(dict.fromkeys(short_name(n) for n in names))
