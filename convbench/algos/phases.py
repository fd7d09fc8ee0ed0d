"""The phase contract: how an implementation exposes where its time goes.

An implementation whose pass has distinct phases (FFT and Winograd: transforms, the batched
product, the inverse or output transform) offers ``phases(problem, pass_, layout, precision)``,
the phase names in execution order, and `prepare` returns a callable that carries
``phase_fns``: a dict, in that order, of phase name -> zero-argument callable. After one full call
``run(a, b, out)``, calling every phase function once, in order, recomputes that call phase by
phase on the same arrays (the last ones `run` was given) and leaves `out` as the full call does.
Call them all, in order, for each repetition: a phase reads what the previous ones wrote, and may
consume it (cuFFT's C2R overwrites its input spectrum), so one phase repeated alone is not the
pass's phase. The harness records an event (on the CPU, a ``perf_counter`` reading) between
phases. Calling a phase before any full call raises RuntimeError.

Phase names use the pass's tensor names: ``transform <a>``, ``transform <b>``, ``product``,
``inverse <out>``, with ``x``, ``w``, ``y`` for fwd, ``dy``, ``w``, ``dx`` for bwd_data and
``x``, ``dy``, ``dw`` for bwd_filter; a transform includes packing or tiling, the inverse
includes cropping into the output. A fused kernel, which transforms, multiplies and transforms
back in one launch, is one phase named `FUSED`, after the transforms that run apart from it;
so is a CPU pass that alternates its transform and product block by block (`gemm`'s blocked
nhwc passes).
A library call that returns its own result (torch's convolution) is the phase `CONVOLUTION`,
then `OUTPUT_COPY` into the harness's buffer, which the pass's time leaves out. A problem
padded unequally before and after, run through an explicit pad on an implementation that pads
both sides alike, adds `EXPLICIT_PAD` first (fwd, bwd_filter) or `CROP` last (bwd_data), both
left out of the pass's time too (`APART`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

#: The (first input, second input, output) of each pass, by name.
OPERAND_NAMES = {"fwd": ("x", "w", "y"), "bwd_data": ("dy", "w", "dx"),
                 "bwd_filter": ("x", "dy", "dw")}

#: A library's whole convolution as one call (torch's, into a result it allocates).
CONVOLUTION = "convolution"
#: The phase of a kernel that fuses the transforms with the product (`winograd-fused-*`), or of
#: a pass that alternates them block by block (`gemm` in nhwc on large images, Winograd's
#: filters by blocks of output channels on the CPU).
FUSED = "fused"
#: The copy of a library's own result into the harness's output buffer (torch's convolution
#: allocates its result; the harness hands every pass a buffer to write): timed as a phase and
#: kept in the breakdown, but not part of the pass's time, which is the other phases' sum.
OUTPUT_COPY = "copy to output"
#: The explicit pad of x (or crop of dx) that runs a problem padded unequally before and after
#: on an implementation that pads both sides alike (`convbench.algos.padding`): timed, kept in the
#: breakdown and left out of the pass's time, as the output copy is.
EXPLICIT_PAD = "explicit pad"
CROP = "crop to output"
#: The phases timed apart from the pass's time.
APART = (OUTPUT_COPY, EXPLICIT_PAD, CROP)


def phase_names(pass_: str) -> list[str]:
    a, b, out = OPERAND_NAMES[pass_]
    return [f"transform {a}", f"transform {b}", "product", f"inverse {out}"]


class Phased:
    """A pass as named steps ``step(a, b, out)``: calling it runs them all and remembers the
    arrays, so that `phase_fns` can rerun the steps one by one.

    The phase functions hold the steps and a box with the last call's arrays, never the
    `Phased` itself: a reference cycle (object -> phase_fns -> bound method -> object) would
    keep a finished case's arrays, workspaces and plans alive until the garbage collector next
    ran, which on a GPU is the next case's memory (a stale peak, a false `oom`)."""

    def __init__(self, steps: dict[str, Callable], on_forget: Callable[[], None] | None = None):
        self._steps = steps
        self._on_forget = on_forget
        self._box: list[tuple] = []
        self.phase_fns = {name: functools.partial(_replay, self._box, step)
                          for name, step in steps.items()}

    def __call__(self, a, b, out) -> None:
        self._box[:] = [(a, b, out)]
        for step in self._steps.values():
            step(a, b, out)

    def forget(self) -> None:
        """Drop the arrays of the last call (a warm-up's scratch operands, which must not stay
        alive in the memory the prepared pass is seen to hold, nor a step's activations in a
        memoized pass: `functional.run` forgets after every call). `on_forget` drops what the
        steps keep of them (torch's views of the arrays, an inner pass's own last call)."""
        self._box.clear()
        if self._on_forget is not None:
            self._on_forget()


def _replay(box: list[tuple], step: Callable) -> None:
    if not box:
        raise RuntimeError("phase functions replay the last full call: call the pass first")
    step(*box[0])
