"""Which errors leave the GPU unusable in this process: one list for every reader.

A CUDA fault (an illegal address, a kernel that trapped) is sticky: every later call in the
process fails with it, so the run must stop after the case that caused it rather than blame the
cases after it. The runner and cuDNN's find both ask `is_sticky_fault`, so the two never
disagree about whether an error ends the run. An error whose words do not say (cuDNN's
`CUDNN_STATUS_INTERNAL_ERROR`, which is also its answer to a configuration it cannot run) is
decided by the device itself: `device_usable` runs a tiny kernel and synchronizes, and only
where that fails is it raised as `DeviceUnusable`, which is sticky by type.
"""

from __future__ import annotations

#: How CUDA words the faults after which its context is unusable in this process: every later
#: call fails with the same error (the runtime's and the driver's names, and their messages),
#: and the libraries' own words for a kernel of theirs that faulted or a mapping that failed.
STICKY_WORDS = ("illegal memory access", "illegal_address", "illegaladdress",
                "unspecified launch failure", "launch_failed", "launchfailure",
                "misaligned address", "misaligned_address", "misalignedaddress",
                "illegal instruction", "illegal_instruction", "illegalinstruction",
                "device-side assert", "hardware stack error", "invalid program counter",
                "launch timed out", "launch_timeout",
                "cudnn_status_execution_failed", "cudnn_status_mapping_error",
                "cublas_status_execution_failed", "cufft_exec_failed")


class DeviceUnusable(RuntimeError):
    """An error after which the device failed a tiny kernel: sticky whatever its words."""


def is_sticky_fault(exc: BaseException) -> bool:
    """Whether `exc` is a CUDA fault that leaves the device unusable in this process."""
    if isinstance(exc, DeviceUnusable):
        return True
    text = f"{type(exc).__name__} {exc}".lower()
    return any(word in text for word in STICKY_WORDS)


def device_usable() -> str | None:
    """None where the current CUDA device still runs a kernel and synchronizes; else the error
    it gave (one line)."""
    try:
        import cupy

        a = cupy.arange(4, dtype=cupy.float32)
        (a * 2).sum().get()
        cupy.cuda.Device().synchronize()
    except Exception as exc:  # noqa: BLE001 - any failure here is the answer
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return None
